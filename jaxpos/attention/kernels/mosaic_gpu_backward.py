"""The Mosaic GPU backward kernels (`mosaic_gpu`): dQ (with a pair term's du) on the forward's walk over key
blocks, dK and dV on transposed tiles over query blocks, and the table's gradient per block diagonal."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jaxpos.attention.kernels.mosaic_gpu_common import (BLOCK, CONSUMER_REGISTERS, HALF, LOG2E, PRODUCER_REGISTERS,
                                                        BackwardInputs, MosaicGpuSpec, Operands, Table, bases_bytes,
                                                        cta_inputs, kernel_preamble, nbytes, own_rows,
                                                        pipeline_stages, plgpu_module, producer_loop, run_kernel,
                                                        swizzled_smem)
from jaxpos.attention.kernels.mosaic_gpu_forward import KeyBlockKernel, key_block_kernel, load_query_extras
from jaxpos.attention.kernels.mosaic_gpu_tiles import (apply_mask, in_pieces, inverse_keep, keep_mask, keep_sign,
                                                       kept_weights, key_block_offsets, minus_delta,
                                                       query_block_offsets, score_gradient, tile_logits, tile_mask,
                                                       walk, with_pair)

# --- dQ --------------------------------------------------------------------------------------------------------

def query_gradients(x: Operands, grads: BackwardInputs, table: Table | None, visits: jax.Array,
                    spec: MosaicGpuSpec):
    """dQ [B, T_pad, H, D]: the forward's walk over key blocks (visits as the forward's), with dS = P * (dP - delta)
    times K; with a pair term also du [B, H, r, T_pad] = dS w (float32)."""
    plgpu = plgpu_module()
    ops, sizes, inputs = kernel_preamble(x, grads, table, visits, spec)
    dim, dim_v, dtype = sizes.dim, sizes.dim_v, sizes.dtype

    def consumer(refs, own, stream, cta):
        (q_s, do_s, lse_s, delta_s, qid_s), extras, own_bar = own
        b, h, qc, wg = cta.b, cta.h, cta.qc, cta.wg
        row0 = qc * BLOCK + wg * HALF
        rows = pl.ds(row0, HALF)
        own_rows(wg, [(refs["q"].at[b, rows, h], q_s.at[wg]), (refs["do"].at[b, rows, h], do_s.at[wg]),
                      (refs["lse"].at[b, h, rows], lse_s.at[wg]), (refs["delta"].at[b, h, rows], delta_s.at[wg]),
                      (refs["q_pieces"].at[b, rows], qid_s.at[wg])]
                 + cta.query_extra_copies(refs, extras, rows, spec), own_bar)
        q_ids, lse, delta = (ops.load(ref.at[wg], "rows") for ref in (qid_s, lse_s, delta_s))
        row_keys, u_rows = load_query_extras(ops, extras, wg, spec)

        def step(i, carry, crossing, piece):
            dq, du = carry
            slot = lax.rem(i, stream.stages)
            kc = cta.visits[1 + i]

            def weights(issue, read):
                """P from S = Q K^T while dP = dO V^T runs (FlashAttention-3's backward)."""

                def product(k_ref):
                    issue(0, q_s.at[wg], k_ref, transpose_b=True)
                    piece.wait(stream.v_ready.at[slot])
                    issue(1, do_s.at[wg], piece.of(stream.v.at[slot]), transpose_b=True)
                    return read(0, 1)

                s = stream.logits(product, slot, kc, cta, q_ids, row0, u_rows, crossing, piece)
                return jnp.exp2(s - lax.broadcast_in_dim(lse, s.shape, [0]))

            (_, dp), p = ops.products([(HALF, piece.width), minus_delta(lambda: delta, 0, spec, piece.width)],
                                      weights, jax.ShapeDtypeStruct((HALF, piece.width), jnp.float32))
            piece.free(stream.v_free.at[slot])
            kept = keep_mask(ops, row_keys, kc * BLOCK + piece.start, spec, False, piece.width)
            ds = score_gradient(keep_sign(p, kept), dp, lambda: delta, 0, spec)
            # w read again here, not held across the products: a rank-r pair term's columns are up to 32r registers
            du = tuple(d + jnp.sum(ds * lax.broadcast_in_dim(w, ds.shape, [1]), axis=1)
                       for d, w in zip(du, stream.pair_keys(slot, piece)))
            piece.free(stream.tile_free.at[slot])  # with the ids and w
            dq = ops.mma(ds.astype(dtype), piece.of(stream.k.at[slot]), dq)
            piece.free(stream.k_free.at[slot])
            return dq, du

        du0 = tuple(ops.full((HALF,), 0.0, "rows") for _ in range(spec.pair_rank))
        dq, du = walk(cta.visits, cta.count, in_pieces(step, spec.pieces),
                      (ops.full((HALF, dim), 0.0, "wgmma"), du0), functools.partial(key_block_offsets, row0), True,
                      spec)
        q_s[wg] = (dq * spec.scale).astype(dtype)
        u_s = extras[1]
        for g, d in enumerate(du):  # u's buffer is free: du goes out through it
            u_s[wg, g] = d
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(q_s.at[wg], refs["out0"].at[b, rows, h])
        if spec.pair_rank:
            plgpu.copy_smem_to_gmem(u_s.at[wg], refs["out1"].at[b, h, :, rows])
        plgpu.wait_smem_to_gmem(0)

    own_buffers = (swizzled_smem((2, HALF, dim), dtype), swizzled_smem((2, HALF, dim_v), dtype),
                   plgpu.SMEM((2, HALF), jnp.float32), plgpu.SMEM((2, HALF), jnp.float32),
                   plgpu.SMEM((2, HALF), jnp.int32))
    own_bytes = nbytes((2, HALF, dim), dtype) + nbytes((2, HALF, dim_v), dtype) + 3 * nbytes((2, HALF), jnp.float32)
    out_type = jax.ShapeDtypeStruct(x.q.shape, dtype)
    if spec.pair_rank:
        out_type = (out_type, jax.ShapeDtypeStruct(x.pair_u.shape, jnp.float32))
    kernel = KeyBlockKernel(name="toeplitz_attention_mgpu_dq", consumer=consumer, own_buffers=own_buffers,
                            own_copies=5, own_bytes=own_bytes, out_type=out_type)
    return key_block_kernel(kernel, ops, sizes, inputs, spec)


# --- dK, dV ----------------------------------------------------------------------------------------------------

def key_value_gradients(x: Operands, grads: BackwardInputs, table_t: Table | None, visits: jax.Array,
                        spec: MosaicGpuSpec):
    """dK [B, S_pad, H, D] and dV [B, S_pad, H, Dv]: per key block, over the query blocks of its visit list (visits
    [B, nk, 1 + nq, padded]), on transposed tiles (keys as rows): dV += P^T dO, dK += dS^T Q."""
    plgpu = plgpu_module()
    ops, sizes, inputs = kernel_preamble(x, grads, table_t, visits, spec)
    dim, dim_v, dtype, has_table = sizes.dim, sizes.dim_v, sizes.dtype, sizes.has_table
    per_stage = (nbytes((BLOCK, dim), dtype) + nbytes((BLOCK, dim_v), dtype) + 2 * nbytes((BLOCK,), jnp.float32)
                 + (2 if spec.dropout else 1) * nbytes((BLOCK,), jnp.int32)
                 + (nbytes((BLOCK, BLOCK), dtype) if has_table else 0)
                 + nbytes((spec.pair_rank, BLOCK), jnp.float32))
    fixed = (nbytes((2, HALF, dim), dtype) + nbytes((2, HALF, dim_v), dtype) + nbytes((2, HALF), jnp.int32)
             + nbytes((2, spec.pair_rank, HALF), jnp.float32)
             + 4 * visits.shape[-1] + bases_bytes(inputs, sizes))
    stages = pipeline_stages(per_stage, fixed, "dK/dV")

    def body(refs, scratch):
        (k_s, v_s, kid_s, w_s), own_bar, (vis_s, base_s), cta_bar, \
            (q_s, do_s, lse_s, delta_s, qid_s, t_s, rk_s, u_s), \
            (q_bar, do_bar, lse_bar, delta_bar, qid_bar, t_bar, rk_bar, u_bar), (q_free, do_free, t_free) = scratch
        kc, h, b = lax.axis_index("k"), lax.axis_index("heads"), lax.axis_index("batch")
        wg = lax.axis_index("wg")
        th = h if sizes.table_heads > 1 else 0
        cta_inputs(wg, [(refs["visits"].at[b, kc], vis_s)] + ([(refs["bases"].at[th], base_s)] if has_table else []),
                   cta_bar)
        count = vis_s[0]

        @pl.when(wg < 2)
        def _consumer():
            ops.set_registers(CONSUMER_REGISTERS, "increase")
            key0 = kc * BLOCK + wg * HALF
            keys = pl.ds(key0, HALF)
            own_rows(wg, [(refs["k"].at[b, keys, h], k_s.at[wg]), (refs["v"].at[b, keys, h], v_s.at[wg]),
                          (refs["k_pieces"].at[b, keys], kid_s.at[wg])]
                     + ([(refs["pair_w"].at[b, :, keys], w_s.at[wg])] if spec.pair_rank else []), own_bar)
            k_ids = ops.load(kid_s.at[wg], "rows")
            w_rows = [ops.load(w_s.at[wg, g], "rows") for g in range(spec.pair_rank)]

            def step(i, carry, crossing, piece):
                dk, dv = carry
                slot = lax.rem(i, stages)
                qc = vis_s[1 + i]
                piece.wait(lse_bar.at[slot])
                # the product starts from -lse (in q.k units): lse's column vector dies before the tile is live
                lse = ops.load(lse_s.at[slot], "cols", rows=piece.span) * (-1.0 / (spec.scale * LOG2E))
                piece.wait(q_bar.at[slot])
                s = ops.mma(k_s.at[wg], piece.of(q_s.at[slot]), lax.broadcast_in_dim(lse, (HALF, piece.width), [1]),
                            transpose_b=True)
                piece.wait(qid_bar.at[slot])
                if has_table:
                    piece.wait(t_bar.at[slot])
                    s = tile_logits(ops, s, t_s.at[slot], base_s[spec.table_diagonal(qc, kc)], (wg * HALF, HALF), spec,
                                    piece.span)
                else:
                    s = tile_logits(ops, s, None, None, None, spec)
                if spec.pair_rank:
                    piece.wait(u_bar.at[slot])
                    s = with_pair(s, [ops.load(u_s.at[slot, g], "cols", rows=piece.span)
                                      for g in range(spec.pair_rank)], w_rows, True)
                mask = tile_mask(ops, k_ids, ops.load(qid_s.at[slot], "cols", rows=piece.span), key0,
                                 qc * BLOCK + piece.start, spec, True, crossing)
                p = jnp.exp2(apply_mask(s, mask))
                if spec.dropout:
                    piece.wait(rk_bar.at[slot])
                    p = keep_sign(p, keep_mask(ops, ops.load(rk_s.at[slot], "cols", rows=piece.span), key0, spec,
                                               True, piece.width))
                piece.wait(do_bar.at[slot])
                piece.wait(delta_bar.at[slot])
                load_delta = functools.partial(ops.load, delta_s.at[slot], "cols", rows=piece.span)
                dv = ops.mma(kept_weights(p, spec).astype(dtype), piece.of(do_s.at[slot]), dv)
                dp = ops.mma(v_s.at[wg], piece.of(do_s.at[slot]), minus_delta(load_delta, 1, spec, piece.width),
                             transpose_b=True)
                ds = score_gradient(p, dp, load_delta, 1, spec)
                piece.free(t_free.at[slot])  # with the ids, lse, delta, row keys and u of the slot
                piece.free(do_free.at[slot])
                dk = ops.mma(ds.astype(dtype), piece.of(q_s.at[slot]), dk)
                piece.free(q_free.at[slot])
                return dk, dv

            carry = (ops.full((HALF, dim), 0.0, "wgmma"), ops.full((HALF, dim_v), 0.0, "wgmma"))
            dk, dv = walk(vis_s, count, in_pieces(step, spec.pieces), carry,
                          functools.partial(query_block_offsets, key0), False, spec)
            k_s[wg] = (dk * spec.scale).astype(dtype)
            v_s[wg] = (dv * inverse_keep(spec)).astype(dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(k_s.at[wg], refs["out0"].at[b, keys, h])
            plgpu.copy_smem_to_gmem(v_s.at[wg], refs["out1"].at[b, keys, h])
            plgpu.wait_smem_to_gmem(0)

        @pl.when(wg == 2)
        def _producer():
            ops.set_registers(PRODUCER_REGISTERS, "decrease")

            def fetch(i, slot):
                qc = vis_s[1 + i]
                queries = pl.ds(qc * BLOCK, BLOCK)
                plgpu.copy_gmem_to_smem(refs["q"].at[b, queries, h], q_s.at[slot], q_bar.at[slot])
                plgpu.copy_gmem_to_smem(refs["q_pieces"].at[b, queries], qid_s.at[slot], qid_bar.at[slot])
                plgpu.copy_gmem_to_smem(refs["lse"].at[b, h, queries], lse_s.at[slot], lse_bar.at[slot])
                if has_table:
                    plgpu.copy_gmem_to_smem(refs["tiles"].at[th, spec.table_diagonal(qc, kc)], t_s.at[slot],
                                            t_bar.at[slot])
                plgpu.copy_gmem_to_smem(refs["do"].at[b, queries, h], do_s.at[slot], do_bar.at[slot])
                plgpu.copy_gmem_to_smem(refs["delta"].at[b, h, queries], delta_s.at[slot], delta_bar.at[slot])
                if spec.dropout:
                    plgpu.copy_gmem_to_smem(refs["row_keys"].at[b, h, queries], rk_s.at[slot], rk_bar.at[slot])
                if spec.pair_rank:
                    plgpu.copy_gmem_to_smem(refs["pair_u"].at[b, h, :, queries], u_s.at[slot], u_bar.at[slot])

            producer_loop(count, stages, (q_free, t_free, do_free), fetch)

    scratch = (
        (swizzled_smem((2, HALF, dim), dtype), swizzled_smem((2, HALF, dim_v), dtype),
         plgpu.SMEM((2, HALF), jnp.int32),
         plgpu.SMEM((2, spec.pair_rank, HALF), jnp.float32) if spec.pair_rank else None),
        plgpu.Barrier(num_barriers=8 if spec.pair_rank else 6),
        (plgpu.SMEM(visits.shape[-1:], jnp.int32), plgpu.SMEM(inputs["bases"].shape[-1:], jnp.float32)),
        plgpu.Barrier(num_barriers=2),
        (swizzled_smem((stages, BLOCK, dim), dtype), swizzled_smem((stages, BLOCK, dim_v), dtype),
         plgpu.SMEM((stages, BLOCK), jnp.float32), plgpu.SMEM((stages, BLOCK), jnp.float32),
         plgpu.SMEM((stages, BLOCK), jnp.int32),
         swizzled_smem((stages, BLOCK, BLOCK), dtype) if has_table else None,
         plgpu.SMEM((stages, BLOCK), jnp.int32) if spec.dropout else None,
         plgpu.SMEM((stages, spec.pair_rank, BLOCK), jnp.float32) if spec.pair_rank else None),
        (plgpu.Barrier(num_barriers=stages),) * 6
        + tuple(plgpu.Barrier(num_barriers=stages) if used else None for used in (spec.dropout, spec.pair_rank)),
        (plgpu.Barrier(num_arrivals=2, num_barriers=stages),) * 3,
    )
    out_type = (jax.ShapeDtypeStruct(x.k.shape, dtype), jax.ShapeDtypeStruct(x.v.shape, dtype))
    return run_kernel("toeplitz_attention_mgpu_dkdv", body, inputs, out_type, scratch,
                      {"k": spec.nk, "heads": sizes.heads, "batch": sizes.batch}, spec)


# --- the table's gradient --------------------------------------------------------------------------------------

def tile_gradients(x: Operands, grads: BackwardInputs, table: Table, visits: jax.Array, spec: MosaicGpuSpec):
    """dS summed over each block diagonal's tiles, batch rows and (shared table) heads -> [H', nd, 128, 128]
    float32, w.r.t. natural-log logits, for the nd block diagonals of `spec.diagonals`; visits [nd, 1 + B*nq,
    padded] (`diagonal_visits`). Each diagonal's walk is cut into `spec.table_splits` CTAs, whose partial tiles
    XLA adds up."""
    plgpu = plgpu_module()
    ops, sizes, inputs = kernel_preamble(x, grads, table, visits, spec)
    dim, dim_v, dtype, table_heads = sizes.dim, sizes.dim_v, sizes.dtype, sizes.table_heads
    diagonals = table.tiles.shape[1]
    group = sizes.heads // table_heads  # heads summed into one table head
    splits = spec.table_splits
    per_stage = (2 * nbytes((BLOCK, dim), dtype) + 2 * nbytes((BLOCK, dim_v), dtype)
                 + 2 * nbytes((BLOCK,), jnp.float32) + (3 if spec.dropout else 2) * nbytes((BLOCK,), jnp.int32)
                 + 2 * nbytes((spec.pair_rank, BLOCK), jnp.float32))
    fixed = (nbytes((BLOCK, BLOCK), dtype) + nbytes((2, HALF, HALF), jnp.float32)
             + 4 * visits.shape[-1] + bases_bytes(inputs, sizes))
    stages = pipeline_stages(per_stage, fixed, "table-gradient")

    def body(refs, scratch):
        (t_s, out_s, vis_s, base_s, q_s, do_s, lse_s, delta_s, qid_s, k_s, v_s, kid_s, rk_s, u_s, w_s), \
            (cta_bar, q_bar, do_bar, lse_bar, delta_bar, qid_bar, k_bar, v_bar, kid_bar, rk_bar, u_bar, w_bar), \
            (q_free, k_free) = scratch
        d, th, split = lax.axis_index("diagonal"), lax.axis_index("heads"), lax.axis_index("split")
        wg = lax.axis_index("wg")
        cta_inputs(wg, [(refs["visits"].at[d], vis_s), (refs["bases"].at[th], base_s),
                        (refs["tiles"].at[th, d], t_s)], cta_bar)
        pairs = vis_s[0] * group  # (head of the group, live tile) pairs on the diagonal
        chunk = lax.div(pairs + splits - 1, splits)
        first = jnp.minimum(split * chunk, pairs)  # this CTA's pairs: first, first + 1, ... (steps of them)
        steps = jnp.minimum(first + chunk, pairs) - first
        shift = d + spec.diagonals[0] - (spec.nq - 1)  # key block minus query block on this diagonal

        def tile_of(i):
            """(batch row, query block, head) of step i."""
            pair = first + i
            head = th * group + lax.div(pair, vis_s[0])
            entry = vis_s[1 + lax.rem(pair, vis_s[0])]
            return lax.div(entry, spec.nq), lax.rem(entry, spec.nq), head

        @pl.when(wg < 2)
        def _consumer():
            ops.set_registers(CONSUMER_REGISTERS, "increase")
            base = base_s[d]

            def step(i, grad):
                slot = lax.rem(i, stages)
                _, qc, _ = tile_of(i)
                row0 = qc * BLOCK + wg * HALF
                plgpu.barrier_wait(q_bar.at[2 * slot + wg])
                plgpu.barrier_wait(k_bar.at[slot])
                s = ops.mma(q_s.at[slot, wg], k_s.at[slot], (HALF, BLOCK), transpose_b=True)
                plgpu.barrier_wait(qid_bar.at[2 * slot + wg])
                plgpu.barrier_wait(lse_bar.at[2 * slot + wg])
                plgpu.barrier_wait(kid_bar.at[slot])
                s = tile_logits(ops, s, t_s, base, (wg * HALF, HALF), spec)
                if spec.pair_rank:
                    plgpu.barrier_wait(u_bar.at[2 * slot + wg])
                    plgpu.barrier_wait(w_bar.at[slot])
                    s = with_pair(s, [ops.load(u_s.at[slot, wg, g], "rows") for g in range(spec.pair_rank)],
                                  [ops.load(w_s.at[slot, g], "cols") for g in range(spec.pair_rank)], False)
                mask = tile_mask(ops, ops.load(qid_s.at[slot, wg], "rows"), ops.load(kid_s.at[slot], "cols"),
                                 row0, (qc + shift) * BLOCK, spec, False)
                lse = ops.load(lse_s.at[slot, wg], "rows")
                p = jnp.exp2(apply_mask(s, mask) - lax.broadcast_in_dim(lse, s.shape, [0]))
                if spec.dropout:
                    plgpu.barrier_wait(rk_bar.at[2 * slot + wg])
                    p = keep_sign(p, keep_mask(ops, ops.load(rk_s.at[slot, wg], "rows"), (qc + shift) * BLOCK, spec,
                                               False))
                plgpu.barrier_wait(do_bar.at[2 * slot + wg])
                plgpu.barrier_wait(v_bar.at[slot])
                plgpu.barrier_wait(delta_bar.at[2 * slot + wg])
                load_delta = functools.partial(ops.load, delta_s.at[slot, wg], "rows")
                dp = ops.mma(do_s.at[slot, wg], v_s.at[slot], minus_delta(load_delta, 0, spec), transpose_b=True)
                grad = grad + score_gradient(p, dp, load_delta, 0, spec)
                plgpu.barrier_arrive(q_free.at[slot])
                plgpu.barrier_arrive(k_free.at[slot])
                return grad

            grad = lax.fori_loop(0, steps, step, ops.full((HALF, BLOCK), 0.0, "wgmma"))
            for half in range(2):  # through a [64, 64] float32 buffer per consumer, one column half at a time
                out_s[wg] = grad[:, half * HALF:(half + 1) * HALF]
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(out_s.at[wg], refs["out0"].at[split, th, d, pl.ds(wg * HALF, HALF),
                                                                      pl.ds(half * HALF, HALF)])
                plgpu.wait_smem_to_gmem(0)

        @pl.when(wg == 2)
        def _producer():
            ops.set_registers(PRODUCER_REGISTERS, "decrease")

            def fetch(i, slot):
                b, qc, h = tile_of(i)

                keys = pl.ds((qc + shift) * BLOCK, BLOCK)
                plgpu.copy_gmem_to_smem(refs["k"].at[b, keys, h], k_s.at[slot], k_bar.at[slot])
                plgpu.copy_gmem_to_smem(refs["k_pieces"].at[b, keys], kid_s.at[slot], kid_bar.at[slot])
                if spec.pair_rank:
                    plgpu.copy_gmem_to_smem(refs["pair_w"].at[b, :, keys], w_s.at[slot], w_bar.at[slot])
                for half in range(2):
                    rows = pl.ds(qc * BLOCK + half * HALF, HALF)
                    plgpu.copy_gmem_to_smem(refs["q"].at[b, rows, h], q_s.at[slot, half], q_bar.at[2 * slot + half])
                    plgpu.copy_gmem_to_smem(refs["q_pieces"].at[b, rows], qid_s.at[slot, half],
                                            qid_bar.at[2 * slot + half])
                    plgpu.copy_gmem_to_smem(refs["lse"].at[b, h, rows], lse_s.at[slot, half],
                                            lse_bar.at[2 * slot + half])
                    if spec.dropout:
                        plgpu.copy_gmem_to_smem(refs["row_keys"].at[b, h, rows], rk_s.at[slot, half],
                                                rk_bar.at[2 * slot + half])
                    if spec.pair_rank:
                        plgpu.copy_gmem_to_smem(refs["pair_u"].at[b, h, :, rows], u_s.at[slot, half],
                                                u_bar.at[2 * slot + half])
                plgpu.copy_gmem_to_smem(refs["v"].at[b, keys, h], v_s.at[slot], v_bar.at[slot])
                for half in range(2):
                    rows = pl.ds(qc * BLOCK + half * HALF, HALF)
                    plgpu.copy_gmem_to_smem(refs["do"].at[b, rows, h], do_s.at[slot, half], do_bar.at[2 * slot + half])
                    plgpu.copy_gmem_to_smem(refs["delta"].at[b, h, rows], delta_s.at[slot, half],
                                            delta_bar.at[2 * slot + half])

            producer_loop(steps, stages, (q_free, k_free), fetch)

    halves = (stages, 2)
    scratch = (
        (swizzled_smem((BLOCK, BLOCK), dtype), plgpu.SMEM((2, HALF, HALF), jnp.float32),
         plgpu.SMEM(visits.shape[-1:], jnp.int32), plgpu.SMEM(inputs["bases"].shape[-1:], jnp.float32),
         swizzled_smem((*halves, HALF, dim), dtype), swizzled_smem((*halves, HALF, dim_v), dtype),
         plgpu.SMEM((*halves, HALF), jnp.float32), plgpu.SMEM((*halves, HALF), jnp.float32),
         plgpu.SMEM((*halves, HALF), jnp.int32), swizzled_smem((stages, BLOCK, dim), dtype),
         swizzled_smem((stages, BLOCK, dim_v), dtype), plgpu.SMEM((stages, BLOCK), jnp.int32),
         plgpu.SMEM((*halves, HALF), jnp.int32) if spec.dropout else None,
         plgpu.SMEM((*halves, spec.pair_rank, HALF), jnp.float32) if spec.pair_rank else None,
         plgpu.SMEM((stages, spec.pair_rank, BLOCK), jnp.float32) if spec.pair_rank else None),
        (plgpu.Barrier(num_barriers=3),) + (plgpu.Barrier(num_barriers=2 * stages),) * 5
        + (plgpu.Barrier(num_barriers=stages),) * 3
        + (plgpu.Barrier(num_barriers=2 * stages) if spec.dropout else None,)
        + ((plgpu.Barrier(num_barriers=2 * stages), plgpu.Barrier(num_barriers=stages)) if spec.pair_rank
           else (None, None)),
        (plgpu.Barrier(num_arrivals=2, num_barriers=stages),) * 2,
    )
    out_type = jax.ShapeDtypeStruct((splits, table_heads, diagonals, BLOCK, BLOCK), jnp.float32)
    partials = run_kernel("toeplitz_attention_mgpu_table_grad", body, inputs, out_type, scratch,
                          {"diagonal": diagonals, "heads": table_heads, "split": splits}, spec)
    return jnp.sum(partials, axis=0)
