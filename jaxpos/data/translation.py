"""Translation batches: a shared SentencePiece vocabulary, packed training rows, held-out sets, eval batches.

The pairs come from data/parallel.py (Bible, TFDS, local files). Training pairs with a side longer than
`max_length` tokens (EOS included) are dropped and counted; held-out pairs are kept whole (sources cut to
`eval_max_length`).

Training rows (as flax examples/wmt): pairs, each side ending in EOS, are packed greedily in parallel into rows
of `max_length` tokens: a pair joins the current row when both its sides fit, else opens a new row. Per row:
`inputs`, `targets` (0 = padding), `*_piece_ids` (1, 2, ... per pair, 0 = padding) and `*_positions`
(restarting at 0 in every pair), all [rows, max_length] int32.

Order, a pure function of (seed, step): pairs are packed once in the order
default_rng([seed, TRANSLATION_PACKING]).permutation; epoch e visits the rows in the order
default_rng([seed, TRANSLATION_ROW_ORDER, e]).permutation, and global batch k is rows [j·B, (j+1)·B) of it, with
e, j = divmod(k, rows // B) (each epoch drops the rows mod B it puts last). The streams: jaxpos/config/rng.py.
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Iterator, Sequence

import numpy as np

from jaxpos.config.rng import TRANSLATION_PACKING, TRANSLATION_ROW_ORDER
from jaxpos.config.run import TranslationDataConfig, tokenizer_algorithm
from jaxpos.data.order import ShuffledBatches, padded_batches
from jaxpos.data.parallel import SPLITS, ParallelText, TranslationStats, load_parallel
from jaxpos.data.tokenizer import RUN_TOKENIZER_NAMES, TRANSLATION_SPECIAL_TOKENS, Tokenizer, load_or_train_tokenizer

PAD_ID, UNK_ID, BOS_ID, EOS_ID = (TRANSLATION_SPECIAL_TOKENS.index(t) for t in ("[PAD]", "[UNK]", "[BOS]", "[EOS]"))


def load_eval_set(config, split: str, tokenizer: Tokenizer) -> tuple[EvalSet, TranslationStats]:
    """One held-out split ("dev" or "test") of `config`'s data, tokenized as in training; no training pair is
    read (for `jaxpos eval-bleu` on a finished run)."""
    stats = {name: TranslationStats() for name in SPLITS}
    text = load_parallel(config, stats, splits_wanted=(split,))[split]
    return make_eval_set(text, tokenizer, config.eval_max_length, stats[split]), stats[split]


# ------------------------------------------------------------------------------------------ tokens and packing
def encode_pairs(text: ParallelText, tokenizer: Tokenizer, max_length: int, stats: TranslationStats, *,
                 truncate: bool = False, chunk: int = 100_000) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(source ids, target ids): int32 arrays, each ending in EOS. A side longer than `max_length` tokens drops
    the pair (training; counted in dropped_long) or, with `truncate`, is cut to it, EOS kept last (held out;
    counted in truncated)."""
    sources, targets = [], []
    for start in range(0, len(text), chunk):
        encoded = zip(tokenizer.encode_batch(text.sources[start:start + chunk]),
                      tokenizer.encode_batch(text.targets[start:start + chunk]))
        for source, target in encoded:
            source, target = source + [EOS_ID], target + [EOS_ID]
            if len(source) > max_length or len(target) > max_length:
                if not truncate:
                    stats.dropped_long += 1
                    stats.dropped_long_tokens += len(source) + len(target)
                    continue
                stats.truncated += 1
                source, target = source[:max_length - 1] + [EOS_ID], target[:max_length - 1] + [EOS_ID]
            sources.append(np.asarray(source, np.int32))
            targets.append(np.asarray(target, np.int32))
    stats.pairs += len(sources)
    stats.source_tokens += sum(len(s) for s in sources)
    stats.target_tokens += sum(len(t) for t in targets)
    return sources, targets


