"""Attenuated encoding (Chen et al. eq. 8): delta[i, :] = softmax_j(alpha_ij), added to the logits.

alpha_ij = -s*w*(j-i)^2 for i <= j (keys at or after the query) and -w*(j-i)^2 for i > j; w sets locality,
s symmetry. Forms (model.position.attenuated.form):
- `fixed`: no parameters, any length; the softmax runs over the keys each query attends to (its own piece of a
  padded or packed row; in a causal stack the keys up to itself), so padding and neighbours do not change it;
- `matrix`: a learnable n x n matrix per head, as counted in Chen et al. A.2, initialised from the fixed form;
- `offset`: a learnable table over offsets j - i in [-(n-1), n-1];
- `abs_offset`: a learnable table over distances |j - i| in [0, n-1], as the authors' code (symmetric: s = 1).
Both tables start from the fixed form's centre row i = (n-1)//2: at initialisation that row equals the fixed
form's, and so does every row far from both ends, up to the tails of exp(alpha) that its keys do not reach.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxpos.attention.bias import DenseBias, PositionalBias, ToeplitzTable, offsets, relative_offsets
from jaxpos.config.checks import check_number
from jaxpos.config.position import MechanismOptions
from jaxpos.positions.base import PositionMechanism, check_length, check_sharing, param, sharing_axes, sharing_shape
from jaxpos.positions.registry import Mechanism, When, register

ATTENUATED_FORMS = ("fixed", "matrix", "offset", "abs_offset")


@dataclasses.dataclass(frozen=True)
class AttenuatedOptions(MechanismOptions):
    w: float = 0.05  # locality: larger w = more local
    s: float = 1.0  # symmetry: weight of keys after the query relative to keys before it
    # fixed | matrix (a learnable n x n matrix, Chen A.2) | offset (a learnable table over offsets j - i) |
    # abs_offset (a learnable table over |j - i|, as the authors' code; needs s = 1). Learned forms start at the
    # fixed form: the tables from its centre row.
    form: str = "fixed"
    sharing: str = "none"  # none = BERT-A* (per head); head = BERT-A*-s (shared by the heads of a layer)

    def check(self, model) -> None:
        if self.form not in ATTENUATED_FORMS:
            raise ValueError(f"position.attenuated.form={self.form!r}; choose one of {ATTENUATED_FORMS}")
        check_sharing("attenuated", self.sharing)
        # w > 0 sets locality, s >= 0 symmetry (Chen et al. eq. 8)
        check_number("position.attenuated.w", self.w, 0.0, open_low=True)
        check_number("position.attenuated.s", self.s, 0.0)
        if self.form == "abs_offset" and self.s != 1.0:
            raise ValueError(f"position.attenuated.form='abs_offset' indexes by |j - i|, so it is symmetric and "
                             f"needs s=1 (got s={self.s}); use form='offset' for s != 1")


def attenuated_alpha(offset: jax.Array, w: float, s: float) -> jax.Array:
    """alpha for offsets j - i (any shape): -s*w*k^2 for k >= 0, -w*k^2 for k < 0."""
    k = offset.astype(jnp.float32)
    return jnp.where(k >= 0, -s * w * k**2, -w * k**2)


def attenuated_delta(q_pos: jax.Array, k_pos: jax.Array, w: float, s: float) -> jax.Array:
    """The fixed encoding for the given positions, normalised over all the keys. q_pos [T], k_pos [S] -> [T, S].
    In a model, attention renormalises it over each query's own piece (`DenseBias.attending`)."""
    return jax.nn.softmax(attenuated_alpha(relative_offsets(q_pos, k_pos), w, s), axis=-1)


def attenuated_centre_row(n: int, w: float, s: float, index: jax.Array) -> jax.Array:
    """exp(alpha(k)) / Z at offsets k = `index` (any shape), Z the normaliser of the fixed form's centre row
    i = (n-1)//2 over its n keys: the table of a Toeplitz matrix whose centre row is the fixed form's."""
    centre = (n - 1) // 2
    log_z = jax.nn.logsumexp(attenuated_alpha(jnp.arange(n) - centre, w, s))
    return jnp.exp(attenuated_alpha(index, w, s) - log_z)


class AttenuatedPosition(PositionMechanism):
    """Chen et al.'s delta as a position-only logit term, in the configured form (module docstring).

    Learned forms hold [L', H', ...] parameters (sharing `none`: per head and layer, BERT-A*; `head`: one per
    layer shared by its heads, BERT-A*-s; `layer`: one per head shared by all layers) and check lengths against
    n = max_length. Returns:
    fixed -> dense [1, 1, T, S], over all S keys (attention renormalises it over the query's own piece:
    `DenseBias.attending`);
    matrix [L', H', n, n] -> dense [L', H', T, S];
    offset [L', H', 2n - 1] and abs_offset [L', H', n] -> Toeplitz table [L', H', 2*span - 1].
    """

    def setup(self):
        acfg, n = self.pcfg.attenuated, self.cfg.position_range
        if acfg.form == "fixed":
            return
        layers, heads = sharing_shape(acfg.sharing, self.num_layers, self.cfg.num_heads)
        lead = sharing_axes(layers, heads)
        if acfg.form == "matrix":
            def init(key, shape, dtype=jnp.float32):
                full = attenuated_delta(jnp.arange(n), jnp.arange(n), acfg.w, acfg.s)
                return jnp.broadcast_to(full, shape).astype(dtype)

            self.matrix = param(self, "matrix", init, (layers, heads, n, n), lead + ("abspos", "abspos_k"))
            return
        index = offsets(n) if acfg.form == "offset" else jnp.arange(n)

        def init(key, shape, dtype=jnp.float32):
            return jnp.broadcast_to(attenuated_centre_row(n, acfg.w, acfg.s, index), shape).astype(dtype)

        self.table = param(self, "table", init, (layers, heads, index.shape[0]), lead + ("relpos",))

    def __call__(self, q_pos, k_pos):
        acfg = self.pcfg.attenuated
        if acfg.form == "fixed":
            return PositionalBias.of(DenseBias(attenuated_delta(q_pos, k_pos, acfg.w, acfg.s)[None, None],
                                               normalise=True))
        span = self.span(q_pos, k_pos)
        check_length(f"attenuated ({acfg.form})", span, self.cfg.position_range)
        if acfg.form == "matrix":
            rows = jnp.take(self.matrix, q_pos, axis=2)
            return PositionalBias.of(DenseBias(jnp.take(rows, k_pos, axis=3)))
        # Columns of the Toeplitz table over offsets -(span-1)..span-1 within the learned table.
        column = offsets(span) + self.cfg.position_range - 1 if acfg.form == "offset" else jnp.abs(offsets(span))
        return PositionalBias.of(ToeplitzTable(jnp.take(self.table, column, axis=-1)))


MECHANISM = register(Mechanism(
    "attenuated", AttenuatedPosition, "attenuated, fixed", "softmax_j(−w(j−i)², ×s after the query)",
    inductive=When("fixed form", lambda o: o.form == "fixed"), learned=When("learned forms", lambda o: o.form != "fixed"),
    options=AttenuatedOptions,
    options_text="`attenuated.w`, `.s`, `.form`: `fixed`, `matrix` (n×n), `offset` (table over j−i), `abs_offset` "
                 "(table over \\|j−i\\|, the authors' code, s = 1); learned forms start from the fixed form; "
                 "`.sharing`", reference="Chen et al., 2021"))
