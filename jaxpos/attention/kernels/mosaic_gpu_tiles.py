"""The tiles of the Mosaic GPU kernels (`mosaic_gpu`): the offset table laid out as the tiles of its block
diagonals and the visit lists, both computed in XLA once per call, and the arithmetic of one [64, 128] tile inside
the kernels (logits, masks, the walk over a visit list, dropout, the pair term, dS)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from jaxpos.attention import dropout
from jaxpos.attention.kernels.mosaic_gpu_common import (BLOCK, HALF, LIST_ALIGN, LOG2E, NEG, MosaicGpuSpec, Ops,
                                                        Table, plgpu_module)

_BIG_ID = 2**30


# --- tiles and visit lists (XLA, once per call) ---------------------------------------------------------------

def diagonal_tiles(ext: jax.Array, dtype, upper: int | None = None, lower: int | None = None,
                   diagonals: tuple[int, int] | None = None) -> Table:
    """Offset table [H', T_pad + S_pad] -> (tiles [H', nd, 128, 128] `dtype`, bases [H', nd_pad] float32), in
    base-2 logits: tile d [r, c] + bases[d] = ext[d*128 + 127 + c - r] * log2(e), the tile's main diagonal
    (c = r) being its base. nd = (T_pad + S_pad)/128 - 1 block diagonals, or `diagonals` = (first, count) of
    them (`MosaicGpuSpec.diagonals`: tile n is block diagonal first + n); bases padded to 128-byte rows.
    `upper`, `lower`: the causal limit or a window's far side, and a window's near side, which depend on the
    offset alone, as NEG in the entries of ext index > upper or < lower (bf16; -inf in f16), so that the kernels
    need no mask arithmetic for them; bases stay the table's values."""
    heads, length = ext.shape
    first, count = diagonals or (0, length // BLOCK - 1)
    d = first + jnp.arange(count)
    r = jnp.arange(BLOCK)[:, None]
    c = jnp.arange(BLOCK)[None, :]
    index = d[:, None, None] * BLOCK + (BLOCK - 1) + c - r
    scaled = ext.astype(jnp.float32) * LOG2E
    bases = scaled[:, d * BLOCK + BLOCK - 1]
    tiles = scaled[:, index] - bases[:, :, None, None]
    if upper is not None:
        tiles = jnp.where(index <= upper, tiles, NEG)
    if lower is not None:
        tiles = jnp.where(index >= lower, tiles, NEG)
    tiles = tiles.astype(dtype)
    bases = jnp.pad(bases, ((0, 0), (0, -count % LIST_ALIGN)))
    return Table(tiles, bases)


def table_gradient(tile_grads: jax.Array, first: int = 0, length: int | None = None) -> jax.Array:
    """Gradients of the diagonal tiles [H', nd, 128, 128] (w.r.t. natural-log logits) of block diagonals first,
    first + 1, ... -> offset-table gradient [H', length] (None: (nd + 1) * 128 = T_pad + S_pad when they are all
    of them): each tile summed along its 255 diagonals (m = c - r + 127) into offsets (first + d)*128 + m."""
    heads, diagonals, n, _ = tile_grads.shape
    flipped = tile_grads[:, :, ::-1, :]  # row n - 1 - r: a left skew by the row index sorts by c - r
    padded = jnp.pad(flipped, ((0, 0), (0, 0), (0, 0), (0, n)))
    skewed = padded.reshape(heads, diagonals, -1)[..., : n * (2 * n - 1)].reshape(heads, diagonals, n, 2 * n - 1)
    windows = jnp.pad(jnp.sum(skewed, axis=2), ((0, 0), (0, 0), (0, 1)))  # [H', nd, 2n]: offsets d*n + m
    low, high = windows[..., :n], windows[..., n:]
    chunks = jnp.pad(low, ((0, 0), (0, 1), (0, 0))) + jnp.pad(high, ((0, 0), (1, 0), (0, 0)))
    covered = chunks.reshape(heads, -1)  # offsets first*128 ... (first + nd + 1)*128 - 1; the others have no tile
    length = covered.shape[-1] + first * n if length is None else length
    return jnp.pad(covered, ((0, 0), (first * n, length - covered.shape[-1] - first * n)))


def _block_ranges(ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Ids [B, L] -> (smallest non-zero, largest) id per block of 128 [B, L/128]; (BIG, 0) for padding."""
    blocks = ids.reshape(ids.shape[0], -1, BLOCK)
    return jnp.min(jnp.where(blocks != 0, blocks, _BIG_ID), axis=-1), jnp.max(blocks, axis=-1)


def live_within_limits(spec: MosaicGpuSpec) -> np.ndarray:
    """Bool [nq, nk] (static): whether the tile holds an entry inside the causal limit and the window, decided by
    its nearest entry to each (last query row and first key column; first query row and last key column); every
    tile without them. A local layer's tiles lie in a band of about window / 128 + 2 block diagonals."""
    offsets = (np.arange(spec.nk)[None, :] - np.arange(spec.nq)[:, None]) * BLOCK  # key minus query, tile corner
    live = np.ones((spec.nq, spec.nk), bool)
    if spec.upper is not None:
        live &= offsets - (BLOCK - 1) <= spec.upper
    if spec.lower is not None:
        live &= offsets + (BLOCK - 1) >= spec.lower
    return live


def live_tiles(q_pieces: jax.Array, k_pieces: jax.Array, spec: MosaicGpuSpec) -> jax.Array:
    """Ids [B, T_pad], [B, S_pad] -> bool [B, nq, nk]: whether the (query block, key block) tile can hold a visible
    entry."""
    k_lo, k_hi = _block_ranges(k_pieces)
    live = jnp.broadcast_to((k_hi > 0)[:, None, :], (k_pieces.shape[0], spec.nq, spec.nk))
    if spec.use_q_ids:
        q_lo, q_hi = _block_ranges(q_pieces)
        live = live & (k_lo[:, None, :] <= q_hi[:, :, None]) & (q_lo[:, :, None] <= k_hi[:, None, :])
    return live & live_within_limits(spec)[None]


def visit_lists(live: jax.Array) -> jax.Array:
    """Bool [..., n] -> int32 [..., 1 + n, padded]: the count of live entries, then their indices in order."""
    order = jnp.argsort(~live, axis=-1, stable=True).astype(jnp.int32)
    count = jnp.sum(live, axis=-1, dtype=jnp.int32)
    lists = jnp.concatenate([count[..., None], order], axis=-1)
    pad = -lists.shape[-1] % LIST_ALIGN
    return jnp.pad(lists, [(0, 0)] * (lists.ndim - 1) + [(0, pad)])


def diagonal_visits(live: jax.Array, spec: MosaicGpuSpec) -> jax.Array:
    """Visit lists of the table-gradient kernel: per block diagonal d of `spec.diagonals` (the n-th from its
    first), the live tiles (b, query block) on it as b * nq + qc -> [nd, 1 + B*nq, padded]."""
    batch = live.shape[0]
    first, diagonals = spec.diagonals
    qc = jnp.arange(spec.nq)
    kc = qc[None, :] + first + jnp.arange(diagonals)[:, None] - (spec.nq - 1)  # [nd, nq]
    inside = (kc >= 0) & (kc < spec.nk)
    on_diagonal = live[:, qc[None, :], jnp.clip(kc, 0, spec.nk - 1)] & inside[None]  # [B, nd, nq]
    return visit_lists(jnp.swapaxes(on_diagonal, 0, 1).reshape(diagonals, batch * spec.nq))


# --- the arithmetic of a tile inside the kernels ------------------------------------------------------------------

def tile_logits(ops: Ops, s, tile_ref, base, rows, spec: MosaicGpuSpec, cols=None):
    """Base-2 logits of a [64, 128] (or [64, 64]) tile: scale*log2(e)*q.k plus the table's tile (its `rows` half,
    and `cols`: (start, size) of a column piece) and base."""
    s = s * (spec.scale * LOG2E)
    if tile_ref is None:
        return s
    return s + (ops.load(tile_ref, "wgmma", rows=rows, cols=cols).astype(jnp.float32) + base)


def tile_mask(ops: Ops, row_ids, col_ids, row_start, col_start, spec: MosaicGpuSpec, keys_are_rows: bool,
              crossing: bool = False):
    """Bool [64, W] of visible entries (None: no mask). row_ids [64] / col_ids [W] in the row / column layouts;
    rows are queries (or keys, for the dK/dV kernel's transposed tiles). `crossing`: the tile may cross the causal
    limit or a side of the window, which the kernel computes (`walk`)."""
    crossing = crossing and spec.limits_in_kernel
    if not (spec.masked or crossing):
        return None
    shape = (HALF, col_ids.shape[0])
    rows = lax.broadcast_in_dim(row_ids, shape, [0])
    cols = lax.broadcast_in_dim(col_ids, shape, [1])
    q_ids, k_ids = (cols, rows) if keys_are_rows else (rows, cols)
    # the key ids even under a causal mask alone: without them, LLVM hoists the loop-invariant iotas and the
    # dK/dV kernels spill (ptxas: 0 -> 172 B without a table)
    visible = k_ids != 0
    if spec.use_q_ids:
        visible = visible & (q_ids == k_ids)
    if crossing:
        r = ops.iota(shape, 0) + row_start
        c = ops.iota(shape, 1) + col_start
        offset = r - c if keys_are_rows else c - r  # key position minus query position
        if spec.upper is not None:
            visible = visible & (offset <= spec.upper)
        if spec.lower is not None:
            visible = visible & (offset >= spec.lower)
    return visible


def apply_mask(s, mask):
    """s where the mask shows an entry, NEG elsewhere; s itself without a mask."""
    return s if mask is None else jnp.where(mask, s, NEG)


def key_block_offsets(row0, kc):
    """(smallest, largest) key - query offset between the keys of block kc and the 64 query rows from row0."""
    return kc * BLOCK - (row0 + HALF - 1), kc * BLOCK + BLOCK - 1 - row0


def query_block_offsets(key0, qc):
    """(smallest, largest) key - query offset between the 64 keys from key0 and the queries of block qc."""
    return key0 - (qc * BLOCK + BLOCK - 1), key0 + HALF - 1 - qc * BLOCK


def walk(vis_s, count, step, carry, offsets, keys_listed: bool, spec: MosaicGpuSpec):
    """A consumer's loop over its visit list: step(i, carry, crossing) for i < count. Under a causal limit or a
    window that the kernel computes (no table to carry them), FlashAttention-3's split: the tiles wholly inside
    the limits (`offsets` of the listed block index: the tile's smallest and largest key - query offset) skip the
    mask's arithmetic, in a loop of their own. The list is sorted, so they are one run, after the tiles across
    one limit and before those across the other: offsets grow along a list of key blocks (`keys_listed`: the
    window's near side leads) and fall along one of query blocks (the causal limit or the far side leads)."""
    if not spec.limits_in_kernel:
        return lax.fori_loop(0, count, functools.partial(step, crossing=False), carry)
    upper, lower = spec.upper, spec.lower

    def inside(index):
        low, high = offsets(index)
        within = True if upper is None else high <= upper
        return within if lower is None else jnp.logical_and(within, low >= lower)

    def tally(predicate):
        return lax.fori_loop(0, count, lambda i, n: n + predicate(vis_s[1 + i]).astype(jnp.int32), jnp.int32(0))

    leading, trailing = (lower, upper) if keys_listed else (upper, lower)  # the limits crossed before and after
    plain = tally(inside)
    if leading is None:
        first = 0
    elif trailing is None:
        first = count - plain
    elif keys_listed:
        first = tally(lambda index: offsets(index)[0] < lower)
    else:
        first = tally(lambda index: offsets(index)[1] > upper)
    if leading is not None:
        carry = lax.fori_loop(0, first, functools.partial(step, crossing=True), carry)
    carry = lax.fori_loop(first, first + plain, functools.partial(step, crossing=False), carry)
    if trailing is not None:
        carry = lax.fori_loop(first + plain, count, functools.partial(step, crossing=True), carry)
    return carry


@dataclasses.dataclass(frozen=True)
class Piece:
    """The rows [start, start + width) of a streamed 128-row block that a consumer takes at once: a [64, width]
    S and dP live instead of [64, 128] ones (`in_pieces`)."""

    start: int = 0
    width: int = BLOCK

    def wait(self, barrier):
        """Waits for a slot's buffer in the first piece only (a second wait would expect the barrier's next
        phase)."""
        if self.start == 0:
            plgpu_module().barrier_wait(barrier)

    def free(self, barrier):
        """Arrives on a slot's "free" barrier in the last piece only: the later pieces still read the slot."""
        if self.start + self.width == BLOCK:
            plgpu_module().barrier_arrive(barrier)

    @property
    def span(self) -> tuple[int, int] | None:
        """(start, size) for `Ops.load`; None for the whole block."""
        return None if self.width == BLOCK else (self.start, self.width)

    def of(self, ref):
        """The piece's rows of a streamed [128, ...] buffer."""
        return ref if self.width == BLOCK else ref.at[pl.ds(self.start, self.width)]


def in_pieces(piece_step, count: int):
    """A `walk` step that runs piece_step(i, carry, crossing, piece) over `count` pieces of entry i's block, one
    after another."""

    def step(i, carry, crossing):
        for n in range(count):
            carry = piece_step(i, carry, crossing, Piece(n * BLOCK // count, BLOCK // count))
        return carry

    return step


def keep_mask(ops: Ops, row_keys, key_start, spec: MosaicGpuSpec, keys_are_rows: bool, width: int = BLOCK):
    """`dropout.keep` of a [64, width] tile (None without dropout): row_keys, the dropout keys of its queries (a
    row-layout [64] vector, or a column-layout [width] one in the dK/dV kernel's transposed tiles, whose rows are
    keys from key index `key_start`)."""
    if not spec.dropout:
        return None
    shape = (HALF, width)
    query_axis, key_axis = (1, 0) if keys_are_rows else (0, 1)
    keys = lax.broadcast_in_dim(row_keys, shape, [query_axis])
    return dropout.keep(keys, ops.iota(shape, key_axis) + key_start, spec.dropout_rate)


def dropped(x, kept):
    """x where the weight is kept, else 0; x without dropout. Products of dropped P take the 1 / (1 - rate) once
    per accumulator, dP in each tile (`score_gradient`)."""
    return x if kept is None else jnp.where(kept, x, 0.0)


def with_pair(s, u_queries, w_keys, keys_are_rows: bool):
    """Base-2 logits plus the pair term sum_g u[i, g] w[j, g]: u_queries / w_keys, r vectors each along the tile's
    query / key axis (rows / columns, swapped in the dK/dV kernel's transposed tiles)."""
    query_axis, key_axis = (1, 0) if keys_are_rows else (0, 1)
    for u, w in zip(u_queries, w_keys):
        s = s + (lax.broadcast_in_dim(u * LOG2E, s.shape, [query_axis]) * lax.broadcast_in_dim(w, s.shape, [key_axis]))
    return s


def inverse_keep(spec: MosaicGpuSpec) -> float:
    return 1.0 / (1.0 - spec.dropout_rate)


def minus_delta(load_delta, query_axis: int, spec: MosaicGpuSpec, width: int = BLOCK):
    """The start of a [64, width] tile's dP accumulator: -delta broadcast along the query axis (0, or 1 in the
    dK/dV kernel's transposed tiles), so that the product leaves dP - delta and delta's vector does not live past
    it; with dropout, which scales dP before delta comes off, zero (its shape), and delta is loaded later."""
    if spec.dropout:
        return (HALF, width)
    return lax.broadcast_in_dim(-load_delta(), (HALF, width), [query_axis])


def keep_sign(p, kept):
    """P with the dropout keep mask in its sign bit (dropped weights negated; P without dropout): one [64, 128]
    array of registers where the mask would be a second one, live across the dK/dV kernel's two products."""
    return p if kept is None else jnp.where(kept, p, -p)


def kept_weights(p_signed, spec: MosaicGpuSpec):
    """The weights that dropout keeps (0 where dropped), from `keep_sign`'s P; P itself without dropout."""
    return jnp.maximum(p_signed, 0.0) if spec.dropout else p_signed


def score_gradient(p_signed, dp, load_delta, query_axis: int, spec: MosaicGpuSpec):
    """dS = P * (dP - delta) of a tile whose dP accumulator started at `minus_delta`; with dropout, P carries the
    keep mask in its sign (`keep_sign`; a weight of 0 gives dS = 0 whatever its sign) and dP / (1 - rate) where
    kept, 0 where dropped."""
    if not spec.dropout:
        return p_signed * dp
    delta = lax.broadcast_in_dim(load_delta(), dp.shape, [query_axis])
    return jnp.abs(p_signed) * (jnp.where(p_signed > 0.0, dp * inverse_keep(spec), 0.0) - delta)
