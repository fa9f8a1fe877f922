"""Masked-LM examples: sentence splitting, packing whole sentences into rows, BERT masking, a unigram baseline.

Row layout (T = seq_len), as in DIET App. A (whole sentences of documents, no next-sentence task):

    tokens       [CLS] a1 a2 a3 [SEP] b1 b2 [SEP] [PAD] [PAD]
    piece_ids      1   1  1  1    1   2  2    2     0     0
    positions      0   1  2  3    4   0  1    2     0     0

Every row starts with [CLS]; each run of one document's sentences in a row (a "piece") ends with [SEP] and has
its own piece id 1, 2, 3, ... so attention can be kept inside a document; 0 marks padding. Positions restart
at 0 in every piece (`piece_positions`), so each piece is encoded as if it had the row to itself, for every
positional mechanism (a later piece's first token takes position 0, where a row of its own would put [CLS]:
TUPE's untied [CLS] applies to it too). A document that
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


def piece_positions(piece_ids: np.ndarray) -> np.ndarray:
    """Positions within each packed piece: piece_ids [..., T] -> [..., T] int32, restarting at 0 wherever the
    piece id changes (so a piece sees the positions it would have in a row of its own); 0 on padding."""
    piece_ids = np.asarray(piece_ids)
    column = np.arange(piece_ids.shape[-1])
    starts = np.ones(piece_ids.shape, bool)
    starts[..., 1:] = piece_ids[..., 1:] != piece_ids[..., :-1]
    first = np.maximum.accumulate(np.where(starts, column, 0), axis=-1)  # each token's piece start
    return np.where(piece_ids > 0, column - first, 0).astype(np.int32)


@dataclasses.dataclass
class PackedExamples:
    """Packed rows of a split: `tokens` [N, T] int32 (unmasked ids), `piece_ids` [N, T] int32 (0 = pad)."""

    tokens: np.ndarray
    piece_ids: np.ndarray

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def seq_len(self) -> int:
        return self.tokens.shape[1]

    @property
    def positions(self) -> np.ndarray:
        """[N, T] int32 positions within each piece (`piece_positions`)."""
        return piece_positions(self.piece_ids)


class RowPacker:
    """Packs whole sentences into rows of `seq_len` tokens as they arrive (layout in the module docstring).

    `add_document` returns the rows it completed; `finish` closes the last one. Its state (the open row) is
    a small JSON-ready dict, so a stream that packs on the fly can save and restore its position.
    """

    def __init__(self, seq_len: int, stats: DataStats | None = None, *, cls_id: int = CLS_ID,
                 sep_id: int = SEP_ID, pad_id: int = PAD_ID):
        if seq_len < 3:
            raise ValueError(f"seq_len={seq_len}: a row needs room for [CLS], one token and [SEP]")
        self.seq_len, self.cls_id, self.sep_id, self.pad_id = seq_len, cls_id, sep_id, pad_id
        self.stats = stats if stats is not None else DataStats()
        self.capacity = seq_len - 2  # the longest sentence piece that fits in a row beside [CLS] and [SEP]
        self.row, self.piece_ids, self.piece = [cls_id], [1], 0

    def get_state(self) -> dict:
        """The open row (tokens without its [SEP]s yet to come, piece ids, pieces so far)."""
        # "segments": the key data states already saved in checkpoints hold the piece ids under.
        return dict(row=list(map(int, self.row)), segments=list(map(int, self.piece_ids)), piece=self.piece)

    def set_state(self, state: dict) -> None:
        self.row, self.piece_ids, self.piece = list(state["row"]), list(state["segments"]), int(state["piece"])

    def _close_row(self, rows: list) -> None:
        if self.piece:
            pad = self.seq_len - len(self.row)
            rows.append((self.row + [self.pad_id] * pad, self.piece_ids + [0] * pad))
        self.row, self.piece_ids, self.piece = [self.cls_id], [1], 0

    def add_document(self, document: Sequence[Sequence[int]]) -> list[tuple[list[int], list[int]]]:
        """Adds one document's sentences (token id lists; empty ones are ignored); returns the completed rows as
        (tokens, piece_ids) lists of seq_len ints. The document's last piece is closed with [SEP]."""
        rows, piece_open = [], False
        for sentence in document:
            if len(sentence) > self.capacity:
                self.stats.split_long += 1
            for start in range(0, len(sentence), self.capacity):
                chunk = list(sentence[start:start + self.capacity])
                if len(self.row) + len(chunk) + 1 > self.seq_len:  # + 1: an open piece always has room for [SEP]
                    if piece_open:
                        self.row.append(self.sep_id)
                        self.piece_ids.append(self.piece)
                        piece_open = False
                    self._close_row(rows)
                if not piece_open:
                    self.piece += 1
                    piece_open = True
                self.row.extend(chunk)
                self.piece_ids.extend([self.piece] * len(chunk))
        if piece_open:  # the document ends: the next one starts a new piece
            self.row.append(self.sep_id)
            self.piece_ids.append(self.piece)
        self.stats.packed_examples += len(rows)
        return rows

    def finish(self) -> list[tuple[list[int], list[int]]]:
        """Closes the open row (if it holds a piece) and returns it; the packer starts empty again."""
        rows = []
        self._close_row(rows)
        self.stats.packed_examples += len(rows)
        return rows


def rows_to_examples(rows: Sequence[tuple[Sequence[int], Sequence[int]]], seq_len: int) -> PackedExamples:
    """(tokens, piece_ids) row pairs -> PackedExamples [N, seq_len] int32."""
    tokens = np.asarray([r[0] for r in rows], np.int32).reshape(-1, seq_len)
    return PackedExamples(tokens, np.asarray([r[1] for r in rows], np.int32).reshape(-1, seq_len))


