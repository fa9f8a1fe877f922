"""Streaming masked-LM data for corpora that do not fit in memory (`data.streaming=True`): shards read one at a
time, sentences packed on the fly, BERT masking as in memory, and a position that checkpoints save.

Shards are the files of `data.paths` (source=text) or the array_record files of a TFDS split (source=tfds, each a
range of the split's records). Process p of P reads shards p, p + P, p + 2P, ... and nothing else, and packs,
masks and batches them itself: every step it contributes batch_size / P rows to the global batch.

Order, a pure function of (seed, p, epoch), one epoch being one pass over this process's shards (the streams
are named in jaxpos/config/rng.py):

    shards   in the order default_rng([seed, MLM_SHARD_ORDER, epoch, p]).permutation (listed order with
             data.shuffle=False)
    rows     packed from the shards' training documents in that order (`RowPacker`; held-out ones skipped)
    windows  consecutive runs of W = data.shuffle_window rows; window w is permuted by
             default_rng([seed, MLM_ROW_ORDER, epoch, w, p]), except window 0 of process 0:
             default_rng([seed, MLM_ROW_ORDER, epoch]), the in-memory permutation (none with data.shuffle=False)
    batches  consecutive batch_size / P rows of the permuted windows; the rows left at an epoch's end are dropped
    masks    row r of an epoch (r counted before the permutation) is masked by `mask_batch` with key
             (seed, MLM_TRAIN_MASKS, epoch) and id r·P + p

So one process reading one shard whose rows fit in one window gets exactly the in-memory batches
(jaxpos/data/pipeline.py), shuffled or not. Held-out documents are every (1/eval_fraction)-th document of each
shard (`is_eval_document` of its index in the shard), or the TFDS split `data.tfds_eval_split`.

The state (`get_state`, JSON) holds, for every process, the epoch, the window, where the window starts (shard,
document, the packer's open row, rows already taken from that document) and how many of its rows were used;
`set_state` re-reads that one window and continues with the same batches. It is gathered from all processes,
so the one checkpoint file resumes each of them; resuming needs the same shards and process count.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import zlib
from typing import Callable, Iterator, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxpos.config.rng import MLM_ROW_ORDER, MLM_SHARD_ORDER, MLM_TRAIN_MASKS
from jaxpos.data.corpus import (DataStats, check_doc_separator, expand_globs, file_documents, is_eval_document,
                                tfds_documents)
from jaxpos.data.mlm import (PackedExamples, RowPacker, encode_documents, masked_rows, rows_to_examples,
                             split_sentences)
from jaxpos.data.order import host_slice

_ENCODE_CHUNK = 256  # documents tokenized per SentencePiece call


@dataclasses.dataclass(frozen=True)
class Shard:
    """A unit of reading: a text file (`path`), or records [start, stop) of the TFDS split `path`."""

    path: str
    start: int = 0
    stop: int | None = None

    def __str__(self) -> str:
        return self.path if self.stop is None else f"{self.path}[{self.start}:{self.stop}]"


def tfds_shards(name: str, split: str, data_dir: str | None) -> list[Shard]:
    """One shard per array_record file of a prepared TFDS split (slices such as "train[:90%]" work): the range
    of the split's record indices that the file holds."""
    import tensorflow_datasets as tfds  # lazy: TFDS costs ~0.5 s at import; only data.source=tfds needs it

    info = tfds.builder(name, data_dir=data_dir or None).info.splits[split]
    bounds = np.cumsum([0] + [instruction.take for instruction in info.file_instructions])
    return [Shard(split, int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def list_shards(config) -> list[Shard]:
    """The shards of `config` (a `default_data_config()` block) in their listed order."""
    if config.max_documents:
        raise ValueError("data.max_documents limits the in-memory path; with data.streaming=True choose the shards "
                         "instead (data.paths, or TFDS slicing such as data.tfds_split='train[:10%]')")
    if config.source == "text":
        check_doc_separator(config.doc_separator)
        return [Shard(path) for path in expand_globs(config.paths)]
    if config.source == "tfds":
        return tfds_shards(config.tfds_name, config.tfds_split, config.data_dir)
    fits = " (that corpus fits in memory: set data.streaming=False)" if config.source in ("embedded", "bible") else ""
    raise ValueError(f"data.streaming=True reads data.source='text' or 'tfds', not {config.source!r}{fits}")


def host_process(process_index: int | None, process_count: int | None) -> tuple[int, int]:
    """(this process's index, process count): the given values, or JAX's."""
    return (jax.process_index() if process_index is None else process_index,
            jax.process_count() if process_count is None else process_count)


def process_shards(shards: Sequence[Shard], process_index: int, process_count: int) -> list[Shard]:
    """This process's shards: shard i goes to process i mod P. Raises ValueError when there are fewer shards than
    processes (every process reads whole shards)."""
    if not shards:
        raise ValueError("data.streaming=True: the shard list is empty (no file in data.paths or the TFDS split)")
    if len(shards) < process_count:
        raise ValueError(f"data.streaming=True: {len(shards)} shard(s) for {process_count} processes; each process "
                         f"reads whole shards, so give at least {process_count} (split the files into more), or "
                         "set data.streaming=False")
    return list(shards[process_index::process_count])


def shard_documents(config, shard: Shard, stats: DataStats, first: int = 0) -> Iterator[tuple[int, str]]:
    """(index in the shard, document) from document `first` on, empty documents included."""
    if config.source == "text":
        documents = file_documents(shard.path, config.doc_separator, stats)
        yield from zip(itertools.count(first), documents[first:])
    else:
        yield from zip(itertools.count(first), tfds_documents(
            config.tfds_name, shard.path, config.data_dir, config.text_field, start=shard.start + first,
            stop=shard.stop))


class ShardReader:
    """Encoded documents of shards: `read(shard, first)` yields (index in the shard, sentences as token id lists)
    from document `first` on, for the documents of `which` split: "train", "held_out" (`is_eval_document` of the
    index) or "all" (a split of its own, such as data.tfds_eval_split); empty documents are skipped."""

    def __init__(self, config, tokenizer, stats: DataStats, which: str = "train"):
        self.config, self.tokenizer, self.stats, self.which = config, tokenizer, stats, which

    def keeps(self, index: int) -> bool:
        """Whether document `index` of a shard belongs to this reader's split."""
        config = self.config
        if self.which == "all":
            return True
        held = not (config.source == "tfds" and config.tfds_eval_split) and is_eval_document(
            index, config.eval_fraction)
        return held == (self.which == "held_out")

    def read(self, shard: Shard, first: int = 0) -> Iterator[tuple[int, list[list[int]]]]:
        documents = ((i, d) for i, d in shard_documents(self.config, shard, self.stats, first) if self.keeps(i))
        while chunk := list(itertools.islice(documents, _ENCODE_CHUNK)):
            kept = [(i, d) for i, d in chunk if d.strip()]
            self.stats.skipped_empty += len(chunk) - len(kept)
            self.stats.documents += len(kept)
            encoded = encode_documents([d for _, d in kept], self.tokenizer, self.stats,
                                       self.config.newline_ends_sentence)
            yield from ((i, sentences) for (i, _), sentences in zip(kept, encoded) if sentences)

    def sentences(self, shards: Sequence[Shard], max_sentences: int) -> Iterator[str]:
        """This split's sentences for training a tokenizer, bounded without reading everything: from each shard in
        the listed order, its first ceil(max_sentences / shards) sentences."""
        quota = -(-max_sentences // len(shards))
        for shard in shards:
            texts = (d for i, d in shard_documents(self.config, shard, DataStats()) if self.keeps(i))
            found = (s for d in texts for s in split_sentences(d, self.config.newline_ends_sentence))
            yield from itertools.islice(found, quota)


START = dict(shard=0, document=0, packer=None, taken=0)  # the first row of a pass


def stream_rows(shards: Sequence[Shard], read: Callable, seq_len: int, stats: DataStats,
                position: dict = START) -> Iterator[tuple[dict, tuple[list[int], list[int]]]]:
    """(position, row) for every row of one pass over `shards`, from `position` on. A row's position (shard,
    document, the packer's state before that document, rows of it to skip) restarts the pass at that row.
    `read(shard, first)` yields (document index, sentences) as `ShardReader.read`."""
    packer = RowPacker(seq_len, stats)
    if position["packer"]:
        packer.set_state(position["packer"])
    at = (position["shard"], position["document"])
    for s in range(position["shard"], len(shards)):
        for d, sentences in read(shards[s], position["document"] if s == position["shard"] else 0):
            before = packer.get_state()
            rows = packer.add_document(sentences)
            for k in range(position["taken"] if (s, d) == at else 0, len(rows)):
                yield dict(shard=s, document=d, packer=before, taken=k), rows[k]
    before = packer.get_state()
    for k, row in enumerate(packer.finish()):
        if (len(shards), 0) != at or k >= position["taken"]:
            yield dict(shard=len(shards), document=0, packer=before, taken=k), row


class StreamingMLMIterator:
    """Endless training batches streamed from this process's shards: dicts of numpy arrays input_ids, targets,
    piece_ids, positions, token_types int32 and mask_weights float32, all [batch_size / processes, T]
    (module docstring: order, masking, state)."""

    def __init__(self, shards: Sequence[Shard], reader: ShardReader, seq_len: int, batch_size: int, *,
                 vocab_size: int, seed: int = 0, mask_prob: float = 0.15, shuffle: bool = True,
                 window: int = 16384, fingerprint: int = 0, process_index: int | None = None,
                 process_count: int | None = None):
        if seed < 0:
            raise ValueError(f"data.seed={seed}; the RNG streams need a non-negative seed")
        if window < 1:
            raise ValueError(f"data.shuffle_window={window}; it must be at least 1 row")
        self.process_index, self.process_count = host_process(process_index, process_count)
        _, self.local_rows = host_slice(batch_size, self.process_index, self.process_count)
        self.shards = process_shards(shards, self.process_index, self.process_count)
        self.reader, self.seq_len, self.batch_size, self.vocab_size = reader, seq_len, batch_size, vocab_size
        self.seed, self.mask_prob, self.shuffle, self.window_size = seed, mask_prob, shuffle, window
        self.fingerprint = zlib.crc32(json.dumps([str(s) for s in shards]).encode(), fingerprint)  # all processes
        self.stats = reader.stats
        self.step, self.epoch, self.window, self.window_start, self.used = 0, 0, 0, START, 0
        self._rows: Iterator | None = None  # the pass being read; None: (re)open at window_start when needed
        self._tokens = self._piece_ids = np.zeros((0, seq_len), np.int32)  # the current window's rows [n, T]
        self._ids = np.zeros(0, np.int64)  # their row numbers in the pass [n]

    def shard_order(self, epoch: int) -> list[Shard]:
        """This process's shards in the order of `epoch`."""
        if not self.shuffle:
            return self.shards
        order = np.random.default_rng([self.seed, MLM_SHARD_ORDER, epoch, self.process_index])
        return [self.shards[i] for i in order.permutation(len(self.shards))]

    def window_order(self, epoch: int, window: int, rows: int) -> np.ndarray:
        """The permutation [rows] of window `window` of `epoch`."""
        if not self.shuffle:
            return np.arange(rows)
        # Window 0 of process 0 draws as the in-memory permutation, so the two paths agree where both apply.
        words = [] if (window, self.process_index) == (0, 0) else [window, self.process_index]
        return np.random.default_rng([self.seed, MLM_ROW_ORDER, epoch, *words]).permutation(rows)

    def _load_window(self) -> None:
        """Reads window `self.window` (W rows, fewer at the end of the pass) and permutes it."""
        rows = []
        for position, row in self._rows:
            if not rows:
                self.window_start = position
            rows.append(row)
            if len(rows) == self.window_size:
                break
        order = self.window_order(self.epoch, self.window, len(rows))
        shape = (len(rows), self.seq_len)  # numpy rows: a window of Python lists would take ~10x the memory
        self._tokens = np.asarray([r[0] for r in rows], np.int32).reshape(shape)[order]
        self._piece_ids = np.asarray([r[1] for r in rows], np.int32).reshape(shape)[order]
        self._ids = (self.window * self.window_size + order).astype(np.int64)

    def _open(self) -> None:
        """Reopens the pass of `self.epoch` at `self.window_start` and reloads the current window."""
        self._rows = stream_rows(self.shard_order(self.epoch), self.reader.read, self.seq_len, self.stats,
                                 self.window_start)
        self._load_window()

    def _next_window(self) -> bool:
        """Moves to the next window of the pass; False at the pass's end."""
        if len(self._ids) < self.window_size:  # a short window is the last of its pass
            return False
        self.window, self.used = self.window + 1, 0
        self._load_window()
        return len(self._ids) > 0

    def _next_epoch(self) -> None:
        rows = self.window * self.window_size + len(self._ids)
        if rows < self.local_rows:
            raise ValueError(f"process {self.process_index}'s {len(self.shards)} shard(s) pack into {rows} rows of "
                             f"{self.seq_len} tokens, fewer than its share of one global batch ({self.local_rows} "
                             f"of {self.batch_size}): add data, or lower the batch size or data.seq_len")
        self.epoch, self.window, self.window_start, self.used = self.epoch + 1, 0, START, 0
        self._open()

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self._rows is None:
            self._open()
        parts, rows = [], 0  # (tokens, piece_ids, ids) slices of windows: a batch may span two or more
        while rows < self.local_rows:
            if self.used == len(self._ids) and not self._next_window():
                self._next_epoch()
                parts, rows = [], 0  # the rows an epoch leaves over are dropped
                continue
            take = min(self.local_rows - rows, len(self._ids) - self.used)
            parts.append((self._tokens[self.used:self.used + take], self._piece_ids[self.used:self.used + take],
                          self._ids[self.used:self.used + take]))
            self.used, rows = self.used + take, rows + take
        self.step += 1
        tokens, piece_ids, ids = (np.concatenate(arrays) for arrays in zip(*parts))
        return masked_rows(tokens, piece_ids, ids * self.process_count + self.process_index,
                           (self.seed, MLM_TRAIN_MASKS, self.epoch), self.vocab_size, self.mask_prob)

    _CHECKED = ("seed", "batch_size", "process_count", "shuffle", "window_size", "seq_len", "fingerprint")

    def get_state(self) -> dict:
        """The position (JSON-ready) of every process, keyed by process index, and what it was computed for.
        With several processes this is a collective (each process's position is gathered), so that whichever
        process writes the checkpoint saves them all: call it on every process at the same step."""
        position = dict(epoch=self.epoch, window=self.window, window_start=self.window_start, used=self.used)
        return dict(step=self.step, processes=self._gather(position)) | {k: getattr(self, k) for k in self._CHECKED}

    def _gather(self, position: dict) -> dict[str, dict]:
        """{process index: position} of all processes (this one only without jax.distributed)."""
        if jax.process_count() == 1:
            return {str(self.process_index): position}

        mine = np.frombuffer(json.dumps([self.process_index, position]).encode(), np.uint8)
        lengths = np.asarray(multihost_utils.process_allgather(np.array([len(mine)], np.int32))).reshape(-1)
        padded = np.zeros(int(lengths.max()), np.uint8)
        padded[:len(mine)] = mine
        everyone = np.asarray(multihost_utils.process_allgather(padded))
        entries = (json.loads(bytes(row[:n]).decode()) for row, n in zip(everyone, lengths))
        return {str(index): entry for index, entry in entries}

    def set_state(self, state: dict) -> None:
        """Continues at this process's saved position; raises ValueError if the shards, tokenizer, settings or
        process count differ from the saved ones."""
        changed = {k: (state.get(k), getattr(self, k)) for k in self._CHECKED if state.get(k) != getattr(self, k)}
        if changed:
            raise ValueError(f"the data position was saved for other data (saved, now): {changed}; the shards, "
                             "tokenizer, data config or process count changed since the checkpoint")
        position = state.get("processes", {}).get(str(self.process_index))
        if position is None:
            raise ValueError(f"the checkpoint holds no stream position for process {self.process_index} (it has "
                             f"processes {sorted(state.get('processes', {}), key=int)})")
        self.step = int(state["step"])
        self.epoch, self.window, self.used = (int(position[k]) for k in ("epoch", "window", "used"))
        self.window_start = position["window_start"]
        self._rows = None  # reopened lazily: re-reads one window

    def describe(self) -> str:
        return (f"streaming {len(self.shards)} shard(s) on process {self.process_index} of {self.process_count}, "
                f"window {self.window_size} rows, shuffle={self.shuffle}")


def held_out_examples(config, shards: Sequence[Shard], tokenizer, stats: DataStats, seq_len: int,
                      max_rows: int = 0) -> PackedExamples:
    """The held-out rows [N, seq_len], the same on every process: the held-out documents of the shards in listed
    order (or the split data.tfds_eval_split), packed in order; reading stops after `max_rows` rows (0 = all)."""
    reader = ShardReader(config, tokenizer, stats, "held_out")
    if config.source == "tfds" and config.tfds_eval_split:
        shards, reader.which = [Shard(config.tfds_eval_split)], "all"
    rows = list(itertools.islice((row for _, row in stream_rows(shards, reader.read, seq_len, stats)),
                                 max_rows or None))
    return rows_to_examples(rows, seq_len)
