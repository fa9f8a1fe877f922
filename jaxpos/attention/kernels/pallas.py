"""Flash attention in Pallas with a Toeplitz bias computed inside the kernel, and its table gradient: the kernels
of `api.toeplitz_attention` on its "triton" and "mosaic_tpu" backends.

How the table enters the kernels. Outside them, one small gather (`api._offset_table`) re-indexes the table by the
local offset of the padded problem: ext[h, (j - i) + Tp - 1] = table[h, clip(k_pos[j] - q_pos[i] + centre)]
(the convention of `bias.expand_toeplitz`, clipping included), so a (query block, key block) tile reads a
contiguous window of bq + bk - 1 entries of ext that depends on the block diagonal alone. The gradient goes the
other way: the dq kernel sums each tile's dS along its diagonals (a window of partial sums), chains the windows
of a group of G query blocks into one row, and a reshape-and-sum in XLA (`_sum_rows`) adds the rows of all
groups and the batch; autodiff of the gather then folds clipped offsets back onto the table's ends. No atomics
and no [T, S] tensor: the partial rows take B*H*T*(S + G*b)/(G*b) floats (b = dq block), and G (`_dq_group`)
grows with S so that they stay within twice the size of q, 2*B*H*T*D: linear in T. The table is H*(T + S).
On Mosaic the rows go straight into each head's table gradient, H*(T + S) floats (a block that stays in VMEM
while the grid runs over the batch and the query groups), with no XLA reduction after. Triton's alternative,
`table_grad="diagonals"`: a kernel per (head, block diagonal) recomputes the diagonal's dS tiles for every batch
row, adds them up in registers and skews once (H*(T + S)*(b + 2) floats, independent of the batch; one skew per
diagonal instead of one per tile, at the price of the q.k and dO.v products computed once more).

Attention dropout: the weights `dropout.keep_mask` drops (the XLA path's mask), decided per tile from per-row keys
[B, H, T] (one int32 per query row, read like the logsumexp) and the key index; the logsumexp stays the
undropped softmax's, so the backward recomputes P as without dropout and masks P and dP.

A pair term u_i . w_j of small rank r (a per-head segment table: `bias.segment_pair_factors`) is added by r
broadcast products per tile from columns u [B, H, T, r] and rows w [B, r, S]; the dq kernel also returns
du = dS w^T, row sums it has at hand.

Backends: Pallas Triton on GPUs, Pallas Mosaic on TPUs, the Pallas interpreters where `interpret` (by default on
the CPU; the Mosaic kernels then run in the TPU interpreter). One set of kernels; what differs by backend is
`_bias_tile` and `_diagonal_sums` (Triton: gathers, through a scratch tile for the skew; Mosaic, which has no
vector gather: strided rolls of per-diagonal windows of the table), where the dq kernel puts the sums (above),
the layout of q, k, v ([B, T, H, D] for Triton, [B, H, T, D] for Mosaic's (8, 128) block tiling), the grid order
(`_grid`), the block sizes (128 on Mosaic) and where a tile's id ranges come from (`_call`). On the TPU the
lowering is checked from the CPU and the kernels run in the TPU interpreter; they have not run on a TPU.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jaxpos.attention import dropout

NEG = -1e30  # finite logit for masked entries: exp(NEG - NEG) = 1 keeps the running max of an empty row NaN-free
_BIG_ID = 2**30


@dataclasses.dataclass(frozen=True)
class _Static:
    """Static settings of one call (hashable: a nondiff argument of the custom VJP)."""

    scale: float
    causal: bool
    q_offset: int  # causal: key j is visible to query i when j - i <= q_offset (q_pos[i] - k_pos[j] >= 0)
    block_q: int
    block_k: int
    block_dq: int  # square tiles of the dq / table-gradient kernel
    dq_group: int  # query blocks per dq program: the table-gradient rows are B*H*T*(S + G*b)/(G*b) floats
    table_grad: str  # "tiles": the dq kernel sums each tile's diagonals; "diagonals": `_table_grad_kernel`
    t_pad: int
    s_pad: int
    use_q_pieces: bool
    masked: bool  # any mask at all (key ids, query ids, causal or padded keys); else no mask arithmetic
    skip_tiles: bool  # ids given: test each tile for overlap (a branch in the loop, which stops Triton pipelining)
    dropout_rate: float  # attention dropout (0: none); the mask is `dropout.keep` of per-row keys
    interpret: bool
    backend: str  # "triton" | "mosaic_tpu": the tile and diagonal-sum code, layouts and compiler parameters
    num_warps: int
    num_stages: int

    @property
    def heads_major(self) -> bool:
        """q, k, v as [B, H, T, D]: Mosaic tiles a block's last two axes by (8, 128), so H cannot sit between
        T and D as in [B, T, H, D] (the Triton layout, which needs no transposes)."""
        return self.backend == "mosaic_tpu"


def _pltpu():
    """Pallas's TPU module, for the mosaic_tpu backend."""
    from jax.experimental.pallas import tpu  # lazy: 0.14 s at import, which no CPU or GPU run needs
    return tpu


def _pltriton():
    """Pallas's Triton module, for the triton backend."""
    from jax.experimental.pallas import triton  # lazy: 0.07 s at import, which no CPU or TPU run needs
    return triton