def pack_documents(documents: Sequence[Sequence[Sequence[int]]], seq_len: int,
                   stats: DataStats | None = None, *, cls_id: int = CLS_ID, sep_id: int = SEP_ID,
                   pad_id: int = PAD_ID) -> PackedExamples:
    """Packs whole sentences into rows of `seq_len` tokens, greedily in order (layout in the module docstring).

    documents: per document, its sentences as lists of token ids (empty sentences are ignored).
    Returns PackedExamples with tokens/piece_ids [N, seq_len] int32.
    """
    packer = RowPacker(seq_len, stats, cls_id=cls_id, sep_id=sep_id, pad_id=pad_id)
    rows = [row for document in documents for row in packer.add_document(document)]
    return rows_to_examples(rows + packer.finish(), seq_len)


def encode_documents(documents: Sequence[str], tokenizer, stats: DataStats,
                     newline_ends_sentence: bool = False) -> list[list[list[int]]]:
    """Per document, its sentences' token ids (`split_sentences`, then one batched SentencePiece call); sentences
    that tokenize to nothing are dropped and counted."""
    sentences = [split_sentences(d, newline_ends_sentence) for d in documents]
    encoded = iter(tokenizer.encode_batch([s for doc in sentences for s in doc]))
    by_document = []
    for document in sentences:
        ids = [next(encoded) for _ in document]
        stats.skipped_empty += sum(not s for s in ids)  # e.g. a sentence of characters the vocabulary drops
        by_document.append([s for s in ids if s])
    stats.sentences += sum(len(d) for d in by_document)
    stats.tokens += sum(len(s) for d in by_document for s in d)
    return by_document


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
               mask_prob: float = 0.15, num_special: int = NUM_MLM_SPECIAL, mask_id: int = MASK_ID,
               reserved: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """BERT masking. targets [B, T] int, example_ids [B] -> (input_ids [B, T] int32, mask_weights [B, T] f32).

    Row b's masking is a pure function of (key, example_ids[b]) (e.g. key = (seed, stream, epoch)), not of the
    batch it sits in. Of its n candidate tokens (ids >= num_special: never [PAD], [UNK], [CLS], [SEP],
    [MASK]) exactly max(1, round(mask_prob·n)) are chosen, as in BERT's data code (so a row never needs more
    than ceil(mask_prob·T) predictions). Each chosen token becomes [MASK] with probability 0.8, a uniformly
    random non-special token with probability 0.1, and stays itself otherwise; mask_weights is 1.0 there.
    `reserved`: the special ids of a vocabulary that keeps them elsewhere than 0..num_special-1 (a Hugging Face
    one); the same draws choose among the other ids (`range(num_special)` gives exactly the default's result).
    """
    targets = np.asarray(targets)
    rows = np.asarray(example_ids, np.int64)[:, None]
    positions = np.arange(targets.shape[1])[None, :]
    u_choose, u_action, u_token = (hash_uniform(*key, rows, positions, draw) for draw in range(3))
    candidates = targets >= num_special if reserved is None else ~np.isin(targets, np.asarray(reserved))
    num_candidates = candidates.sum(axis=1)
    count = np.where(num_candidates > 0,
                     np.minimum(num_candidates, np.maximum(1, np.floor(mask_prob * num_candidates + 0.5))), 0)
    rank = np.argsort(np.argsort(np.where(candidates, u_choose, 2.0), axis=1), axis=1)  # others rank last
    chosen = rank < count[:, None]
    if reserved is None:
        random_ids = num_special + np.floor(u_token * (vocab_size - num_special)).astype(np.int64)
    else:  # the same draw, among the ids left once the reserved are out, in order
        ordinary = np.setdiff1d(np.arange(vocab_size), np.asarray(reserved))
        random_ids = ordinary[np.floor(u_token * len(ordinary)).astype(np.int64)]
    input_ids = np.where(chosen & (u_action < 0.8), mask_id, targets)
    input_ids = np.where(chosen & (u_action >= 0.8) & (u_action < 0.9), random_ids, input_ids)
    return input_ids.astype(np.int32), chosen.astype(np.float32)


def masked_rows(targets: np.ndarray, piece_ids: np.ndarray, example_ids: np.ndarray, key: tuple[int, ...],
                vocab_size: int, mask_prob: float) -> dict[str, np.ndarray]:
    """A training batch from packed rows targets/piece_ids [B, T] with ids `example_ids` [B] (masking is a
    function of (key, id)): input_ids, targets, piece_ids, positions, token_types int32, mask_weights
    float32, all [B, T]."""
    input_ids, mask_weights = mask_batch(targets, example_ids, key, vocab_size=vocab_size, mask_prob=mask_prob)
    return mlm_batch(input_ids, targets, mask_weights, piece_ids)


def mlm_batch(input_ids: np.ndarray, targets: np.ndarray, mask_weights: np.ndarray,
              piece_ids: np.ndarray) -> dict[str, np.ndarray]:
    """The masked-LM batch every step and evaluation reads, from masked rows [B, T]: input_ids, targets,
    mask_weights, piece_ids, and the positions within each piece and the token types derived from them."""
    return dict(input_ids=input_ids, targets=targets, mask_weights=mask_weights, piece_ids=piece_ids,
                positions=piece_positions(piece_ids),
                token_types=np.zeros_like(targets))  # one sentence "A" per row: no next-sentence task


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
