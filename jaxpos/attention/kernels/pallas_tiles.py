"""A tile's arithmetic in the Pallas kernels of `pallas`: products, the table's bias tile and its diagonal sums
(per backend), masks, dropout's keep mask, a pair term's logits, tile skipping by id ranges, causal limits and
windows, and the recomputed P and dS of the backward kernels."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jaxpos.attention import dropout
from jaxpos.attention.kernels.pallas_common import PallasSpec, piece_id_range, tpu_module, triton_module


class QueryTile(NamedTuple):
    """A backward tile's query side: rows [bq, D] of q and dO, per-row columns [bq, 1]."""

    start: Any  # the first query row (traced)
    q: jax.Array
    do: jax.Array
    lse: jax.Array
    delta: jax.Array
    ids: jax.Array  # query ids
    keys: jax.Array | None  # dropout's row keys (None without dropout)


class KeyTile(NamedTuple):
    """A backward tile's key side: rows [bk, D] of k and v, key ids as a row [1, bk]."""

    start: Any  # the first key (traced)
    k: jax.Array
    v: jax.Array
    ids: jax.Array


def dot(a, b, contract):
    """a . b contracting axis contract[0] of a with contract[1] of b, float32 accumulation (float32 inputs in
    full precision: Triton's default for them is tf32)."""
    precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    return lax.dot_general(a, b, ((contract[:1], contract[1:]), ((), ())), precision=precision,
                           preferred_element_type=jnp.float32)


def bias_tile(ext_ref, q_start, k_start, bq, bk, st: PallasSpec):
    """Toeplitz tile [bq, bk]: ext[(k_start + c) - (q_start + r) + T_pad - 1].

    Triton: a gather from the offset row ext_ref [T_pad + S_pad]. Mosaic (no vector gather; bq = bk = b):
    ext_ref holds the windows [diagonals, 2b] of `pallas_common.kernel_table`; the tile's window, broadcast to b
    rows, rolled right by r + b + 1 in row r (a strided roll), puts window[c - r + b - 1] at column c.
    """
    if st.backend != "mosaic_tpu":
        r = lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
        c = lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
        return ext_ref[k_start - q_start + (st.t_pad - 1) + c - r]
    pltpu = tpu_module()
    diagonal = lax.div(k_start - q_start, bq) + st.t_pad // bq - 1
    window = jnp.broadcast_to(ext_ref[pl.ds(diagonal, 1), :], (bq, 2 * bq))
    return pltpu.roll(window, bq + 1, 1, stride=1, stride_axis=0)[:, :bk]


def tile_mask(q_ids, k_ids, q_start, k_start, bq, bk, st: PallasSpec):
    """Boolean [bq, bk] from query ids [bq, 1] and key ids [1, bk]: key not padding, same piece (when query
    ids are given), inside the causal limit and the window (`PallasSpec.upper`, `lower`); None: no mask."""
    if not st.masked:
        return None
    valid = k_ids != 0
    if st.use_q_pieces:
        valid = jnp.logical_and(valid, q_ids == k_ids)
    if st.upper is not None or st.lower is not None:
        r = lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
        c = lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
        offset = (k_start + c) - (q_start + r)
        if st.upper is not None:
            valid = jnp.logical_and(valid, offset <= st.upper)
        if st.lower is not None:
            valid = jnp.logical_and(valid, offset >= st.lower)
    return jnp.broadcast_to(valid, (bq, bk))


def pair_columns(u_ref, rows, *at):
    """The per-query factors u of a pair term as r columns [rows, 1] (None without one); `at`: leading indices."""
    if u_ref is None:
        return None
    return [u_ref[(*at, rows, pl.ds(c, 1))] for c in range(u_ref.shape[-1])]


def pair_rows(w_ref, cols, *at):
    """The per-key features w of a pair term as r rows [1, cols] (None without one)."""
    if w_ref is None:
        return None
    return [w_ref[(*at, pl.ds(c, 1), cols)] for c in range(w_ref.shape[-2])]


def pair_logits(u_cols, w_rows):
    """sum_c u[:, c] w[c, :]: a rank-r term [rows, cols] by r broadcast products (r is small: a tensor-core dot
    needs a contraction of 16)."""
    total = None
    for u, w in zip(u_cols, w_rows):
        total = u * w if total is None else total + u * w
    return total


def tile_keep(keys, k_start, bk, st: PallasSpec):
    """Dropout's keep mask [bq, bk] from the rows' keys [bq, 1] (`dropout.row_keys`); None: no dropout."""
    if not st.dropout_rate:
        return None
    return dropout.keep(keys, k_start + lax.broadcasted_iota(jnp.int32, (1, bk), 1), st.dropout_rate)


def loaded_id_range(side, block, ids):
    """Triton's `id_range(side, block index, ids)`: reduced from the ids the kernel has loaded."""
    del side, block
    return piece_id_range(ids)


def overlaps(q_range, k_range, st: PallasSpec):
    """Whether a (query block, key block) tile can hold an unmasked entry (from the id ranges alone)."""
    k_lo, k_hi = k_range
    if not st.use_q_pieces:
        return k_hi > 0
    q_lo, q_hi = q_range
    return jnp.logical_and(k_lo <= q_hi, q_lo <= k_hi)