def _dq_group(t_pad: int, s_pad: int, b: int, dim: int, limit: int = 16) -> int:
    """Query blocks per dq program: the least power of two dividing T_pad / b (at most `limit`, which bounds the
    registers a program carries) whose table-gradient rows fit in 2*T*D floats per (batch, head)."""
    nq, group = t_pad // b, 1
    while (group * 2 <= limit and nq % (group * 2) == 0
           and (nq // group) * (s_pad + group * b) > 2 * t_pad * dim):
        group *= 2
    return group

def _dot(a, b, contract):
    """a . b contracting axis contract[0] of a with contract[1] of b, float32 accumulation (float32 inputs in
    full precision: Triton's default for them is tf32)."""
    precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    return lax.dot_general(a, b, ((contract[:1], contract[1:]), ((), ())), precision=precision,
                           preferred_element_type=jnp.float32)


def _bias_tile(ext_ref, q_start, k_start, bq, bk, st: _Static):
    """Toeplitz tile [bq, bk]: ext[(k_start + c) - (q_start + r) + T_pad - 1].

    Triton: a gather from the offset row ext_ref [T_pad + S_pad]. Mosaic (no vector gather; bq = bk = b):
    ext_ref holds the windows [diagonals, 2b] of `_diagonal_windows`; the tile's window, broadcast to b rows,
    rolled right by r + b + 1 in row r (a strided roll), puts window[c - r + b - 1] at column c.
    """
    if st.backend != "mosaic_tpu":
        r = lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
        c = lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
        return ext_ref[k_start - q_start + (st.t_pad - 1) + c - r]
    pltpu = _pltpu()
    diagonal = lax.div(k_start - q_start, bq) + st.t_pad // bq - 1
    window = jnp.broadcast_to(ext_ref[pl.ds(diagonal, 1), :], (bq, 2 * bq))
    return pltpu.roll(window, bq + 1, 1, stride=1, stride_axis=0)[:, :bk]


def _tile_mask(q_ids, k_ids, q_start, k_start, bq, bk, st: _Static):
    """Boolean [bq, bk] from query ids [bq, 1] and key ids [1, bk]: key not padding, same piece (when query
    ids are given), causal; None: no mask."""
    if not st.masked:
        return None
    valid = k_ids != 0
    if st.use_q_pieces:
        valid = jnp.logical_and(valid, q_ids == k_ids)
    if st.causal:
        r = lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
        c = lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
        valid = jnp.logical_and(valid, (k_start + c) - (q_start + r) <= st.q_offset)
    return jnp.broadcast_to(valid, (bq, bk))


def _pair_columns(u_ref, rows, *at):
    """The per-query factors u of a pair term as r columns [rows, 1] (None without one); `at`: leading indices."""
    if u_ref is None:
        return None
    return [u_ref[(*at, rows, pl.ds(c, 1))] for c in range(u_ref.shape[-1])]


def _pair_rows(w_ref, cols, *at):
    """The per-key features w of a pair term as r rows [1, cols] (None without one)."""
    if w_ref is None:
        return None
    return [w_ref[(*at, pl.ds(c, 1), cols)] for c in range(w_ref.shape[-2])]


def _pair_logits(u_cols, w_rows):
    """sum_c u[:, c] w[c, :]: a rank-r term [rows, cols] by r broadcast products (r is small: a tensor-core dot
    needs a contraction of 16)."""
    total = None
    for u, w in zip(u_cols, w_rows):
        total = u * w if total is None else total + u * w
    return total


def _tile_keep(keys, k_start, bk, st: _Static):
    """Dropout's keep mask [bq, bk] from the rows' keys [bq, 1] (`dropout.row_keys`); None: no dropout."""
    if not st.dropout_rate:
        return None
    return dropout.keep(keys, k_start + lax.broadcasted_iota(jnp.int32, (1, bk), 1), st.dropout_rate)


def _id_range(ids, axis=None):
    """(smallest, largest) non-zero id of a block (along `axis`); (BIG, 0) when it is all padding."""
    return jnp.min(jnp.where(ids != 0, ids, _BIG_ID), axis=axis), jnp.max(ids, axis=axis)


def _ids_range_from_vector(side, block, ids):
    """Triton's `id_range(side, block index, ids)`: reduced from the ids the kernel has loaded."""
    del side, block
    return _id_range(ids)


def _overlaps(q_range, k_range, st: _Static):
    """Whether a (query block, key block) tile can hold an unmasked entry (from the id ranges alone)."""
    k_lo, k_hi = k_range
    if not st.use_q_pieces:
        return k_hi > 0
    q_lo, q_hi = q_range
    return jnp.logical_and(k_lo <= q_hi, q_lo <= k_hi)


def _causal_k_end(q_start, bq, bk, st: _Static, num_k_blocks):
    """Number of key blocks a query block starting at q_start can see."""
    if not st.causal:
        return num_k_blocks
    last = q_start + bq - 1 + st.q_offset  # last visible key index
    return jnp.clip(lax.div(last + bk, bk), 0, num_k_blocks)


def _causal_q_begin(k_start, bq, st: _Static):
    """First query block that can see a key block starting at k_start."""
    if not st.causal:
        return 0
    return lax.div(jnp.maximum(k_start - st.q_offset, 0), bq)


def _forward_kernel(q_ref, k_ref, v_ref, ext_ref, qseg_ref, kseg_ref, keys_ref, u_ref, w_ref, o_ref, lse_ref, *,
                    st: _Static, id_range=_ids_range_from_vector):
    """One query block of one (batch, head): online softmax over the key blocks, writes out and logsumexp.

    With dropout the running sum (and so the logsumexp) is the undropped softmax's; the kept weights, scaled by
    1 / (1 - rate) at the end, multiply v.

    Per-query quantities (ids, running max and sum, logsumexp) are columns [bq, 1], key ids rows [1, bk]: the
    layouts that broadcast against a [bq, bk] tile on every backend.
    """
    bq, bk = st.block_q, st.block_k
    q_start = pl.program_id(2) * bq
    q = q_ref[...]
    q_ids = qseg_ref[...]
    keys = None if keys_ref is None else keys_ref[...]
    u_cols = _pair_columns(u_ref, slice(None))
    q_range = id_range("q", pl.program_id(2), q_ids) if st.skip_tiles and st.use_q_pieces else None
    carry = (jnp.zeros(o_ref.shape, jnp.float32), jnp.full((bq, 1), NEG, jnp.float32),
             jnp.zeros((bq, 1), jnp.float32))

    def body(jb, carry):
        k_start = jb * bk
        k_ids = kseg_ref[:, pl.ds(k_start, bk)]

        def compute(carry):
            acc, m, l = carry
            k = k_ref[pl.ds(k_start, bk), :]
            v = v_ref[pl.ds(k_start, bk), :]
            s = _dot(q, k, (1, 1)) * st.scale
            if ext_ref is not None:
                s = s + _bias_tile(ext_ref, q_start, k_start, bq, bk, st)
            if u_cols is not None:
                s = s + _pair_logits(u_cols, _pair_rows(w_ref, pl.ds(k_start, bk)))
            mask = _tile_mask(q_ids, k_ids, q_start, k_start, bq, bk, st)
            if mask is not None:
                s = jnp.where(mask, s, NEG)
            m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
            p = jnp.exp(s - m_new)
            if mask is not None:
                p = jnp.where(mask, p, 0.0)
            correction = jnp.exp(m - m_new)
            keep = _tile_keep(keys, k_start, bk, st)
            kept = p if keep is None else jnp.where(keep, p, 0.0)
            acc = acc * correction + _dot(kept.astype(v.dtype), v, (1, 0))
            return acc, m_new, l * correction + jnp.sum(p, axis=1, keepdims=True)

        if not st.skip_tiles:
            return compute(carry)
        return lax.cond(_overlaps(q_range, id_range("k", jb, k_ids), st), compute, lambda c: c, carry)

    k_end = _causal_k_end(q_start, bq, bk, st, st.s_pad // bk)
    acc, m, l = lax.fori_loop(0, k_end, body, carry)
    seen = l > 0.0
    safe_l = jnp.where(seen, l, 1.0)
    o_ref[...] = (acc / (safe_l * (1.0 - st.dropout_rate))).astype(o_ref.dtype)
    # +inf for rows with no visible key: the backward's exp(s - lse) is then 0 there.
    lse_ref[...] = jnp.where(seen, m + jnp.log(safe_l), jnp.inf)


def _probabilities_and_ds(q, k, v, do, lse, delta, keys, pair, ext_ref, q_ids, k_ids, q_start, k_start, bq, bk,
                          st):
    """Recomputed P [bq, bk] and dS = P * (dP - delta) [bq, bk] of one tile, float32 (lse, delta, keys [bq, 1];
    pair: (u columns, w rows) of a pair term, or None).

    With dropout, P is the kept weights scaled by 1 / (1 - rate) (what multiplied v) and dP the gradient of the
    undropped weights (dO.v kept and scaled the same way); delta = rowsum(dO * out) holds as without dropout.
    """
    s = _dot(q, k, (1, 1)) * st.scale
    if ext_ref is not None:
        s = s + _bias_tile(ext_ref, q_start, k_start, bq, bk, st)
    if pair is not None:
        s = s + _pair_logits(*pair)
    mask = _tile_mask(q_ids, k_ids, q_start, k_start, bq, bk, st)
    p = jnp.exp(s - lse)
    if mask is not None:
        p = jnp.where(mask, p, 0.0)
    dp = _dot(do, v, (1, 1))
    keep = _tile_keep(keys, k_start, bk, st)
    if keep is None:
        return p, p * (dp - delta)
    inverse = 1.0 / (1.0 - st.dropout_rate)
    dp = jnp.where(keep, dp * inverse, 0.0)
    return jnp.where(keep, p * inverse, 0.0), p * (dp - delta)


def _dkdv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, ext_ref, qseg_ref, kseg_ref, keys_ref, u_ref,
                 w_ref, dk_ref, dv_ref, *, st: _Static, id_range=_ids_range_from_vector):
    """One key block of one (batch, head): dK and dV accumulated over the query blocks."""
    bq, bk = st.block_q, st.block_k
    k_start = pl.program_id(2) * bk
    k, v = k_ref[...], v_ref[...]
    k_ids = kseg_ref[...]
    w_rows = _pair_rows(w_ref, slice(None))
    k_range = id_range("k", pl.program_id(2), k_ids) if st.skip_tiles else None
    carry = (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))

    def body(ib, carry):
        q_start = ib * bq
        q_ids = qseg_ref[pl.ds(q_start, bq), :]

        def compute(carry):
            dk, dv = carry
            q = q_ref[pl.ds(q_start, bq), :]
            do = do_ref[pl.ds(q_start, bq), :]
            rows = pl.ds(q_start, bq)
            keys = None if keys_ref is None else keys_ref[rows, :]
            pair = None if u_ref is None else (_pair_columns(u_ref, rows), w_rows)
            p, ds = _probabilities_and_ds(q, k, v, do, lse_ref[rows, :], delta_ref[rows, :], keys, pair, ext_ref,
                                          q_ids, k_ids, q_start, k_start, bq, bk, st)
            dv = dv + _dot(p.astype(do.dtype), do, (0, 0))
            dk = dk + _dot(ds.astype(q.dtype), q, (0, 0)) * st.scale
            return dk, dv

        if not st.skip_tiles:
            return compute(carry)
        q_range = id_range("q", ib, q_ids) if st.use_q_pieces else None
        return lax.cond(_overlaps(q_range, k_range, st), compute, lambda c: c, carry)

    dk, dv = lax.fori_loop(_causal_q_begin(k_start, bq, st), st.t_pad // bq, body, carry)
    dk_ref[...] = dk.astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _diagonal_sums(ds, scratch_ref, st: _Static):
    """Sums of a square tile dS [b, b] along its 2b - 1 diagonals, as (low [1, b], high [1, b]) halves.

    Window entry w = c - r + b - 1 holds sum_r dS[r, c]; low = w in [0, b), high = w in [b, 2b - 1) (last entry
    0). Triton: registers cannot be read skewed, so dS goes through a scratch block and comes back by a skewed
    gather. Mosaic: dS padded to [b, 2b] and rolled right by b - 1 - r in row r (a strided roll; the adjoint of
    `_bias_tile`'s) has diagonal w in column w, so the window is a sum over rows.
    """
    b = ds.shape[0]
    if st.backend == "mosaic_tpu":
        pltpu = _pltpu()
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


def _barrier(st: _Static):
    if st.interpret or st.backend != "triton":  # sequential interpreter; Mosaic orders its own stores
        return lambda: None
    return _pltriton().debug_barrier


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, ext_ref, qseg_ref, kseg_ref, keys_ref, u_ref,
               w_ref, dq_ref, du_ref, drow_ref, scratch_ref, *, st: _Static, id_range=_ids_range_from_vector):
    """G = st.dq_group query blocks of one (batch, head): their dQ over the key blocks, with a pair term the
    gradient of its u (du[:, c] = sum over keys of dS * w[c, :]) and, with a table (and table_grad "tiles"), one
    row of dS diagonal sums for the group.

    Tile (query block g of the group, key block j) has its window of 2b - 1 offsets at row positions
    j*b + (G - 1 - g)*b + w, so the group's row (length S_pad + G*b) reads like one query block of G*b rows. For
    a key block j the G tiles' windows cover G + 1 chunks of b positions from j*b: they are summed in registers,
    the first chunk is final and written, the others carry to the next key block (G = 1: the high half of each
    window carries into the next). Triton: no read-back of the row, so no barrier. Mosaic: the row is added into
    the head's table gradient [(T_pad + S_pad) / b, b] (chunk c of group i's row is offset chunk c + nq - G*(i + 1)),
    one block that stays in VMEM while the grid runs over the batch and the groups (its innermost, sequential axes).
    """
    b, group = st.block_dq, st.dq_group
    first = pl.program_id(2) * group  # the group's first query block
    has_table = ext_ref is not None and st.table_grad == "tiles"  # the table's gradient summed here
    zeros_b = jnp.zeros((1, b), jnp.float32)
    accumulate = has_table and st.backend == "mosaic_tpu"
    if accumulate:
        @pl.when(jnp.logical_and(pl.program_id(1) == 0, pl.program_id(2) == 0))  # the head's first visit
        def _():
            drow_ref[...] = jnp.zeros(drow_ref.shape, jnp.float32)

        shift = st.t_pad // b - first - group

    def store(chunk_index, chunk):
        if accumulate:
            drow_ref[pl.ds(chunk_index + shift, 1), :] += chunk
        else:
            drow_ref[pl.ds(chunk_index, 1), :] = chunk

    rows = [pl.ds(g * b, b) for g in range(group)]
    qs, dos, lses, deltas, q_ids = ([ref[r, :] for r in rows] for ref in (q_ref, do_ref, lse_ref, delta_ref, qseg_ref))
    keys = [None if keys_ref is None else keys_ref[r, :] for r in rows]
    u_cols = [_pair_columns(u_ref, r) for r in rows]
    rank = 0 if u_ref is None else u_ref.shape[-1]
    zeros_col = jnp.zeros((b, 1), jnp.float32)
    q_ranges = [id_range("q", first + g, ids) if st.skip_tiles and st.use_q_pieces else None
                for g, ids in enumerate(q_ids)]

    def body(jb, carry):
        dqs, chunks, dus = list(carry[0]), list(carry[1]), list(carry[2])
        k_start = jb * b
        k_ids = kseg_ref[:, pl.ds(k_start, b)]
        w_rows = _pair_rows(w_ref, pl.ds(k_start, b))

        def load():
            return k_ref[pl.ds(k_start, b), :], v_ref[pl.ds(k_start, b), :]

        # K and V once for the group; with tile skipping, only in the tiles that compute (as with G = 1).
        kv = None if st.skip_tiles else load()
        k_range = id_range("k", jb, k_ids) if st.skip_tiles else None
        for g in range(group):
            q_start = (first + g) * b

            def compute(dq, du, g=g, q_start=q_start):
                k, v = load() if kv is None else kv
                pair = None if u_ref is None else (u_cols[g], w_rows)
                _, ds = _probabilities_and_ds(qs[g], k, v, dos[g], lses[g], deltas[g], keys[g], pair, ext_ref,
                                              q_ids[g], k_ids, q_start, k_start, b, b, st)
                dq = dq + _dot(ds.astype(k.dtype), k, (1, 0)) * st.scale
                du = tuple(col + jnp.sum(ds * w, axis=1, keepdims=True) for col, w in zip(du, w_rows or ()))
                sums = _diagonal_sums(ds, scratch_ref, st) if has_table else (zeros_b, zeros_b)
                return dq, du, *sums

            if st.skip_tiles:
                dqs[g], dus[g], low, high = lax.cond(_overlaps(q_ranges[g], k_range, st), compute,
                                                     lambda dq, du: (dq, du, zeros_b, zeros_b), dqs[g], dus[g])
            else:
                dqs[g], dus[g], low, high = compute(dqs[g], dus[g])
            if has_table:
                chunks[group - 1 - g] = chunks[group - 1 - g] + low
                chunks[group - g] = chunks[group - g] + high
        if has_table:
            store(jb, chunks[0])
        return tuple(dqs), tuple(chunks[1:]) + (zeros_b,), tuple(dus)

    num_k = st.s_pad // b
    k_end = _causal_k_end((first + group - 1) * b, b, b, st, num_k)  # the group's last block sees the most
    dqs, chunks, dus = lax.fori_loop(0, k_end, body, (tuple(jnp.zeros(x.shape, jnp.float32) for x in qs),
                                                      (zeros_b,) * (group + 1), ((zeros_col,) * rank,) * group))
    for r, dq, du in zip(rows, dqs, dus):
        dq_ref[r, :] = dq.astype(dq_ref.dtype)
        for c, col in enumerate(du):
            du_ref[r, pl.ds(c, 1)] = col
    if has_table:
        for c in range(group):  # the last chunk is always zeros after the final shift
            store(k_end + c, chunks[c])
    if has_table and not accumulate:
        def clear(jb, carry):  # chunks past the causal limit
            drow_ref[pl.ds(jb, 1), :] = zeros_b
            return carry

        lax.fori_loop(k_end + group, num_k + group, clear, None)


def _interpret(st: _Static):
    """pallas_call's `interpret`: Mosaic kernels run in the TPU interpreter (which also checks their reads stay in
    bounds), the others in the generic one."""
    if not st.interpret:
        return False
    if st.backend == "mosaic_tpu":
        pltpu = _pltpu()
        return pltpu.InterpretParams()
    return True


def _compiler_params(st: _Static, reduces: bool = False):
    """`reduces`: Mosaic's grid (head, batch, block) accumulates an output over its last two axes, which must then
    run in order on one core."""
    if st.interpret:
        return None
    if st.backend == "mosaic_tpu":
        pltpu = _pltpu()
        inner = "arbitrary" if reduces else "parallel"
        return pltpu.CompilerParams(dimension_semantics=("parallel", inner, inner))
    return _pltriton().CompilerParams(num_warps=st.num_warps, num_stages=st.num_stages)


def _grid(st: _Static, batch: int, heads: int, blocks: int):
    """Triton: (batch, head, block). Mosaic: (head, batch, block), so that a per-head output (the table gradient)
    can stay resident over the batch and the blocks. Kernels read the block as program_id(2) either way."""
    return (heads, batch, blocks) if st.heads_major else (batch, heads, blocks)


def _spec(st: _Static, shape, index):
    """BlockSpec whose index map takes the grid point as (batch, head, block) whatever `_grid`'s order (and
    ignores the scalar-prefetch refs that Mosaic passes after it)."""
    if st.heads_major:
        return pl.BlockSpec(shape, lambda h, b, i, *_: index(b, h, i))
    return pl.BlockSpec(shape, lambda b, h, i, *_: index(b, h, i))


def _block_ranges(ids, block: int):
    """Ids [B, L] -> flat int32 [B * L/block * 2]: (smallest non-zero, largest) id of each block, for SMEM."""
    lo, hi = _id_range(ids.reshape(ids.shape[0], -1, block), axis=-1)
    return jnp.stack([lo, hi], axis=-1).reshape(-1)


def _call(kernel, st: _Static, grid, in_specs, out_specs, out_shape, name, args, q_pieces, k_pieces, reduces=False):
    """pallas_call of `kernel` on `args`. Mosaic with tile skipping: the blocks' id ranges come by scalar prefetch
    (SMEM) and the kernel's `id_range` reads them there, since a branch cannot hang on a vector reduced in a
    Mosaic kernel; Triton reduces the ids it has loaded."""
    params = dict(out_shape=out_shape, interpret=_interpret(st), compiler_params=_compiler_params(st, reduces),
                  name=name)
    if not (st.backend == "mosaic_tpu" and st.skip_tiles):
        return pl.pallas_call(kernel, grid=grid, in_specs=in_specs, out_specs=out_specs, **params)(*args)
    pltpu = _pltpu()
    b = st.block_q  # Mosaic's blocks are all equal

    def with_ranges(q_ranges_ref, k_ranges_ref, *refs):
        def id_range(side, block, ids):
            del ids
            ref, blocks = (q_ranges_ref, st.t_pad // b) if side == "q" else (k_ranges_ref, st.s_pad // b)
            at = (pl.program_id(1) * blocks + block) * 2  # program_id(1): the batch row (`_grid`)
            return ref[at], ref[at + 1]

        kernel(*refs, id_range=id_range)

    spec = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=2, grid=grid, in_specs=in_specs, out_specs=out_specs)
    ranges = _block_ranges(q_pieces[:, :, 0], b), _block_ranges(k_pieces[:, 0, :], b)
    return pl.pallas_call(with_ranges, grid_spec=spec, **params)(*ranges, *args)


def _table_spec(ext, st: _Static):
    """BlockSpec of the offset table (or its windows): the whole of the program's head (or the shared one)."""
    if ext is None:
        return None
    shared = ext.shape[0] == 1
    return _spec(st, (None, *ext.shape[1:]), lambda b, h, i: (0 if shared else h,) + (0,) * (ext.ndim - 1))


def _diagonal_windows(ext, b: int):
    """Offset table [H', T_pad + S_pad] -> windows [H', (T_pad + S_pad) / b, 2b]: window d = ext[d*b : d*b + 2b]
    (zeros past the end) serves every tile on block diagonal d = j - i + T_pad/b - 1 (Mosaic reads it as a row)."""
    heads, length = ext.shape
    chunks = jnp.pad(ext, ((0, 0), (0, b))).reshape(heads, length // b + 1, b)
    return jnp.concatenate([chunks[:, :-1], chunks[:, 1:]], axis=-1)


def _kernel_table(ext, st: _Static):
    """The table as the kernels read it: the offset row (Triton's gather) or its diagonal windows (Mosaic)."""
    if ext is None or st.backend != "mosaic_tpu":
        return ext
    return _diagonal_windows(ext, st.block_q)


def _seq_spec(st: _Static, rows: int, dim: int, block=lambda i: i):
    """BlockSpec of `rows` positions of q, k, v or their gradients for grid point (batch, head, i)."""
    if st.heads_major:
        return _spec(st, (None, None, rows, dim), lambda b, h, i: (b, h, block(i), 0))
    return _spec(st, (None, rows, None, dim), lambda b, h, i: (b, block(i), h, 0))


def _column_spec(st: _Static, rows: int, block=lambda i: i):
    """BlockSpec of per-query quantities [B, H, T, 1] (logsumexp, delta) as columns [rows, 1]."""
    return _spec(st, (None, None, rows, 1), lambda b, h, i: (b, h, block(i), 0))


def _ids_specs(st: _Static, q_rows: int, k_cols: int, q_block=lambda i: i, k_block=lambda i: i):
    """BlockSpecs of query ids [B, T, 1] (columns) and key ids [B, 1, S] (rows)."""
    return (_spec(st, (None, q_rows, 1), lambda b, h, i: (b, q_block(i), 0)),
            _spec(st, (None, 1, k_cols), lambda b, h, i: (b, 0, k_block(i))))


def _dims(q, st: _Static):
    """(batch, heads, length, dim) of q, k or v in the kernel's layout."""
    batch, a, c, dim = q.shape
    return (batch, a, c, dim) if st.heads_major else (batch, c, a, dim)


def _keys_spec(keys, st: _Static, rows: int, block=lambda i: i):
    """BlockSpec of dropout's row keys [B, H, T_pad, 1] (None without dropout)."""
    return None if keys is None else _column_spec(st, rows, block)


def _u_spec(u, st: _Static, rows: int, block=lambda i: i):
    """BlockSpec of a pair term's per-query factors u [B, H, T_pad, r] (or their gradient) as [rows, r]."""
    return None if u is None else _spec(st, (None, None, rows, u.shape[-1]), lambda b, h, i: (b, h, block(i), 0))


def _w_spec(w, st: _Static, cols: int, block=lambda i: i):
    """BlockSpec of a pair term's per-key features w [B, r, S_pad] as [r, cols]."""
    return None if w is None else _spec(st, (None, w.shape[1], cols), lambda b, h, i: (b, 0, block(i)))


def _forward(q, k, v, ext, q_pieces, k_pieces, keys, u, w, st: _Static):
    batch, heads, t_pad, dim = _dims(q, st)
    dim_v = v.shape[-1]  # q and k may be wider (folded factors)
    bq = st.block_q
    whole = lambda i: 0  # noqa: E731
    q_ids, k_ids = _ids_specs(st, bq, st.s_pad, k_block=whole)
    table = _kernel_table(ext, st)
    return _call(
        functools.partial(_forward_kernel, st=st), st, _grid(st, batch, heads, t_pad // bq),
        in_specs=[_seq_spec(st, bq, dim), _seq_spec(st, st.s_pad, dim, whole), _seq_spec(st, st.s_pad, dim_v, whole),
                  _table_spec(table, st), q_ids, k_ids, _keys_spec(keys, st, bq), _u_spec(u, st, bq),
                  _w_spec(w, st, st.s_pad, whole)],
        out_specs=[_seq_spec(st, bq, dim_v), _column_spec(st, bq)],
        out_shape=[jax.ShapeDtypeStruct(q.shape[:-1] + (dim_v,), q.dtype),
                   jax.ShapeDtypeStruct((batch, heads, t_pad, 1), jnp.float32)],
        name="toeplitz_attention_fwd", args=(q, k, v, table, q_pieces, k_pieces, keys, u, w), q_pieces=q_pieces,
        k_pieces=k_pieces)


def _backward(q, k, v, ext, q_pieces, k_pieces, keys, u, w, out, lse, do, st: _Static):
    batch, heads, t_pad, dim = _dims(q, st)
    s_pad, bk = st.s_pad, st.block_k
    whole = lambda i: 0  # noqa: E731
    einsum = "bhtd,bhtd->bht" if st.heads_major else "bthd,bthd->bht"
    delta = jnp.einsum(einsum, out.astype(jnp.float32), do.astype(jnp.float32))[..., None]
    table = _kernel_table(ext, st)
    dim_v = v.shape[-1]
    full_q, full_k = _seq_spec(st, t_pad, dim, whole), _seq_spec(st, s_pad, dim, whole)
    full_do, full_v = _seq_spec(st, t_pad, dim_v, whole), _seq_spec(st, s_pad, dim_v, whole)
    dk, dv = _call(
        functools.partial(_dkdv_kernel, st=st), st, _grid(st, batch, heads, s_pad // bk),
        in_specs=[full_q, _seq_spec(st, bk, dim), _seq_spec(st, bk, dim_v), full_do, _column_spec(st, t_pad, whole),
                  _column_spec(st, t_pad, whole), _table_spec(table, st), *_ids_specs(st, t_pad, bk, q_block=whole),
                  _keys_spec(keys, st, t_pad, whole), _u_spec(u, st, t_pad, whole), _w_spec(w, st, bk)],
        out_specs=[_seq_spec(st, bk, dim), _seq_spec(st, bk, dim_v)],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        name="toeplitz_attention_dkdv", args=(q, k, v, do, lse, delta, table, q_pieces, k_pieces, keys, u, w),
        q_pieces=q_pieces, k_pieces=k_pieces)

    b, group = st.block_dq, st.dq_group
    groups, chunks = t_pad // (b * group), s_pad // b + group
    row_q = _seq_spec(st, group * b, dim)
    out_specs, out_shape = [row_q], [jax.ShapeDtypeStruct(q.shape, q.dtype)]
    if u is not None:  # the gradient of the pair term's u
        out_specs.append(_u_spec(u, st, group * b))
        out_shape.append(jax.ShapeDtypeStruct(u.shape, jnp.float32))
    accumulate = ext is not None and st.backend == "mosaic_tpu"
    if st.table_grad == "diagonals":
        pass  # a kernel of its own, below
    elif accumulate:  # each head's table gradient [(T_pad + S_pad) / b, b], resident while the grid reduces into it
        offsets = (t_pad + s_pad) // b
        out_specs.append(_spec(st, (None, offsets, b), lambda bb, h, i: (h, 0, 0)))
        out_shape.append(jax.ShapeDtypeStruct((heads, offsets, b), jnp.float32))
    elif ext is not None:  # one row of diagonal sums per group, as chunks [S_pad / b + G, b]
        out_specs.append(_spec(st, (None, None, None, chunks, b), lambda bb, h, i: (bb, h, i, 0, 0)))
        out_shape.append(jax.ShapeDtypeStruct((batch, heads, groups, chunks, b), jnp.float32))
        # Triton's skew goes through memory: a scratch tile, discarded
        out_specs.append(_spec(st, (None, None, None, b, b), lambda bb, h, i: (bb, h, i, 0, 0)))
        out_shape.append(jax.ShapeDtypeStruct((batch, heads, groups, b, b), jnp.float32))

    def kernel(*refs, **kwargs):  # the outputs present, in order: dq, [du], [table rows], [skew scratch]
        inputs, outputs = refs[:12], list(refs[12:])
        dq_ref = outputs.pop(0)
        du_ref = outputs.pop(0) if u is not None else None
        drow_ref = outputs.pop(0) if outputs else None
        scratch_ref = outputs.pop(0) if outputs else None
        _dq_kernel(*inputs, dq_ref, du_ref, drow_ref, scratch_ref, st=st, **kwargs)

    results = _call(
        kernel, st, _grid(st, batch, heads, groups),
        in_specs=[row_q, full_k, full_v, _seq_spec(st, group * b, dim_v), _column_spec(st, group * b),
                  _column_spec(st, group * b), _table_spec(table, st),
                  *_ids_specs(st, group * b, s_pad, k_block=whole), _keys_spec(keys, st, group * b),
                  _u_spec(u, st, group * b), _w_spec(w, st, s_pad, whole)],
        out_specs=out_specs, out_shape=out_shape, name="toeplitz_attention_dq",
        args=(q, k, v, do, lse, delta, table, q_pieces, k_pieces, keys, u, w), q_pieces=q_pieces, k_pieces=k_pieces,
        reduces=accumulate)
    dq, results = results[0], list(results[1:])  # then [du], [table rows], as the kernel's outputs
    du = results.pop(0) if u is not None else None
    d_ext = None
    if ext is not None and st.table_grad == "diagonals":
        d_ext = _table_grad_by_diagonals(q, k, v, do, lse, delta, ext, q_pieces, k_pieces, keys, u, w, st)
    elif accumulate:
        d_ext = results[0].reshape(heads, -1)
        d_ext = jnp.sum(d_ext, axis=0, keepdims=True) if ext.shape[0] == 1 else d_ext
    elif ext is not None:
        d_ext = _sum_rows(results[0].reshape(batch, heads, groups, chunks * b), ext.shape[0], group * b)
    return dq, dk, dv, d_ext, du


def _table_grad_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, ext_ref, qseg_ref, kseg_ref, keys_ref,
                       u_ref, w_ref, out_ref, scratch_ref, *, st: _Static, batch: int):
    """table_grad="diagonals": one (head, block diagonal d) of the table gradient. The tiles (i, i + d - nq + 1)
    of every batch row recompute dS and add it up in registers; one skew at the end (`_diagonal_sums`) gives the
    window of diagonal sums, out [2, b] = (low, high): offset chunks d and d + 1 of the table gradient."""
    b = st.block_dq
    nq, nk = st.t_pad // b, st.s_pad // b
    d = pl.program_id(1)
    shift = d - (nq - 1)  # key block minus query block on this diagonal
    first_i = jnp.maximum(0, -shift)
    count = jnp.minimum(nq, nk - shift) - first_i
    if st.causal:  # the whole diagonal lies above the causal limit when its nearest entry is invisible
        count = jnp.where(shift * b - (b - 1) <= st.q_offset, count, 0)

    def body(step, acc):
        bb, i = lax.div(step, count), first_i + lax.rem(step, count)
        q_start, k_start = i * b, (i + shift) * b
        rows, cols = pl.ds(q_start, b), pl.ds(k_start, b)
        q_ids, k_ids = qseg_ref[bb, rows, :], kseg_ref[bb, :, cols]

        def compute(acc):
            keys = None if keys_ref is None else keys_ref[bb, rows, :]
            pair = None if u_ref is None else (_pair_columns(u_ref, rows, bb), _pair_rows(w_ref, cols, bb))
            _, ds = _probabilities_and_ds(q_ref[bb, rows, :], k_ref[bb, cols, :], v_ref[bb, cols, :],
                                          do_ref[bb, rows, :], lse_ref[bb, rows, :], delta_ref[bb, rows, :], keys,
                                          pair, ext_ref, q_ids, k_ids, q_start, k_start, b, b, st)
            return acc + ds

        if not st.skip_tiles:
            return compute(acc)
        return lax.cond(_overlaps(_id_range(q_ids), _id_range(k_ids), st), compute, lambda a: a, acc)

    acc = lax.fori_loop(0, batch * count, body, jnp.zeros((b, b), jnp.float32))
    low, high = _diagonal_sums(acc, scratch_ref, st)
    out_ref[0:1, :] = low
    out_ref[1:2, :] = high


def _table_grad_by_diagonals(q, k, v, do, lse, delta, ext, q_pieces, k_pieces, keys, u, w, st: _Static):
    """Offset-table gradient [H'|1, T_pad + S_pad] by `_table_grad_kernel`, through windows [H, diagonals, 2, b]
    and the skews' scratch [H, diagonals, b, b] (H*(T + S)*(b + 2) floats), at the price of recomputing dS (the
    q.k and dO.v products) once more."""
    batch, heads, t_pad, _ = _dims(q, st)
    b = st.block_dq
    diagonals = (t_pad + st.s_pad) // b - 1

    def full(x):  # every batch row and position of head h
        return pl.BlockSpec((batch, x.shape[1], None, x.shape[-1]), lambda h, d: (0, 0, h, 0))

    windows, _ = pl.pallas_call(
        functools.partial(_table_grad_kernel, st=st, batch=batch),
        grid=(heads, diagonals),
        in_specs=[full(q), full(k), full(v), full(do),
                  pl.BlockSpec((batch, None, t_pad, 1), lambda h, d: (0, h, 0, 0)),
                  pl.BlockSpec((batch, None, t_pad, 1), lambda h, d: (0, h, 0, 0)),
                  pl.BlockSpec((None, ext.shape[1]), lambda h, d: (0 if ext.shape[0] == 1 else h, 0)),
                  pl.BlockSpec(q_pieces.shape, lambda h, d: (0, 0, 0)),
                  pl.BlockSpec(k_pieces.shape, lambda h, d: (0, 0, 0)),
                  None if keys is None else pl.BlockSpec((batch, None, t_pad, 1), lambda h, d: (0, h, 0, 0)),
                  None if u is None else pl.BlockSpec((batch, None, t_pad, u.shape[-1]), lambda h, d: (0, h, 0, 0)),
                  None if w is None else pl.BlockSpec(w.shape, lambda h, d: (0, 0, 0))],
        out_specs=[pl.BlockSpec((None, None, 2, b), lambda h, d: (h, d, 0, 0)),
                   pl.BlockSpec((None, None, b, b), lambda h, d: (h, d, 0, 0))],  # the skew's scratch, discarded
        out_shape=[jax.ShapeDtypeStruct((heads, diagonals, 2, b), jnp.float32),
                   jax.ShapeDtypeStruct((heads, diagonals, b, b), jnp.float32)],
        interpret=_interpret(st), compiler_params=_compiler_params(st), name="toeplitz_attention_table_grad",
    )(q, k, v, do, lse, delta, ext, q_pieces, k_pieces, keys, u, w)
    chunks = jnp.pad(windows[:, :, 0], ((0, 0), (0, 1), (0, 0))) + jnp.pad(windows[:, :, 1], ((0, 0), (1, 0), (0, 0)))
    d_ext = chunks.reshape(heads, -1)  # chunk d holds offsets d*b ... d*b + b - 1
    return jnp.sum(d_ext, axis=0, keepdims=True) if ext.shape[0] == 1 else d_ext


def _sum_rows(drow, table_heads, b):
    """Rows of diagonal sums [B, H, nq, S_pad + b], one per query group of b rows -> offset-table gradient
    [H'|1, T_pad + S_pad].

    Row i starts at offset column (nq - 1 - i) * b. Reversing the rows makes the shift k * b for row k; padding
    each row with nq * b zeros and re-reading the flat buffer with rows b shorter applies exactly those shifts.
    """
    rows = jnp.sum(drow, axis=0)  # [H, nq, L]
    if table_heads == 1:
        rows = jnp.sum(rows, axis=0, keepdims=True)
    heads, nq, length = rows.shape
    rows = jnp.pad(rows[:, ::-1], ((0, 0), (0, 0), (0, nq * b)))
    width = length + (nq - 1) * b
    skewed = rows.reshape(heads, -1)[:, : nq * width].reshape(heads, nq, width)
    return jnp.sum(skewed, axis=1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(9,))
def _attention(q, k, v, ext, q_pieces, k_pieces, keys, u, w, st):
    return _forward(q, k, v, ext, q_pieces, k_pieces, keys, u, w, st)[0]


def _attention_fwd(q, k, v, ext, q_pieces, k_pieces, keys, u, w, st):
    out, lse = _forward(q, k, v, ext, q_pieces, k_pieces, keys, u, w, st)
    return out, (q, k, v, ext, q_pieces, k_pieces, keys, u, w, out, lse)


def _attention_bwd(st, residuals, do):
    q, k, v, ext, q_pieces, k_pieces, keys, u, w, out, lse = residuals
    dq, dk, dv, d_ext, du = _backward(q, k, v, ext, q_pieces, k_pieces, keys, u, w, out, lse, do, st)
    return dq, dk, dv, d_ext, None, None, None, du, None  # w (key features) takes no gradient


_attention.defvjp(_attention_fwd, _attention_bwd)
