"""T5 relative attention bias (Raffel et al.): bucketed offsets, one table per head shared by a stack."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from jaxpos.attention.bias import PositionalBias, ToeplitzTable, offsets
from jaxpos.config.position import MechanismOptions
from jaxpos.initializers import normal_init
from jaxpos.positions.base import PositionMechanism, param
from jaxpos.positions.registry import Mechanism, register


def t5_exact_buckets(num_buckets: int, bidirectional: bool) -> int:
    """Offsets 0..count-1 (per direction) that get a T5 bucket each: num_buckets/4 bidirectional, /2 causal."""
    return num_buckets // 4 if bidirectional else num_buckets // 2


@dataclasses.dataclass(frozen=True)
class T5Options(MechanismOptions):
    num_buckets: int = 32  # bidirectional stacks: even and >= 4 (half per direction); causal stacks: >= 2
    max_distance: int = 128  # log-spaced buckets reach it; must exceed the exact-bucket count (t5_exact_buckets)

    def check(self, model) -> None:
        """Raises a ValueError unless the bucket function is well defined for every stack the model builds."""
        stacks = [("stack", not model.causal)]  # (name, bidirectional)
        if model.num_decoder_layers:  # encoder-decoder: a bidirectional encoder and a causal decoder
            stacks = [("encoder", True), ("decoder", False)]
        for stack, bidirectional in stacks:
            self.check_stack(bidirectional, stack)

    def check_stack(self, bidirectional: bool, stack: str) -> None:
        """Raises a ValueError unless the bucket function is well defined for a stack of this direction."""
        where = f"the {'bidirectional' if bidirectional else 'causal'} {stack}"
        if self.num_buckets < (4 if bidirectional else 2) or (bidirectional and self.num_buckets % 2):
            need = "even and >= 4 (half the buckets per direction)" if bidirectional else ">= 2"
            raise ValueError(f"position.t5.num_buckets={self.num_buckets} must be {need} for {where}")
        exact = t5_exact_buckets(self.num_buckets, bidirectional)
        if self.max_distance <= exact:
            raise ValueError(
                f"position.t5.max_distance={self.max_distance} must be greater than {exact}, the number of exact "
                f"buckets (num_buckets/{4 if bidirectional else 2}) of {where}: the log-spaced buckets divide by "
                f"log(max_distance/{exact}), which is 0 (NaN) or negative (buckets of the other direction)")


def t5_bucket(relative_position: jax.Array, *, bidirectional: bool, num_buckets: int = 32,
              max_distance: int = 128) -> jax.Array:
    """Bucket of each offset j - i (key minus query), same shape: exact below num_buckets/4 (bidirectional) or
    num_buckets/2 (causal), log-spaced up to max_distance, which must exceed that count (T5Options.check).

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
        return PositionalBias.of(ToeplitzTable(table[None]))


MECHANISM = register(Mechanism(
    "t5", T5Position, "T5 buckets", "bucketed relative bias per head", inductive=True, learned=True,
    options=T5Options,
    options_text="`t5.num_buckets` (even and ≥ 4 in a bidirectional stack), `t5.max_distance` (above the exact "
                 "buckets: > num_buckets/4 bidirectional, > num_buckets/2 causal)", reference="Raffel et al., 2020"))
