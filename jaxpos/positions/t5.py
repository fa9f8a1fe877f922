"""T5 relative attention bias (Raffel et al.): bucketed offsets, one table per head shared by a stack."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxpos.attention.bias import PositionalBias, offsets
from jaxpos.config.model import t5_exact_buckets
from jaxpos.initializers import normal_init
from jaxpos.positions.base import PositionMechanism, param


def t5_bucket(relative_position: jax.Array, *, bidirectional: bool, num_buckets: int = 32,
              max_distance: int = 128) -> jax.Array:
    """Bucket of each offset j - i (key minus query), same shape: exact below num_buckets/4 (bidirectional) or
    num_buckets/2 (causal), log-spaced up to max_distance, which must exceed that count (T5Config.check).

    Bidirectional: keys before the query use buckets [0, num_buckets/2), keys after it the upper half.
    Causal: keys after the query all map to bucket 0.
    """
    n = -relative_position.astype(jnp.int32)
    bucket = jnp.zeros_like(n)
    max_exact = t5_exact_buckets(num_buckets, bidirectional)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (n < 0).astype(jnp.int32) * num_buckets
        n = jnp.abs(n)
    else:
        n = jnp.maximum(n, 0)
    is_small = n < max_exact
    safe_n = jnp.maximum(n, 1).astype(jnp.float32)  # log(0) never reaches the cast
    large = max_exact + (jnp.log(safe_n / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).astype(jnp.int32)
    large = jnp.minimum(large, num_buckets - 1)
    return bucket + jnp.where(is_small, n, large)


class T5Position(PositionMechanism):
    """A learned score per bucket and head, embedding [num_buckets, H], shared by all layers of the stack.

    Returns a Toeplitz table [1, H, 2*span - 1]. Inductive (offsets beyond max_distance share the last bucket);
    bidirectional unless the stack is causal.
    """

    def setup(self):
        tcfg = self.pcfg.t5
        self.embedding = param(self, "embedding", normal_init(self.cfg.init_std),
                               (tcfg.num_buckets, self.cfg.num_heads), ("relpos", "heads"))

    def __call__(self, q_pos, k_pos):
        tcfg = self.pcfg.t5
        buckets = t5_bucket(offsets(self.span(q_pos, k_pos)), bidirectional=not self.causal,
                            num_buckets=tcfg.num_buckets, max_distance=tcfg.max_distance)
        table = jnp.take(self.embedding, buckets, axis=0).T  # [H, W]
        return PositionalBias(table=table[None])
