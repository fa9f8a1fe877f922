"""TISA (Wennberg & Henter): per-head radial-basis Toeplitz scores, f(k) = sum_s a_s exp(-|b_s| (k - c_s)^2)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxpos.attention.bias import PositionalBias, ToeplitzTable, offsets
from jaxpos.config.checks import check_count
from jaxpos.config.position import MechanismOptions
from jaxpos.initializers import normal_init
from jaxpos.positions.absolute import learned_position_table, lookup_learned
from jaxpos.positions.base import PositionMechanism, check_sharing, param, sharing_axes, sharing_shape
from jaxpos.positions.registry import Mechanism, When, register


@dataclasses.dataclass(frozen=True)
class TisaOptions(MechanismOptions):
    num_kernels: int = 5  # S radial basis functions per head
    sharing: str = "none"
    input_positions: bool = False  # TISA use (a): keep learned input position embeddings as well

    def check(self, model) -> None:
        check_count("position.tisa.num_kernels", self.num_kernels, 1)
        check_sharing("tisa", self.sharing)
        if not isinstance(self.input_positions, bool):
            raise ValueError(f"position.tisa.input_positions={self.input_positions!r} must be true or false")


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
        return PositionalBias.of(ToeplitzTable(tisa_scores(offsets(self.span(q_pos, k_pos)), self.a, self.b, self.c)))


MECHANISM = register(Mechanism(
    "tisa", TisaPosition, "TISA", "Σ_s a_s exp(−|b_s|(k − c_s)²) per head",
    inductive=When("without input_positions", lambda o: not o.input_positions), learned=True, options=TisaOptions,
    options_text="`tisa.num_kernels`, `tisa.sharing`, `tisa.input_positions`", reference="Wennberg & Henter, 2021"))
