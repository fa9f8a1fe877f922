"""BERT's WordPiece tokenizer and the files of a Hugging Face BERT/ALBERT folder that describe it (vocab.txt,
tokenizer_config.json), for importing pretrained models and fine-tuning them."""

from __future__ import annotations

import json
import os
import unicodedata
from typing import Sequence


def lower_case_setting(path: str, model_type: str) -> bool:
    """do_lower_case from tokenizer_config.json; uncased is the default of BertTokenizer and AlbertTokenizer."""
    config_path = os.path.join(path, "tokenizer_config.json")
    if os.path.isfile(config_path):
        with open(config_path) as f:
            return bool(json.load(f).get("do_lower_case", True))
    return True


def read_vocab(path: str) -> list[str]:
    """The pieces of a vocab.txt, one per line (trailing blank lines dropped); a ValueError if there are none."""
    with open(path, encoding="utf-8") as f:
        vocabulary = [line.rstrip("\n") for line in f]
    while vocabulary and not vocabulary[-1]:
        vocabulary.pop()
    if not vocabulary:
        raise ValueError(f"{path} is empty")
    return vocabulary


def _is_punctuation(c: str) -> bool:
    """BERT's rule: every non-alphanumeric printable ASCII character, and Unicode punctuation (category P*)."""
    code = ord(c)
    return 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126 or \
        unicodedata.category(c).startswith("P")


class WordPiece:
    """BERT's tokenizer: split on whitespace and punctuation (lower-casing and stripping accents for uncased
    vocabularies), then greedy longest-match-first pieces with '##' continuations; [UNK] for a word it cannot
    cover. Enough to feed analyses; Chinese-character splitting and `never_split` lists are left out."""

    def __init__(self, vocabulary: Sequence[str], lower_case: bool = True, max_chars: int = 100):
        self.index = {piece: i for i, piece in enumerate(vocabulary)}
        self.unk = self.index.get("[UNK]", 0)
        self.lower_case, self.max_chars = lower_case, max_chars

    def words(self, text: str) -> list[str]:
        if self.lower_case:
            text = "".join(c for c in unicodedata.normalize("NFD", text.lower()) if unicodedata.category(c) != "Mn")
        words = []
        for chunk in text.split():
            start = 0
            for i, c in enumerate(chunk):
                if _is_punctuation(c):  # BERT splits off every punctuation character, "_" included
                    words += [chunk[start:i], c] if i > start else [c]
                    start = i + 1
            if start < len(chunk):
                words.append(chunk[start:])
        return words

    def __call__(self, text: str) -> list[int]:
        ids = []
        for word in self.words(text):
            if len(word) > self.max_chars:
                ids.append(self.unk)
                continue
            pieces, start = [], 0
            while start < len(word):
                end = len(word)
                while end > start and (("##" if start else "") + word[start:end]) not in self.index:
                    end -= 1
                if end == start:
                    pieces = [self.unk]
                    break
                pieces.append(self.index[("##" if start else "") + word[start:end]])
                start = end
            ids.extend(pieces)
        return ids
