"""What every positional mechanism shares: the module interface, sharing shapes, length checks."""

from __future__ import annotations

from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxpos.attention.bias import PositionalBias
from jaxpos.config.model import ModelConfig
from jaxpos.config.position import SHARING_MODES
from jaxpos.positions.registry import inductive_summary


class LengthError(ValueError):
    """A sequence is longer than a non-inductive mechanism's learned table."""


def check_length(kind: str, length: int, max_length: int, hint: str = "") -> None:
    """Raises a LengthError naming the mechanism and both lengths when `length` exceeds what it supports."""
    if length > max_length:
        raise LengthError(
            f"position mechanism {kind!r} has learned parameters for {max_length} positions "
            f"(model.max_length) but got a sequence of length {length}{hint}; inductive mechanisms work at any "
            f"length: {inductive_summary()}")


def sharing_shape(sharing: str, num_layers: int, num_heads: int) -> tuple[int, int]:
    """Leading (layers, heads) sizes of a parameter under a sharing mode (config.position.SHARING_MODES).

    none: a set per head and layer; head: one set per layer, shared by that layer's heads; layer: one set per
    head, shared by all layers of the stack.
    """
    if sharing == "none":
        return num_layers, num_heads
    if sharing == "head":
        return num_layers, 1
    if sharing == "layer":
        return 1, num_heads
    raise ValueError(f"unknown sharing mode {sharing!r}; choose none, head or layer")


def check_sharing(name: str, sharing: str) -> None:
    """Raises a one-line ValueError unless `sharing` (the option `position.NAME.sharing`) is a sharing mode."""
    if sharing not in SHARING_MODES:
        raise ValueError(f"position.{name}.sharing={sharing!r}; choose one of {SHARING_MODES}")


def sharing_axes(layers: int, heads: int) -> tuple[str | None, str | None]:
    """Logical names of the two leading axes; a broadcast (size-1) axis is never sharded."""
    return ("layers" if layers > 1 else None, "heads" if heads > 1 else None)


def param(module: nn.Module, name: str, init: Callable, shape: Sequence[int],
          axes: Sequence[str | None], dtype=jnp.float32) -> jax.Array:
    """A parameter carrying logical axis names, so the sharding rules can place it on a mesh."""
    return module.param(name, nn.with_logical_partitioning(init, tuple(axes)), tuple(shape), dtype)


# The sample a pass without a random stream (evaluation, analysis) takes: the same for every pass of one length.
FIXED_POSITIONS_SEED = 0


def randomized_positions(key: jax.Array, length: int, count: int) -> jax.Array:
    """Ruoss et al.'s randomized positions: a sorted sample of `length` distinct integers drawn uniformly from
    [0, count). -> [length] int32. Raises a LengthError when the row is longer than the range."""
    if length > count:
        raise LengthError(f"randomized positions are drawn from [0, {count}) (position.randomized_max_length) but "
                          f"got a sequence of length {length}")
    return jnp.sort(jax.random.choice(key, count, (length,), replace=False)).astype(jnp.int32)


class PositionMechanism(nn.Module):
    """Base of every mechanism: owns its parameters for a whole stack of `num_layers` layers.

    `embed(positions)` returns what is added to the token embeddings at the input ([T, d] or None);
    `__call__(q_pos, k_pos)` returns the stacked compact bias for all layers (its terms, jaxpos.attention.terms),
    computed once per forward pass.
    """

    cfg: ModelConfig
    num_layers: int
    causal: bool = False
    # Least half-width of offset tables. A cached decoding step's query position is a traced value, not a shape:
    # the stack passes the cache length, so cross-attention queries past the source length stay inside the table.
    min_span: int = 0

    @property
    def pcfg(self):
        """The position block of the model config."""
        return self.cfg.position

    @property
    def options(self):
        """The mechanism's own options block (`model.position.<kind>`)."""
        return self.cfg.position.options

    def embed(self, positions: jax.Array) -> jax.Array | None:
        """Input position embeddings at `positions` [T] (or [B, T]) -> [T, d] (or [B, T, d]); None: nothing added."""
        return None

    def __call__(self, q_pos: jax.Array, k_pos: jax.Array) -> PositionalBias:
        """The logit terms for queries at q_pos [T] and keys at k_pos [S], all layers at once ("none": empty)."""
        return PositionalBias()

    def span(self, q_pos: jax.Array, k_pos: jax.Array) -> int:
        """The static half-width of the offset table needed by positions that start at 0: the longer of q_pos [T]
        and k_pos [S], and at least `min_span`."""
        return max(q_pos.shape[0], k_pos.shape[0], self.min_span)
