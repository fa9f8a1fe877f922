"""TISA (Wennberg & Henter): per-head radial-basis Toeplitz scores, f(k) = sum_s a_s exp(-|b_s| (k - c_s)^2)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxpos.attention.bias import PositionalBias, offsets
from jaxpos.initializers import normal_init
from jaxpos.positions.absolute import learned_position_table, lookup_learned
from jaxpos.positions.base import PositionMechanism, param, sharing_axes, sharing_shape


def tisa_scores(offset: jax.Array, a: jax.Array, b: jax.Array, c: jax.Array) -> jax.Array:
    """Scoring function at integer offsets j - i. a, b, c [..., S]; offset [K] -> [..., K].

    Paper convention F[i, j] = f(j - i). (The authors' PyTorch code builds f(i - j - 1): importing its
    parameters needs offset -> -(offset + 1).)
    """
    k = offset.astype(jnp.float32)
    rbf = jnp.exp(-jnp.abs(b)[..., None] * (k - c[..., None]) ** 2)  # [..., S, K]
    return jnp.einsum("...s,...sk->...k", a, rbf)


class TisaPosition(PositionMechanism):
    """Translation-invariant self-attention scores; inductive (any length, no new parameters).

    Parameters a, b, c of shape [L', H', S] under the sharing mode: 3*S*H*L in all when nothing is shared.
    """

    def setup(self):
        tcfg = self.pcfg.tisa
        layers, heads = sharing_shape(tcfg.sharing, self.num_layers, self.cfg.num_heads)
        shape = (layers, heads, tcfg.num_kernels)
        axes = sharing_axes(layers, heads) + ("kernels",)
        # The authors' initialisation: c ~ N(0, 5^2), a ~ N(0.1, 0.01^2), b ~ N(0.1, 0.01^2).
        self.a = param(self, "a", normal_init(0.01, 0.1), shape, axes)
        self.b = param(self, "b", normal_init(0.01, 0.1), shape, axes)
        self.c = param(self, "c", normal_init(5.0), shape, axes)
        if tcfg.input_positions:  # TISA use (a): on top of a model that keeps input position embeddings
            self.embedding = learned_position_table(self, self.cfg)

    def embed(self, positions):
        if self.pcfg.tisa.input_positions:
            return lookup_learned("tisa (with input_positions)", self.embedding, positions)
        return None

    def __call__(self, q_pos, k_pos):
        return PositionalBias(table=tisa_scores(offsets(self.span(q_pos, k_pos)), self.a, self.b, self.c))
