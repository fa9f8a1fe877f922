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

def diagonal_tiles(ext: jax.Array, dtype, limit: int | None = None) -> Table:
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
    bases = jnp.pad(bases, ((0, 0), (0, -diagonals % LIST_ALIGN)))
    return Table(tiles, bases)


def table_gradient(tile_grads: jax.Array) -> jax.Array:
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


def causally_live(spec: MosaicGpuSpec) -> np.ndarray:
    """Bool [nq, nk] (static): whether the tile's nearest entry (last query row, first key column) is inside the
    causal limit; every tile without a causal mask."""
    first_key = np.arange(spec.nk)[None, :] * BLOCK
    last_query = np.arange(spec.nq)[:, None] * BLOCK + BLOCK - 1
    return (first_key - last_query <= spec.q_offset) | (not spec.causal)


def live_tiles(q_pieces: jax.Array, k_pieces: jax.Array, spec: MosaicGpuSpec) -> jax.Array:
    """Ids [B, T_pad], [B, S_pad] -> bool [B, nq, nk]: whether the (query block, key block) tile can hold a visible
    entry."""
    k_lo, k_hi = _block_ranges(k_pieces)
    live = jnp.broadcast_to((k_hi > 0)[:, None, :], (k_pieces.shape[0], spec.nq, spec.nk))
    if spec.use_q_ids:
        q_lo, q_hi = _block_ranges(q_pieces)
        live = live & (k_lo[:, None, :] <= q_hi[:, :, None]) & (q_lo[:, :, None] <= k_hi[:, None, :])
    return live & causally_live(spec)[None]


def visit_lists(live: jax.Array) -> jax.Array:
    """Bool [..., n] -> int32 [..., 1 + n, padded]: the count of live entries, then their indices in order."""
    order = jnp.argsort(~live, axis=-1, stable=True).astype(jnp.int32)
    count = jnp.sum(live, axis=-1, dtype=jnp.int32)
    lists = jnp.concatenate([count[..., None], order], axis=-1)
    pad = -lists.shape[-1] % LIST_ALIGN
    return jnp.pad(lists, [(0, 0)] * (lists.ndim - 1) + [(0, pad)])


def diagonal_visits(live: jax.Array, spec: MosaicGpuSpec) -> jax.Array:
    """Visit lists of the table-gradient kernel: per block diagonal d, the live tiles (b, query block) on it as
    b * nq + qc -> [nd, 1 + B*nq, padded]."""
    batch = live.shape[0]
    diagonals = spec.nq + spec.nk - 1
    qc = jnp.arange(spec.nq)
    kc = qc[None, :] + jnp.arange(diagonals)[:, None] - (spec.nq - 1)  # [nd, nq]
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
              causal: bool = False):
    """Bool [64, W] of visible entries (None: no mask). row_ids [64] / col_ids [W] in the row / column layouts;
    rows are queries (or keys, for the dK/dV kernel's transposed tiles). `causal`: the tile may cross the causal
    limit, which the kernel computes (`walk`)."""
    causal = causal and spec.causal_in_kernel
    if not (spec.masked or causal):
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
    if causal:
        r = ops.iota(shape, 0) + row_start
        c = ops.iota(shape, 1) + col_start
        offset = r - c if keys_are_rows else c - r  # key position minus query position
        visible = visible & (offset <= spec.q_offset)
    return visible


def apply_mask(s, mask):
    """s where the mask shows an entry, NEG elsewhere; s itself without a mask."""
    return s if mask is None else jnp.where(mask, s, NEG)


def keys_wholly_visible(row0, spec: MosaicGpuSpec, kc):
    """Whether every key of block kc is inside the causal limit of the 64 query rows from row0."""
    return kc * BLOCK + BLOCK - 1 - row0 <= spec.q_offset


def queries_wholly_visible(key0, spec: MosaicGpuSpec, qc):
    """Whether the 64 keys from key0 are inside the causal limit of every query of block qc."""
    return key0 + HALF - 1 - qc * BLOCK <= spec.q_offset


def walk(vis_s, count, step, carry, wholly_visible, keys_listed: bool, spec: MosaicGpuSpec):
    """A consumer's loop over its visit list: step(i, carry, causal) for i < count. Under a causal mask that the
    kernel computes (no table to carry it), FlashAttention-3's split: the tiles wholly inside the causal limit
    (`wholly_visible` of the listed block index) skip the mask's arithmetic, in a loop of their own. The list is
    sorted, so they are a run: first in a list of key blocks (`keys_listed`), last in one of query blocks."""
    if not spec.causal_in_kernel:
        return lax.fori_loop(0, count, functools.partial(step, causal=False), carry)
    plain = lax.fori_loop(0, count, lambda i, n: n + wholly_visible(vis_s[1 + i]).astype(jnp.int32), jnp.int32(0))
    split = plain if keys_listed else count - plain
    first_crosses = not keys_listed  # whether the entries before `split` are the ones across the limit
    carry = lax.fori_loop(0, split, functools.partial(step, causal=first_crosses), carry)
    return lax.fori_loop(split, count, functools.partial(step, causal=not first_crosses), carry)


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
    """A `walk` step that runs piece_step(i, carry, causal, piece) over `count` pieces of entry i's block, one
    after another."""

    def step(i, carry, causal):
        for n in range(count):
            carry = piece_step(i, carry, causal, Piece(n * BLOCK // count, BLOCK // count))
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
