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

import jax
import jax.numpy as jnp

from jaxpos.attention.bias import PositionalBias, offsets, relative_offsets
from jaxpos.positions.base import PositionMechanism, check_length, param, sharing_axes, sharing_shape


def attenuated_alpha(offset: jax.Array, w: float, s: float) -> jax.Array:
    """alpha for offsets j - i (any shape): -s*w*k^2 for k >= 0, -w*k^2 for k < 0."""
    k = offset.astype(jnp.float32)
    return jnp.where(k >= 0, -s * w * k**2, -w * k**2)


def attenuated_delta(q_pos: jax.Array, k_pos: jax.Array, w: float, s: float) -> jax.Array:
    """The fixed encoding for the given positions, normalised over all the keys. q_pos [T], k_pos [S] -> [T, S].
    In a model, attention renormalises it over each query's own piece (`bias.over_attended_keys`)."""
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
    fixed -> dense [1, 1, T, S], over all S keys (attention renormalises it over the query's own piece);
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
            return PositionalBias(dense=attenuated_delta(q_pos, k_pos, acfg.w, acfg.s)[None, None],
                                  normalise_dense=True)
        span = self.span(q_pos, k_pos)
        check_length(f"attenuated ({acfg.form})", span, self.cfg.position_range)
        if acfg.form == "matrix":
            rows = jnp.take(self.matrix, q_pos, axis=2)
            return PositionalBias(dense=jnp.take(rows, k_pos, axis=3))
        # Columns of the Toeplitz table over offsets -(span-1)..span-1 within the learned table.
        column = offsets(span) + self.cfg.position_range - 1 if acfg.form == "offset" else jnp.abs(offsets(span))
        return PositionalBias(table=jnp.take(self.table, column, axis=-1))
