"""TUPE (Ke et al.): untied positional correlation per head and layer, from absolute positions.

alpha_ij = (x_i W_Q)(x_j W_K)^T / sqrt(2D) + (p_i U_Q)(p_j U_K)^T / sqrt(2D): the TUPE paper scales both terms
by 1/sqrt(2D) (REFERENCE.md), to keep the sum at the variance of one term; so the content term carries
`content_scale` = 1/sqrt(2) on top of the usual 1/sqrt(D). The [CLS] untying (theta_1, theta_2) is not built.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxpos.attention.bias import PositionalBias
from jaxpos.initializers import normal_init
from jaxpos.positions.absolute import learned_position_table
from jaxpos.positions.base import PositionMechanism, check_length, param, span_of


class TupePosition(PositionMechanism):
    """Absolute embeddings p [n, E] shared by all layers, never added at the input; U_Q, U_K [L, E, H, D].

    Returns factors P_Q [L, H, T, D], P_K [L, H, S, D] with P_Q P_K^T = (p U_Q)(p U_K)^T / sqrt(2D) (an exact
    low-rank product, like DIET-Abs) and content_scale 1/sqrt(2). Not inductive.
    """

    def setup(self):
        cfg = self.cfg
        self.embedding = learned_position_table(self, cfg)
        shape = (self.num_layers, cfg.embed_width, cfg.num_heads, cfg.head_dim)  # p is E-wide (ALBERT)
        axes = ("layers", "embed", "heads", "kv")
        self.u_q = param(self, "u_q", normal_init(cfg.init_std), shape, axes)
        self.u_k = param(self, "u_k", normal_init(cfg.init_std), shape, axes)

    def __call__(self, q_pos, k_pos):
        check_length("tupe", span_of(q_pos, k_pos), self.cfg.max_length)
        scale = (2.0 * self.cfg.head_dim) ** -0.5  # TUPE's 1/sqrt(2D), split evenly between the factors
        p_q = jnp.einsum("td,ldhr->lhtr", jnp.take(self.embedding, q_pos, axis=0), self.u_q) * scale ** 0.5
        p_k = jnp.einsum("sd,ldhr->lhsr", jnp.take(self.embedding, k_pos, axis=0), self.u_k) * scale ** 0.5
        return PositionalBias(factors=(p_q, p_k), content_scale=2.0 ** -0.5)
