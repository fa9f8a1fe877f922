"""What the Mosaic GPU kernels of `mosaic_gpu` share: block constants, the spec of a call, the capability check,
`Ops` (the one seam between the compiled code and the interpreter), the arrays a kernel reads, and the frame of a
kernel (shared-memory sizing, three warpgroups, the producer's loop, the copies a CTA starts with)."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams, force_gpu_interpret_mode
from jax.experimental import pallas as pl

from jaxpos.attention.kernels.limits import VisibleOffsets
from jaxpos.attention.registry import IMPLEMENTATIONS, Call, lacks, platform_facts

BLOCK = 128  # rows of a CTA's own block (two consumers of HALF) and of each streamed block
HALF = 64  # rows per consumer warpgroup: the wgmma M
LOG2E = math.log2(math.e)  # logits are kept in base 2 (exp2)
NEG = -1e30  # finite logit of masked entries
# registers per thread after setmaxnreg: a CTA's 3 x 128 threads launch with 168 (64512 of an SM's 65536), and the
# TMA producer hands all but 24 to the two consumers (FlashAttention-3's split: 2 x 128 x 240 + 128 x 24 = 64512)
CONSUMER_REGISTERS, PRODUCER_REGISTERS = 240, 24
SMEM_LIMIT = 227 * 1024  # bytes of shared memory a Hopper CTA can have
# what Mosaic adds to the buffers' bytes (barriers, each buffer's alignment): 5,024 B in the head width 128 forward
SMEM_HEADROOM = 8 * 1024
LIST_ALIGN = 32  # visit lists padded to 128 bytes: TMA copies split evenly over a warpgroup's threads


@dataclasses.dataclass(frozen=True)
class MosaicGpuSpec(VisibleOffsets):
    """What one call's kernels are built for: padded lengths, masks, dropout, the pair term and the block choices
    (hashable: the nondiff argument of the custom VJP)."""

    scale: float
    causal: bool
    q_offset: int  # causal: key j visible to query i when j - i <= q_offset
    t_pad: int
    s_pad: int
    use_q_ids: bool
    masked: bool  # ids can hide keys (key ids, query ids, padded keys); else no id arithmetic
    interpret: bool
    dropout_rate: float = 0.0
    pair_rank: int = 0  # r of a pair term u_i . w_j (0: none)
    half_window: int | None = None  # a local window: key j visible to query i when |j - i - q_offset| <= this
    limits_in_tiles: bool = False  # the causal limit and the window are in the table's tiles (`diagonal_tiles`)
    pieces: int = 1  # pieces the dQ and dK/dV consumers take each streamed block in (`Piece`)
    table_splits: int = 1  # CTAs per (table head, block diagonal) of the table-gradient kernel

    @property
    def diagonals(self) -> tuple[int, int]:
        """(first, count): the block diagonals d = key block - query block + nq - 1 whose tiles can hold an entry
        inside the causal limit and the window, a run (all nq + nk - 1 without them; at least one). The table's
        tiles and the table-gradient kernel's grid cover these only: a local layer's about window / 128 + 2."""
        shifts = (np.arange(self.nq + self.nk - 1) - (self.nq - 1)) * BLOCK  # key minus query at the tile corner
        live = np.ones(shifts.shape, bool)
        if self.upper is not None:
            live &= shifts - (BLOCK - 1) <= self.upper
        if self.lower is not None:
            live &= shifts + (BLOCK - 1) >= self.lower
        found = np.flatnonzero(live)
        return (int(found[0]), int(found[-1] - found[0] + 1)) if found.size else (0, 1)

    def table_diagonal(self, qc, kc):
        """The index in the table's tiles (`diagonals`) of the tile of query block qc and key block kc."""
        return kc - qc + self.nq - 1 - self.diagonals[0]

    @property
    def limits_in_kernel(self) -> bool:
        """Whether the kernels compute the causal limit or the window from iotas (no table's tiles carry them)."""
        return (self.causal or self.half_window is not None) and not self.limits_in_tiles

    @property
    def dropout(self) -> bool:
        return self.dropout_rate > 0.0

    @property
    def nq(self) -> int:
        return self.t_pad // BLOCK

    @property
    def nk(self) -> int:
        return self.s_pad // BLOCK


