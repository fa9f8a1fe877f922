"""The training state: one pytree (step, parameters, optimiser state, RNG), sharded by logical rules."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct


@struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array


def init_state(model: nn.Module, tx: optax.GradientTransformation, rng: jax.Array, init_args: tuple,
               init_kwargs: dict) -> TrainState:
    """Boxed (logically partitioned) state: parameters and optimiser moments keep their axis names."""
    params_rng, state_rng = jax.random.split(rng)
    params = model.init(params_rng, *init_args, **init_kwargs)["params"]
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=state_rng)