def key_blocks(q_start, bq, bk, st: PallasSpec, num_k_blocks):
    """(first, end): the key blocks [first, end) that some query of the block from q_start can see, within the
    causal limit and the window (every block without them). Traced or not: the loops' bounds, and their count
    outside a kernel."""
    end = num_k_blocks
    if st.upper is not None:
        last = q_start + bq - 1 + st.upper  # last visible key index
        end = jnp.clip(lax.div(last + bk, bk), 0, num_k_blocks)
    if st.lower is None:
        return 0, end
    first = q_start + st.lower  # first visible key index
    return jnp.minimum(lax.div(jnp.maximum(first, 0), bk), end), end


def query_blocks(k_start, bq, bk, st: PallasSpec, num_q_blocks):
    """(first, end): the query blocks [first, end) that can see a key of the block from k_start."""
    first = 0 if st.upper is None else lax.div(jnp.maximum(k_start - st.upper, 0), bq)
    if st.lower is None:
        return first, num_q_blocks
    last = k_start + bk - 1 - st.lower  # the last query that sees a key of the block
    end = jnp.clip(lax.div(last + bq, bq), 0, num_q_blocks)
    return jnp.minimum(first, end), end


def diagonal_visible(shift, b: int, st: PallasSpec):
    """Whether block diagonal `shift` (key block minus query block, square tiles of b) holds an entry inside the
    causal limit and the window: its nearest entry to each limit decides (True: no limits)."""
    visible = True
    if st.upper is not None:
        visible = jnp.logical_and(visible, shift * b - (b - 1) <= st.upper)
    if st.lower is not None:
        visible = jnp.logical_and(visible, shift * b + (b - 1) >= st.lower)
    return visible


def probabilities_and_ds(rows: QueryTile, cols: KeyTile, pair, ext_ref, st: PallasSpec):
    """Recomputed P [bq, bk] and dS = P * (dP - delta) [bq, bk] of one tile, float32 (pair: (u columns, w rows)
    of a pair term, or None).

    With dropout, P is the kept weights scaled by 1 / (1 - rate) (what multiplied v) and dP the gradient of the
    undropped weights (dO.v kept and scaled the same way); delta = rowsum(dO * out) holds as without dropout.
    """
    bq, bk = rows.q.shape[0], cols.k.shape[0]
    s = dot(rows.q, cols.k, (1, 1)) * st.scale
    if ext_ref is not None:
        s = s + bias_tile(ext_ref, rows.start, cols.start, bq, bk, st)
    if pair is not None:
        s = s + pair_logits(*pair)
    mask = tile_mask(rows.ids, cols.ids, rows.start, cols.start, bq, bk, st)
    p = jnp.exp(s - rows.lse)
    if mask is not None:
        p = jnp.where(mask, p, 0.0)
    dp = dot(rows.do, cols.v, (1, 1))
    keep = tile_keep(rows.keys, cols.start, bk, st)
    if keep is None:
        return p, p * (dp - rows.delta)
    inverse = 1.0 / (1.0 - st.dropout_rate)
    dp = jnp.where(keep, dp * inverse, 0.0)
    return jnp.where(keep, p * inverse, 0.0), p * (dp - rows.delta)


def diagonal_sums(ds, scratch_ref, st: PallasSpec):
    """Sums of a square tile dS [b, b] along its 2b - 1 diagonals, as (low [1, b], high [1, b]) halves.

    Window entry w = c - r + b - 1 holds sum_r dS[r, c]; low = w in [0, b), high = w in [b, 2b - 1) (last entry
    0). Triton: registers cannot be read skewed, so dS goes through a scratch block and comes back by a skewed
    gather. Mosaic: dS padded to [b, 2b] and rolled right by b - 1 - r in row r (a strided roll; the adjoint of
    `bias_tile`'s) has diagonal w in column w, so the window is a sum over rows.
    """
    b = ds.shape[0]
    if st.backend == "mosaic_tpu":
        pltpu = tpu_module()
        padded = jnp.concatenate([ds, jnp.zeros_like(ds)], axis=1)
        window = jnp.sum(pltpu.roll(padded, b - 1, 1, stride=2 * b - 1, stride_axis=0), axis=0, keepdims=True)
        return window[:, :b], window[:, b:]
    barrier = _barrier(st)
    scratch_ref[...] = ds
    barrier()  # the gather below reads entries other threads wrote
    r = lax.broadcasted_iota(jnp.int32, (b, b), 0)
    w = lax.broadcasted_iota(jnp.int32, (b, b), 1)
    halves = []
    for col in (w - (b - 1) + r, w + 1 + r):
        inside = jnp.logical_and(col >= 0, col < b)
        vals = scratch_ref[r, jnp.clip(col, 0, b - 1)]
        halves.append(jnp.sum(jnp.where(inside, vals, 0.0), axis=0, keepdims=True))
    barrier()  # the next tile's store must not overtake these reads
    return halves


def _barrier(st: PallasSpec):
    if st.interpret or st.backend != "triton":  # sequential interpreter; Mosaic orders its own stores
        return lambda: None
    return triton_module().debug_barrier