def unsupported(dtype) -> str | None:
    """Why the Mosaic GPU kernels cannot take a call of `dtype` inputs in this process, in words (None: they can;
    the CPU runs them in the interpreter): the registry's record of them (`IMPLEMENTATIONS["mosaic_gpu"]`) asked
    about the platform, the GPUs, the CPU mesh and the precision."""
    low_precision = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
    return lacks(IMPLEMENTATIONS["mosaic_gpu"], Call(**platform_facts(), low_precision=low_precision))


def plgpu_module():
    """Pallas's Mosaic GPU module, imported where a kernel is built (importing it costs the CPU-only paths time)."""
    # lazy: 0.34 s at import; CPU-only paths never build a kernel
    from jax.experimental.pallas import mosaic_gpu as plgpu
    return plgpu


class Ops:
    """The operations the Mosaic GPU interpreter has no rule for, and their plain equivalents under it."""

    def __init__(self, interpret: bool):
        self.interpret = interpret
        self.plgpu = None if interpret else plgpu_module()

    def mma(self, a, b_ref, acc, transpose_b=False, issued=None):
        """acc + a [M, K] (registers or a shared-memory ref) @ b_ref [K, N] (or b_ref^T) -> float32 [M, N]; `acc`
        a float32 [M, N] in the wgmma layout, which the product accumulates into (no second [M, N] of registers,
        no add), or the shape (M, N) to start from zero. `issued()` runs while the wgmma does."""
        fresh = isinstance(acc, tuple)
        if self.interpret:
            product = self._dot(a, b_ref, transpose_b)
            if issued is not None:
                issued()
            return product if fresh else acc + product
        plgpu = self.plgpu

        def accumulate(acc_ref):
            self._wgmma(acc_ref, a, b_ref, transpose_b)
            if issued is not None:
                issued()

        if fresh:  # the first wgmma zeroes the accumulator

            def product(acc_ref):
                accumulate(acc_ref)
                return acc_ref[...]

            return pl.run_scoped(product, plgpu.ACC(acc, jnp.float32))
        return pl.run_state(accumulate)(plgpu.ACC.init(acc))

    def products(self, starts, program, result_like=None):
        """Products in flight together (FlashAttention-3's overlap of one product with the CUDA-core work on
        another's result): accumulators from `starts` (float32 [M, N] in the wgmma layout, or the shape (M, N) for
        zero); program(issue, read) issues acc[n] += a @ b_ref (or b_ref^T) by issue(n, a, b_ref, transpose_b=False),
        reads acc[n] by read(n, pending) once at most `pending` products are in flight, and returns arrays shaped
        like `result_like` (a pytree of jax.ShapeDtypeStruct; None: nothing). Returns the accumulators' final values
        (every product done) and the program's result."""
        starts = [self.full(s, 0.0, "wgmma") if isinstance(s, tuple) else s for s in starts]
        if self.interpret:
            accs = list(starts)

            def issue(n, a, b_ref, transpose_b=False):
                accs[n] = accs[n] + self._dot(a, b_ref, transpose_b)

            result = program(issue, lambda n, pending: accs[n])
            return accs, result
        plgpu = self.plgpu

        def body(refs):
            acc_refs, result_ref = refs

            def issue(n, a, b_ref, transpose_b=False):
                self._wgmma(acc_refs[n], a, b_ref, transpose_b)

            result = program(issue, lambda n, pending: plgpu.wgmma_accumulator_load(acc_refs[n], wait_n=pending))
            for ref, value in zip(jax.tree.leaves(result_ref), jax.tree.leaves(result)):
                ref[...] = value

        result_start = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), result_like)
        accs, result = pl.run_state(body)(([plgpu.ACC.init(s) for s in starts], result_start))
        return accs, result

    @staticmethod
    def _dot(a, b_ref, transpose_b):
        """The interpreter's product: float32 a @ b (or b^T); `a` registers or a ref."""
        a_val = a if isinstance(a, jax.Array) else a[...]
        b_val = b_ref[...]
        return jnp.dot(a_val, b_val.T if transpose_b else b_val, preferred_element_type=jnp.float32)

    def _wgmma(self, acc_ref, a, b_ref, transpose_b):
        self.plgpu.wgmma(acc_ref, a, self.plgpu.transpose_ref(b_ref, (1, 0)) if transpose_b else b_ref)

    def load(self, ref, layout, rows=None, cols=None):
        """ref[...] (rows / cols: (start, size) of its first / second axis) in a register layout ("wgmma", "rows",
        "cols")."""
        if self.interpret:
            x = ref[...]
            x = x if rows is None else lax.dynamic_slice_in_dim(x, rows[0], rows[1], axis=0)
            return x if cols is None else lax.dynamic_slice_in_dim(x, cols[0], cols[1], axis=1)
        if rows is not None:
            ref = ref.at[pl.ds(*rows)]
        if cols is not None:
            ref = ref.at[:, pl.ds(*cols)]
        return self.plgpu.load(ref, (), layout=self._layout(layout))

    def cast(self, x, layout):
        return x if self.interpret else self.plgpu.layout_cast(x, self._layout(layout))

    def full(self, shape, value, layout):
        return self.cast(jnp.full(shape, value, jnp.float32), layout)

    def iota(self, shape, dim):
        if self.interpret:
            return lax.broadcasted_iota(jnp.int32, shape, dim)
        return self.plgpu.broadcasted_iota(jnp.int32, shape, dim, layout=self.plgpu.Layout.WGMMA)

    def _layout(self, name):
        wgmma = self.plgpu.Layout.WGMMA
        return {"wgmma": wgmma, "rows": wgmma.reduce(1), "cols": wgmma.reduce(0)}[name]

    def set_registers(self, count, action):
        if not self.interpret:
            self.plgpu.set_max_registers(count, action=action)


