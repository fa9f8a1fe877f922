"""KERPLE (Chi et al., 2022), its logarithmic variant: a learned per-head Toeplitz score −r₁ log(1 + r₂|j − i|)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxpos.attention.bias import PositionalBias, ToeplitzTable, offsets
from jaxpos.config.position import MechanismOptions
from jaxpos.positions.alibi import alibi_slopes
from jaxpos.positions.base import PositionMechanism, check_sharing, param, sharing_axes, sharing_shape
from jaxpos.positions.registry import Mechanism, register


@dataclasses.dataclass(frozen=True)
class KerpleOptions(MechanismOptions):
    sharing: str = "none"  # none: r1, r2 per layer and head (KERPLE); head; layer

    def check(self, model) -> None:
        check_sharing("kerple", self.sharing)


MIN_RATE = 1e-2  # r₁, r₂ are read no smaller (the authors clamp them after each update): the kernel stays CPD


def kerple_log_scores(offset: jax.Array, r1: jax.Array, r2: jax.Array) -> jax.Array:
    """−r₁ log(1 + r₂|k|) at integer offsets k = j − i. r1, r2 [...]; offset [K] -> [..., K]."""
    distance = jnp.abs(offset).astype(jnp.float32)
    r1, r2 = jnp.maximum(r1, MIN_RATE), jnp.maximum(r2, MIN_RATE)
    return -r1[..., None] * jnp.log1p(r2[..., None] * distance)


class KerplePosition(PositionMechanism):
    """Inductive (a function of the distance, no table over positions); parameters r₁, r₂ [L', H'] under the
    sharing mode. They start at r₁ = 1 and r₂ = ALiBi's head slopes, so the heads differ from the first step."""

    def setup(self):
        layers, heads = sharing_shape(self.pcfg.kerple.sharing, self.num_layers, self.cfg.num_heads)
        axes = sharing_axes(layers, heads)
        slopes = np.broadcast_to(alibi_slopes(self.cfg.num_heads)[:heads], (layers, heads))
        self.r1 = param(self, "r1", lambda key, shape, dtype: jnp.ones(shape, dtype), (layers, heads), axes)
        self.r2 = param(self, "r2", lambda key, shape, dtype: jnp.asarray(slopes, dtype), (layers, heads), axes)

    def __call__(self, q_pos, k_pos):
        return PositionalBias.of(ToeplitzTable(kerple_log_scores(offsets(self.span(q_pos, k_pos)), self.r1, self.r2)))


MECHANISM = register(Mechanism(
    "kerple", KerplePosition, "KERPLE (log)", "−r₁ log(1 + r₂|j − i|) per head", inductive=True, learned=True,
    options=KerpleOptions, options_text="`kerple.sharing`", reference="Chi et al., 2022"))
