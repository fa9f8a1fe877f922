"""TUPE (Ke et al.): untied positional correlation per head and layer, from absolute positions.

alpha_ij = (x_i W_Q)(x_j W_K)^T / sqrt(2D) + (p_i U_Q)(p_j U_K)^T / sqrt(2D): the TUPE paper scales both terms
by 1/sqrt(2D) (docs/conventions.md), to keep the sum at the variance of one term; so the content term carries
`content_scale` = 1/sqrt(2) on top of the usual 1/sqrt(D). With `position.tupe.untie_cls`, the positional logits of
[CLS] (position 0 of each sequence) are reset: row 0 (from [CLS], [CLS]->[CLS] included) to theta_1, column 0 of
the other rows (to [CLS]) to theta_2, as Ke et al.'s reset_theta; one pair per head and layer, like U_Q, U_K.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxpos.attention.bias import LowRankFactors, PositionalBias
from jaxpos.config.position import MechanismOptions
from jaxpos.initializers import normal_init
from jaxpos.positions.absolute import learned_position_table
from jaxpos.positions.base import PositionMechanism, check_length, param
from jaxpos.positions.registry import Mechanism, register


@dataclasses.dataclass(frozen=True)
class TupeOptions(MechanismOptions):
    # Ke et al. reset the positional correlations of [CLS] (position 0 of each sequence) to two learned scalars
    # per head: theta_1 from [CLS] to every key, theta_2 from every other query to [CLS].
    untie_cls: bool = True

    def check(self, model) -> None:
        if not isinstance(self.untie_cls, bool):
            raise ValueError(f"position.tupe.untie_cls={self.untie_cls!r} must be true or false")
        if self.untie_cls and model.position.randomized_max_length:
            raise ValueError("tupe's untie_cls finds [CLS] at position 0, which randomized positions do not keep: set "
                             "position.tupe.untie_cls=False to randomize TUPE's positions")


class TupePosition(PositionMechanism):
    """Absolute embeddings p [n, E] shared by all layers, never added at the input; U_Q, U_K [L, E, H, D].

    Returns factors P_Q [L, H, T, D], P_K [L, H, S, D] with P_Q P_K^T = (p U_Q)(p U_K)^T / sqrt(2D) (an exact
    low-rank product, like DIET-Abs) and content_scale 1/sqrt(2). Not inductive. With untie_cls, theta_1 and
    theta_2 [L, H] enter as two more factor columns (rank D + 2, `untie_cls_factors`): no [T, S] tensor.
    """

    def setup(self):
        cfg = self.cfg
        self.embedding = learned_position_table(self, cfg)
        shape = (self.num_layers, cfg.embed_width, cfg.num_heads, cfg.head_dim)  # p is E-wide (ALBERT)
        axes = ("layers", "embed", "heads", "kv")
        self.u_q = param(self, "u_q", normal_init(cfg.init_std), shape, axes)
        self.u_k = param(self, "u_k", normal_init(cfg.init_std), shape, axes)
        if self.pcfg.tupe.untie_cls:
            self.theta = param(self, "cls_theta", normal_init(cfg.init_std), (self.num_layers, cfg.num_heads, 2),
                               ("layers", "heads", None))

    def __call__(self, q_pos, k_pos):
        check_length("tupe", self.span(q_pos, k_pos), self.cfg.position_range)
        scale = (2.0 * self.cfg.head_dim) ** -0.5  # TUPE's 1/sqrt(2D), split evenly between the factors
        p_q = jnp.einsum("td,ldhr->lhtr", jnp.take(self.embedding, q_pos, axis=0), self.u_q) * scale ** 0.5
        p_k = jnp.einsum("sd,ldhr->lhsr", jnp.take(self.embedding, k_pos, axis=0), self.u_k) * scale ** 0.5
        if self.pcfg.tupe.untie_cls:
            p_q, p_k = untie_cls_factors(p_q, p_k, q_pos, k_pos, self.theta)
        return PositionalBias.of(LowRankFactors(p_q, p_k), content_scale=2.0 ** -0.5)


def untie_cls_factors(p_q, p_k, q_pos, k_pos, theta):
    """Factors whose product is P_Q P_K^T with row 0 set to theta_1 and column 0 of rows > 0 to theta_2.

    p_q [L, H, T, r], p_k [L, H, S, r] at q_pos [T], k_pos [S]; theta [L, H, 2] -> [L, H, T, r + 2], [L, H, S, r + 2]:
    q' = [p_q (i > 0), i == 0, i > 0], k' = [p_k (j > 0), theta_1, theta_2 (j == 0)]. The columns depend on the
    position only, so reading them at per-piece positions unties each packed piece's first token.
    """
    q_cls = (q_pos == 0).astype(p_q.dtype)[:, None]  # [T, 1]
    k_cls = (k_pos == 0).astype(p_k.dtype)[:, None]
    lead_q, lead_k = p_q.shape[:2] + (p_q.shape[2], 1), p_k.shape[:2] + (p_k.shape[2], 1)
    theta_1, theta_2 = theta[..., 0, None, None], theta[..., 1, None, None]  # [L, H, 1, 1]
    p_q = jnp.concatenate([p_q * (1 - q_cls), jnp.broadcast_to(q_cls, lead_q), jnp.broadcast_to(1 - q_cls, lead_q)],
                          axis=-1)
    p_k = jnp.concatenate([p_k * (1 - k_cls), jnp.broadcast_to(theta_1, lead_k), theta_2 * k_cls], axis=-1)
    return p_q, p_k


MECHANISM = register(Mechanism(
    "tupe", TupePosition, "TUPE", "(p_i U_Q)(p_j U_K)ᵀ/√(2D), and q·k/√(2D) instead of q·k/√D (TUPE paper)",
    inductive=False, learned=True, options=TupeOptions, options_text="`tupe.untie_cls`", reference="Ke et al., 2021"))
