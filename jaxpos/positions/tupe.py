"""TUPE (Ke et al.): untied positional correlation (p_i U_Q)(p_j U_K)^T / sqrt(2D) per head and layer."""

from __future__ import annotations

import jax.numpy as jnp

from jaxpos.attention.bias import PositionalBias
from jaxpos.initializers import normal_init
from jaxpos.positions.absolute import learned_position_table
from jaxpos.positions.base import PositionMechanism, check_length, param, span_of


class TupePosition(PositionMechanism):
    """Absolute embeddings p shared by all layers, never added at the input; per-layer projections U_Q, U_K.

    The term is an exact low-rank product, so it travels as factors (rank D) like DIET-Abs. Not inductive.
    """

    def setup(self):
        cfg = self.cfg
        self.embedding = learned_position_table(self, cfg)
        shape = (self.num_layers, cfg.d_model, cfg.num_heads, cfg.head_dim)
        axes = ("layers", "embed", "heads", "kv")
        self.u_q = param(self, "u_q", normal_init(cfg.init_std), shape, axes)
        self.u_k = param(self, "u_k", normal_init(cfg.init_std), shape, axes)

    def __call__(self, q_pos, k_pos):
        check_length("tupe", span_of(q_pos, k_pos), self.cfg.max_length)
        scale = (2.0 * self.cfg.head_dim) ** -0.5  # TUPE's 1/sqrt(2d), split evenly between the factors
        p_q = jnp.einsum("td,ldhr->lhtr", jnp.take(self.embedding, q_pos, axis=0), self.u_q) * scale ** 0.5
        p_k = jnp.einsum("sd,ldhr->lhsr", jnp.take(self.embedding, k_pos, axis=0), self.u_k) * scale ** 0.5
        return PositionalBias(factors=(p_q, p_k))
