"""Masked-LM examples: sentence splitting, packing whole sentences into rows, BERT masking, a unigram baseline.

Row layout (T = seq_len), as in DIET App. A (whole sentences of documents, no next-sentence task):

    tokens       [CLS] a1 a2 a3 [SEP] b1 b2 [SEP] [PAD] [PAD]
    segment_ids    1   1  1  1    1   2  2    2     0     0

Every row starts with [CLS]; each run of one document's sentences in a row (a "piece") ends with [SEP] and has
its own segment id 1, 2, 3, ... so attention can be kept inside a document; 0 marks padding. A document that
does not fit continues in the next row (as piece 1 there). A sentence longer than T - 2 tokens is cut into
pieces of at most T - 2 tokens (counted in `DataStats.split_long`).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Mapping, Sequence

import numpy as np

from jaxpos.data.corpus import DataStats
from jaxpos.data.tokenizer import CLS_ID, MASK_ID, NUM_MLM_SPECIAL, PAD_ID, SEP_ID

# A sentence ends at . ! or ? (closing quotes/brackets may follow) when whitespace and then a capital letter,
# a digit or an opening quote/bracket come next. "e.g. this" stays whole; "Mr. Smith" is split (a known limit).
_SENTENCE_END = re.compile(r"(?<=[.!?])([\"'”’)\]]*)\s+(?=[\"'“‘(\[]?[A-Z0-9])")
_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n")


def split_sentences(document: str, newline_ends_sentence: bool = False) -> list[str]:
    """Sentences of a document, whitespace collapsed. Blank lines always end a sentence; single line breaks
    do only with `newline_ends_sentence` (for one-paragraph- or one-sentence-per-line text such as Wikipedia;
    otherwise they are taken as line wrapping). Inside a paragraph, sentences end as `_SENTENCE_END` says."""
    paragraphs = document.split("\n") if newline_ends_sentence else _PARAGRAPH_BREAK.split(document)
    sentences = []
    for paragraph in paragraphs:
        text = " ".join(paragraph.split())
        if text:
            sentences.extend(s for s in _SENTENCE_END.sub(r"\1\n", text).split("\n") if s)
    return sentences


@dataclasses.dataclass
class PackedExamples:
    """Packed rows of a split: `tokens` [N, T] int32 (unmasked ids), `segment_ids` [N, T] int32 (0 = pad)."""

    tokens: np.ndarray
    segment_ids: np.ndarray

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def seq_len(self) -> int:
        return self.tokens.shape[1]


def pack_documents(documents: Sequence[Sequence[Sequence[int]]], seq_len: int,
                   stats: DataStats | None = None, *, cls_id: int = CLS_ID, sep_id: int = SEP_ID,
                   pad_id: int = PAD_ID) -> PackedExamples:
    """Packs whole sentences into rows of `seq_len` tokens, greedily in order (layout in the module docstring).

    documents: per document, its sentences as lists of token ids (empty sentences are ignored).
    Returns PackedExamples with tokens/segment_ids [N, seq_len] int32.
    """
    if seq_len < 3:
        raise ValueError(f"seq_len={seq_len}: a row needs room for [CLS], one token and [SEP]")
    stats = stats if stats is not None else DataStats()
    capacity = seq_len - 2  # the longest sentence piece that fits in a row beside [CLS] and [SEP]
    rows, row_segments = [], []
    row, segments, piece, piece_open = [cls_id], [1], 0, False

    def close_piece():
        nonlocal piece_open
        if piece_open:
            row.append(sep_id)
            segments.append(piece)
            piece_open = False

    def close_row():
        nonlocal row, segments, piece
        close_piece()
        if piece:
            rows.append(row + [pad_id] * (seq_len - len(row)))
            row_segments.append(segments + [0] * (seq_len - len(segments)))
        row, segments, piece = [cls_id], [1], 0

    for document in documents:
        for sentence in document:
            if len(sentence) > capacity:
                stats.split_long += 1
            for start in range(0, len(sentence), capacity):
                chunk = list(sentence[start:start + capacity])
                if len(row) + len(chunk) + 1 > seq_len:  # + 1: an open piece always has room for its [SEP]
                    close_row()
                if not piece_open:
                    piece += 1
                    piece_open = True
                row.extend(chunk)
                segments.extend([piece] * len(chunk))
        close_piece()  # the document ends: the next one starts a new piece
    close_row()
    stats.packed_examples += len(rows)
    tokens = np.asarray(rows, np.int32).reshape(-1, seq_len)
    return PackedExamples(tokens, np.asarray(row_segments, np.int32).reshape(-1, seq_len))


def _splitmix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's mixing step on uint64 arrays (a bijection; arithmetic wraps modulo 2**64)."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def hash_uniform(*words) -> np.ndarray:
    """Uniform floats in [0, 1) that are a pure function of non-negative integer `words` (scalars or arrays,
    broadcast together): a SplitMix64 hash chain. Any element is computed without generating the ones before
    it, so a whole batch is drawn in a few vector operations whatever rows it holds."""
    with np.errstate(over="ignore"):
        state = np.zeros((), np.uint64)
        for word in words:
            state = _splitmix64(state ^ np.asarray(word, np.uint64))
    return (state >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def mask_batch(targets: np.ndarray, example_ids: np.ndarray, key: Sequence[int], *, vocab_size: int,
               mask_prob: float = 0.15, num_special: int = NUM_MLM_SPECIAL,
               mask_id: int = MASK_ID) -> tuple[np.ndarray, np.ndarray]:
    """BERT masking. targets [B, T] int, example_ids [B] -> (input_ids [B, T] int32, mask_weights [B, T] f32).

    Row b's masking is a pure function of (key, example_ids[b]) (e.g. key = (seed, stream, epoch)), not of the
    batch it sits in. Of its n candidate tokens (ids >= num_special: never [PAD], [UNK], [CLS], [SEP],
    [MASK]) exactly max(1, round(mask_prob·n)) are chosen, as in BERT's data code (so a row never needs more
    than ceil(mask_prob·T) predictions). Each chosen token becomes [MASK] with probability 0.8, a uniformly
    random non-special token with probability 0.1, and stays itself otherwise; mask_weights is 1.0 there.
    """
    targets = np.asarray(targets)
    rows = np.asarray(example_ids, np.int64)[:, None]
    positions = np.arange(targets.shape[1])[None, :]
    u_choose, u_action, u_token = (hash_uniform(*key, rows, positions, draw) for draw in range(3))
    candidates = targets >= num_special
    num_candidates = candidates.sum(axis=1)
    count = np.where(num_candidates > 0,
                     np.minimum(num_candidates, np.maximum(1, np.floor(mask_prob * num_candidates + 0.5))), 0)
    rank = np.argsort(np.argsort(np.where(candidates, u_choose, 2.0), axis=1), axis=1)  # others rank last
    chosen = rank < count[:, None]
    random_ids = num_special + np.floor(u_token * (vocab_size - num_special)).astype(np.int64)
    input_ids = np.where(chosen & (u_action < 0.8), mask_id, targets)
    input_ids = np.where(chosen & (u_action >= 0.8) & (u_action < 0.9), random_ids, input_ids)
    return input_ids.astype(np.int32), chosen.astype(np.float32)


def unigram_entropy(tokens: np.ndarray | Sequence[int] | None = None, *,
                    counts: Mapping[int, int] | np.ndarray | None = None,
                    num_special: int = NUM_MLM_SPECIAL) -> float:
    """Entropy in nats/token of the unigram distribution of the prediction targets (ids >= num_special):
    the loss of a model that ignores the context, a baseline the MLM loss must beat.

    Give either `tokens` (ids of any shape, or an iterable of id arrays) or `counts` (a {id: count} mapping,
    or an array indexed by id).
    """
    if (tokens is None) == (counts is None):
        raise ValueError("give exactly one of tokens= or counts=")
    if tokens is not None:
        if not isinstance(tokens, np.ndarray):
            tokens = np.concatenate([np.ravel(np.asarray(t, np.int64)) for t in tokens] or [np.zeros(0, np.int64)])
        ids = np.ravel(tokens).astype(np.int64)
        freq = np.bincount(ids[ids >= num_special])
    elif isinstance(counts, Mapping):
        freq = np.array([c for token, c in counts.items() if token >= num_special], np.float64)
    else:
        freq = np.asarray(counts, np.float64)[num_special:]
    freq = freq[freq > 0].astype(np.float64)
    if freq.size == 0:
        raise ValueError("no non-special tokens to compute a unigram entropy from")
    p = freq / freq.sum()
    return float(-(p * np.log(p)).sum())
