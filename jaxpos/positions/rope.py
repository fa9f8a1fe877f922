"""RoPE (Su et al.): queries and keys rotated by position-dependent angles, q.k then depends on j - i."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxpos.attention.bias import PositionalBias
from jaxpos.positions.base import PositionMechanism


def rotary_tables(positions: jax.Array, head_dim: int, base: float) -> tuple[jax.Array, jax.Array]:
    """cos, sin of the rotation angles. positions [T] -> two [T, D/2]; head_dim even (ModelConfig checks it)."""
    inv_freq = 1.0 / base ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
    angles = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]
    return jnp.cos(angles), jnp.sin(angles)


class RopePosition(PositionMechanism):
    """Fixed rotations; inductive. The tables for the query and key positions are computed once per pass."""

    def __call__(self, q_pos, k_pos):
        base, head_dim = self.pcfg.rope.base, self.cfg.head_dim
        cos_q, sin_q = rotary_tables(q_pos, head_dim, base)
        cos_k, sin_k = rotary_tables(k_pos, head_dim, base)
        return PositionalBias(rotary=(cos_q[None], sin_q[None]), rotary_keys=(cos_k[None], sin_k[None]))
