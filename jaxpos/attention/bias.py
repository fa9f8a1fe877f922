"""The compact positional terms that travel from a positional mechanism to the attention function.

A mechanism computes them once per forward pass from its parameters (never per example). In packed rows only the
read becomes per example: `piece_positions` says where each token sits in its own piece, and `at_pieces` gathers
the rows of factors, dense matrices and rotary tables there (per layer, inside attention). Packed
cross-attention also hands attention per-pair query and key positions [B, T] / [B, S], from which Toeplitz
tables and Shaw vectors take their offsets (a pair's source and target start at different columns). Every
other field carries a leading layer axis of size L (one entry per layer) or 1 (shared by all layers of the
stack); `for_layer` picks a layer's slice. Fields stay compact (tables, low-rank factors) so that attention
implementations can avoid materialising [H, T, S]; `position_logits` is the reference expansion.

Toeplitz tables: a bias that depends on the offset j - i only is a table over offsets [-(span-1), span-1];
column `(j - i) + span - 1` holds the score for that offset. `expand_toeplitz` is the one expansion.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct



def offsets(span: int) -> jnp.ndarray:
    """Offsets -(span-1) .. span-1, the columns of a Toeplitz table. Shape [2*span - 1]."""
    return jnp.arange(-(span - 1), span, dtype=jnp.int32)


def relative_offsets(q_pos: jnp.ndarray, k_pos: jnp.ndarray) -> jnp.ndarray:
    """Offsets j - i of every (query, key) pair. q_pos [T], k_pos [S] -> [T, S]; per example [B, T], [B, S] ->
    [B, T, S]."""
    return k_pos[..., None, :].astype(jnp.int32) - q_pos[..., :, None].astype(jnp.int32)


def expand_toeplitz(table: jnp.ndarray, q_pos: jnp.ndarray, k_pos: jnp.ndarray) -> jnp.ndarray:
    """Expands a table over offsets into the matrix it defines.

    table [..., W] with W = 2*span - 1 odd; q_pos [T], k_pos [S] -> [..., T, S] with
    out[..., t, s] = table[..., (k_pos[s] - q_pos[t]) + span - 1]; per example q_pos [B, T], k_pos [B, S] ->
    [B, ..., T, S]. Offsets outside the table clip to its ends.
    """
    width = table.shape[-1]
    if width % 2 != 1:
        raise ValueError(f"a Toeplitz table has an odd number of offset columns, got {width}")
    center = (width - 1) // 2
    index = jnp.clip(relative_offsets(q_pos, k_pos) + center, 0, width - 1)
    out = jnp.take(table, index, axis=-1)
    return jnp.moveaxis(out, -3, 0) if index.ndim == 3 else out


def clipped_offset_index(q_pos: jax.Array, k_pos: jax.Array, clip: int) -> jax.Array:
    """Column of each (i, j) pair in a table over clipped offsets -clip..clip (Shaw). -> [T, S] (per example
    [B, T, S]) int32."""
    return jnp.clip(relative_offsets(q_pos, k_pos), -clip, clip) + clip


def disentangled_logits(q_BTHD: jax.Array, k_BSHD: jax.Array, rel_q_RHD: jax.Array, rel_k_RHD: jax.Array,
                        rows: jax.Array) -> jax.Array:
    """DeBERTa's c2p + p2c terms, unscaled, as transformers computes them: q_i . K_r[c_ij] + k_j . Q_r[c_ij], both at
    the row c_ij of the pair (i, j). q [B, T, H, D], k [B, S, H, D], Q_r, K_r [R, H, D], rows [T, S] (per example
    [B, T, S]) int -> [B, H, T, S] float32; per query and key a product with all R rows, then a gather."""
    c2p = jnp.einsum("bthd,rhd->bhtr", q_BTHD, rel_k_RHD.astype(q_BTHD.dtype), preferred_element_type=jnp.float32)
    p2c = jnp.einsum("bshd,rhd->bhsr", k_BSHD, rel_q_RHD.astype(k_BSHD.dtype), preferred_element_type=jnp.float32)
    rows_TS = rows[:, None] if rows.ndim == 3 else rows  # per example: under the head axis
    rows_ST = jnp.swapaxes(rows_TS, -1, -2)
    c2p = jnp.take_along_axis(c2p, jnp.broadcast_to(rows_TS, c2p.shape[:3] + rows_TS.shape[-1:]), axis=-1)
    p2c = jnp.take_along_axis(p2c, jnp.broadcast_to(rows_ST, p2c.shape[:3] + rows_ST.shape[-1:]), axis=-1)
    return c2p + jnp.swapaxes(p2c, -1, -2)  # p2c[b, h, j, i] = k_j . Q_r[c_ij]


def segment_logits(table_HGG: jax.Array, q_types_BT: jax.Array, k_types_BS: jax.Array) -> jax.Array:
    """Per-example segment bias: out[b, h, i, j] = table[h, q_types[b, i], k_types[b, j]]. -> [B, H, T, S]."""
    rows = jnp.moveaxis(jnp.take(table_HGG, q_types_BT, axis=1), 0, 1)  # [B, H, T, G]
    index = jnp.broadcast_to(k_types_BS[:, None, None, :], rows.shape[:3] + (k_types_BS.shape[-1],))
    return jnp.take_along_axis(rows, index, axis=-1)


def segment_pair_factors(table_HGG: jax.Array, q_types_BT: jax.Array, k_types_BS: jax.Array):
    """A per-head segment table as a rank G - 1 term for kernels: (u [B, T, H, G-1], w [B, S, G-1]) with
    u[b, i, h] . w[b, j] = table[h, g_i, g_j] - table[h, g_i, 0].

    The subtracted part is constant along each query's row, so softmax and every gradient are unchanged (rows of
    dS sum to zero, so table[:, :, 0] gets its gradient through the subtraction); w is one-hot in the key's type.
    """
    rows = jnp.take(table_HGG, q_types_BT, axis=1)  # [H, B, T, G]
    u = jnp.moveaxis(rows[..., 1:] - rows[..., :1], 0, 2)
    w = jax.nn.one_hot(k_types_BS, table_HGG.shape[-1], dtype=jnp.float32)[..., 1:]
    return u, w


@jax.checkpoint  # keeps its inputs alone for the backward pass, which recomputes gates, counts and reads
def contextual_logits(gate_logits_BHTS: jax.Array, q_BTHD: jax.Array, table_RDP: jax.Array, q_pos: jax.Array,
                      k_pos: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """CoPE's term q_i . e[p_ij] [B, H, T, S] (float32), read at fractional positions by linear interpolation.

    gate_logits [B, H, T, S]: the content logits q.k/sqrt(D), whose sigmoids g_it are the gates; q [B, T, H, D];
    table [R, D, P] (`PositionalBias.contextual`); q_pos [T], k_pos [S] (or per example [B, T], [B, S]), keys in
    order along the row; mask [B|1, 1, T, S] bool (None: every key): a key the query may not attend to neither gates
    nor counts. A key j at or before the query i sits at p_ij = sum of g_it over t = j..i (the reversed cumulative
    sum of the paper), one after it (R = 2) at the sum over t = i..j, read from its own table; p_ij <= P - 1.
    """
    directions, _, npos = table_RDP.shape
    gates = jax.nn.sigmoid(gate_logits_BHTS.astype(jnp.float32))
    if mask is not None:
        gates = jnp.where(mask, gates, 0.0)
    offset = relative_offsets(q_pos, k_pos)  # [T, S] j - i, or per example [B, T, S]
    offset = offset[:, None] if offset.ndim == 3 else offset  # per example: under the head axis
    before = offset <= 0
    positions = jax.lax.cumsum(jnp.where(before, gates, 0.0), axis=3, reverse=True)
    if directions == 2:  # keys after the query count from it rightwards, including it, as the causal count does
        positions = jnp.where(before, positions, jax.lax.cumsum(jnp.where(offset >= 0, gates, 0.0), axis=3))
    positions = jnp.minimum(positions, npos - 1)
    per_position = jnp.einsum("bthd,rdp->bhtrp", q_BTHD, table_RDP.astype(q_BTHD.dtype),
                              preferred_element_type=jnp.float32)  # z_i[p] for every integer p, per direction
    per_position = per_position.reshape(*per_position.shape[:3], directions * npos)
    column = 0 if directions == 1 else jnp.where(before, 0, npos)  # the after-table's columns follow the before's
    low = jnp.floor(positions)
    read = lambda p: jnp.take_along_axis(per_position, p.astype(jnp.int32) + column, axis=-1)  # noqa: E731
    weight = positions - low  # the gradient reaches the gates through the weight, as in the authors' code
    return read(jnp.ceil(positions)) * weight + read(low) * (1.0 - weight)


@struct.dataclass
class PositionalBias:
    """What a mechanism hands to attention, for all layers of a stack; every field is optional.

    L' is L (one entry per layer) or 1 (shared by all layers); H' is H or 1 (shared by the heads); T queries,
    S keys, D head dim. Only `content_scale` and `fold_factors` are static (not arrays).
    """

    table: jax.Array | None = None  # [L', H', W] Toeplitz scores per offset j - i, W = 2*span - 1
    factors: tuple[jax.Array, jax.Array] | None = None  # P_Q [L', H', T, r], P_K [L', H', S|k, r]: bias = P_Q P_K^T
    dense: jax.Array | None = None  # [L', H', T, S] a full position-only matrix (attenuated encoding)
    rel_keys: jax.Array | None = None  # [L', 2c+1, D] Shaw r^K over clipped offsets -c..c
    rel_values: jax.Array | None = None  # [L', 2c+1, D] Shaw r^V
    # DeBERTa: the normalised relative embeddings [L', R, d], which each attention layer projects with its own query
    # and key projections into `rel_projections` (Q_r, K_r [R, H, D], one layer's, no layer axis), and the row of
    # each offset j - i as an integer Toeplitz table [L', W]
    rel_embeddings: jax.Array | None = None
    rel_projections: tuple[jax.Array, jax.Array] | None = None
    rel_index: jax.Array | None = None
    segment_table: jax.Array | None = None  # [L', H, G, G] per-head segment attention E_S[h, g_i, g_j]
    # cos, sin [L', T, D/2] at the query positions (L' = L where local and global layers turn at different bases)
    rotary: tuple[jax.Array, jax.Array] | None = None
    rotary_keys: tuple[jax.Array, jax.Array] | None = None  # cos, sin [L', S, D/2] at the key positions
    kv_projection: jax.Array | None = None  # [L', k, S] Linformer E: keys/values projected to k positions
    # [L', R, D, P] CoPE's position embeddings e, shared by the heads, per direction (R = 1: keys at or before the
    # query; 2: and keys after it) over contextual positions 0..P-1; read inside the logits (`contextual_logits`)
    contextual: jax.Array | None = None
    # (q [B, T], k [B, S]) positions within each packed piece (no layer axis), at which `factors`, `dense` and
    # `rotary` (computed at positions 0..T-1 / 0..S-1) are read; None: read at the row positions, as computed.
    piece_positions: tuple[jax.Array, jax.Array] | None = None
    fold_factors: bool = struct.field(pytree_node=False, default=False)  # fold P_Q P_K^T into q.k
    # `dense` rows are a softmax over all S keys (fixed attenuated delta): `over_attended_keys` renormalises them.
    normalise_dense: bool = struct.field(pytree_node=False, default=False)
    # Factor on the content term q.k/sqrt(D): 1 everywhere but TUPE, whose q.k/sqrt(2D) needs 1/sqrt(2).
    content_scale: float = struct.field(pytree_node=False, default=1.0)

    def for_layer(self, layer: int) -> "PositionalBias":
        """The slice of layer `layer` (leading axis removed; shared fields give their only entry)."""

        def pick(x):
            return x[layer if x.shape[0] > 1 else 0]

        pieces = self.piece_positions  # per example, not per layer
        return jax.tree.map(pick, self.replace(piece_positions=None)).replace(piece_positions=pieces)

    @property
    def has_position_logits(self) -> bool:
        """Whether a table, factors, a dense matrix, Shaw r^K, DeBERTa's relative terms or CoPE add positional terms
        to the logits."""
        return any(x is not None for x in (self.table, self.factors, self.dense, self.rel_keys, self.rel_index,
                                           self.contextual))


def at_pieces(bias: PositionalBias) -> PositionalBias:
    """One layer's slice with factors, dense matrices and rotary tables read at its `piece_positions` (unchanged
    without them).

    factors P_Q [H', T, r], P_K [H', S, r] -> [B, H', T, r], [B, H', S, r] (a Linformer P_K has no positions and
    stays); dense [H', T, S] -> [B, H', T, S]; rotary cos, sin [T, D/2] -> [B, T, D/2] (rotary_keys at the key
    positions). Toeplitz tables need no read: self-attention offsets j - i are the same within a piece, and
    packed cross-attention passes attention per-pair positions.
    """
    if bias.piece_positions is None:
        return bias
    q_BT, k_BS = bias.piece_positions
    factors, dense, rotary, rotary_keys = bias.factors, bias.dense, bias.rotary, bias.rotary_keys
    if factors is not None:
        p_q, p_k = factors
        p_q = jnp.moveaxis(jnp.take(p_q, q_BT, axis=1), 1, 0)  # [B, H', T, r]
        if bias.kv_projection is None:
            p_k = jnp.moveaxis(jnp.take(p_k, k_BS, axis=1), 1, 0)
        factors = (p_q, p_k)
    if dense is not None:
        rows = jnp.moveaxis(jnp.take(dense, q_BT, axis=1), 1, 0)  # [B, H', T, S_full]
        index = jnp.broadcast_to(k_BS[:, None, None, :], rows.shape[:3] + k_BS.shape[-1:])
        dense = jnp.take_along_axis(rows, index, axis=-1)
    if rotary is not None:
        rotary = tuple(jnp.take(table, q_BT, axis=0) for table in rotary)
    if rotary_keys is not None:
        rotary_keys = tuple(jnp.take(table, k_BS, axis=0) for table in rotary_keys)
    return bias.replace(factors=factors, dense=dense, rotary=rotary, rotary_keys=rotary_keys, piece_positions=None)


def over_attended_keys(bias: PositionalBias, mask: jax.Array | None) -> PositionalBias:
    """One layer's slice with a key-normalised dense term (`normalise_dense`) renormalised over the keys of `mask`.

    dense [B|1, H', T, S] or [H', T, S], rows summing to 1 over all S keys; mask [B|1, 1, T, S] bool ->
    dense [B|1, H', T, S], the softmax over each query's attended keys alone (its own piece, and in a causal stack
    the keys up to itself), so that padding and packed neighbours leave a piece's term as it is in a row of its
    own. Unchanged without the flag or a mask; a query with no key keeps zeros.
    """
    if not bias.normalise_dense or bias.dense is None or mask is None:
        return bias
    kept = jnp.where(mask, bias.dense, 0.0)
    total = jnp.sum(kept, axis=-1, keepdims=True)
    return bias.replace(dense=kept / jnp.where(total > 0, total, 1.0), normalise_dense=False)


def position_logits(bias: PositionalBias, q_pos: jax.Array, k_pos: jax.Array, *,
                    include_factors: bool = True) -> jax.Array | None:
    """Position-only logit terms of one layer, materialised: [H'|1, T, S], or [B, H'|1, T, S] when read at
    piece positions or given per-example positions q_pos [B, T], k_pos [B, S] (None if there are none).

    `bias` is a layer slice (no leading layer axis). Query-dependent (Shaw) and per-example (segment) terms are
    not position-only and are added by the attention function itself.
    """
    bias = at_pieces(bias)
    total = None

    def add(term):
        nonlocal total
        total = term if total is None else total + term

    if bias.table is not None:
        add(expand_toeplitz(bias.table, q_pos, k_pos))
    if bias.factors is not None and include_factors:
        p_q, p_k = bias.factors
        add(jnp.einsum("...htr,...hsr->...hts", p_q, p_k))
    if bias.dense is not None:
        add(bias.dense)
    return total