# --- the arrays a kernel reads ----------------------------------------------------------------------------------

class Operands(NamedTuple):
    """A call's padded inputs as every kernel reads them; the last three None where the call has no dropout or no
    pair term."""

    q: jax.Array  # [B, T_pad, H, D] bf16/f16
    k: jax.Array  # [B, S_pad, H, D]
    v: jax.Array  # [B, S_pad, H, Dv]
    q_pieces: jax.Array  # [B, T_pad] int32 query ids
    k_pieces: jax.Array  # [B, S_pad] int32 key ids (0: padding)
    row_keys: jax.Array | None  # [B, H, T_pad] int32: the query rows' dropout keys
    pair_u: jax.Array | None  # [B, H, r, T_pad] float32: a pair term's query vectors
    pair_w: jax.Array | None  # [B, r, S_pad] float32: its key vectors


class BackwardInputs(NamedTuple):
    """What the backward kernels read per query row beside the operands."""

    do: jax.Array  # [B, T_pad, H, Dv] in q's dtype
    lse: jax.Array  # [B, H, T_pad] float32: the forward's base-2 logsumexp
    delta: jax.Array  # [B, H, T_pad] float32: rowsum(dO * O)


class Table(NamedTuple):
    """The offset table laid out as the tiles of its block diagonals (`diagonal_tiles`)."""

    tiles: jax.Array  # [H', nd, 128, 128] in q's dtype (transposed for the dK/dV kernel)
    bases: jax.Array  # [H', nd_pad] float32


@dataclasses.dataclass(frozen=True)
class KernelSizes:
    """The sizes one kernel is built for, read from its operands."""

    batch: int
    heads: int
    dim: int  # head width of q and k
    dim_v: int  # head width of v
    dtype: jnp.dtype  # of q, k, v, dO and the table's tiles
    table_heads: int  # H' of the table; 0: no table

    @property
    def has_table(self) -> bool:
        return self.table_heads > 0


