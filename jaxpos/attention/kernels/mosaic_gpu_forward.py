"""The Mosaic GPU forward kernel (`mosaic_gpu`), and the frame it shares with the dQ kernel: a CTA owns 128 query
rows and walks its visit list of key blocks, which the producer streams into shared memory (`KeyBlocks`)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jaxpos.attention.kernels.mosaic_gpu_common import (BLOCK, CONSUMER_REGISTERS, HALF, NEG, PRODUCER_REGISTERS,
                                                        KernelSizes, MosaicGpuSpec, Operands, Ops, Table,
                                                        bases_bytes, cta_inputs, kernel_preamble, nbytes, own_rows,
                                                        pipeline_stages, plgpu_module, producer_loop, run_kernel,
                                                        swizzled_smem)
from jaxpos.attention.kernels.mosaic_gpu_tiles import (Piece, apply_mask, dropped, keep_mask, key_block_offsets,
                                                       tile_logits, tile_mask, walk, with_pair)


# --- the frame of the forward and dQ kernels --------------------------------------------------------------------

def query_extras_scratch(spec: MosaicGpuSpec):
    """A forward or dQ consumer's buffers for its rows' dropout keys and pair vectors u (None: not in the call)."""
    plgpu = plgpu_module()
    return (plgpu.SMEM((2, HALF), jnp.int32) if spec.dropout else None,
            plgpu.SMEM((2, spec.pair_rank, HALF), jnp.float32) if spec.pair_rank else None)


@dataclasses.dataclass(frozen=True)
class Cta:
    """One CTA of a key-block kernel as its warpgroups see it: where it is in the grid, which warpgroup runs, and
    what every warpgroup read first (the visit list and the table's bases, in shared memory)."""

    b: Any  # batch row
    h: Any  # head
    th: Any  # table head (0: one table for every head)
    qc: Any  # query block
    wg: Any  # warpgroup: consumers 0 and 1, the producer 2
    visits: Any  # the visit list: its count, then the key blocks
    count: Any  # visits[0]
    bases: Any  # the bases of the table head's block diagonals

    def query_extra_copies(self, refs, extras, rows, spec: MosaicGpuSpec):
        """(src, dst) copies of a consumer's rows' dropout keys and u into `query_extras_scratch`, for
        `own_rows`."""
        rk_s, u_s = extras
        return (([(refs["row_keys"].at[self.b, self.h, rows], rk_s.at[self.wg])] if spec.dropout else [])
                + ([(refs["pair_u"].at[self.b, self.h, :, rows], u_s.at[self.wg])] if spec.pair_rank else []))


def load_query_extras(ops: Ops, extras, wg, spec: MosaicGpuSpec):
    """A consumer's rows' dropout keys ([64] or None) and the r vectors of u ([64] each), once copied."""
    rk_s, u_s = extras
    return (ops.load(rk_s.at[wg], "rows") if spec.dropout else None,
            [ops.load(u_s.at[wg, g], "rows") for g in range(spec.pair_rank)])


class KeyBlocks:
    """The stream of the forward and dQ kernels: for each visited key block, K, V, the key ids (and a pair term's
    key vectors w) and the table's tile of the CTA's block diagonal, `stages` slots deep, with a barrier per buffer
    and slot and "free" barriers (K, V, and tile with ids and w) that both consumers arrive on."""

    def __init__(self, buffers, ready, free, stages: int, ops: Ops, sizes: KernelSizes, spec: MosaicGpuSpec):
        self.k, self.v, self.tile, self.ids, self.w = buffers
        self.k_ready, self.v_ready, self.tile_ready, self.ids_ready, *self.w_ready = ready
        self.k_free, self.v_free, self.tile_free = free
        self.stages = stages
        self.ops, self.sizes, self.spec = ops, sizes, spec

    @staticmethod
    def scratch(stages: int, sizes: KernelSizes, spec: MosaicGpuSpec):
        plgpu = plgpu_module()
        pair_rank = spec.pair_rank
        return ((swizzled_smem((stages, BLOCK, sizes.dim), sizes.dtype),
                 swizzled_smem((stages, BLOCK, sizes.dim_v), sizes.dtype),
                 swizzled_smem((stages, BLOCK, BLOCK), sizes.dtype) if sizes.has_table else None,
                 plgpu.SMEM((stages, BLOCK), jnp.int32),
                 plgpu.SMEM((stages, pair_rank, BLOCK), jnp.float32) if pair_rank else None),
                (plgpu.Barrier(num_barriers=stages),) * (5 if pair_rank else 4),
                (plgpu.Barrier(num_arrivals=2, num_barriers=stages),) * 3)

    @staticmethod
    def bytes_per_stage(sizes: KernelSizes, spec: MosaicGpuSpec) -> int:
        return (nbytes((BLOCK, sizes.dim), sizes.dtype) + nbytes((BLOCK, sizes.dim_v), sizes.dtype)
                + nbytes((BLOCK,), jnp.int32) + (nbytes((BLOCK, BLOCK), sizes.dtype) if sizes.has_table else 0)
                + nbytes((spec.pair_rank, BLOCK), jnp.float32))

    def produce(self, refs, cta: Cta):
        """The producer: K, key ids (and pair features w), tile, V of visit-list entry i into slot i % stages."""
        plgpu = plgpu_module()
        b, h, spec = cta.b, cta.h, self.spec

        def fetch(i, slot):
            kc = cta.visits[1 + i]
            keys = pl.ds(kc * BLOCK, BLOCK)
            plgpu.copy_gmem_to_smem(refs["k"].at[b, keys, h], self.k.at[slot], self.k_ready.at[slot])
            plgpu.copy_gmem_to_smem(refs["k_pieces"].at[b, keys], self.ids.at[slot], self.ids_ready.at[slot])
            if spec.pair_rank:
                plgpu.copy_gmem_to_smem(refs["pair_w"].at[b, :, keys], self.w.at[slot], self.w_ready[0].at[slot])
            if self.sizes.has_table:
                plgpu.copy_gmem_to_smem(refs["tiles"].at[cta.th, spec.table_diagonal(cta.qc, kc)], self.tile.at[slot],
                                        self.tile_ready.at[slot])
            plgpu.copy_gmem_to_smem(refs["v"].at[b, keys, h], self.v.at[slot], self.v_ready.at[slot])

        producer_loop(cta.count, self.stages, (self.k_free, self.tile_free, self.v_free), fetch)

    def logits(self, product, slot, kc, cta: Cta, q_ids, row0, u_rows=(), crossing=False, piece=Piece()):
        """A consumer's base-2 logits [64, 128] of key block kc (or [64, width] of its keys `piece`; masked entries
        NEG; q_ids, u_rows: its rows' ids and pair vectors u, from row row0) from product(k_ref), the float32
        Q K^T of the slot's K (or its piece). The caller frees the slot (`k_free`, `tile_free` with the ids and w,
        `v_free`)."""
        ops, spec = self.ops, self.spec
        piece.wait(self.k_ready.at[slot])
        s = product(piece.of(self.k.at[slot]))
        piece.wait(self.ids_ready.at[slot])
        if self.sizes.has_table:
            piece.wait(self.tile_ready.at[slot])
            s = tile_logits(ops, s, self.tile.at[slot], cta.bases[spec.table_diagonal(cta.qc, kc)],
                            (cta.wg * HALF, HALF), spec, piece.span)
        else:
            s = tile_logits(ops, s, None, None, None, spec)
        if spec.pair_rank:
            piece.wait(self.w_ready[0].at[slot])
            s = with_pair(s, u_rows, self.pair_keys(slot, piece), False)
        mask = tile_mask(ops, q_ids, ops.load(self.ids.at[slot], "cols", rows=piece.span), row0,
                         kc * BLOCK + piece.start, spec, False, crossing)
        return apply_mask(s, mask)

    def pair_keys(self, slot, piece: Piece):
        """The pair term's key vectors w of the slot's keys (or its piece): r column-layout vectors."""
        return [self.ops.load(self.w.at[slot, g], "cols", rows=piece.span) for g in range(self.spec.pair_rank)]


@dataclasses.dataclass(frozen=True)
class KeyBlockKernel:
    """What a key-block kernel (the forward, dQ) adds to the frame they share."""

    name: str
    consumer: Callable  # consumer(refs, own, stream, cta): each consumer warpgroup's part
    own_buffers: tuple  # the consumers' buffers of their own rows (q, dO, ids, ...)
    own_copies: int  # copies into them per consumer
    own_bytes: int  # their shared memory
    out_type: Any  # a jax.ShapeDtypeStruct or a tuple of them


def key_block_kernel(kernel: KeyBlockKernel, ops: Ops, sizes: KernelSizes, inputs: dict[str, jax.Array],
                     spec: MosaicGpuSpec):
    """Runs a kernel whose CTA owns 128 query rows and walks its visit list of key blocks (the forward, dQ) on
    `inputs` (`kernel_preamble`): the producer streams `KeyBlocks`; `kernel.consumer` is each consumer warpgroup's
    part, with own = (own_buffers, `query_extras_scratch`, a barrier for own_copies copies and the extras')."""
    plgpu = plgpu_module()
    visits = inputs["visits"]
    per_stage = KeyBlocks.bytes_per_stage(sizes, spec)
    extras = query_extras_scratch(spec)
    own_bytes = (kernel.own_bytes + spec.dropout * nbytes((2, HALF), jnp.int32)
                 + nbytes((2, spec.pair_rank, HALF), jnp.float32))
    own_copies = kernel.own_copies + sum(extra is not None for extra in extras)
    fixed = own_bytes + 4 * visits.shape[-1] + bases_bytes(inputs, sizes)
    stages = pipeline_stages(per_stage, fixed, kernel.name)

    def body(refs, scratch):
        own, (vis_s, base_s), cta_bar, stream_buffers, ready, free = scratch
        stream = KeyBlocks(stream_buffers, ready, free, stages, ops, sizes, spec)
        qc, h, b = lax.axis_index("q"), lax.axis_index("heads"), lax.axis_index("batch")
        wg = lax.axis_index("wg")
        th = h if sizes.table_heads > 1 else 0
        cta_inputs(wg, [(refs["visits"].at[b, qc], vis_s)]
                   + ([(refs["bases"].at[th], base_s)] if sizes.has_table else []), cta_bar)
        cta = Cta(b=b, h=h, th=th, qc=qc, wg=wg, visits=vis_s, count=vis_s[0], bases=base_s)

        @pl.when(wg < 2)
        def _():
            ops.set_registers(CONSUMER_REGISTERS, "increase")
            kernel.consumer(refs, own, stream, cta)

        @pl.when(wg == 2)
        def _():
            ops.set_registers(PRODUCER_REGISTERS, "decrease")
            stream.produce(refs, cta)

    own_scratch = (kernel.own_buffers, extras, plgpu.Barrier(num_barriers=2 * own_copies))
    scratch = (own_scratch, (plgpu.SMEM(visits.shape[-1:], jnp.int32), plgpu.SMEM(inputs["bases"].shape[-1:],
                                                                                 jnp.float32)),
               plgpu.Barrier(num_barriers=2), *KeyBlocks.scratch(stages, sizes, spec))
    return run_kernel(kernel.name, body, inputs, kernel.out_type, scratch,
                      {"q": spec.nq, "heads": sizes.heads, "batch": sizes.batch}, spec)


# --- forward ---------------------------------------------------------------------------------------------------

def forward(x: Operands, table: Table | None, visits: jax.Array, spec: MosaicGpuSpec):
    """out [B, T_pad, H, Dv] and the base-2 logsumexp [B, H, T_pad] (+inf for rows that see no key). visits
    [B, nq, 1 + nk, padded] int32: each query block's key blocks (`visit_lists`)."""
    plgpu = plgpu_module()
    ops, sizes, inputs = kernel_preamble(x, None, table, visits, spec)
    batch, heads, dim, dim_v, dtype = sizes.batch, sizes.heads, sizes.dim, sizes.dim_v, sizes.dtype

    def consumer(refs, own, stream, cta):
        (q_s, o_s, lse_s, qid_s, turn), extras, own_bar = own
        o_s = q_s if o_s is None else o_s  # Q's buffer is free at the end: the output goes out through it
        b, h, qc, wg = cta.b, cta.h, cta.qc, cta.wg

        def take_turns():
            """FlashAttention-3's ping-pong: the consumers meet here after issuing Q K^T and before P V, so that
            one's softmax runs while the other's products do (consumer 1 meets once before its walk, consumer 0
            once after: both meet 2 * count + 1 times)."""
            plgpu.barrier_arrive(turn)
            plgpu.barrier_wait(turn)

        row0 = qc * BLOCK + wg * HALF
        rows = pl.ds(row0, HALF)
        own_rows(wg, [(refs["q"].at[b, rows, h], q_s.at[wg]), (refs["q_pieces"].at[b, rows], qid_s.at[wg])]
                 + cta.query_extra_copies(refs, extras, rows, spec), own_bar)
        q_ids = ops.load(qid_s.at[wg], "rows")
        row_keys, u_rows = load_query_extras(ops, extras, wg, spec)

        def step(i, carry, crossing):
            acc, m, l = carry
            slot = lax.rem(i, stream.stages)
            kc = cta.visits[1 + i]

            def product(k_ref):
                return ops.mma(q_s.at[wg], k_ref, (HALF, BLOCK), transpose_b=True, issued=take_turns)

            s = stream.logits(product, slot, kc, cta, q_ids, row0, u_rows, crossing)
            plgpu.barrier_arrive(stream.tile_free.at[slot])  # with the ids and w
            plgpu.barrier_arrive(stream.k_free.at[slot])
            m_new = jnp.maximum(m, jnp.max(s, axis=1))
            # a row whose keys so far are all masked has m_new = NEG: subtracting 0 keeps its weights exp2(NEG) = 0
            limited = spec.causal or spec.half_window is not None
            m_sub = jnp.where(m_new > 0.5 * NEG, m_new, 0.0) if spec.masked or limited else m_new
            p = jnp.exp2(s - lax.broadcast_in_dim(m_sub, s.shape, [0]))
            alpha = jnp.exp2(m - m_new)
            l = l * alpha + jnp.sum(p, axis=1)  # the weights before dropout
            p = dropped(p, keep_mask(ops, row_keys, kc * BLOCK, spec, False)).astype(dtype)
            acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
            # the softmax finished before the turn is handed over: the order jax's FlashAttention-3 found fastest
            acc, l, m_new, p = lax.optimization_barrier((acc, l, m_new, p))
            plgpu.barrier_arrive(turn)
            plgpu.barrier_wait(stream.v_ready.at[slot])
            plgpu.barrier_wait(turn)  # the other consumer's Q K^T is issued: the tensor cores are free for P V
            acc = ops.mma(p, stream.v.at[slot], acc)
            plgpu.barrier_arrive(stream.v_free.at[slot])
            return acc, m_new, l

        carry = (ops.full((HALF, dim_v), 0.0, "wgmma"), ops.full((HALF,), NEG, "rows"), ops.full((HALF,), 0.0, "rows"))
        pl.when(wg == 1)(take_turns)
        acc, m, l = walk(cta.visits, cta.count, step, carry, functools.partial(key_block_offsets, row0), True, spec)
        pl.when(wg == 0)(take_turns)
        seen = l > 0.0
        safe = jnp.where(seen, l, 1.0)
        norm = safe * (1.0 - spec.dropout_rate) if spec.dropout else safe  # dropout's 1 / (1 - rate)
        o_s[wg] = (acc / lax.broadcast_in_dim(norm, acc.shape, [0])).astype(dtype)
        lse_s[wg] = jnp.where(seen, m + jnp.log2(safe), jnp.inf)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_s.at[wg], refs["out0"].at[b, rows, h])
        plgpu.copy_smem_to_gmem(lse_s.at[wg], refs["out1"].at[b, h, rows])
        plgpu.wait_smem_to_gmem(0)

    own_buffers = (swizzled_smem((2, HALF, dim), dtype),
                   swizzled_smem((2, HALF, dim_v), dtype) if dim_v != dim else None,
                   plgpu.SMEM((2, HALF), jnp.float32), plgpu.SMEM((2, HALF), jnp.int32),
                   plgpu.Barrier(num_arrivals=2))
    own_bytes = (nbytes((2, HALF, dim), dtype) + (nbytes((2, HALF, dim_v), dtype) if dim_v != dim else 0)
                 + 2 * nbytes((2, HALF), jnp.float32))
    out_type = (jax.ShapeDtypeStruct((batch, spec.t_pad, heads, dim_v), dtype),
                jax.ShapeDtypeStruct((batch, heads, spec.t_pad), jnp.float32))
    kernel = KeyBlockKernel(name="toeplitz_attention_mgpu_fwd", consumer=consumer, own_buffers=own_buffers,
                            own_copies=2, own_bytes=own_bytes, out_type=out_type)
    return key_block_kernel(kernel, ops, sizes, inputs, spec)
