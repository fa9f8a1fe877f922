"""FIRE (Li et al., 2024): a small MLP of the progressively interpolated distance, one output per head,
b(i, j) = f_θ(ψ(i − j) / ψ(max(L, i))) with ψ(x) = log(cx + 1) and c, L learned.

FIRE normalises the distance by the query's visible context, so the MLP's input stays in [0, 1] at any length.
In a causal stack that context is the query position i: the bias depends on i as well as on i − j, so it reaches
attention as a position-only matrix [1, H, T, S] (computed once per forward pass, never per example; the XLA path
takes it). In a bidirectional stack a query may see the whole row, so the context is the row's length T (the
longer of the query and key lengths; in packed rows a query sees only its own piece, and the row still sets T): the
input becomes sign(j − i) ψ(|j − i|) / ψ(max(L, T)) (the sign keeps the direction an encoder needs), a function of
the offset alone for a given row length, and the bias is a Toeplitz table [1, H, 2T − 1] that takes the fast path.
One MLP serves every layer of the stack (FIRE shares it).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxpos.attention.bias import DenseBias, PositionalBias, ToeplitzTable, offsets
from jaxpos.config.checks import check_count
from jaxpos.config.position import MechanismOptions
from jaxpos.initializers import normal_init
from jaxpos.positions.base import PositionMechanism, param
from jaxpos.positions.registry import Mechanism, register


@dataclasses.dataclass(frozen=True)
class FireOptions(MechanismOptions):
    hidden: int = 32  # the MLP's hidden width (FIRE: 32)
    c: float = 0.1  # initial c of psi(x) = log(c x + 1), learned (kept above 1e-3)
    threshold: float = 0.0  # initial L of psi(max(L, i)), learned; 0: model.max_length, the training length

    def check(self, model) -> None:
        check_count("position.fire.hidden", self.hidden, 1)
        if not (self.c > 0 and self.threshold >= 0):
            raise ValueError(f"position.fire.c={self.c} must be positive and position.fire.threshold="
                             f"{self.threshold} at least 0 (0: model.max_length)")

MIN_C = 1e-3  # c is read no smaller: ψ stays increasing
MIN_THRESHOLD = 1.0  # L is read no smaller: ψ(max(L, i)) > 0 at the first position


def fire_psi(x: jax.Array, c: jax.Array) -> jax.Array:
    """ψ(x) = log(cx + 1), c read no smaller than MIN_C."""
    return jnp.log1p(jnp.maximum(c, MIN_C) * x)


def fire_mlp(x: jax.Array, w1: jax.Array, b1: jax.Array, w2: jax.Array) -> jax.Array:
    """f_θ: x [...] -> [..., H], one hidden ReLU layer (w1, b1 [F]; w2 [F, H]). No output bias: a constant per
    head adds the same to every logit of a row, which softmax ignores (its gradient is always zero)."""
    hidden = jax.nn.relu(x[..., None] * w1 + b1)
    return hidden @ w2


class FirePosition(PositionMechanism):
    """Inductive (the MLP's input is bounded at any length); parameters: the MLP (2F + F·H), c and L."""

    def setup(self):
        fcfg = self.pcfg.fire
        hidden, heads = fcfg.hidden, self.cfg.num_heads
        self.w1 = param(self, "w1", normal_init(1.0), (hidden,), ("kernels",))
        self.b1 = param(self, "b1", normal_init(0.0), (hidden,), ("kernels",))
        self.w2 = param(self, "w2", normal_init(self.cfg.init_std), (hidden, heads), ("kernels", "heads"))
        self.c = param(self, "c", lambda key, shape, dtype: jnp.full(shape, fcfg.c, dtype), (), ())
        start = fcfg.threshold or self.cfg.max_length
        self.threshold = param(self, "threshold", lambda key, shape, dtype: jnp.full(shape, start, dtype), (), ())

    def __call__(self, q_pos, k_pos):
        threshold = jnp.maximum(self.threshold, MIN_THRESHOLD)
        mlp = (self.w1, self.b1, self.w2)
        if not self.causal:  # the whole row is every query's context: a Toeplitz table
            span = self.span(q_pos, k_pos)
            offset = offsets(span)
            x = jnp.sign(offset) * fire_psi(jnp.abs(offset), self.c) / fire_psi(jnp.maximum(threshold, span), self.c)
            return PositionalBias.of(ToeplitzTable(fire_mlp(x, *mlp).T[None]))
        i = q_pos[:, None].astype(jnp.float32)
        distance = jnp.maximum(i - k_pos[None, :], 0)  # keys after the query are masked anyway
        x = fire_psi(distance, self.c) / fire_psi(jnp.maximum(threshold, i), self.c)
        return PositionalBias.of(DenseBias(jnp.moveaxis(fire_mlp(x, *mlp), -1, 0)[None]))


MECHANISM = register(Mechanism(
    "fire", FirePosition, "FIRE",
    "MLP(ψ(i − j) / ψ(max(L, i))) per head, ψ(x) = log(cx + 1); an encoder's: MLP(sign(j − i) ψ(|j − i|) / "
    "ψ(max(L, T)))", inductive=True, learned=True, options=FireOptions,
    options_text="`fire.hidden`, `fire.c`, `fire.threshold` (initial L; 0: `model.max_length`)",
    reference="Li et al., 2024"))
