"""Absolute positions added at the input: learned (BERT) and sinusoidal (Vaswani et al.)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from jaxpos.config.position import MechanismOptions
from jaxpos.initializers import normal_init
from jaxpos.positions.base import PositionMechanism, check_length, param
from jaxpos.positions.registry import Mechanism, register

SINUSOIDAL_SCALES = ("source", "none")


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


@dataclasses.dataclass(frozen=True)
class SinusoidalOptions(MechanismOptions):
    # The scale of the token embeddings the table (amplitude 1) is added to. source: Vaswani et al.'s, token
    # embeddings multiplied by sqrt(E) and drawn at std E^-1/2 (as fairseq), so each channel of a token has unit
    # variance beside the table's 1/2; none: the tokens as every other mechanism draws them (std init_std, 0.02),
    # which the table swamps (jaxpos before this option)
    scale: str = "source"
    saved_defaults: ClassVar = {"scale": "none"}  # runs saved before the option trained with the table alone

    def check(self, model) -> None:
        if self.scale not in SINUSOIDAL_SCALES:
            raise ValueError(f"position.sinusoidal.scale={self.scale!r}; choose {' or '.join(SINUSOIDAL_SCALES)}")


def sinusoidal_token_scale(cfg) -> tuple[float, float] | None:
    """(std, multiplier) of the token embeddings beside the sinusoidal table: the source's (E^-1/2, sqrt(E)), or
    None (the model's own) with scale='none'."""
    if cfg.position.options.scale == "none":
        return None
    return cfg.embed_width ** -0.5, cfg.embed_width ** 0.5


class SinusoidalPosition(PositionMechanism):
    """Fixed sinusoidal embeddings at the input (inductive: any length)."""

    def embed(self, positions):
        return sinusoidal_table(positions, self.cfg.embed_width)


ABSOLUTE = register(Mechanism(
    "absolute", AbsolutePosition, "absolute, learned (BERT)", "learned input embeddings (BERT)", inductive=False,
    learned=True, input_only=True, reference="Devlin et al., 2019"))
SINUSOIDAL = register(Mechanism(
    "sinusoidal", SinusoidalPosition, "absolute, sinusoidal", "fixed input embeddings (Vaswani)", inductive=True,
    learned=False, input_only=True, options=SinusoidalOptions, token_scale=sinusoidal_token_scale,
    options_text="`sinusoidal.scale`: `source` (token embeddings × √E, drawn at std E^−½, as Vaswani et al.), "
                 "`none` (tokens as drawn at `model.init_std`)", reference="Vaswani et al., 2017"))