_OPTIONAL_INPUTS = ("row_keys", "pair_u", "pair_w")  # every kernel's last inputs


def kernel_preamble(x: Operands, grads: BackwardInputs | None, table: Table | None, visits: jax.Array,
                    spec: MosaicGpuSpec) -> tuple[Ops, KernelSizes, dict[str, jax.Array]]:
    """What every kernel builder starts from: its operations, its sizes and its global-memory inputs by name in the
    order the kernel takes them (q, k, v, dO, lse, delta, tiles, bases, ids, visit lists [..., 1 + n, padded],
    dropout keys, u, w), with placeholders the kernels never read for a missing table, dropout or pair term."""
    batch, _, heads, dim = x.q.shape
    sizes = KernelSizes(batch=batch, heads=heads, dim=dim, dim_v=x.v.shape[-1], dtype=x.q.dtype,
                        table_heads=0 if table is None else table.tiles.shape[0])
    if table is None:
        table = Table(jnp.zeros((1, 1, BLOCK, BLOCK), x.q.dtype), jnp.zeros((1, LIST_ALIGN), jnp.float32))
    inputs = dict(q=x.q, k=x.k, v=x.v, **({} if grads is None else grads._asdict()), tiles=table.tiles,
                  bases=table.bases, q_pieces=x.q_pieces, k_pieces=x.k_pieces, visits=visits)
    inputs.update(zip(_OPTIONAL_INPUTS, _optional_inputs(x.row_keys, x.pair_u, x.pair_w)))
    return Ops(spec.interpret), sizes, inputs


def _optional_inputs(row_keys, pair_u, pair_w) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The dropout keys [B, H, T_pad] int32 and a pair term's u [B, H, r, T_pad] and w [B, r, S_pad] float32, with
    placeholders the kernels never read where the call has no dropout or pair term."""
    if row_keys is None:
        row_keys = jnp.zeros((1, 1, LIST_ALIGN), jnp.int32)
    if pair_u is None:
        pair_u, pair_w = jnp.zeros((1, 1, 1, LIST_ALIGN), jnp.float32), jnp.zeros((1, 1, LIST_ALIGN), jnp.float32)
    return row_keys, pair_u, pair_w


def bases_bytes(inputs: dict[str, jax.Array], sizes: KernelSizes) -> int:
    """Shared memory of the table's bases (none without a table)."""
    return 4 * inputs["bases"].shape[-1] if sizes.has_table else 0


# --- shared memory and the kernel's frame ----------------------------------------------------------------------

def swizzled_smem(shape, dtype):
    """SMEM of `shape` whose last axis is read by wgmma or in the wgmma register layout: 128-byte swizzle."""
    plgpu = plgpu_module()
    per_row = 128 // jnp.dtype(dtype).itemsize
    return plgpu.SMEM(shape, dtype, transforms=(plgpu.TilingTransform((8, per_row)), plgpu.SwizzleTransform(128)))


def nbytes(shape, dtype) -> int:
    return math.prod(shape) * jnp.dtype(dtype).itemsize


def pipeline_stages(per_stage: int, fixed: int, what: str) -> int:
    """Pipeline depth (2, else 1) that fits shared memory, given the bytes of one stage and of the rest."""
    for stages in (2, 1):
        if fixed + stages * per_stage + SMEM_HEADROOM <= SMEM_LIMIT:
            return stages
    raise ValueError(f"the Mosaic GPU {what} kernel needs {fixed + per_stage + SMEM_HEADROOM} bytes of shared "
                     f"memory, more than {SMEM_LIMIT}: head widths too large")