@dataclasses.dataclass
class PackedPairs:
    """Packed training rows, all [rows, length] int32 (module docstring)."""

    inputs: np.ndarray
    targets: np.ndarray
    input_piece_ids: np.ndarray
    target_piece_ids: np.ndarray
    input_positions: np.ndarray
    target_positions: np.ndarray

    FIELDS = ("inputs", "targets", "input_piece_ids", "target_piece_ids", "input_positions",
              "target_positions")

    def __len__(self) -> int:
        return self.inputs.shape[0]

    @property
    def length(self) -> int:
        return self.inputs.shape[1]

    def rows(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        return {name: getattr(self, name)[indices] for name in self.FIELDS}


def _fill(sequences: Sequence[np.ndarray], row: np.ndarray, offset: np.ndarray, piece_id: np.ndarray,
          shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens, piece ids, positions) [R, L] with sequence i written at (row[i], offset[i]...)."""
    lengths = np.array([len(s) for s in sequences], np.int64)
    starts = np.cumsum(lengths) - lengths
    pair = np.repeat(np.arange(len(sequences)), lengths)  # which pair each token belongs to
    position = np.arange(lengths.sum()) - starts[pair]
    flat = row[pair] * shape[1] + offset[pair] + position
    tokens, piece_ids, positions = (np.zeros(shape[0] * shape[1], np.int32) for _ in range(3))
    tokens[flat] = np.concatenate(sequences) if sequences else []
    piece_ids[flat], positions[flat] = piece_id[pair], position
    return tokens.reshape(shape), piece_ids.reshape(shape), positions.reshape(shape)


def one_pair_per_row(sources: Sequence[np.ndarray], targets: Sequence[np.ndarray], length: int) -> PackedPairs:
    """Rows holding one pair each (data.pack=False), in the `PackedPairs` layout (the unpacked control of a
    comparison: every mechanism also trains on packed rows)."""
    n = len(sources)
    too_long = [i for i, (s, t) in enumerate(zip(sources, targets)) if len(s) > length or len(t) > length]
    if too_long:
        raise ValueError(f"pair {too_long[0]} has more tokens than a row of {length}")
    row, zeros, ones = np.arange(n), np.zeros(n, np.int64), np.ones(n, np.int64)
    inputs, input_piece_ids, input_positions = _fill(sources, row, zeros, ones, (n, length))
    targets_, target_piece_ids, target_positions = _fill(targets, row, zeros, ones, (n, length))
    return PackedPairs(inputs, targets_, input_piece_ids, target_piece_ids, input_positions,
                       target_positions)


def pack_pairs(sources: Sequence[np.ndarray], targets: Sequence[np.ndarray], length: int) -> PackedPairs:
    """Greedy parallel packing in the given order: a pair joins the current row when both sides fit."""
    n = len(sources)
    row, piece_id = np.zeros(n, np.int64), np.zeros(n, np.int64)
    source_offset, target_offset = np.zeros(n, np.int64), np.zeros(n, np.int64)
    rows, used_source, used_target, pieces = 0, length, length, 0
    for i, (source, target) in enumerate(zip(sources, targets)):
        if len(source) > length or len(target) > length:
            raise ValueError(f"pair {i} has {len(source)} + {len(target)} tokens, more than a row of {length}")
        if used_source + len(source) > length or used_target + len(target) > length:
            rows, used_source, used_target, pieces = rows + 1, 0, 0, 0
        pieces += 1
        row[i], piece_id[i], source_offset[i], target_offset[i] = rows - 1, pieces, used_source, used_target
        used_source += len(source)
        used_target += len(target)
    shape = (rows, length)
    inputs, input_piece_ids, input_positions = _fill(sources, row, source_offset, piece_id, shape)
    targets_, target_piece_ids, target_positions = _fill(targets, row, target_offset, piece_id, shape)
    return PackedPairs(inputs, targets_, input_piece_ids, target_piece_ids, input_positions,
                       target_positions)


# -------------------------------------------------------------------------------------------------- batches
class TranslationTrainIterator(ShuffledBatches):
    """Endless training batches: this host's slice of every global batch, a dict of the six `PackedPairs`
    fields, each [batch_size / hosts, max_length] int32. Batch k is a pure function of (seed, k)
    (see jaxpos/data/order.py)."""

    def __init__(self, packed: PackedPairs, batch_size: int, *, seed: int = 0, process_index: int | None = None,
                 process_count: int | None = None):
        if len(packed) < batch_size:
            raise ValueError(f"the training pairs pack into {len(packed)} rows of {packed.length} tokens, fewer "
                             f"than one global batch of {batch_size}: add data, or lower the batch size")
        super().__init__(len(packed), batch_size, seed=seed, order_stream=TRANSLATION_ROW_ORDER,
                         fingerprint=zlib.crc32(packed.targets.tobytes(), zlib.crc32(packed.inputs.tobytes())),
                         process_index=process_index, process_count=process_count)
        self.packed = packed

    def batch_at(self, step: int) -> dict[str, np.ndarray]:
        """This host's slice of global batch `step`."""
        return self.packed.rows(self.host_indices(step))


@dataclasses.dataclass
class EvalSet:
    """Held-out pairs for loss and decoding, one per row (not packed)."""

    inputs: np.ndarray  # [N, S] int32 source ids ending in EOS, 0-padded (S = eval_max_length)
    targets: np.ndarray  # [N, S] int32 target ids ending in EOS, 0-padded
    sources: list[str]  # source sentences
    references: list[str]  # target sentences as read: the BLEU references
    ids: list[str]  # where each pair comes from

    def __len__(self) -> int:
        return len(self.sources)


def make_eval_set(text: ParallelText, tokenizer: Tokenizer, max_length: int, stats: TranslationStats) -> EvalSet:
    """Tokenizes every pair of `text` (sides longer than `max_length` cut, EOS kept) into [N, max_length]."""
    sources, targets = encode_pairs(text, tokenizer, max_length, stats, truncate=True)
    inputs, target_ids = (np.zeros((len(text), max_length), np.int32) for _ in range(2))
    for i, (source, target) in enumerate(zip(sources, targets)):
        inputs[i, :len(source)], target_ids[i, :len(target)] = source, target
    return EvalSet(inputs, target_ids, list(text.sources), list(text.targets), list(text.ids))


def eval_batches(eval_set: EvalSet, batch_size: int, max_batches: int = 0, process_index: int | None = None,
                 process_count: int | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Held-out batches in order: inputs, targets [b, S] int32 and index [b] int32, the row of `eval_set` (-1 for
    the filler rows, copies of row 0, that give the last batch its full shape); b = batch_size / hosts.
    ceil(N / batch_size) batches, or `max_batches` if smaller (0 = all)."""
    for rows, real in padded_batches(len(eval_set), batch_size, max_batches, process_index, process_count):
        yield dict(inputs=eval_set.inputs[rows], targets=eval_set.targets[rows],
                   index=np.where(real, rows, -1).astype(np.int32))


def detokenize(tokenizer: Tokenizer, ids: Sequence[int], eos_id: int = EOS_ID) -> str:
    """Text of decoded ids [L]: everything before the first EOS, padding dropped."""
    ids = [int(i) for i in ids]
    if eos_id in ids:
        ids = ids[:ids.index(eos_id)]
    return tokenizer.decode([i for i in ids if i != PAD_ID])


# ------------------------------------------------------------------------------------------------- assembly
@dataclasses.dataclass
class TranslationData:
    """Everything `build_translation_data` made."""

    tokenizer: Tokenizer
    train: TranslationTrainIterator
    dev: EvalSet
    test: EvalSet
    stats: dict[str, TranslationStats]
    tokenizer_trained: bool  # False when a cached or configured model was loaded

    def summary(self) -> str:
        return "\n".join([f"{split}: {self.stats[split]}" for split in SPLITS] + [f"tokenizer: {self.tokenizer}"])


def build_translation_data(config: TranslationDataConfig, batch_size: int, workdir: str, *,
                           process_index: int | None = None, process_count: int | None = None) -> TranslationData:
    """Reads the configured pairs, trains (or loads) the shared tokenizer on both sides of the training pairs,
    packs the training rows and tokenizes dev/test; `batch_size` is global. The block's ranges were checked when it
    was built (`TranslationDataConfig`)."""
    stats = {split: TranslationStats() for split in SPLITS}
    splits = load_parallel(config, stats)
    train = splits["train"]
    sentences = (sentence for pair in zip(train.sources, train.targets) for sentence in pair)
    tokenizer, trained = load_or_train_tokenizer(
        workdir, sentences, config.vocab_size, model_path=config.tokenizer_path or None,
        name=RUN_TOKENIZER_NAMES["translation"], special_tokens=TRANSLATION_SPECIAL_TOKENS,
        model_type=tokenizer_algorithm(config.tokenizer, config.tokenizer_model_type),
        max_sentences=config.tokenizer_max_sentences, seed=config.seed, library=config.tokenizer)
    sources, targets = encode_pairs(train, tokenizer, config.max_length, stats["train"])
    if not sources:
        raise ValueError(f"every training pair has a side longer than data.max_length={config.max_length} tokens")
    order = np.random.default_rng([config.seed, TRANSLATION_PACKING]).permutation(len(sources))
    layout = pack_pairs if config.pack else one_pair_per_row
    packed = layout([sources[i] for i in order], [targets[i] for i in order], config.max_length)
    stats["train"].packed_rows = len(packed)
    iterator = TranslationTrainIterator(packed, batch_size, seed=config.seed, process_index=process_index,
                                        process_count=process_count)
    dev, test = (make_eval_set(splits[split], tokenizer, config.eval_max_length, stats[split])
                 for split in ("dev", "test"))
    return TranslationData(tokenizer, iterator, dev, test, stats, trained)
