"""Batches of encoded examples: the resumable training iterator and the evaluation batches."""

from __future__ import annotations

import zlib
from typing import Iterator

import numpy as np

from jaxpos.config.rng import FINETUNE_ROW_ORDER
from jaxpos.data.classification.encoding import EncodedExamples
from jaxpos.data.order import ShuffledBatches, padded_batches


class ClassificationTrainIterator(ShuffledBatches):
    """Endless training batches: this host's slice of every global batch, a dict of input_ids, token_types,
    piece_ids [batch_size / hosts, T] int32 and labels [batch_size / hosts] float32. Batch k is a pure function
    of (seed, k) (jaxpos/data/order.py: each epoch leaves out the N mod batch_size examples it puts last)."""

    def __init__(self, encoded: EncodedExamples, batch_size: int, *, seed: int = 0,
                 process_index: int | None = None, process_count: int | None = None):
        if len(encoded) < batch_size:
            raise ValueError(f"{len(encoded)} training examples, fewer than one global batch of {batch_size}: "
                             "lower the batch size")
        fingerprint = zlib.crc32(encoded.labels.tobytes(), zlib.crc32(encoded.input_ids.tobytes()))
        super().__init__(len(encoded), batch_size, seed=seed, order_stream=FINETUNE_ROW_ORDER, fingerprint=fingerprint,
                         process_index=process_index, process_count=process_count)
        self.encoded = encoded

    def batch_at(self, step: int) -> dict[str, np.ndarray]:
        """This host's slice of global batch `step`."""
        return self.encoded.rows(self.host_indices(step))


def eval_batches(encoded: EncodedExamples, batch_size: int, process_index: int | None = None,
                 process_count: int | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Every example once, in order: ceil(N / batch_size) batches of the train keys plus weights [b] float32
    (1 for real rows; 0 for the copies of row 0 that fill the last batch); b = batch_size / hosts."""
    for rows, real in padded_batches(len(encoded), batch_size, 0, process_index, process_count):
        batch = encoded.rows(rows)
        batch["weights"] = real.astype(np.float32)
        yield batch
