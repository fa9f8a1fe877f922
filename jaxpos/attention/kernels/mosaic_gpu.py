"""Toeplitz attention on Hopper GPUs: Mosaic GPU kernels (wgmma, TMA, warp specialisation) for
`api.toeplitz_attention(..., backend="mosaic_gpu")`.

Every kernel runs one CTA of three warpgroups: two consumers that own 64 rows each of a 128-row block and issue
wgmma, and a producer that streams the other side's 128-row blocks into shared memory by TMA, `STAGES` deep,
through one mbarrier per buffer and slot (and a "free" barrier per slot that both consumers arrive on). In the
forward the consumers take turns on the tensor cores (FlashAttention-3's ping-pong): one's softmax and table tile
run while the other's products do.

How the table enters. The kernels cannot gather, so the offset table `ext` [H'|1, T_pad + S_pad] (from
`api._offset_table`) is laid out once per call as the tiles of its block diagonals: a (128-row,
128-column) tile of block diagonal d = key block - query block + nq - 1 reads ext[d*128 + 127 + c - r], so tile d
serves every tile on its diagonal, for every batch row (`_diagonal_tiles`). A tile is stored as bf16 residuals
around its own main-diagonal value (an f32 scalar per tile, read from shared memory): the entries that carry
softmax weight sit near that value, so they keep f32-like precision even where the table grows with the offset
(ALiBi, attenuated). H'*(T+S)*128 entries: linear in T. The dK/dV kernel reads the transposed tiles.

How the table's gradient comes back. The gradient of tile d is dS summed over the tiles of block diagonal d and
the batch (and the heads of a shared table); a fourth kernel walks exactly those tiles, recomputes P and dP (two
products per tile) and adds dS up in registers, so no atomics and no [T, S] tensor. Its CTAs are (table head,
block diagonal, split): a diagonal's walk is cut into as many pieces as keep the SMs evenly busy
(`_gradient_splits`). Each writes one f32 tile, splits*H'*(T+S)*128 floats; XLA adds the splits up and sums each
tile along its diagonals into the window of offsets it covers (`_table_gradient`). The result is deterministic.

Masks follow `toeplitz_attention`: key id 0 = padding, query ids (when given) must equal key ids, causal
(k_pos <= q_pos). Tiles with no visible entry are skipped: a visit list per CTA (`_visit_lists`), computed in
XLA from the blocks' id ranges and the causal limit, tells both the producer and the consumers which blocks to
walk. Rows that see no key give out = 0, logsumexp +inf and zero gradients. With a table, the causal limit rides
in the tiles (it depends on the offset alone: NEG past it, `_diagonal_tiles`), so no tile computes it from iotas.

Inputs are bf16 or f16 (f32 accumulation); head widths are padded with zero channels to a multiple of 64 (q and k
may be wider than v: folded low-rank factors). Wide heads leave no registers for a [64, 128] S and dP beside the
accumulators, so the dQ and dK/dV consumers then take each streamed block in two [64, 64] pieces (`_Piece`).
Attention dropout drops the weights `dropout.keep_mask` drops: each kernel hashes its tile's keep mask from the
query rows' keys and the key indices (`_kept`), nothing stored. A pair term u_i . w_j of rank r (a per-head segment
table, `bias.segment_pair_factors`) enters every tile from r vectors per query and per key (`_with_pair`); its
gradient du = dS w is a row sum in the dQ kernel.

Testing on a machine without a GPU: Pallas's Mosaic GPU interpreter runs these kernels thread by thread with
simulated shared memory, TMA and barriers (and finds races), but has no rule for wgmma with a transposed or
register operand, `plgpu.load` or layout casts. `_Ops` is the one seam: under the interpreter a product is a
jnp.dot of the same operands and a layout load a plain read; everything else (copies, barriers, loops, visit
lists, masks, softmax, the tile arithmetic) is the compiled code. The compiled path is checked by lowering for
CUDA from the CPU (which runs Mosaic's layout inference and shared-memory accounting), not by ptxas.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams, force_gpu_interpret_mode
from jax.experimental import pallas as pl

from jaxpos.attention import dropout

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
_LIST_ALIGN = 32  # visit lists padded to 128 bytes: TMA copies split evenly over a warpgroup's threads
_BIG_ID = 2**30


@dataclasses.dataclass(frozen=True)
class _Static:
    """Static settings of one call (a nondiff argument of the custom VJP)."""

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
    causal_in_tiles: bool = False  # the causal limit is in the table's tiles (`_diagonal_tiles`), not in iotas

    @property
    def causal_in_kernel(self) -> bool:
        return self.causal and not self.causal_in_tiles

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
    """Why the Mosaic GPU kernels cannot take a call on this backend (None: they can; the CPU runs them in the
    interpreter)."""
    backend = jax.default_backend()
    if backend not in ("gpu", "cpu"):
        return f"the {backend} backend"
    if backend == "gpu":
        capability = getattr(jax.devices()[0], "compute_capability", "0")
        if not str(capability).startswith("9"):
            return f"a GPU of compute capability {capability} (wgmma needs Hopper, 9.0)"
    mesh = jax.sharding.get_abstract_mesh()
    if backend == "cpu" and not mesh.empty and mesh.size > 1:  # one global simulated shared memory
        return (f"a mesh of {mesh.size} CPU devices (the interpreter cannot run kernels on several devices at "
                "once)")
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"{jnp.dtype(dtype).name} inputs (bf16 or f16 only)"
    return None


def _plgpu():
    """Pallas's Mosaic GPU module, imported where a kernel is built (importing it costs the CPU-only paths time)."""
    # lazy: 0.34 s at import; CPU-only paths never build a kernel
    from jax.experimental.pallas import mosaic_gpu as plgpu
    return plgpu


class _Ops:
    """The operations the Mosaic GPU interpreter has no rule for, and their plain equivalents under it."""

    def __init__(self, interpret: bool):
        self.interpret = interpret
        self.plgpu = None if interpret else _plgpu()

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


def _swizzled(shape, dtype):
    """SMEM of `shape` whose last axis is read by wgmma or in the wgmma register layout: 128-byte swizzle."""
    plgpu = _plgpu()
    per_row = 128 // jnp.dtype(dtype).itemsize
    return plgpu.SMEM(shape, dtype, transforms=(plgpu.TilingTransform((8, per_row)), plgpu.SwizzleTransform(128)))


def _nbytes(shape, dtype) -> int:
    return math.prod(shape) * jnp.dtype(dtype).itemsize


def _stages(per_stage: int, fixed: int, what: str) -> int:
    """Pipeline depth (2, else 1) that fits shared memory, given the bytes of one stage and of the rest."""
    for stages in (2, 1):
        if fixed + stages * per_stage + SMEM_HEADROOM <= SMEM_LIMIT:
            return stages
    raise ValueError(f"the Mosaic GPU {what} kernel needs {fixed + per_stage + SMEM_HEADROOM} bytes of shared "
                     f"memory, more than {SMEM_LIMIT}: head widths too large")


def _kernel(body, out_type, scratch, grid, grid_names, st: _Static, name: str):
    """plgpu.kernel of `body(*refs, scratch)` with three warpgroups ("wg": consumers 0, 1 and the producer 2)."""
    plgpu = _plgpu()

    def entry(*refs):
        pl.run_scoped(lambda *s: body(*refs, s), *scratch, collective_axes="wg")

    entry.__name__ = entry.__qualname__ = name  # the kernel's name in profiles
    call = plgpu.kernel(entry, out_type=out_type, grid=grid, grid_names=grid_names, num_threads=3,
                        thread_name="wg", compiler_params=plgpu.CompilerParams(approx_math=True))
    if not st.interpret:
        return call
    _check_interpreter_threads()

    def interpreted(*args):
        with force_gpu_interpret_mode(InterpretGPUParams(detect_races=True)):
            out = call(*args)
        jax.debug.callback(functools.partial(_raise_on_races, name), jax.tree.leaves(out)[0])  # after the kernel
        return out

    return interpreted


def _raise_on_races(name: str, _):
    """The interpreter's race detector only prints what it finds (and keeps the last kernel's state): fail."""
    # lazy: 0.55 s at import; only the interpreter (CPU tests) needs it
    from jax._src.pallas.mosaic_gpu.interpret.interpret_pallas_call import get_races
    if get_races().races_found:
        raise RuntimeError(f"{name}: the Mosaic GPU interpreter found a data race between warpgroups (the lines "
                           "printed above name the accesses)")


def _stream(count, stages: int, frees, fetch):
    """The producer's loop: fetch(i, slot) for i < count, waiting until both consumers have freed a slot before
    refilling it, then waiting for the last frees too (every phase of a barrier observed: no arrival left over
    when the CTA ends)."""
    plgpu = _plgpu()

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


