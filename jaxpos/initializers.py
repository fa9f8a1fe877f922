"""Parameter initialisers shared by models and positional mechanisms."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def normal_init(std: float, mean: float = 0.0):
    """N(mean, std^2), as BERT initialises embeddings and projections (std 0.02)."""

    def init(key, shape, dtype=jnp.float32):
        return mean + std * jax.random.normal(key, shape, dtype)

    return init
