"""Examples as model inputs (T = max_length), BERT's layout and longest-first truncation:

    input_ids    [CLS] a1 a2 [SEP] b1 b2 b3 [SEP] [PAD] [PAD]
    token_types    0   0  0    0   1  1  1    1     0     0
    piece_ids      1   1  1    1   1  1  1    1     0     0     (one packing piece per row, 0 = padding)
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Sequence

import numpy as np

from jaxpos.data.classification.tokenizers import PairTokenizer
from jaxpos.data.examples import Example


@dataclasses.dataclass
class EncodedExamples:
    """Model inputs of N examples (layout in the module docstring)."""

    input_ids: np.ndarray  # [N, T] int32
    token_types: np.ndarray  # [N, T] int32
    piece_ids: np.ndarray  # [N, T] int32
    labels: np.ndarray  # [N] float32
    truncated: int  # examples cut to T tokens

    FIELDS = ("input_ids", "token_types", "piece_ids", "labels")

    def __len__(self) -> int:
        return len(self.labels)

    def rows(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        return {name: getattr(self, name)[indices] for name in self.FIELDS}


def truncate_longest_first(length_a: int, length_b: int, budget: int) -> tuple[int, int]:
    """Lengths after BERT's `_truncate_seq_pair`: drop the last token of the longer side (of b on a tie) until
    length_a + length_b <= budget."""
    while length_a + length_b > budget:
        if length_a > length_b:
            length_a -= 1
        else:
            length_b -= 1
    return length_a, length_b


def _encode_all(tokenizer: PairTokenizer, texts: list[str]) -> list[list[int]]:
    batch = getattr(tokenizer, "encode_batch", None)
    return list(batch(texts)) if batch is not None else [tokenizer.encode(t) for t in texts]


def encode_examples(examples: Sequence[Example], tokenizer: PairTokenizer, max_length: int) -> EncodedExamples:
    """[CLS] a [SEP] (b [SEP]) padded to `max_length`; a pair or sentence too long is cut longest-first."""
    has_b = [e.text_b is not None for e in examples]
    if max_length < (4 if any(has_b) else 3):
        raise ValueError(f"max_length={max_length} leaves no room for text beside [CLS] and [SEP]")
    ids_a = _encode_all(tokenizer, [e.text_a for e in examples])
    ids_b = iter(_encode_all(tokenizer, [e.text_b for e in examples if e.text_b is not None]))
    n = len(examples)
    input_ids = np.full((n, max_length), tokenizer.pad_id, np.int32)
    token_types, piece_ids = np.zeros((n, max_length), np.int32), np.zeros((n, max_length), np.int32)
    truncated = 0
    for i, (a, pair) in enumerate(zip(ids_a, has_b)):
        b = next(ids_b) if pair else []
        la, lb = truncate_longest_first(len(a), len(b), max_length - (3 if pair else 2))
        truncated += (la, lb) != (len(a), len(b))
        row = [tokenizer.cls_id, *a[:la], tokenizer.sep_id] + ([*b[:lb], tokenizer.sep_id] if pair else [])
        input_ids[i, :len(row)] = row
        token_types[i, la + 2:len(row)] = 1
        piece_ids[i, :len(row)] = 1
    labels = np.array([e.label for e in examples], np.float32)
    return EncodedExamples(input_ids, token_types, piece_ids, labels, truncated)


def same_pieces(couples: Sequence[tuple[Example, Example]], tokenizer: PairTokenizer,
                max_length: int | None = None) -> list[bool]:
    """Whether the two members of each couple give a model blind to word order the same input: each sentence
    tokenized to the same multiset of pieces in both, after `encode_examples`' cut to `max_length` (None: whole
    sentences)."""
    texts = list(dict.fromkeys(t for couple in couples for e in couple for t in (e.text_a, e.text_b) if t is not None))
    pieces = dict(zip(texts, _encode_all(tokenizer, texts)))  # the side a couple leaves alone is encoded once

    def bag(example: Example) -> tuple[Counter, Counter]:
        a, b = pieces[example.text_a], pieces[example.text_b] if example.text_b is not None else []
        if max_length is not None:
            la, lb = truncate_longest_first(len(a), len(b), max_length - (3 if example.text_b is not None else 2))
            a, b = a[:la], b[:lb]
        return Counter(a), Counter(b)

    return [bag(first) == bag(second) for first, second in couples]
