"""The backward kernels of `pallas`: dK/dV per key block, dQ per group of query blocks (with a pair term's du and,
by default, the table gradient's rows of diagonal sums), Triton's alternative table gradient per block diagonal,
and the XLA sums that turn rows into the offset table's gradient."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jaxpos.attention.kernels.pallas_common import (BackwardInputs, Operands, PallasSpec, block_spec, call_kernel,
                                                    column_spec, compiler_params, ids_specs, interpret_params,
                                                    kernel_dims, kernel_grid, kernel_table, keys_spec, piece_id_range,
                                                    seq_spec, table_spec, u_spec, w_spec)
from jaxpos.attention.kernels.pallas_tiles import (KeyTile, QueryTile, diagonal_sums, diagonal_visible, dot,
                                                   key_blocks, loaded_id_range, overlaps, pair_columns, pair_rows,
                                                   probabilities_and_ds, query_blocks)


def _dkdv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, ext_ref, qseg_ref, kseg_ref, keys_ref, u_ref,
                 w_ref, dk_ref, dv_ref, *, st: PallasSpec, id_range=loaded_id_range):
    """One key block of one (batch, head): dK and dV accumulated over the query blocks that see it
    (`query_blocks`)."""
    bq, bk = st.block_q, st.block_k
    k_start = pl.program_id(2) * bk
    k, v = k_ref[...], v_ref[...]
    k_ids = kseg_ref[...]
    w_rows = pair_rows(w_ref, slice(None))
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
            pair = None if u_ref is None else (pair_columns(u_ref, rows), w_rows)
            p, ds = probabilities_and_ds(QueryTile(q_start, q, do, lse_ref[rows, :], delta_ref[rows, :], q_ids, keys),
                                         KeyTile(k_start, k, v, k_ids), pair, ext_ref, st)
            dv = dv + dot(p.astype(do.dtype), do, (0, 0))
            dk = dk + dot(ds.astype(q.dtype), q, (0, 0)) * st.scale
            return dk, dv

        if not st.skip_tiles:
            return compute(carry)
        q_range = id_range("q", ib, q_ids) if st.use_q_pieces else None
        return lax.cond(overlaps(q_range, k_range, st), compute, lambda c: c, carry)

    dk, dv = lax.fori_loop(*query_blocks(k_start, bq, bk, st, st.t_pad // bq), body, carry)
    dk_ref[...] = dk.astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, ext_ref, qseg_ref, kseg_ref, keys_ref, u_ref,
               w_ref, dq_ref, du_ref, drow_ref, scratch_ref, *, st: PallasSpec, id_range=loaded_id_range):
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
    u_cols = [pair_columns(u_ref, r) for r in rows]
    rank = 0 if u_ref is None else u_ref.shape[-1]
    zeros_col = jnp.zeros((b, 1), jnp.float32)
    q_ranges = [id_range("q", first + g, ids) if st.skip_tiles and st.use_q_pieces else None
                for g, ids in enumerate(q_ids)]

    def body(jb, carry):
        dqs, chunks, dus = list(carry[0]), list(carry[1]), list(carry[2])
        k_start = jb * b
        k_ids = kseg_ref[:, pl.ds(k_start, b)]
        w_rows = pair_rows(w_ref, pl.ds(k_start, b))

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
                _, ds = probabilities_and_ds(QueryTile(q_start, qs[g], dos[g], lses[g], deltas[g], q_ids[g], keys[g]),
                                             KeyTile(k_start, k, v, k_ids), pair, ext_ref, st)
                dq = dq + dot(ds.astype(k.dtype), k, (1, 0)) * st.scale
                du = tuple(col + jnp.sum(ds * w, axis=1, keepdims=True) for col, w in zip(du, w_rows or ()))
                sums = diagonal_sums(ds, scratch_ref, st) if has_table else (zeros_b, zeros_b)
                return dq, du, *sums

            if st.skip_tiles:
                dqs[g], dus[g], low, high = lax.cond(overlaps(q_ranges[g], k_range, st), compute,
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
    # the key blocks of the group: from the first block's first (a window's near side) to the last block's end
    k_begin = key_blocks(first * b, b, b, st, num_k)[0]
    k_end = key_blocks((first + group - 1) * b, b, b, st, num_k)[1]
    dqs, chunks, dus = lax.fori_loop(k_begin, k_end, body, (tuple(jnp.zeros(x.shape, jnp.float32) for x in qs),
                                                            (zeros_b,) * (group + 1), ((zeros_col,) * rank,) * group))
    for r, dq, du in zip(rows, dqs, dus):
        dq_ref[r, :] = dq.astype(dq_ref.dtype)
        for c, col in enumerate(du):
            du_ref[r, pl.ds(c, 1)] = col
    if has_table:
        for c in range(group):  # the last chunk is always zeros after the final shift
            store(k_end + c, chunks[c])
    if has_table and not accumulate:
        def clear(jb, carry):  # chunks before a window or past the causal limit or the window
            drow_ref[pl.ds(jb, 1), :] = zeros_b
            return carry

        if st.lower is not None:
            lax.fori_loop(0, k_begin, clear, None)
        lax.fori_loop(k_end + group, num_k + group, clear, None)


def _kernel_args(x: Operands, grads: BackwardInputs, table):
    """The inputs of the backward kernels, in the order they take them."""
    return (x.q, x.k, x.v, *grads, table, x.q_pieces, x.k_pieces, x.keys, x.u, x.w)


def backward(x: Operands, out, lse, do, st: PallasSpec):
    """The backward kernels on a call's operands, its output and logsumexp and the output's gradient do ->
    (dq, dk, dv like q, k, v; the offset table's gradient [H'|1, T_pad + S_pad] float32 or None; du like u or
    None)."""
    batch, heads, t_pad, dim = kernel_dims(x.q, st)
    s_pad, bk = st.s_pad, st.block_k
    whole = lambda i: 0  # noqa: E731
    einsum = "bhtd,bhtd->bht" if st.heads_major else "bthd,bthd->bht"
    delta = jnp.einsum(einsum, out.astype(jnp.float32), do.astype(jnp.float32))[..., None]
    grads = BackwardInputs(do, lse, delta)
    table = kernel_table(x.ext, st)
    args = _kernel_args(x, grads, table)
    dim_v = x.v.shape[-1]
    full_q, full_k = seq_spec(st, t_pad, dim, whole), seq_spec(st, s_pad, dim, whole)
    full_do, full_v = seq_spec(st, t_pad, dim_v, whole), seq_spec(st, s_pad, dim_v, whole)
    dk, dv = call_kernel(
        functools.partial(_dkdv_kernel, st=st), args, st, grid=kernel_grid(st, batch, heads, s_pad // bk),
        in_specs=[full_q, seq_spec(st, bk, dim), seq_spec(st, bk, dim_v), full_do, column_spec(st, t_pad, whole),
                  column_spec(st, t_pad, whole), table_spec(table, st), *ids_specs(st, t_pad, bk, q_block=whole),
                  keys_spec(x.keys, st, t_pad, whole), u_spec(x.u, st, t_pad, whole), w_spec(x.w, st, bk)],
        out_specs=[seq_spec(st, bk, dim), seq_spec(st, bk, dim_v)],
        out_shape=[jax.ShapeDtypeStruct(x.k.shape, x.k.dtype), jax.ShapeDtypeStruct(x.v.shape, x.v.dtype)],
        name="toeplitz_attention_dkdv", q_pieces=x.q_pieces, k_pieces=x.k_pieces)

    b, group = st.block_dq, st.dq_group
    groups, chunks = t_pad // (b * group), s_pad // b + group
    row_q = seq_spec(st, group * b, dim)
    out_specs, out_shape = [row_q], [jax.ShapeDtypeStruct(x.q.shape, x.q.dtype)]
    if x.u is not None:  # the gradient of the pair term's u
        out_specs.append(u_spec(x.u, st, group * b))
        out_shape.append(jax.ShapeDtypeStruct(x.u.shape, jnp.float32))
    accumulate = x.ext is not None and st.backend == "mosaic_tpu"
    if st.table_grad == "diagonals":
        pass  # a kernel of its own, below
    elif accumulate:  # each head's table gradient [(T_pad + S_pad) / b, b], resident while the grid reduces into it
        offsets = (t_pad + s_pad) // b
        out_specs.append(block_spec(st, (None, offsets, b), lambda bb, h, i: (h, 0, 0)))
        out_shape.append(jax.ShapeDtypeStruct((heads, offsets, b), jnp.float32))
    elif x.ext is not None:  # one row of diagonal sums per group, as chunks [S_pad / b + G, b]
        out_specs.append(block_spec(st, (None, None, None, chunks, b), lambda bb, h, i: (bb, h, i, 0, 0)))
        out_shape.append(jax.ShapeDtypeStruct((batch, heads, groups, chunks, b), jnp.float32))
        # Triton's skew goes through memory: a scratch tile, discarded
        out_specs.append(block_spec(st, (None, None, None, b, b), lambda bb, h, i: (bb, h, i, 0, 0)))
        out_shape.append(jax.ShapeDtypeStruct((batch, heads, groups, b, b), jnp.float32))

    def kernel(*refs, **kwargs):  # the outputs present, in order: dq, [du], [table rows], [skew scratch]
        inputs, outputs = refs[:12], list(refs[12:])
        dq_ref = outputs.pop(0)
        du_ref = outputs.pop(0) if x.u is not None else None
        drow_ref = outputs.pop(0) if outputs else None
        scratch_ref = outputs.pop(0) if outputs else None
        _dq_kernel(*inputs, dq_ref, du_ref, drow_ref, scratch_ref, st=st, **kwargs)

    results = call_kernel(
        kernel, args, st, grid=kernel_grid(st, batch, heads, groups),
        in_specs=[row_q, full_k, full_v, seq_spec(st, group * b, dim_v), column_spec(st, group * b),
                  column_spec(st, group * b), table_spec(table, st),
                  *ids_specs(st, group * b, s_pad, k_block=whole), keys_spec(x.keys, st, group * b),
                  u_spec(x.u, st, group * b), w_spec(x.w, st, s_pad, whole)],
        out_specs=out_specs, out_shape=out_shape, name="toeplitz_attention_dq", q_pieces=x.q_pieces,
        k_pieces=x.k_pieces, reduces=accumulate)
    dq, results = results[0], list(results[1:])  # then [du], [table rows], as the kernel's outputs
    du = results.pop(0) if x.u is not None else None
    d_ext = None
    if x.ext is not None and st.table_grad == "diagonals":
        d_ext = _table_grad_by_diagonals(x, grads, st)
    elif accumulate:
        d_ext = results[0].reshape(heads, -1)
        d_ext = jnp.sum(d_ext, axis=0, keepdims=True) if x.ext.shape[0] == 1 else d_ext
    elif x.ext is not None:
        d_ext = _sum_rows(results[0].reshape(batch, heads, groups, chunks * b), x.ext.shape[0], group * b)
    return dq, dk, dv, d_ext, du


def _table_grad_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, ext_ref, qseg_ref, kseg_ref, keys_ref,
                       u_ref, w_ref, out_ref, scratch_ref, *, st: PallasSpec, batch: int):
    """table_grad="diagonals": one (head, block diagonal d) of the table gradient. The tiles (i, i + d - nq + 1)
    of every batch row recompute dS and add it up in registers; one skew at the end (`diagonal_sums`) gives the
    window of diagonal sums, out [2, b] = (low, high): offset chunks d and d + 1 of the table gradient."""
    b = st.block_dq
    nq, nk = st.t_pad // b, st.s_pad // b
    d = pl.program_id(1)
    shift = d - (nq - 1)  # key block minus query block on this diagonal
    first_i = jnp.maximum(0, -shift)
    count = jnp.minimum(nq, nk - shift) - first_i
    count = jnp.where(diagonal_visible(shift, b, st), count, 0)  # a diagonal wholly past a limit has no tiles

    def body(step, acc):
        bb, i = lax.div(step, count), first_i + lax.rem(step, count)
        q_start, k_start = i * b, (i + shift) * b
        rows, cols = pl.ds(q_start, b), pl.ds(k_start, b)
        q_ids, k_ids = qseg_ref[bb, rows, :], kseg_ref[bb, :, cols]

        def compute(acc):
            keys = None if keys_ref is None else keys_ref[bb, rows, :]
            pair = None if u_ref is None else (pair_columns(u_ref, rows, bb), pair_rows(w_ref, cols, bb))
            query = QueryTile(q_start, q_ref[bb, rows, :], do_ref[bb, rows, :], lse_ref[bb, rows, :],
                              delta_ref[bb, rows, :], q_ids, keys)
            _, ds = probabilities_and_ds(query, KeyTile(k_start, k_ref[bb, cols, :], v_ref[bb, cols, :], k_ids),
                                         pair, ext_ref, st)
            return acc + ds

        if not st.skip_tiles:
            return compute(acc)
        return lax.cond(overlaps(piece_id_range(q_ids), piece_id_range(k_ids), st), compute, lambda a: a, acc)

    acc = lax.fori_loop(0, batch * count, body, jnp.zeros((b, b), jnp.float32))
    low, high = diagonal_sums(acc, scratch_ref, st)
    out_ref[0:1, :] = low
    out_ref[1:2, :] = high


def _table_grad_by_diagonals(x: Operands, grads: BackwardInputs, st: PallasSpec):
    """Offset-table gradient [H'|1, T_pad + S_pad] by `_table_grad_kernel`, through windows [H, diagonals, 2, b]
    and the skews' scratch [H, diagonals, b, b] (H*(T + S)*(b + 2) floats), at the price of recomputing dS (the
    q.k and dO.v products) once more."""
    batch, heads, t_pad, _ = kernel_dims(x.q, st)
    b = st.block_dq
    diagonals = (t_pad + st.s_pad) // b - 1
    ext, u = x.ext, x.u

    def full(y):  # every batch row and position of head h
        return pl.BlockSpec((batch, y.shape[1], None, y.shape[-1]), lambda h, d: (0, 0, h, 0))

    windows, _ = pl.pallas_call(
        functools.partial(_table_grad_kernel, st=st, batch=batch),
        grid=(heads, diagonals),
        in_specs=[full(x.q), full(x.k), full(x.v), full(grads.do),
                  pl.BlockSpec((batch, None, t_pad, 1), lambda h, d: (0, h, 0, 0)),
                  pl.BlockSpec((batch, None, t_pad, 1), lambda h, d: (0, h, 0, 0)),
                  pl.BlockSpec((None, ext.shape[1]), lambda h, d: (0 if ext.shape[0] == 1 else h, 0)),
                  pl.BlockSpec(x.q_pieces.shape, lambda h, d: (0, 0, 0)),
                  pl.BlockSpec(x.k_pieces.shape, lambda h, d: (0, 0, 0)),
                  None if x.keys is None else pl.BlockSpec((batch, None, t_pad, 1), lambda h, d: (0, h, 0, 0)),
                  None if u is None else pl.BlockSpec((batch, None, t_pad, u.shape[-1]), lambda h, d: (0, h, 0, 0)),
                  None if x.w is None else pl.BlockSpec(x.w.shape, lambda h, d: (0, 0, 0))],
        out_specs=[pl.BlockSpec((None, None, 2, b), lambda h, d: (h, d, 0, 0)),
                   pl.BlockSpec((None, None, b, b), lambda h, d: (h, d, 0, 0))],  # the skew's scratch, discarded
        out_shape=[jax.ShapeDtypeStruct((heads, diagonals, 2, b), jnp.float32),
                   jax.ShapeDtypeStruct((heads, diagonals, b, b), jnp.float32)],
        interpret=interpret_params(st), compiler_params=compiler_params(st), name="toeplitz_attention_table_grad",
    )(*_kernel_args(x, grads, ext))
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
