"""The tokenizer of a local Hugging Face folder, read the way transformers reads it: `tokenizer.json` (the fast
tokenizer of the `tokenizers` library: BPE, WordPiece or Unigram, as ModernBERT, NeoBERT, Ettin and most encoders
since 2024 ship it) first, else BERT's `vocab.txt` (WordPiece) or ALBERT's `spiece.model` (SentencePiece). Every
reader of a Hugging Face folder (import, analyze, finetune, evaluate, export) takes its tokenizer from here.

The special tokens ([CLS], [SEP], [PAD], [MASK], or RoBERTa's <s>, </s>, <pad>, <mask>) come from the folder's
tokenizer_config.json or special_tokens_map.json where they name them, else by those usual names; ids are looked
up in the vocabulary, and a token the vocabulary lacks is a one-line error. Nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable

from jaxpos.data.tokenizer import SpecialIds, read_tokenizer_json
from jaxpos.data.wordpiece import WordPiece, lower_case_setting, read_vocab

TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "spiece.model")  # in the order they are tried
ROLES = ("cls", "sep", "pad", "mask")
# The usual names of each special token, BERT's first, then RoBERTa's and SentencePiece's
USUAL_NAMES = {"cls": ("[CLS]", "<s>"), "sep": ("[SEP]", "</s>"), "pad": ("[PAD]", "<pad>"),
               "mask": ("[MASK]", "<mask>")}


@dataclasses.dataclass(frozen=True)
class FolderTokenizer:
    """A Hugging Face folder's tokenizer: `encode` text -> ids without special tokens; the special tokens' ids
    (None where the vocabulary has none); the vocabulary id -> piece."""

    encode: Callable[[str], list[int]]
    vocabulary: list[str]
    cls_id: int | None
    sep_id: int | None
    pad_id: int | None
    mask_id: int | None
    source: str  # the file it was read from
    kind: str  # "tokenizers" (tokenizer.json), "wordpiece" (vocab.txt) or "sentencepiece" (spiece.model)
    encode_batch: Callable[[list[str]], list[list[int]]]
    added_special: tuple[int, ...] = ()  # tokenizer.json's special added tokens (<unk>, <bos>, ... as well)

    @property
    def vocab_size(self) -> int:
        return len(self.vocabulary)

    def check_fits(self, vocab_size: int, config_path: str) -> None:
        """A one-line ValueError when the vocabulary has more entries than the model's `vocab_size` (a model may
        pad its embedding table beyond the vocabulary, never the other way)."""
        if self.vocab_size > vocab_size:
            raise ValueError(f"{self.source} has {self.vocab_size} entries but {config_path} says "
                             f"vocab_size={vocab_size}")

    def special_ids(self) -> SpecialIds:
        """[CLS], [SEP] and [MASK], and every special id (those three, [PAD], [UNK] and tokenizer.json's special
        added tokens) as reserved: what masking the folder's text needs. A ValueError when one of the three is
        missing."""
        missing = [USUAL_NAMES[role][0] for role in ("cls", "sep", "mask") if getattr(self, f"{role}_id") is None]
        if missing:
            raise ValueError(f"{self.source} has no {', '.join(missing)} token: its text cannot be masked and framed "
                             "as a masked-LM reads it")
        unknown = [i for i, piece in enumerate(self.vocabulary) if piece in ("[UNK]", "<unk>")]
        reserved = {self.cls_id, self.sep_id, self.mask_id, *unknown, *self.added_special}
        reserved |= {self.pad_id} if self.pad_id is not None else set()
        return SpecialIds(self.cls_id, self.sep_id, self.mask_id, tuple(sorted(reserved)))


def special_token_names(folder: str) -> dict[str, str]:
    """{role: token} that tokenizer_config.json (or special_tokens_map.json) names, for the roles it names."""
    names = {}
    for file in ("special_tokens_map.json", "tokenizer_config.json"):  # the config's own entries win
        path = os.path.join(folder, file)
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as f:
            values = json.load(f)
        for role in ROLES:
            value = values.get(f"{role}_token")
            if isinstance(value, dict):  # {"content": "[CLS]", ...}
                value = value.get("content")
            if isinstance(value, str) and value:
                names[role] = value
    return names


def _special_ids(folder: str, index: dict[str, int], source: str) -> dict[str, int | None]:
    """{role: id}: the named token where the folder names one (it must be in the vocabulary), else the first usual
    name the vocabulary holds, else None."""
    named = special_token_names(folder)
    ids = {}
    for role in ROLES:
        if role in named:
            if named[role] not in index:
                raise ValueError(f"{folder} names {named[role]!r} as its {role} token, but {source} has no such token")
            ids[role] = index[named[role]]
        else:
            ids[role] = next((index[name] for name in USUAL_NAMES[role] if name in index), None)
    return ids


def _from_tokenizer_json(folder: str) -> FolderTokenizer:
    path = os.path.join(folder, "tokenizer.json")
    with open(path, "rb") as f:
        tokenizer = read_tokenizer_json(f.read(), path)
    index = tokenizer.get_vocab(with_added_tokens=True)
    vocabulary = [""] * (max(index.values()) + 1)
    for piece, i in index.items():
        vocabulary[i] = piece
    ids = _special_ids(folder, index, path)

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    added = tuple(sorted(i for i, token in tokenizer.get_added_tokens_decoder().items() if token.special))
    return FolderTokenizer(encode, vocabulary, ids["cls"], ids["sep"], ids["pad"], ids["mask"], path, "tokenizers",
                           encode_batch, added)


def _from_vocab_txt(folder: str, model_type: str) -> FolderTokenizer:
    path = os.path.join(folder, "vocab.txt")
    vocabulary = read_vocab(path)
    ids = _special_ids(folder, {piece: i for i, piece in enumerate(vocabulary)}, path)
    encode = WordPiece(vocabulary, lower_case_setting(folder, model_type))
    return FolderTokenizer(encode, vocabulary, ids["cls"], ids["sep"], ids["pad"], ids["mask"], path, "wordpiece",
                           lambda texts: [encode(t) for t in texts])


def _from_spiece(folder: str, model_type: str) -> FolderTokenizer:
    import sentencepiece as spm  # lazy: only ALBERT's spiece.model folders need it

    path = os.path.join(folder, "spiece.model")
    processor = spm.SentencePieceProcessor(model_file=path)
    vocabulary = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    ids = _special_ids(folder, {piece: i for i, piece in enumerate(vocabulary)}, path)
    lower = lower_case_setting(folder, model_type)
    encode = (lambda text: processor.encode(text.lower())) if lower else processor.encode
    return FolderTokenizer(encode, vocabulary, ids["cls"], ids["sep"], ids["pad"], ids["mask"], path,
                           "sentencepiece", lambda texts: [encode(t) for t in texts])


def folder_tokenizer(folder: str, model_type: str = "bert") -> FolderTokenizer | None:
    """The tokenizer of a local Hugging Face folder (`TOKENIZER_FILES`, the first present), or None when it holds
    none of them. `model_type`: config.json's, for the lower-casing default of vocab.txt and spiece.model."""
    if os.path.isfile(os.path.join(folder, "tokenizer.json")):
        return _from_tokenizer_json(folder)
    if os.path.isfile(os.path.join(folder, "vocab.txt")):
        return _from_vocab_txt(folder, model_type)
    if os.path.isfile(os.path.join(folder, "spiece.model")):
        return _from_spiece(folder, model_type)
    return None


def require_folder_tokenizer(folder: str, model_type: str = "bert") -> FolderTokenizer:
    """`folder_tokenizer`, or a FileNotFoundError naming the files looked for."""
    tokenizer = folder_tokenizer(folder, model_type)
    if tokenizer is None:
        raise FileNotFoundError(f"{folder} has no tokenizer: none of {', '.join(TOKENIZER_FILES)}")
    return tokenizer