def run_kernel(name: str, body: Callable, inputs: dict[str, jax.Array], out_type, scratch, grid: dict[str, int],
               spec: MosaicGpuSpec):
    """Runs body(refs, scratch) as a plgpu.kernel of three warpgroups ("wg": consumers 0, 1 and the producer 2)
    over `grid` (axis name -> size) -> its outputs (`out_type`). refs: the inputs' and outputs' global-memory refs
    by name (the inputs' names, then out0, out1, ...)."""
    plgpu = plgpu_module()
    names = (*inputs, *(f"out{n}" for n in range(len(jax.tree.leaves(out_type)))))

    def entry(*refs):
        pl.run_scoped(lambda *s: body(dict(zip(names, refs)), s), *scratch, collective_axes="wg")

    entry.__name__ = entry.__qualname__ = name  # the kernel's name in profiles
    call = plgpu.kernel(entry, out_type=out_type, grid=tuple(grid.values()), grid_names=tuple(grid), num_threads=3,
                        thread_name="wg", compiler_params=plgpu.CompilerParams(approx_math=True))
    if not spec.interpret:
        return call(*inputs.values())
    check_interpreter_threads()
    with force_gpu_interpret_mode(InterpretGPUParams(detect_races=True)):
        out = call(*inputs.values())
    jax.debug.callback(functools.partial(_raise_on_races, name), jax.tree.leaves(out)[0])  # after the kernel
    return out


def _raise_on_races(name: str, _):
    """The interpreter's race detector only prints what it finds (and keeps the last kernel's state): fail."""
    # lazy: 0.55 s at import; only the interpreter (CPU tests) needs it
    from jax._src.pallas.mosaic_gpu.interpret.interpret_pallas_call import get_races
    if get_races().races_found:
        raise RuntimeError(f"{name}: the Mosaic GPU interpreter found a data race between warpgroups (the lines "
                           "printed above name the accesses)")


def check_interpreter_threads():
    """The interpreter runs the three warpgroups as concurrent XLA host callbacks, which share the CPU client's
    thread pool (one thread per core unless PJRT_NPROC says otherwise): with fewer than three, a waiting
    warpgroup holds a thread that the one it waits for needs, and the call hangs."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = int(os.environ.get("PJRT_NPROC", 0)) or cores
    if threads < 3:
        raise RuntimeError(f"the Mosaic GPU interpreter needs 3 CPU threads for its warpgroups, this process has "
                           f"{threads}: set PJRT_NPROC=4 (or more) before JAX starts")


def producer_loop(count, stages: int, frees, fetch):
    """The producer's loop: fetch(i, slot) for i < count, waiting until both consumers have freed a slot before
    refilling it, then waiting for the last frees too (every phase of a barrier observed: no arrival left over
    when the CTA ends)."""
    plgpu = plgpu_module()

    def wait_free(slot):
        for free in frees:
            plgpu.barrier_wait(free.at[slot])

    def refill(slot):
        wait_free(slot)
        plgpu.commit_smem()  # fence.proxy.async: the consumers' reads of the slot precede the TMA writes into it

    def step(i, _):
        slot = lax.rem(i, stages)
        pl.when(i >= stages)(lambda: refill(slot))
        fetch(i, slot)

    lax.fori_loop(0, count, step, None)
    lax.fori_loop(jnp.maximum(count - stages, 0), count, lambda i, _: wait_free(lax.rem(i, stages)), None)


def cta_inputs(wg, copies, barrier):
    """What every warpgroup of the CTA reads first (visit list, bases, ...): copied once by the producer,
    (src, dst) pairs on barriers 0, 1, ...; everyone waits."""
    plgpu = plgpu_module()

    @pl.when(wg == 2)
    def _():
        for n, (src, dst) in enumerate(copies):
            plgpu.copy_gmem_to_smem(src, dst, barrier.at[n])

    for n in range(len(copies)):
        plgpu.barrier_wait(barrier.at[n])


def own_rows(wg, copies, barrier):
    """A consumer's own 64 rows (q, dO, ids, ...), (src, dst) pairs on barriers 2n + wg; it waits for them."""
    plgpu = plgpu_module()
    for n, (src, dst) in enumerate(copies):
        plgpu.copy_gmem_to_smem(src, dst, barrier.at[2 * n + wg])
    for n in range(len(copies)):
        plgpu.barrier_wait(barrier.at[2 * n + wg])
