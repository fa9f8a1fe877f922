"""Absolute positions added at the input: learned (BERT) and sinusoidal (Vaswani et al.)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxpos.positions.base import PositionMechanism, check_length, param
from jaxpos.initializers import normal_init


def sinusoidal_table(positions: jax.Array, d_model: int, base: float = 10_000.0) -> jax.Array:
    """Vaswani et al.'s encoding: sin on even, cos on odd channels. positions [..., T] -> [..., T, d]."""
    inv_freq = 1.0 / base ** (np.arange(0, d_model, 2, dtype=np.float32) / d_model)
    angles = jnp.asarray(positions).astype(jnp.float32)[..., None] * inv_freq
    table = jnp.zeros(angles.shape[:-1] + (d_model,), jnp.float32)
    table = table.at[..., 0::2].set(jnp.sin(angles))
    return table.at[..., 1::2].set(jnp.cos(angles[..., : d_model // 2]))


def learned_position_table(module, cfg, name: str = "embedding") -> jax.Array:
    """A learned [n, E] table of input position embeddings (BERT's `position_embeddings`)."""
    return param(module, name, normal_init(cfg.init_std), (cfg.position_range, cfg.embed_width), ("abspos", "embed"))


def lookup_learned(kind: str, table: jax.Array, positions: jax.Array) -> jax.Array:
    """Rows of a learned table at `positions` [..., T] -> [..., T, d], with a clear error past its end."""
    check_length(kind, positions.shape[-1], table.shape[0])
    return jnp.take(table, positions, axis=0)


class AbsolutePosition(PositionMechanism):
    """Learned absolute position embeddings at the input (not inductive)."""

    def setup(self):
        self.embedding = learned_position_table(self, self.cfg)

    def embed(self, positions):
        return lookup_learned("absolute", self.embedding, positions)


class SinusoidalPosition(PositionMechanism):
    """Fixed sinusoidal embeddings at the input (inductive: any length)."""

    def embed(self, positions):
        return sinusoidal_table(positions, self.cfg.embed_width)
