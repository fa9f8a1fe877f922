"""Resumable data order shared by every task's training iterator.

Batch k of a run is a pure function of (seed, k): epoch e = k // batches_per_epoch takes rows
permutation(seed, stream, e)[j*B:(j+1)*B] for j = k mod batches_per_epoch (the rows the permutation puts
last, num_rows mod B of them, sit out that epoch). The iterator's state is the step plus what the order was
computed for, so a resumed run sees exactly the batches it would have seen, and resuming on other data fails.
Each host takes its contiguous slice of every global batch.
"""

from __future__ import annotations

from typing import Iterator

import jax
import numpy as np


def host_slice(batch_size: int, process_index: int | None, process_count: int | None) -> tuple[int, int]:
    """(first row, rows) of this host's share of a global batch."""
    index = jax.process_index() if process_index is None else process_index
    count = jax.process_count() if process_count is None else process_count
    if not 0 <= index < count:
        raise ValueError(f"process_index={index} is outside 0..{count - 1}")
    if batch_size % count:
        raise ValueError(f"the global batch size {batch_size} does not divide over {count} hosts; "
                         f"choose a multiple of {count}")
    return index * (batch_size // count), batch_size // count


def padded_batches(num_rows: int, batch_size: int, max_batches: int = 0, process_index: int | None = None,
                   process_count: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Held-out rows in order, in batches that all have the full shape: (rows [b], real [b] bool) per batch, this
    host's slice of global batches of `batch_size` consecutive rows (b = batch_size / hosts); the last batch is
    filled up with row 0, where `real` is False. ceil(num_rows / batch_size) batches, or `max_batches` if smaller
    (0 = all)."""
    start, rows = host_slice(batch_size, process_index, process_count)
    num_batches = -(-num_rows // batch_size)
    for b in range(min(num_batches, max_batches) if max_batches else num_batches):
        index = np.arange(b * batch_size, (b + 1) * batch_size)[start:start + rows]
        real = index < num_rows
        yield np.where(real, index, 0), real


class ShuffledBatches:
    """Endless batches of this host's rows; subclasses turn row indices into arrays in `batch_at`."""

    def __init__(self, num_rows: int, batch_size: int, *, seed: int, order_stream: int, fingerprint: int,
                 process_index: int | None = None, process_count: int | None = None):
        if seed < 0:
            raise ValueError(f"data.seed={seed}; the RNG streams need a non-negative seed")
        self.host_start, self.host_rows = host_slice(batch_size, process_index, process_count)
        self.num_rows, self.batch_size, self.seed = num_rows, batch_size, seed
        self.order_stream, self.fingerprint = order_stream, fingerprint
        self.batches_per_epoch = num_rows // batch_size
        self.step = 0
        self._order_epoch, self._order = -1, np.zeros(0, np.int64)

    def order(self, epoch: int) -> np.ndarray:
        """The row permutation of `epoch` [num_rows] (cached for the current epoch)."""
        if epoch != self._order_epoch:
            self._order = np.random.default_rng([self.seed, self.order_stream, epoch]).permutation(self.num_rows)
            self._order_epoch = epoch
        return self._order

    def global_indices(self, step: int) -> np.ndarray:
        """Row indices [batch_size] of global batch `step`."""
        epoch, j = divmod(step, self.batches_per_epoch)
        return self.order(epoch)[j * self.batch_size:(j + 1) * self.batch_size]

    def host_indices(self, step: int) -> np.ndarray:
        """This host's row indices [batch_size / hosts] of global batch `step`."""
        return self.global_indices(step)[self.host_start:self.host_start + self.host_rows]

    def batch_at(self, step: int) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = self.batch_at(self.step)
        self.step += 1
        return batch

    def get_state(self) -> dict:
        """The position (plain ints, JSON-ready): the next step, and what the order was computed for."""
        return dict(step=self.step, seed=self.seed, batch_size=self.batch_size, num_rows=self.num_rows,
                    fingerprint=self.fingerprint)

    def set_state(self, state: dict) -> None:
        """Continues at `state["step"]`; raises if the rows, seed or batch size differ from the saved ones."""
        now = self.get_state()
        changed = {k: (state.get(k), now[k]) for k in ("seed", "batch_size", "num_rows", "fingerprint")
                   if state.get(k) != now[k]}
        if changed:
            raise ValueError(f"the data position was saved for other data (saved, now): {changed}; the corpus, "
                             "tokenizer or data config changed since the checkpoint")
        self.step = int(state["step"])