def _check_interpreter_threads():
    """The interpreter runs the three warpgroups as concurrent XLA host callbacks, which share the CPU client's
    thread pool (one thread per core unless PJRT_NPROC says otherwise): with fewer than three, a waiting
    warpgroup holds a thread that the one it waits for needs, and the call hangs."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = int(os.environ.get("PJRT_NPROC", 0)) or cores
    if threads < 3:
        raise RuntimeError(f"the Mosaic GPU interpreter needs 3 CPU threads for its warpgroups, this process has "
                           f"{threads}: set PJRT_NPROC=4 (or more) before JAX starts")


# --- tiles and visit lists (XLA, once per call) ---------------------------------------------------------------

def _diagonal_tiles(ext: jax.Array, dtype, limit: int | None = None) -> tuple[jax.Array, jax.Array]:
    """Offset table [H', T_pad + S_pad] -> (tiles [H', nd, 128, 128] `dtype`, bases [H', nd_pad] float32), in
    base-2 logits: tile d [r, c] + bases[d] = ext[d*128 + 127 + c - r] * log2(e), the tile's main diagonal
    (c = r) being its base. nd = (T_pad + S_pad)/128 - 1 block diagonals; bases padded to 128-byte rows.
    `limit`: the causal mask, which depends on the offset alone, as NEG in the entries of ext index > limit (bf16;
    -inf in f16), so that the kernels need no mask arithmetic for it; bases stay the table's values."""
    heads, length = ext.shape
    diagonals = length // BLOCK - 1
    r = jnp.arange(BLOCK)[:, None]
    c = jnp.arange(BLOCK)[None, :]
    index = jnp.arange(diagonals)[:, None, None] * BLOCK + (BLOCK - 1) + c - r
    scaled = ext.astype(jnp.float32) * LOG2E
    bases = scaled[:, jnp.arange(diagonals) * BLOCK + BLOCK - 1]
    tiles = scaled[:, index] - bases[:, :, None, None]
    if limit is not None:
        tiles = jnp.where(index <= limit, tiles, NEG)
    tiles = tiles.astype(dtype)
    bases = jnp.pad(bases, ((0, 0), (0, -diagonals % _LIST_ALIGN)))
    return tiles, bases


def _table_gradient(tile_grads: jax.Array) -> jax.Array:
    """Gradients of the diagonal tiles [H', nd, 128, 128] (w.r.t. natural-log logits) -> offset-table gradient
    [H', T_pad + S_pad]: each tile summed along its 255 diagonals (m = c - r + 127) into offsets d*128 + m."""
    heads, diagonals, n, _ = tile_grads.shape
    flipped = tile_grads[:, :, ::-1, :]  # row n - 1 - r: a left skew by the row index sorts by c - r
    padded = jnp.pad(flipped, ((0, 0), (0, 0), (0, 0), (0, n)))
    skewed = padded.reshape(heads, diagonals, -1)[..., : n * (2 * n - 1)].reshape(heads, diagonals, n, 2 * n - 1)
    windows = jnp.pad(jnp.sum(skewed, axis=2), ((0, 0), (0, 0), (0, 1)))  # [H', nd, 2n]: offsets d*n + m
    low, high = windows[..., :n], windows[..., n:]
    chunks = jnp.pad(low, ((0, 0), (0, 1), (0, 0))) + jnp.pad(high, ((0, 0), (1, 0), (0, 0)))
    return chunks.reshape(heads, -1)


def _block_ranges(ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Ids [B, L] -> (smallest non-zero, largest) id per block of 128 [B, L/128]; (BIG, 0) for padding."""
    blocks = ids.reshape(ids.shape[0], -1, BLOCK)
    return jnp.min(jnp.where(blocks != 0, blocks, _BIG_ID), axis=-1), jnp.max(blocks, axis=-1)


def _causally_live(st: _Static) -> np.ndarray:
    """Bool [nq, nk] (static): whether the tile's nearest entry (last query row, first key column) is inside the
    causal limit; every tile without a causal mask."""
    first_key = np.arange(st.nk)[None, :] * BLOCK
    last_query = np.arange(st.nq)[:, None] * BLOCK + BLOCK - 1
    return (first_key - last_query <= st.q_offset) | (not st.causal)


def _live_tiles(q_pieces: jax.Array, k_pieces: jax.Array, st: _Static) -> jax.Array:
    """Bool [B, nq, nk]: whether the (query block, key block) tile can hold a visible entry."""
    k_lo, k_hi = _block_ranges(k_pieces)
    live = jnp.broadcast_to((k_hi > 0)[:, None, :], (k_pieces.shape[0], st.nq, st.nk))
    if st.use_q_ids:
        q_lo, q_hi = _block_ranges(q_pieces)
        live = live & (k_lo[:, None, :] <= q_hi[:, :, None]) & (q_lo[:, :, None] <= k_hi[:, None, :])
    return live & _causally_live(st)[None]


def _visit_lists(live: jax.Array) -> jax.Array:
    """Bool [..., n] -> int32 [..., 1 + n, padded]: the count of live entries, then their indices in order."""
    order = jnp.argsort(~live, axis=-1, stable=True).astype(jnp.int32)
    count = jnp.sum(live, axis=-1, dtype=jnp.int32)
    lists = jnp.concatenate([count[..., None], order], axis=-1)
    pad = -lists.shape[-1] % _LIST_ALIGN
    return jnp.pad(lists, [(0, 0)] * (lists.ndim - 1) + [(0, pad)])


def _diagonal_visits(live: jax.Array, st: _Static) -> jax.Array:
    """Visit lists of the table-gradient kernel: per block diagonal d, the live tiles (b, query block) on it as
    b * nq + qc -> [nd, 1 + B*nq, padded]."""
    batch = live.shape[0]
    diagonals = st.nq + st.nk - 1
    qc = jnp.arange(st.nq)
    kc = qc[None, :] + jnp.arange(diagonals)[:, None] - (st.nq - 1)  # [nd, nq]
    inside = (kc >= 0) & (kc < st.nk)
    on_diagonal = live[:, qc[None, :], jnp.clip(kc, 0, st.nk - 1)] & inside[None]  # [B, nd, nq]
    return _visit_lists(jnp.swapaxes(on_diagonal, 0, 1).reshape(diagonals, batch * st.nq))


# --- the tile arithmetic and the pieces of a CTA shared by the kernels --------------------------------------------

def _logits(ops: _Ops, s, tile_ref, base, rows, st: _Static, cols=None):
    """Base-2 logits of a [64, 128] (or [64, 64]) tile: scale*log2(e)*q.k plus the table's tile (its `rows` half,
    and `cols`: (start, size) of a column piece) and base."""
    s = s * (st.scale * LOG2E)
    if tile_ref is None:
        return s
    return s + (ops.load(tile_ref, "wgmma", rows=rows, cols=cols).astype(jnp.float32) + base)


def _tile_mask(ops: _Ops, row_ids, col_ids, row_start, col_start, st: _Static, keys_are_rows: bool,
               causal: bool = False):
    """Bool [64, W] of visible entries (None: no mask). row_ids [64] / col_ids [W] in the row / column layouts;
    rows are queries (or keys, for the dK/dV kernel's transposed tiles). `causal`: the tile may cross the causal
    limit, which the kernel computes (`_walk`)."""
    causal = causal and st.causal_in_kernel
    if not (st.masked or causal):
        return None
    shape = (HALF, col_ids.shape[0])
    rows = lax.broadcast_in_dim(row_ids, shape, [0])
    cols = lax.broadcast_in_dim(col_ids, shape, [1])
    q_ids, k_ids = (cols, rows) if keys_are_rows else (rows, cols)
    # the key ids even under a causal mask alone: without them, LLVM hoists the loop-invariant iotas and the
    # dK/dV kernels spill (ptxas: 0 -> 172 B without a table)
    visible = k_ids != 0
    if st.use_q_ids:
        visible = visible & (q_ids == k_ids)
    if causal:
        r = ops.iota(shape, 0) + row_start
        c = ops.iota(shape, 1) + col_start
        offset = r - c if keys_are_rows else c - r  # key position minus query position
        visible = visible & (offset <= st.q_offset)
    return visible


def _masked(s, mask):
    return s if mask is None else jnp.where(mask, s, NEG)


def _keys_wholly_visible(row0, st: _Static, kc):
    """Whether every key of block kc is inside the causal limit of the 64 query rows from row0."""
    return kc * BLOCK + BLOCK - 1 - row0 <= st.q_offset


def _queries_wholly_visible(key0, st: _Static, qc):
    """Whether the 64 keys from key0 are inside the causal limit of every query of block qc."""
    return key0 + HALF - 1 - qc * BLOCK <= st.q_offset


def _walk(vis_s, count, step, carry, wholly_visible, keys_listed: bool, st: _Static):
    """A consumer's loop over its visit list: step(i, carry, causal) for i < count. Under a causal mask that the
    kernel computes (no table to carry it), FlashAttention-3's split: the tiles wholly inside the causal limit
    (`wholly_visible` of the listed block index) skip the mask's arithmetic, in a loop of their own. The list is
    sorted, so they are a run: first in a list of key blocks (`keys_listed`), last in one of query blocks."""
    if not st.causal_in_kernel:
        return lax.fori_loop(0, count, functools.partial(step, causal=False), carry)
    plain = lax.fori_loop(0, count, lambda i, n: n + wholly_visible(vis_s[1 + i]).astype(jnp.int32), jnp.int32(0))
    split = plain if keys_listed else count - plain
    first_crosses = not keys_listed  # whether the entries before `split` are the ones across the limit
    carry = lax.fori_loop(0, split, functools.partial(step, causal=first_crosses), carry)
    return lax.fori_loop(split, count, functools.partial(step, causal=not first_crosses), carry)


@dataclasses.dataclass(frozen=True)
class _Piece:
    """The rows [start, start + width) of a streamed 128-row block that a consumer takes at once: a [64, width]
    S and dP live instead of [64, 128] ones (`_in_pieces`)."""

    start: int = 0
    width: int = BLOCK

    def wait(self, barrier):
        """Waits for a slot's buffer in the first piece only (a second wait would expect the barrier's next
        phase)."""
        if self.start == 0:
            _plgpu().barrier_wait(barrier)

    def free(self, barrier):
        """Arrives on a slot's "free" barrier in the last piece only: the later pieces still read the slot."""
        if self.start + self.width == BLOCK:
            _plgpu().barrier_arrive(barrier)

    @property
    def span(self) -> tuple[int, int] | None:
        """(start, size) for `_Ops.load`; None for the whole block."""
        return None if self.width == BLOCK else (self.start, self.width)

    def of(self, ref):
        """The piece's rows of a streamed [128, ...] buffer."""
        return ref if self.width == BLOCK else ref.at[pl.ds(self.start, self.width)]


def _pieces(dim: int, dim_v: int) -> int:
    """How many pieces the dQ and dK/dV kernels take each streamed block in (`_Piece`). A consumer thread holds its
    accumulators (dQ: dim/2 float32 registers; dK and dV: dim/2 + dim_v/2) and a tile's S and dP (64 each for 128
    rows) in its CONSUMER_REGISTERS: 256 at head width 128, where whole blocks spilled 20-590 B (ptxas,
    `bench/kernel_registers.py`) and [64, 64] pieces 0-60 B. Folded q and k 128 wide over v 64 keep whole blocks
    (dK/dV: 0 B at 240 registers; causal 168 B), which should cost less than wgmma at N = 64 (bench/RESULTS.md,
    item 13)."""
    return 2 if dim + dim_v > 192 else 1


def _in_pieces(piece_step, count: int):
    """A `_walk` step that runs piece_step(i, carry, causal, piece) over `count` pieces of entry i's block, one
    after another."""

    def step(i, carry, causal):
        for n in range(count):
            carry = piece_step(i, carry, causal, _Piece(n * BLOCK // count, BLOCK // count))
        return carry

    return step


def _kept(ops: _Ops, row_keys, key_start, st: _Static, keys_are_rows: bool, width: int = BLOCK):
    """`dropout.keep` of a [64, width] tile (None without dropout): row_keys, the dropout keys of its queries (a
    row-layout [64] vector, or a column-layout [width] one in the dK/dV kernel's transposed tiles, whose rows are
    keys from key index `key_start`)."""
    if not st.dropout:
        return None
    shape = (HALF, width)
    query_axis, key_axis = (1, 0) if keys_are_rows else (0, 1)
    keys = lax.broadcast_in_dim(row_keys, shape, [query_axis])
    return dropout.keep(keys, ops.iota(shape, key_axis) + key_start, st.dropout_rate)


def _dropped(x, kept):
    """x where the weight is kept, else 0; x without dropout. Products of dropped P take the 1 / (1 - rate) once
    per accumulator, dP in each tile (`_score_gradient`)."""
    return x if kept is None else jnp.where(kept, x, 0.0)


def _with_pair(s, u_queries, w_keys, keys_are_rows: bool):
    """Base-2 logits plus the pair term sum_g u[i, g] w[j, g]: u_queries / w_keys, r vectors each along the tile's
    query / key axis (rows / columns, swapped in the dK/dV kernel's transposed tiles)."""
    query_axis, key_axis = (1, 0) if keys_are_rows else (0, 1)
    for u, w in zip(u_queries, w_keys):
        s = s + (lax.broadcast_in_dim(u * LOG2E, s.shape, [query_axis]) * lax.broadcast_in_dim(w, s.shape, [key_axis]))
    return s


def _inverse_keep(st: _Static) -> float:
    return 1.0 / (1.0 - st.dropout_rate)


def _minus_delta(load_delta, query_axis: int, st: _Static, width: int = BLOCK):
    """The start of a [64, width] tile's dP accumulator: -delta broadcast along the query axis (0, or 1 in the
    dK/dV kernel's transposed tiles), so that the product leaves dP - delta and delta's vector does not live past
    it; with dropout, which scales dP before delta comes off, zero (its shape), and delta is loaded later."""
    if st.dropout:
        return (HALF, width)
    return lax.broadcast_in_dim(-load_delta(), (HALF, width), [query_axis])


def _keep_sign(p, kept):
    """P with the dropout keep mask in its sign bit (dropped weights negated; P without dropout): one [64, 128]
    array of registers where the mask would be a second one, live across the dK/dV kernel's two products."""
    return p if kept is None else jnp.where(kept, p, -p)


def _kept_weights(p_signed, st: _Static):
    """The weights that dropout keeps (0 where dropped), from `_keep_sign`'s P; P itself without dropout."""
    return jnp.maximum(p_signed, 0.0) if st.dropout else p_signed


def _score_gradient(p_signed, dp, load_delta, query_axis: int, st: _Static):
    """dS = P * (dP - delta) of a tile whose dP accumulator started at `_minus_delta`; with dropout, P carries the
    keep mask in its sign (`_keep_sign`; a weight of 0 gives dS = 0 whatever its sign) and dP / (1 - rate) where
    kept, 0 where dropped."""
    if not st.dropout:
        return p_signed * dp
    delta = lax.broadcast_in_dim(load_delta(), dp.shape, [query_axis])
    return jnp.abs(p_signed) * (jnp.where(p_signed > 0.0, dp * _inverse_keep(st), 0.0) - delta)


_OPTIONAL_INPUTS = ("row_keys", "pair_u", "pair_w")  # every kernel's last inputs


def _optional_inputs(row_keys, pair_u, pair_w) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The dropout keys [B, H, T_pad] int32 and a pair term's u [B, H, r, T_pad] and w [B, r, S_pad] float32, with
    placeholders the kernels never read where the call has no dropout or pair term."""
    if row_keys is None:
        row_keys = jnp.zeros((1, 1, _LIST_ALIGN), jnp.int32)
    if pair_u is None:
        pair_u, pair_w = jnp.zeros((1, 1, 1, _LIST_ALIGN), jnp.float32), jnp.zeros((1, 1, _LIST_ALIGN), jnp.float32)
    return row_keys, pair_u, pair_w


def _query_extras_scratch(st: _Static):
    """A forward or dQ consumer's buffers for its rows' dropout keys and pair vectors u (None: not in the call)."""
    plgpu = _plgpu()
    return (plgpu.SMEM((2, HALF), jnp.int32) if st.dropout else None,
            plgpu.SMEM((2, st.pair_rank, HALF), jnp.float32) if st.pair_rank else None)


def _query_extra_copies(refs, extras, b, h, rows, wg, st: _Static):
    """(src, dst) copies of a consumer's rows' dropout keys and u into `_query_extras_scratch`, for `_own_rows`."""
    rk_s, u_s = extras
    return (([(refs["row_keys"].at[b, h, rows], rk_s.at[wg])] if st.dropout else [])
            + ([(refs["pair_u"].at[b, h, :, rows], u_s.at[wg])] if st.pair_rank else []))


def _load_query_extras(ops: _Ops, extras, wg, st: _Static):
    """A consumer's rows' dropout keys ([64] or None) and the r vectors of u ([64] each), once copied."""
    rk_s, u_s = extras
    return (ops.load(rk_s.at[wg], "rows") if st.dropout else None,
            [ops.load(u_s.at[wg, g], "rows") for g in range(st.pair_rank)])


def _table_operands(tiles, bases, dtype):
    """The table's kernel inputs, or placeholders the kernels never read when there is no table."""
    if tiles is None:
        return jnp.zeros((1, 1, BLOCK, BLOCK), dtype), jnp.zeros((1, _LIST_ALIGN), jnp.float32)
    return tiles, bases


def _bases_bytes(bases) -> int:
    """Shared memory of the table's bases (none without a table)."""
    return 0 if bases is None else 4 * bases.shape[-1]


def _cta_inputs(wg, copies, barrier):
    """What every warpgroup of the CTA reads first (visit list, bases, ...): copied once by the producer,
    (src, dst) pairs on barriers 0, 1, ...; everyone waits."""
    plgpu = _plgpu()

    @pl.when(wg == 2)
    def _():
        for n, (src, dst) in enumerate(copies):
            plgpu.copy_gmem_to_smem(src, dst, barrier.at[n])

    for n in range(len(copies)):
        plgpu.barrier_wait(barrier.at[n])


def _own_rows(wg, copies, barrier):
    """A consumer's own 64 rows (q, dO, ids, ...), (src, dst) pairs on barriers 2n + wg; it waits for them."""
    plgpu = _plgpu()
    for n, (src, dst) in enumerate(copies):
        plgpu.copy_gmem_to_smem(src, dst, barrier.at[2 * n + wg])
    for n in range(len(copies)):
        plgpu.barrier_wait(barrier.at[2 * n + wg])


class _KeyBlocks:
    """The stream of the forward and dQ kernels: for each visited key block, K, V, the key ids (and a pair term's
    key vectors w) and the table's tile of the CTA's block diagonal, `stages` slots deep, with a barrier per buffer
    and slot and "free" barriers (K, V, and tile with ids and w) that both consumers arrive on."""

    def __init__(self, buffers, ready, free, stages: int):
        self.k, self.v, self.tile, self.ids, self.w = buffers
        self.k_ready, self.v_ready, self.tile_ready, self.ids_ready, *self.w_ready = ready
        self.k_free, self.v_free, self.tile_free = free
        self.stages = stages

    @staticmethod
    def scratch(stages, dim, dim_v, dtype, tiles, pair_rank):
        plgpu = _plgpu()
        return ((_swizzled((stages, BLOCK, dim), dtype), _swizzled((stages, BLOCK, dim_v), dtype),
                 None if tiles is None else _swizzled((stages, BLOCK, BLOCK), tiles.dtype),
                 plgpu.SMEM((stages, BLOCK), jnp.int32),
                 plgpu.SMEM((stages, pair_rank, BLOCK), jnp.float32) if pair_rank else None),
                (plgpu.Barrier(num_barriers=stages),) * (5 if pair_rank else 4),
                (plgpu.Barrier(num_arrivals=2, num_barriers=stages),) * 3)

    @staticmethod
    def bytes_per_stage(dim, dim_v, dtype, tiles, pair_rank):
        return (_nbytes((BLOCK, dim), dtype) + _nbytes((BLOCK, dim_v), dtype) + _nbytes((BLOCK,), jnp.int32)
                + (0 if tiles is None else _nbytes((BLOCK, BLOCK), tiles.dtype))
                + _nbytes((pair_rank, BLOCK), jnp.float32))

    def produce(self, k_g, v_g, t_g, kid_g, w_g, b, h, th, qc, vis_s, count, st: _Static, has_table: bool):
        """The producer: K, key ids (and pair features w), tile, V of visit-list entry i into slot i % stages."""
        plgpu = _plgpu()

        def fetch(i, slot):
            kc = vis_s[1 + i]
            keys = pl.ds(kc * BLOCK, BLOCK)
            plgpu.copy_gmem_to_smem(k_g.at[b, keys, h], self.k.at[slot], self.k_ready.at[slot])
            plgpu.copy_gmem_to_smem(kid_g.at[b, keys], self.ids.at[slot], self.ids_ready.at[slot])
            if st.pair_rank:
                plgpu.copy_gmem_to_smem(w_g.at[b, :, keys], self.w.at[slot], self.w_ready[0].at[slot])
            if has_table:
                plgpu.copy_gmem_to_smem(t_g.at[th, kc - qc + st.nq - 1], self.tile.at[slot], self.tile_ready.at[slot])
            plgpu.copy_gmem_to_smem(v_g.at[b, keys, h], self.v.at[slot], self.v_ready.at[slot])

        _stream(count, self.stages, (self.k_free, self.tile_free, self.v_free), fetch)

    def logits(self, ops: _Ops, product, slot, kc, qc, q_ids, row0, wg, base_s, st: _Static, has_table: bool,
               u_rows=(), causal=False, piece=_Piece()):
        """A consumer's base-2 logits [64, 128] of key block kc (or [64, width] of its keys `piece`; masked entries
        NEG; u_rows: its rows' pair vectors u) from product(k_ref), the float32 Q K^T of the slot's K (or its
        piece). The caller frees the slot (`k_free`, `tile_free` with the ids and w, `v_free`)."""
        piece.wait(self.k_ready.at[slot])
        s = product(piece.of(self.k.at[slot]))
        piece.wait(self.ids_ready.at[slot])
        if has_table:
            piece.wait(self.tile_ready.at[slot])
            s = _logits(ops, s, self.tile.at[slot], base_s[kc - qc + st.nq - 1], (wg * HALF, HALF), st, piece.span)
        else:
            s = _logits(ops, s, None, None, None, st)
        if st.pair_rank:
            piece.wait(self.w_ready[0].at[slot])
            s = _with_pair(s, u_rows, self.pair_keys(ops, slot, piece, st), False)
        mask = _tile_mask(ops, q_ids, ops.load(self.ids.at[slot], "cols", rows=piece.span), row0,
                          kc * BLOCK + piece.start, st, False, causal)
        return _masked(s, mask)

    def pair_keys(self, ops: _Ops, slot, piece: _Piece, st: _Static):
        """The pair term's key vectors w of the slot's keys (or its piece): r column-layout vectors."""
        return [ops.load(self.w.at[slot, g], "cols", rows=piece.span) for g in range(st.pair_rank)]


def _key_block_kernel(name, consumer, own_buffers, own_copies, own_bytes, out_type, gmem_order, q, k, v, tiles,
                      bases, visits, st: _Static, inputs, optional):
    """A kernel whose CTA owns 128 query rows and walks its visit list of key blocks (the forward, dQ): the
    producer streams `_KeyBlocks`; `consumer(ops, refs, own, stream, vis_s, count, b, h, qc, wg, base_s)` is each
    consumer warpgroup's part, own = (own_buffers, `_query_extras_scratch`, a barrier for own_copies copies and
    the extras'). `inputs` are the call's arrays, `gmem_order` their names in the body's order (k, v, tiles, bases,
    k_pieces, visits are found there by name), followed by the `optional` (row keys, pair u, pair w) arrays."""
    plgpu = _plgpu()
    ops = _Ops(st.interpret)
    batch, _, heads, dim = q.shape
    dim_v, dtype = v.shape[-1], q.dtype
    has_table = tiles is not None
    table_heads = tiles.shape[0] if has_table else 0
    per_stage = _KeyBlocks.bytes_per_stage(dim, dim_v, dtype, tiles, st.pair_rank)
    extras = _query_extras_scratch(st)
    own_bytes += st.dropout * _nbytes((2, HALF), jnp.int32) + _nbytes((2, st.pair_rank, HALF), jnp.float32)
    own_copies += sum(x is not None for x in extras)
    gmem_order += _OPTIONAL_INPUTS
    fixed = own_bytes + 4 * visits.shape[-1] + _bases_bytes(bases)
    stages = _stages(per_stage, fixed, name)
    count_outputs = len(jax.tree.leaves(out_type))

    def body(*refs_and_scratch):
        *refs, scratch = refs_and_scratch
        refs = dict(zip(gmem_order + tuple(f"out{n}" for n in range(count_outputs)), refs))
        own, (vis_s, base_s), cta_bar, stream_buffers, ready, free = scratch
        stream = _KeyBlocks(stream_buffers, ready, free, stages)
        qc, h, b = lax.axis_index("q"), lax.axis_index("heads"), lax.axis_index("batch")
        wg = lax.axis_index("wg")
        th = h if table_heads > 1 else 0
        _cta_inputs(wg, [(refs["visits"].at[b, qc], vis_s)] + ([(refs["bases"].at[th], base_s)] if has_table else []),
                    cta_bar)
        count = vis_s[0]

        @pl.when(wg < 2)
        def _():
            ops.set_registers(CONSUMER_REGISTERS, "increase")
            consumer(ops, refs, own, stream, vis_s, count, b, h, qc, wg, base_s)

        @pl.when(wg == 2)
        def _():
            ops.set_registers(PRODUCER_REGISTERS, "decrease")
            stream.produce(refs["k"], refs["v"], refs["tiles"], refs["k_pieces"], refs["pair_w"], b, h, th, qc, vis_s,
                           count, st, has_table)

    own_scratch = (own_buffers, extras, plgpu.Barrier(num_barriers=2 * own_copies))
    scratch = (own_scratch, (plgpu.SMEM(visits.shape[-1:], jnp.int32),
                             plgpu.SMEM(bases.shape[-1:] if has_table else (_LIST_ALIGN,), jnp.float32)),
               plgpu.Barrier(num_barriers=2), *_KeyBlocks.scratch(stages, dim, dim_v, dtype, tiles, st.pair_rank))
    tiles, bases = _table_operands(tiles, bases, dtype)
    inputs = dict(inputs, tiles=tiles, bases=bases, **dict(zip(_OPTIONAL_INPUTS, _optional_inputs(*optional))))
    call = _kernel(body, out_type, scratch, (st.nq, heads, batch), ("q", "heads", "batch"), st, name)
    return call(*(inputs[n] for n in gmem_order))


# --- forward ---------------------------------------------------------------------------------------------------

def _forward(q, k, v, tiles, bases, q_pieces, k_pieces, visits, row_keys, pair_u, pair_w, st: _Static):
    """out [B, T_pad, H, Dv] and the base-2 logsumexp [B, H, T_pad] (+inf for rows that see no key)."""
    plgpu = _plgpu()
    batch, _, heads, dim = q.shape
    dim_v, dtype = v.shape[-1], q.dtype
    has_table = tiles is not None

    def consumer(ops, refs, own, stream, vis_s, count, b, h, qc, wg, base_s):
        (q_s, o_s, lse_s, qid_s, turn), extras, own_bar = own
        o_s = q_s if o_s is None else o_s  # Q's buffer is free at the end: the output goes out through it

        def take_turns():
            """FlashAttention-3's ping-pong: the consumers meet here after issuing Q K^T and before P V, so that
            one's softmax runs while the other's products do (consumer 1 meets once before its walk, consumer 0
            once after: both meet 2 * count + 1 times)."""
            plgpu.barrier_arrive(turn)
            plgpu.barrier_wait(turn)

        row0 = qc * BLOCK + wg * HALF
        rows = pl.ds(row0, HALF)
        _own_rows(wg, [(refs["q"].at[b, rows, h], q_s.at[wg]), (refs["q_pieces"].at[b, rows], qid_s.at[wg])]
                  + _query_extra_copies(refs, extras, b, h, rows, wg, st), own_bar)
        q_ids = ops.load(qid_s.at[wg], "rows")
        row_keys, u_rows = _load_query_extras(ops, extras, wg, st)

        def step(i, carry, causal):
            acc, m, l = carry
            slot = lax.rem(i, stream.stages)
            kc = vis_s[1 + i]

            def product(k_ref):
                return ops.mma(q_s.at[wg], k_ref, (HALF, BLOCK), transpose_b=True, issued=take_turns)

            s = stream.logits(ops, product, slot, kc, qc, q_ids, row0, wg, base_s, st, has_table, u_rows, causal)
            plgpu.barrier_arrive(stream.tile_free.at[slot])  # with the ids and w
            plgpu.barrier_arrive(stream.k_free.at[slot])
            m_new = jnp.maximum(m, jnp.max(s, axis=1))
            # a row whose keys so far are all masked has m_new = NEG: subtracting 0 keeps its weights exp2(NEG) = 0
            m_sub = jnp.where(m_new > 0.5 * NEG, m_new, 0.0) if st.masked or st.causal else m_new
            p = jnp.exp2(s - lax.broadcast_in_dim(m_sub, s.shape, [0]))
            alpha = jnp.exp2(m - m_new)
            l = l * alpha + jnp.sum(p, axis=1)  # the weights before dropout
            p = _dropped(p, _kept(ops, row_keys, kc * BLOCK, st, False)).astype(dtype)
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
        acc, m, l = _walk(vis_s, count, step, carry, functools.partial(_keys_wholly_visible, row0, st), True, st)
        pl.when(wg == 0)(take_turns)
        seen = l > 0.0
        safe = jnp.where(seen, l, 1.0)
        norm = safe * (1.0 - st.dropout_rate) if st.dropout else safe  # dropout's 1 / (1 - rate)
        o_s[wg] = (acc / lax.broadcast_in_dim(norm, acc.shape, [0])).astype(dtype)
        lse_s[wg] = jnp.where(seen, m + jnp.log2(safe), jnp.inf)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_s.at[wg], refs["out0"].at[b, rows, h])
        plgpu.copy_smem_to_gmem(lse_s.at[wg], refs["out1"].at[b, h, rows])
        plgpu.wait_smem_to_gmem(0)

    own_buffers = (_swizzled((2, HALF, dim), dtype), _swizzled((2, HALF, dim_v), dtype) if dim_v != dim else None,
                   plgpu.SMEM((2, HALF), jnp.float32), plgpu.SMEM((2, HALF), jnp.int32),
                   plgpu.Barrier(num_arrivals=2))
    own_bytes = (_nbytes((2, HALF, dim), dtype) + (_nbytes((2, HALF, dim_v), dtype) if dim_v != dim else 0)
                 + 2 * _nbytes((2, HALF), jnp.float32))
    out_type = (jax.ShapeDtypeStruct((batch, st.t_pad, heads, dim_v), dtype),
                jax.ShapeDtypeStruct((batch, heads, st.t_pad), jnp.float32))
    return _key_block_kernel("toeplitz_attention_mgpu_fwd", consumer, own_buffers, 2, own_bytes, out_type,
                             ("q", "k", "v", "tiles", "bases", "q_pieces", "k_pieces", "visits"), q, k, v, tiles, bases,
                             visits, st, dict(q=q, k=k, v=v, q_pieces=q_pieces, k_pieces=k_pieces, visits=visits),
                             (row_keys, pair_u, pair_w))


# --- dQ --------------------------------------------------------------------------------------------------------

def _dq(q, k, v, do, lse, delta, tiles, bases, q_pieces, k_pieces, visits, row_keys, pair_u, pair_w, st: _Static):
    """dQ [B, T_pad, H, D]: the forward's walk over key blocks, with dS = P * (dP - delta) times K; with a pair
    term also du [B, H, r, T_pad] = dS w (float32)."""
    plgpu = _plgpu()
    dim, dim_v, dtype = q.shape[-1], v.shape[-1], q.dtype
    has_table = tiles is not None

    def consumer(ops, refs, own, stream, vis_s, count, b, h, qc, wg, base_s):
        (q_s, do_s, lse_s, delta_s, qid_s), extras, own_bar = own
        row0 = qc * BLOCK + wg * HALF
        rows = pl.ds(row0, HALF)
        _own_rows(wg, [(refs["q"].at[b, rows, h], q_s.at[wg]), (refs["do"].at[b, rows, h], do_s.at[wg]),
                       (refs["lse"].at[b, h, rows], lse_s.at[wg]), (refs["delta"].at[b, h, rows], delta_s.at[wg]),
                       (refs["q_pieces"].at[b, rows], qid_s.at[wg])]
                  + _query_extra_copies(refs, extras, b, h, rows, wg, st), own_bar)
        q_ids, lse, delta = (ops.load(ref.at[wg], "rows") for ref in (qid_s, lse_s, delta_s))
        row_keys, u_rows = _load_query_extras(ops, extras, wg, st)

        def step(i, carry, causal, piece):
            dq, du = carry
            slot = lax.rem(i, stream.stages)
            kc = vis_s[1 + i]

            def weights(issue, read):
                """P from S = Q K^T while dP = dO V^T runs (FlashAttention-3's backward)."""

                def product(k_ref):
                    issue(0, q_s.at[wg], k_ref, transpose_b=True)
                    piece.wait(stream.v_ready.at[slot])
                    issue(1, do_s.at[wg], piece.of(stream.v.at[slot]), transpose_b=True)
                    return read(0, 1)

                s = stream.logits(ops, product, slot, kc, qc, q_ids, row0, wg, base_s, st, has_table, u_rows, causal,
                                  piece)
                return jnp.exp2(s - lax.broadcast_in_dim(lse, s.shape, [0]))

            (_, dp), p = ops.products([(HALF, piece.width), _minus_delta(lambda: delta, 0, st, piece.width)],
                                      weights, jax.ShapeDtypeStruct((HALF, piece.width), jnp.float32))
            piece.free(stream.v_free.at[slot])
            kept = _kept(ops, row_keys, kc * BLOCK + piece.start, st, False, piece.width)
            ds = _score_gradient(_keep_sign(p, kept), dp, lambda: delta, 0, st)
            # w read again here, not held across the products: a rank-r pair term's columns are up to 32r registers
            du = tuple(d + jnp.sum(ds * lax.broadcast_in_dim(w, ds.shape, [1]), axis=1)
                       for d, w in zip(du, stream.pair_keys(ops, slot, piece, st)))
            piece.free(stream.tile_free.at[slot])  # with the ids and w
            dq = ops.mma(ds.astype(dtype), piece.of(stream.k.at[slot]), dq)
            piece.free(stream.k_free.at[slot])
            return dq, du

        du0 = tuple(ops.full((HALF,), 0.0, "rows") for _ in range(st.pair_rank))
        dq, du = _walk(vis_s, count, _in_pieces(step, _pieces(dim, dim_v)),
                       (ops.full((HALF, dim), 0.0, "wgmma"), du0), functools.partial(_keys_wholly_visible, row0, st),
                       True, st)
        q_s[wg] = (dq * st.scale).astype(dtype)
        u_s = extras[1]
        for g, d in enumerate(du):  # u's buffer is free: du goes out through it
            u_s[wg, g] = d
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(q_s.at[wg], refs["out0"].at[b, rows, h])
        if st.pair_rank:
            plgpu.copy_smem_to_gmem(u_s.at[wg], refs["out1"].at[b, h, :, rows])
        plgpu.wait_smem_to_gmem(0)

    own_buffers = (_swizzled((2, HALF, dim), dtype), _swizzled((2, HALF, dim_v), dtype),
                   plgpu.SMEM((2, HALF), jnp.float32), plgpu.SMEM((2, HALF), jnp.float32),
                   plgpu.SMEM((2, HALF), jnp.int32))
    own_bytes = _nbytes((2, HALF, dim), dtype) + _nbytes((2, HALF, dim_v), dtype) + 3 * _nbytes((2, HALF), jnp.float32)
    out_type = jax.ShapeDtypeStruct(q.shape, dtype)
    if st.pair_rank:
        out_type = (out_type, jax.ShapeDtypeStruct(pair_u.shape, jnp.float32))
    return _key_block_kernel("toeplitz_attention_mgpu_dq", consumer, own_buffers, 5, own_bytes, out_type,
                             ("q", "k", "v", "do", "lse", "delta", "tiles", "bases", "q_pieces", "k_pieces", "visits"),
                             q, k, v, tiles, bases, visits, st,
                             dict(q=q, k=k, v=v, do=do, lse=lse, delta=delta, q_pieces=q_pieces, k_pieces=k_pieces,
                                  visits=visits),
                             (row_keys, pair_u, pair_w))

# --- dK, dV ----------------------------------------------------------------------------------------------------

def _dkdv(q, k, v, do, lse, delta, tiles_t, bases, q_pieces, k_pieces, visits, row_keys, pair_u, pair_w, st: _Static):
    """dK [B, S_pad, H, D] and dV [B, S_pad, H, Dv]: per key block, over the query blocks of its visit list, on
    transposed tiles (keys as rows): dV += P^T dO, dK += dS^T Q."""
    plgpu = _plgpu()
    ops = _Ops(st.interpret)
    batch, _, heads, dim = q.shape
    dim_v, dtype = v.shape[-1], q.dtype
    has_table = tiles_t is not None
    table_heads = tiles_t.shape[0] if has_table else 0
    per_stage = (_nbytes((BLOCK, dim), dtype) + _nbytes((BLOCK, dim_v), dtype) + 2 * _nbytes((BLOCK,), jnp.float32)
                 + (2 if st.dropout else 1) * _nbytes((BLOCK,), jnp.int32)
                 + (_nbytes((BLOCK, BLOCK), tiles_t.dtype) if has_table else 0)
                 + _nbytes((st.pair_rank, BLOCK), jnp.float32))
    fixed = (_nbytes((2, HALF, dim), dtype) + _nbytes((2, HALF, dim_v), dtype) + _nbytes((2, HALF), jnp.int32)
             + _nbytes((2, st.pair_rank, HALF), jnp.float32)
             + 4 * visits.shape[-1] + _bases_bytes(bases))
    stages = _stages(per_stage, fixed, "dK/dV")
    pieces = _pieces(dim, dim_v)

    def body(q_g, k_g, v_g, do_g, lse_g, delta_g, t_g, base_g, qid_g, kid_g, vis_g, rk_g, u_g, w_g, dk_g, dv_g,
             scratch):
        (k_s, v_s, kid_s, w_s), own_bar, (vis_s, base_s), cta_bar, \
            (q_s, do_s, lse_s, delta_s, qid_s, t_s, rk_s, u_s), \
            (q_bar, do_bar, lse_bar, delta_bar, qid_bar, t_bar, rk_bar, u_bar), (q_free, do_free, t_free) = scratch
        kc, h, b = lax.axis_index("k"), lax.axis_index("heads"), lax.axis_index("batch")
        wg = lax.axis_index("wg")
        th = h if table_heads > 1 else 0
        _cta_inputs(wg, [(vis_g.at[b, kc], vis_s)] + ([(base_g.at[th], base_s)] if has_table else []), cta_bar)
        count = vis_s[0]

        @pl.when(wg < 2)
        def _consumer():
            ops.set_registers(CONSUMER_REGISTERS, "increase")
            key0 = kc * BLOCK + wg * HALF
            keys = pl.ds(key0, HALF)
            _own_rows(wg, [(k_g.at[b, keys, h], k_s.at[wg]), (v_g.at[b, keys, h], v_s.at[wg]),
                           (kid_g.at[b, keys], kid_s.at[wg])]
                      + ([(w_g.at[b, :, keys], w_s.at[wg])] if st.pair_rank else []), own_bar)
            k_ids = ops.load(kid_s.at[wg], "rows")
            w_rows = [ops.load(w_s.at[wg, g], "rows") for g in range(st.pair_rank)]

            def step(i, carry, causal, piece):
                dk, dv = carry
                slot = lax.rem(i, stages)
                qc = vis_s[1 + i]
                piece.wait(lse_bar.at[slot])
                # the product starts from -lse (in q.k units): lse's column vector dies before the tile is live
                lse = ops.load(lse_s.at[slot], "cols", rows=piece.span) * (-1.0 / (st.scale * LOG2E))
                piece.wait(q_bar.at[slot])
                s = ops.mma(k_s.at[wg], piece.of(q_s.at[slot]), lax.broadcast_in_dim(lse, (HALF, piece.width), [1]),
                            transpose_b=True)
                piece.wait(qid_bar.at[slot])
                if has_table:
                    piece.wait(t_bar.at[slot])
                    s = _logits(ops, s, t_s.at[slot], base_s[kc - qc + st.nq - 1], (wg * HALF, HALF), st, piece.span)
                else:
                    s = _logits(ops, s, None, None, None, st)
                if st.pair_rank:
                    piece.wait(u_bar.at[slot])
                    s = _with_pair(s, [ops.load(u_s.at[slot, g], "cols", rows=piece.span)
                                       for g in range(st.pair_rank)], w_rows, True)
                mask = _tile_mask(ops, k_ids, ops.load(qid_s.at[slot], "cols", rows=piece.span), key0,
                                  qc * BLOCK + piece.start, st, True, causal)
                p = jnp.exp2(_masked(s, mask))
                if st.dropout:
                    piece.wait(rk_bar.at[slot])
                    p = _keep_sign(p, _kept(ops, ops.load(rk_s.at[slot], "cols", rows=piece.span), key0, st, True,
                                            piece.width))
                piece.wait(do_bar.at[slot])
                piece.wait(delta_bar.at[slot])
                load_delta = functools.partial(ops.load, delta_s.at[slot], "cols", rows=piece.span)
                dv = ops.mma(_kept_weights(p, st).astype(dtype), piece.of(do_s.at[slot]), dv)
                dp = ops.mma(v_s.at[wg], piece.of(do_s.at[slot]), _minus_delta(load_delta, 1, st, piece.width),
                             transpose_b=True)
                ds = _score_gradient(p, dp, load_delta, 1, st)
                piece.free(t_free.at[slot])  # with the ids, lse, delta, row keys and u of the slot
                piece.free(do_free.at[slot])
                dk = ops.mma(ds.astype(dtype), piece.of(q_s.at[slot]), dk)
                piece.free(q_free.at[slot])
                return dk, dv

            carry = (ops.full((HALF, dim), 0.0, "wgmma"), ops.full((HALF, dim_v), 0.0, "wgmma"))
            dk, dv = _walk(vis_s, count, _in_pieces(step, pieces), carry,
                           functools.partial(_queries_wholly_visible, key0, st), False, st)
            k_s[wg] = (dk * st.scale).astype(dtype)
            v_s[wg] = (dv * _inverse_keep(st)).astype(dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(k_s.at[wg], dk_g.at[b, keys, h])
            plgpu.copy_smem_to_gmem(v_s.at[wg], dv_g.at[b, keys, h])
            plgpu.wait_smem_to_gmem(0)

        @pl.when(wg == 2)
        def _producer():
            ops.set_registers(PRODUCER_REGISTERS, "decrease")

            def fetch(i, slot):
                qc = vis_s[1 + i]
                queries = pl.ds(qc * BLOCK, BLOCK)
                plgpu.copy_gmem_to_smem(q_g.at[b, queries, h], q_s.at[slot], q_bar.at[slot])
                plgpu.copy_gmem_to_smem(qid_g.at[b, queries], qid_s.at[slot], qid_bar.at[slot])
                plgpu.copy_gmem_to_smem(lse_g.at[b, h, queries], lse_s.at[slot], lse_bar.at[slot])
                if has_table:
                    plgpu.copy_gmem_to_smem(t_g.at[th, kc - qc + st.nq - 1], t_s.at[slot], t_bar.at[slot])
                plgpu.copy_gmem_to_smem(do_g.at[b, queries, h], do_s.at[slot], do_bar.at[slot])
                plgpu.copy_gmem_to_smem(delta_g.at[b, h, queries], delta_s.at[slot], delta_bar.at[slot])
                if st.dropout:
                    plgpu.copy_gmem_to_smem(rk_g.at[b, h, queries], rk_s.at[slot], rk_bar.at[slot])
                if st.pair_rank:
                    plgpu.copy_gmem_to_smem(u_g.at[b, h, :, queries], u_s.at[slot], u_bar.at[slot])

            _stream(count, stages, (q_free, t_free, do_free), fetch)

    scratch = (
        (_swizzled((2, HALF, dim), dtype), _swizzled((2, HALF, dim_v), dtype), plgpu.SMEM((2, HALF), jnp.int32),
         plgpu.SMEM((2, st.pair_rank, HALF), jnp.float32) if st.pair_rank else None),
        plgpu.Barrier(num_barriers=8 if st.pair_rank else 6),
        (plgpu.SMEM(visits.shape[-1:], jnp.int32),
         plgpu.SMEM(bases.shape[-1:] if has_table else (_LIST_ALIGN,), jnp.float32)),
        plgpu.Barrier(num_barriers=2),
        (_swizzled((stages, BLOCK, dim), dtype), _swizzled((stages, BLOCK, dim_v), dtype),
         plgpu.SMEM((stages, BLOCK), jnp.float32), plgpu.SMEM((stages, BLOCK), jnp.float32),
         plgpu.SMEM((stages, BLOCK), jnp.int32),
         _swizzled((stages, BLOCK, BLOCK), tiles_t.dtype) if has_table else None,
         plgpu.SMEM((stages, BLOCK), jnp.int32) if st.dropout else None,
         plgpu.SMEM((stages, st.pair_rank, BLOCK), jnp.float32) if st.pair_rank else None),
        (plgpu.Barrier(num_barriers=stages),) * 6
        + tuple(plgpu.Barrier(num_barriers=stages) if used else None for used in (st.dropout, st.pair_rank)),
        (plgpu.Barrier(num_arrivals=2, num_barriers=stages),) * 3,
    )
    tiles_t, bases = _table_operands(tiles_t, bases, dtype)
    call = _kernel(body, (jax.ShapeDtypeStruct(k.shape, dtype), jax.ShapeDtypeStruct(v.shape, dtype)), scratch,
                   (st.nk, heads, batch), ("k", "heads", "batch"), st, "toeplitz_attention_mgpu_dkdv")
    return call(q, k, v, do, lse, delta, tiles_t, bases, q_pieces, k_pieces, visits,
                *_optional_inputs(row_keys, pair_u, pair_w))


# --- the table's gradient --------------------------------------------------------------------------------------

def _streaming_multiprocessors(st: _Static) -> int:
    """The SMs the table-gradient kernel's grid is cut for: the GPU's; an H100's 132 when lowering from a host
    without one; 1 in the interpreter, which runs one CTA at a time."""
    if st.interpret:
        return 1
    device = jax.devices()[0]
    return (getattr(device, "core_count", None) if device.platform == "gpu" else None) or 132


def _gradient_splits(batch: int, heads: int, group: int, st: _Static) -> int:
    """CTAs per (table head, block diagonal) of the table-gradient kernel. A CTA walks its share of a diagonal's
    tiles one after another, and the main diagonal holds B*min(nq, nk)*group of them (at B = 32, T = 512: 128,
    where 132 SMs share 6144 tiles, 47 each): each diagonal is cut into as many pieces as make the longest at
    most half an SM's share, so that no CTA outlasts the others' work. Tiles past a causal limit don't count."""
    live = _causally_live(st)  # tiles before any id skipping
    longest = max(int(np.trace(live, offset=d)) for d in range(1 - st.nq, st.nk)) * batch * group
    total = int(np.sum(live)) * batch * heads
    piece = max(1, math.floor(total / _streaming_multiprocessors(st) / 2))  # tiles: half an SM's share
    return math.ceil(longest / piece)


def _tile_gradients(q, k, v, do, lse, delta, tiles, bases, q_pieces, k_pieces, visits, row_keys, pair_u, pair_w,
                    st: _Static):
    """dS summed over each block diagonal's tiles, batch rows and (shared table) heads -> [H', nd, 128, 128]
    float32, w.r.t. natural-log logits; each diagonal's walk cut into `_gradient_splits` CTAs whose partial tiles
    XLA adds up."""
    plgpu = _plgpu()
    ops = _Ops(st.interpret)
    batch, _, heads, dim = q.shape
    dim_v, dtype = v.shape[-1], q.dtype
    table_heads, diagonals = tiles.shape[:2]
    group = heads // table_heads  # heads summed into one table head
    splits = _gradient_splits(batch, heads, group, st)
    per_stage = (2 * _nbytes((BLOCK, dim), dtype) + 2 * _nbytes((BLOCK, dim_v), dtype)
                 + 2 * _nbytes((BLOCK,), jnp.float32) + (3 if st.dropout else 2) * _nbytes((BLOCK,), jnp.int32)
                 + 2 * _nbytes((st.pair_rank, BLOCK), jnp.float32))
    fixed = (_nbytes((BLOCK, BLOCK), tiles.dtype) + _nbytes((2, HALF, HALF), jnp.float32)
             + 4 * visits.shape[-1] + 4 * bases.shape[-1])
    stages = _stages(per_stage, fixed, "table-gradient")

    def body(q_g, k_g, v_g, do_g, lse_g, delta_g, t_g, base_g, qid_g, kid_g, vis_g, rk_g, u_g, w_g, out_g, scratch):
        (t_s, out_s, vis_s, base_s, q_s, do_s, lse_s, delta_s, qid_s, k_s, v_s, kid_s, rk_s, u_s, w_s), \
            (cta_bar, q_bar, do_bar, lse_bar, delta_bar, qid_bar, k_bar, v_bar, kid_bar, rk_bar, u_bar, w_bar), \
            (q_free, k_free) = scratch
        d, th, split = lax.axis_index("diagonal"), lax.axis_index("heads"), lax.axis_index("split")
        wg = lax.axis_index("wg")
        _cta_inputs(wg, [(vis_g.at[d], vis_s), (base_g.at[th], base_s), (t_g.at[th, d], t_s)], cta_bar)
        pairs = vis_s[0] * group  # (head of the group, live tile) pairs on the diagonal
        chunk = lax.div(pairs + splits - 1, splits)
        first = jnp.minimum(split * chunk, pairs)  # this CTA's pairs: first, first + 1, ... (steps of them)
        steps = jnp.minimum(first + chunk, pairs) - first
        shift = d - (st.nq - 1)  # key block minus query block on this diagonal

        def tile_of(i):
            """(batch row, query block, head) of step i."""
            pair = first + i
            head = th * group + lax.div(pair, vis_s[0])
            entry = vis_s[1 + lax.rem(pair, vis_s[0])]
            return lax.div(entry, st.nq), lax.rem(entry, st.nq), head

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
                s = _logits(ops, s, t_s, base, (wg * HALF, HALF), st)
                if st.pair_rank:
                    plgpu.barrier_wait(u_bar.at[2 * slot + wg])
                    plgpu.barrier_wait(w_bar.at[slot])
                    s = _with_pair(s, [ops.load(u_s.at[slot, wg, g], "rows") for g in range(st.pair_rank)],
                                   [ops.load(w_s.at[slot, g], "cols") for g in range(st.pair_rank)], False)
                mask = _tile_mask(ops, ops.load(qid_s.at[slot, wg], "rows"), ops.load(kid_s.at[slot], "cols"),
                                  row0, (qc + shift) * BLOCK, st, False)
                lse = ops.load(lse_s.at[slot, wg], "rows")
                p = jnp.exp2(_masked(s, mask) - lax.broadcast_in_dim(lse, s.shape, [0]))
                if st.dropout:
                    plgpu.barrier_wait(rk_bar.at[2 * slot + wg])
                    p = _keep_sign(p, _kept(ops, ops.load(rk_s.at[slot, wg], "rows"), (qc + shift) * BLOCK, st,
                                            False))
                plgpu.barrier_wait(do_bar.at[2 * slot + wg])
                plgpu.barrier_wait(v_bar.at[slot])
                plgpu.barrier_wait(delta_bar.at[2 * slot + wg])
                load_delta = functools.partial(ops.load, delta_s.at[slot, wg], "rows")
                dp = ops.mma(do_s.at[slot, wg], v_s.at[slot], _minus_delta(load_delta, 0, st), transpose_b=True)
                grad = grad + _score_gradient(p, dp, load_delta, 0, st)
                plgpu.barrier_arrive(q_free.at[slot])
                plgpu.barrier_arrive(k_free.at[slot])
                return grad

            grad = lax.fori_loop(0, steps, step, ops.full((HALF, BLOCK), 0.0, "wgmma"))
            for half in range(2):  # through a [64, 64] float32 buffer per consumer, one column half at a time
                out_s[wg] = grad[:, half * HALF:(half + 1) * HALF]
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(out_s.at[wg], out_g.at[split, th, d, pl.ds(wg * HALF, HALF),
                                                               pl.ds(half * HALF, HALF)])
                plgpu.wait_smem_to_gmem(0)

        @pl.when(wg == 2)
        def _producer():
            ops.set_registers(PRODUCER_REGISTERS, "decrease")

            def fetch(i, slot):
                b, qc, h = tile_of(i)

                keys = pl.ds((qc + shift) * BLOCK, BLOCK)
                plgpu.copy_gmem_to_smem(k_g.at[b, keys, h], k_s.at[slot], k_bar.at[slot])
                plgpu.copy_gmem_to_smem(kid_g.at[b, keys], kid_s.at[slot], kid_bar.at[slot])
                if st.pair_rank:
                    plgpu.copy_gmem_to_smem(w_g.at[b, :, keys], w_s.at[slot], w_bar.at[slot])
                for half in range(2):
                    rows = pl.ds(qc * BLOCK + half * HALF, HALF)
                    plgpu.copy_gmem_to_smem(q_g.at[b, rows, h], q_s.at[slot, half], q_bar.at[2 * slot + half])
                    plgpu.copy_gmem_to_smem(qid_g.at[b, rows], qid_s.at[slot, half], qid_bar.at[2 * slot + half])
                    plgpu.copy_gmem_to_smem(lse_g.at[b, h, rows], lse_s.at[slot, half], lse_bar.at[2 * slot + half])
                    if st.dropout:
                        plgpu.copy_gmem_to_smem(rk_g.at[b, h, rows], rk_s.at[slot, half], rk_bar.at[2 * slot + half])
                    if st.pair_rank:
                        plgpu.copy_gmem_to_smem(u_g.at[b, h, :, rows], u_s.at[slot, half], u_bar.at[2 * slot + half])
                plgpu.copy_gmem_to_smem(v_g.at[b, keys, h], v_s.at[slot], v_bar.at[slot])
                for half in range(2):
                    rows = pl.ds(qc * BLOCK + half * HALF, HALF)
                    plgpu.copy_gmem_to_smem(do_g.at[b, rows, h], do_s.at[slot, half], do_bar.at[2 * slot + half])
                    plgpu.copy_gmem_to_smem(delta_g.at[b, h, rows], delta_s.at[slot, half],
                                            delta_bar.at[2 * slot + half])

            _stream(steps, stages, (q_free, k_free), fetch)

    halves = (stages, 2)
    scratch = (
        (_swizzled((BLOCK, BLOCK), tiles.dtype), plgpu.SMEM((2, HALF, HALF), jnp.float32),
         plgpu.SMEM(visits.shape[-1:], jnp.int32), plgpu.SMEM(bases.shape[-1:], jnp.float32),
         _swizzled((*halves, HALF, dim), dtype), _swizzled((*halves, HALF, dim_v), dtype),
         plgpu.SMEM((*halves, HALF), jnp.float32), plgpu.SMEM((*halves, HALF), jnp.float32),
         plgpu.SMEM((*halves, HALF), jnp.int32), _swizzled((stages, BLOCK, dim), dtype),
         _swizzled((stages, BLOCK, dim_v), dtype), plgpu.SMEM((stages, BLOCK), jnp.int32),
         plgpu.SMEM((*halves, HALF), jnp.int32) if st.dropout else None,
         plgpu.SMEM((*halves, st.pair_rank, HALF), jnp.float32) if st.pair_rank else None,
         plgpu.SMEM((stages, st.pair_rank, BLOCK), jnp.float32) if st.pair_rank else None),
        (plgpu.Barrier(num_barriers=3),) + (plgpu.Barrier(num_barriers=2 * stages),) * 5
        + (plgpu.Barrier(num_barriers=stages),) * 3
        + (plgpu.Barrier(num_barriers=2 * stages) if st.dropout else None,)
        + ((plgpu.Barrier(num_barriers=2 * stages), plgpu.Barrier(num_barriers=stages)) if st.pair_rank
           else (None, None)),
        (plgpu.Barrier(num_arrivals=2, num_barriers=stages),) * 2,
    )
    call = _kernel(body, jax.ShapeDtypeStruct((splits, table_heads, diagonals, BLOCK, BLOCK), jnp.float32),
                   scratch, (diagonals, table_heads, splits), ("diagonal", "heads", "split"), st,
                   "toeplitz_attention_mgpu_table_grad")
    partials = call(q, k, v, do, lse, delta, tiles, bases, q_pieces, k_pieces, visits,
                    *_optional_inputs(row_keys, pair_u, pair_w))
    return jnp.sum(partials, axis=0)


# --- the differentiable call -----------------------------------------------------------------------------------

def _prepare(ext, q_pieces, k_pieces, dtype, st: _Static):
    """Tiles, bases and the visit lists of one call (XLA)."""
    limit = st.q_offset + st.t_pad - 1 if st.causal_in_tiles else None  # ext index of key - query = q_offset
    tiles, bases = (None, None) if ext is None else _diagonal_tiles(ext, dtype, limit)
    live = _live_tiles(q_pieces, k_pieces, st)
    return tiles, bases, live


@functools.partial(jax.custom_vjp, nondiff_argnums=(9,))
def _attention(q, k, v, ext, q_pieces, k_pieces, row_keys, pair_u, pair_w, st):
    return _attention_fwd(q, k, v, ext, q_pieces, k_pieces, row_keys, pair_u, pair_w, st)[0]


def _attention_fwd(q, k, v, ext, q_pieces, k_pieces, row_keys, pair_u, pair_w, st):
    tiles, bases, live = _prepare(ext, q_pieces, k_pieces, q.dtype, st)
    out, lse = _forward(q, k, v, tiles, bases, q_pieces, k_pieces, _visit_lists(live), row_keys, pair_u, pair_w, st)
    return out, (q, k, v, ext, q_pieces, k_pieces, row_keys, pair_u, pair_w, out, lse)


def _attention_bwd(st, residuals, do):
    q, k, v, ext, q_pieces, k_pieces, row_keys, pair_u, pair_w, out, lse = residuals
    tiles, bases, live = _prepare(ext, q_pieces, k_pieces, q.dtype, st)
    delta = jnp.einsum("bthd,bthd->bht", out.astype(jnp.float32), do.astype(jnp.float32))
    do = do.astype(q.dtype)
    dq = _dq(q, k, v, do, lse, delta, tiles, bases, q_pieces, k_pieces, _visit_lists(live), row_keys, pair_u, pair_w,
             st)
    dq, du = dq if st.pair_rank else (dq, None)
    tiles_t = None if tiles is None else jnp.swapaxes(tiles, -1, -2)
    dk, dv = _dkdv(q, k, v, do, lse, delta, tiles_t, bases, q_pieces, k_pieces,
                   _visit_lists(jnp.swapaxes(live, 1, 2)), row_keys, pair_u, pair_w, st)
    d_ext = None
    if ext is not None:
        grads = _tile_gradients(q, k, v, do, lse, delta, tiles, bases, q_pieces, k_pieces, _diagonal_visits(live, st),
                                row_keys, pair_u, pair_w, st)
        d_ext = _table_gradient(grads).astype(ext.dtype)
    d_w = None if pair_w is None else jnp.zeros_like(pair_w)  # w: key features, not differentiated
    return dq, dk, dv, d_ext, None, None, None, du, d_w


_attention.defvjp(_attention_fwd, _attention_bwd)


def mosaic_gpu_attention(q, k, v, ext, q_pieces, k_pieces, *, scale: float, causal: bool, q_offset: int,
                         use_q_ids: bool, masked: bool, interpret: bool, dropout_rate: float = 0.0,
                         row_keys: jax.Array | None = None, pair_u: jax.Array | None = None,
                         pair_w: jax.Array | None = None) -> jax.Array:
    """The Mosaic GPU kernels on padded inputs -> out [B, T_pad, H, Dv_pad].

    q [B, T_pad, H, D], k [B, S_pad, H, D], v [B, S_pad, H, Dv] in bf16/f16 with T_pad, S_pad multiples of 128
    and D, Dv multiples of 64; ext [H'|1, T_pad + S_pad] float32 (`api._offset_table`) or None;
    q_pieces [B, T_pad], k_pieces [B, S_pad] int32 (0: padding; query ids only compared when `use_q_ids`; `masked`: the
    ids can hide a key, else they are not read); with `dropout_rate`, row_keys [B, H, T_pad] int32, the queries'
    `dropout.row_keys`; a pair term u_i . w_j (per-head segment tables) as pair_u [B, H, r, T_pad] and pair_w
    [B, r, S_pad] float32, differentiable in u only.
    """
    batch, t_pad, _, dim = q.shape
    s_pad, dim_v = k.shape[1], v.shape[-1]
    if t_pad % BLOCK or s_pad % BLOCK or dim % 64 or dim_v % 64:
        raise ValueError(f"padded shapes expected (lengths multiples of {BLOCK}, head widths of 64): q {q.shape}, "
                         f"v {v.shape}")
    st = _Static(scale=float(scale), causal=causal, q_offset=int(q_offset) if causal else 0, t_pad=t_pad,
                 s_pad=s_pad, use_q_ids=use_q_ids, masked=masked, interpret=interpret,
                 dropout_rate=float(dropout_rate), pair_rank=0 if pair_u is None else pair_u.shape[2],
                 causal_in_tiles=causal and ext is not None)
    heads = q.shape[2]
    if st.dropout and (row_keys is None or row_keys.shape != (batch, heads, t_pad)):
        raise ValueError(f"attention dropout needs row_keys [B, H, T_pad] = {(batch, heads, t_pad)}")
    if pair_u is not None and (pair_u.shape != (batch, heads, st.pair_rank, t_pad)
                               or pair_w is None or pair_w.shape != (batch, st.pair_rank, s_pad)):
        raise ValueError(f"a pair term needs pair_u [B, H, r, T_pad] and pair_w [B, r, S_pad], got "
                         f"{pair_u.shape} and {None if pair_w is None else pair_w.shape}")
    return _attention(q, k, v, ext, q_pieces, k_pieces, row_keys if st.dropout else None, pair_u, pair_w, st)
