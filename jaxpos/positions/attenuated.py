"""Attenuated encoding (Chen et al. eq. 8): delta[i, :] = softmax_j(alpha_ij), added to the logits.

alpha_ij = -s*w*(j-i)^2 for i <= j (keys at or after the query) and -w*(j-i)^2 for i > j; w sets locality,
s symmetry. Forms: `fixed` (no parameters, any length), `matrix` (a learnable n x n matrix per head as counted
in Chen et al. A.2, initialised from the fixed form), `offset` (a learnable table over offsets j - i, as the
authors' code indexes a table by |j - i|, initialised from an interior row of the fixed form).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxpos.attention.bias import PositionalBias, offsets, relative_offsets
from jaxpos.positions.base import (PositionMechanism, check_length, param, sharing_axes, sharing_shape,
                                   span_of)


def attenuated_alpha(offset: jax.Array, w: float, s: float) -> jax.Array:
    """alpha for offsets j - i (any shape): -s*w*k^2 for k >= 0, -w*k^2 for k < 0."""
    k = offset.astype(jnp.float32)
    return jnp.where(k >= 0, -s * w * k**2, -w * k**2)


def attenuated_delta(q_pos: jax.Array, k_pos: jax.Array, w: float, s: float) -> jax.Array:
    """The fixed encoding for the given positions, normalised over the keys. -> [T, S]."""
    return jax.nn.softmax(attenuated_alpha(relative_offsets(q_pos, k_pos), w, s), axis=-1)


class AttenuatedPosition(PositionMechanism):

    def setup(self):
        acfg, n = self.pcfg.attenuated, self.cfg.max_length
        if acfg.form == "fixed":
            return
        layers, heads = sharing_shape(acfg.sharing, self.num_layers, self.cfg.num_heads)
        lead = sharing_axes(layers, heads)
        if acfg.form == "matrix":
            def init(key, shape, dtype=jnp.float32):
                full = attenuated_delta(jnp.arange(n), jnp.arange(n), acfg.w, acfg.s)
                return jnp.broadcast_to(full, shape).astype(dtype)

            self.matrix = param(self, "matrix", init, (layers, heads, n, n), lead + ("abspos", "abspos_k"))
        else:
            def init(key, shape, dtype=jnp.float32):
                row = jax.nn.softmax(attenuated_alpha(offsets(n), acfg.w, acfg.s))
                return jnp.broadcast_to(row, shape).astype(dtype)

            self.table = param(self, "table", init, (layers, heads, 2 * n - 1), lead + ("relpos",))

    def __call__(self, q_pos, k_pos):
        acfg = self.pcfg.attenuated
        if acfg.form == "fixed":
            return PositionalBias(dense=attenuated_delta(q_pos, k_pos, acfg.w, acfg.s)[None, None])
        check_length(f"attenuated ({acfg.form})", span_of(q_pos, k_pos), self.cfg.max_length)
        if acfg.form == "matrix":
            rows = jnp.take(self.matrix, q_pos, axis=2)
            return PositionalBias(dense=jnp.take(rows, k_pos, axis=3))
        n = self.cfg.max_length
        span = span_of(q_pos, k_pos)
        return PositionalBias(table=self.table[..., n - span: n + span - 1])
