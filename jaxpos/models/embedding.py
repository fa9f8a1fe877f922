"""Embedding tables whose backward pass stays fast on rows that many positions hit.

Flax's `nn.Embed` casts the whole table to the compute dtype before the look-up, so its gradient is a bf16
scatter-add; on GPUs that serialises on hot rows (the token type shared by every position, [MASK], [CLS]) and
took 113 ms of a 145 ms BERT-base step on an H100 (bench/RESULTS.md). Here the look-up reads the float32 table and casts
the rows it gathered, so the backward is a float32 scatter-add (native atomics), and a table of a few rows (token
types) is read by a one-hot contraction, whose backward is a reduction rather than a scatter.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxpos.config import ModelConfig
from jaxpos.initializers import normal_init
from jaxpos.sharding import constrain

ONE_HOT_ROWS = 16  # tables up to this many rows are read by a one-hot contraction


class Embed(nn.Module):
    """A [num_embeddings, features] table (param `embedding`, the same name and layout as `nn.Embed`).

    `__call__`: ids [...] -> rows [..., features] in `dtype`; `attend`: x [..., features] -> logits
    [..., num_embeddings] (the tied output layer).
    """

    num_embeddings: int
    features: int
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    embedding_init: nn.initializers.Initializer = normal_init(0.02)
    axes: tuple[str | None, str | None] | None = None  # logical names of (rows, features); None: unnamed

    def setup(self):
        init = self.embedding_init if self.axes is None else nn.with_logical_partitioning(self.embedding_init,
                                                                                          self.axes)
        self.embedding = self.param("embedding", init, (self.num_embeddings, self.features), self.param_dtype)

    def __call__(self, ids: jax.Array) -> jax.Array:
        if not jnp.issubdtype(ids.dtype, jnp.integer):
            raise ValueError(f"embedding ids must be integers, got {ids.dtype}")
        # The features whole before the look-up (an fsdp all-gather of the table, as for any weight): else XLA
        # keeps them split and gathers the ids of the whole batch instead, then reshards [B, T, d].
        table = constrain(self.embedding, (None if self.axes is None else self.axes[0], None))
        if self.num_embeddings <= ONE_HOT_ROWS:
            one_hot = jax.nn.one_hot(ids, self.num_embeddings, dtype=table.dtype)
            rows = jnp.einsum("...v,ve->...e", one_hot, table, precision=jax.lax.Precision.HIGHEST)
        else:
            rows = jnp.take(table, ids, axis=0)
        return rows.astype(self.dtype)

    def attend(self, x: jax.Array) -> jax.Array:
        return jnp.einsum("...e,ve->...v", x, self.embedding.astype(self.dtype))


def embedding(cfg: ModelConfig, num: int, axes: tuple[str | None, str], name: str, std: float | None = None) -> Embed:
    """An `Embed` of width `cfg.embed_width` with logical axes `axes` and N(0, std or cfg.init_std) rows."""
    return Embed(num, cfg.embed_width, name=name, dtype=jnp.dtype(cfg.dtype), param_dtype=jnp.dtype(cfg.param_dtype),
                 embedding_init=normal_init(std or cfg.init_std), axes=axes)
