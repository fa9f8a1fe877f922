"""PoPE, polar coordinate positional embedding (Gopalakrishnan et al., 2025, arXiv 2509.10534): RoPE's rotation with
the "what" and the "where" decoupled.

Each channel c of a head's query and key becomes a magnitude and a phase (eq. 3-4): μ = softplus(q_c), the
magnitude from the content alone, and a phase from the position alone, tθ_c for the query at t and sθ_c + δ_c for
the key at s, with D frequencies θ_c = base^(−c/D), c = 0..D−1 (twice RoPE's D/2: every channel turns) and a learned
offset δ_c per head and channel, clamped to [−2π, 0] (eq. 6). The logit is Σ_c μ_q μ_k cos((s − t)θ_c + δ_c) (eq.
5-6), a dot product of the 2D-wide real vectors (μ cos φ, μ sin φ) (eq. 7-10), scaled by 1/sqrt(D) as the content
term is. So the layer hands attention q and k of width 2D (`PolarPositions`, this module's term), v keeps D;
the XLA path computes it. δ starts at 0 (`pope.delta_init`; the paper: zero for length generalisation, uniform in
[−2π, 0] for slightly better in-distribution results). No parameters of positions otherwise: inductive.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxpos.attention.bias import PositionalBias, Term
from jaxpos.config.checks import check_number
from jaxpos.config.position import MechanismOptions
from jaxpos.positions.base import PositionMechanism, param
from jaxpos.positions.registry import Mechanism, register

DELTA_INITS = ("zero", "uniform")


@struct.dataclass
class PolarPositions(Term):
    """PoPE's term: the phase tables cos, sin [L', T, D] at the query positions and [L', S, D]
    at the keys', and each head's offsets δ [L', H, D]; q and k become the 2D-wide (softplus(x) cos φ, softplus(x)
    sin φ), the key's phase offset by δ clamped to [−2π, 0]. content_only: every phase 0."""

    kind: ClassVar[str] = "polar"
    description: ClassVar[str] = "PoPE's polar queries and keys (twice the head width)"
    stage: ClassVar[str] = "inputs"
    cos_q: jax.Array = None
    sin_q: jax.Array = None
    cos_k: jax.Array = None
    sin_k: jax.Array = None
    delta: jax.Array = None

    def on_inputs(self, q, k, v, mask, *, q_pos, k_pos, self_attention, content_only):
        mu_q, mu_k = jax.nn.softplus(q.astype(jnp.float32)), jax.nn.softplus(k.astype(jnp.float32))
        if content_only:
            zeros = jnp.zeros_like(mu_q)
            return jnp.concatenate([mu_q, zeros], -1).astype(q.dtype), \
                jnp.concatenate([mu_k, jnp.zeros_like(mu_k)], -1).astype(k.dtype), v, mask
        cos_k, sin_k = (self.cos_q, self.sin_q) if self_attention else (self.cos_k, self.sin_k)
        delta = jnp.clip(self.delta, -2 * math.pi, 0.0)  # [H, D]
        # cos(φ + δ), sin(φ + δ) of the keys: [S, 1, D] x [H, D] -> [S, H, D]
        cos_kd = cos_k[:, None, :] * jnp.cos(delta) - sin_k[:, None, :] * jnp.sin(delta)
        sin_kd = sin_k[:, None, :] * jnp.cos(delta) + cos_k[:, None, :] * jnp.sin(delta)
        q_out = jnp.concatenate([mu_q * self.cos_q[:, None, :], mu_q * self.sin_q[:, None, :]], -1)
        k_out = jnp.concatenate([mu_k * cos_kd, mu_k * sin_kd], -1)
        return q_out.astype(q.dtype), k_out.astype(k.dtype), v, mask



@dataclasses.dataclass(frozen=True)
class PopeOptions(MechanismOptions):
    base: float = 10_000.0  # θ of the frequencies θ_c = base^(−c/D)
    delta_init: str = "zero"  # the offsets δ at initialisation: zero | uniform (in [−2π, 0])

    def check(self, model) -> None:
        check_number("position.pope.base", self.base, 1.0, open_low=True)
        if self.delta_init not in DELTA_INITS:
            raise ValueError(f"position.pope.delta_init={self.delta_init!r}; choose {' or '.join(DELTA_INITS)}")


def pope_frequencies(head_dim: int, base: float) -> np.ndarray:
    """θ_c = base^(−c/D) of a head's D channels, c = 0..D−1 -> [D] float64 (eq. 4, with the paper's dropped minus)."""
    return float(base) ** (-np.arange(head_dim, dtype=np.float64) / head_dim)


class PopePosition(PositionMechanism):
    """The phase tables at the query and key positions (cos, sin [T|S, D]), computed once per pass, and each layer's
    offsets δ [L, H, D]."""

    def setup(self):
        cfg = self.cfg
        uniform = self.options.delta_init == "uniform"

        def init(key, shape, dtype=jnp.float32):
            return jax.random.uniform(key, shape, dtype, -2 * math.pi, 0.0) if uniform else jnp.zeros(shape, dtype)

        self.delta = param(self, "delta", init, (self.num_layers, cfg.num_heads, cfg.head_dim),
                           ("layers", "heads", "kv"))

    def __call__(self, q_pos, k_pos):
        theta = jnp.asarray(pope_frequencies(self.cfg.head_dim, self.options.base), jnp.float32)

        def phases(positions):
            angles = positions.astype(jnp.float32)[:, None] * theta[None, :]
            return jnp.cos(angles)[None], jnp.sin(angles)[None]  # [1, T, D]: shared by the layers

        (cos_q, sin_q), (cos_k, sin_k) = phases(q_pos), phases(k_pos)
        return PositionalBias.of(PolarPositions(cos_q, sin_q, cos_k, sin_k, self.delta), content_scale=2 ** 0.5)


MECHANISM = register(Mechanism(
    "pope", PopePosition, "PoPE", "Σ_c softplus(q_c) softplus(k_c) cos((j − i)θ_c + δ_c), D frequencies per head",
    inductive=True, learned=True, options=PopeOptions,
    options_text="`pope.base`, `pope.delta_init` (`zero`, `uniform`); XLA path", reference="Gopalakrishnan et al., 2025",
    no_position_only_term="PoPE's logits are products of the query's and the key's magnitudes, their content"))
