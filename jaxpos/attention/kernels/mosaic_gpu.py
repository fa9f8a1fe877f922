"""Toeplitz attention on Hopper GPUs: Mosaic GPU kernels (wgmma, TMA, warp specialisation) for
`api.toeplitz_attention(..., backend="mosaic_gpu")`. This module is their differentiable entry,
`mosaic_gpu_attention`; the kernels live beside it: `mosaic_gpu_common` (constants, the call's `MosaicGpuSpec`,
`Ops`, the frame of a kernel), `mosaic_gpu_tiles` (the table's tiles, visit lists and a tile's arithmetic),
`mosaic_gpu_forward` (the forward, and the key-block stream it shares with dQ) and `mosaic_gpu_backward` (dQ,
dK/dV and the table gradient).

Every kernel runs one CTA of three warpgroups: two consumers that own 64 rows each of a 128-row block and issue
wgmma, and a producer that streams the other side's 128-row blocks into shared memory by TMA, `STAGES` deep,
through one mbarrier per buffer and slot (and a "free" barrier per slot that both consumers arrive on). In the
forward the consumers take turns on the tensor cores (FlashAttention-3's ping-pong): one's softmax and table tile
run while the other's products do.

How the table enters. The kernels cannot gather, so the offset table `ext` [H'|1, T_pad + S_pad] (from
`api._offset_table`) is laid out once per call as the tiles of its block diagonals: a (128-row,
128-column) tile of block diagonal d = key block - query block + nq - 1 reads ext[d*128 + 127 + c - r], so tile d
serves every tile on its diagonal, for every batch row (`diagonal_tiles`). A tile is stored as bf16 residuals
around its own main-diagonal value (an f32 scalar per tile, read from shared memory): the entries that carry
softmax weight sit near that value, so they keep f32-like precision even where the table grows with the offset
(ALiBi, attenuated). H'*(T+S)*128 entries: linear in T; only the block diagonals a causal limit or a window
leaves any visible entry on (`MosaicGpuSpec.diagonals`: a local layer's are about window / 128 + 2, whatever T).
The dK/dV kernel reads the transposed tiles.

How the table's gradient comes back. The gradient of tile d is dS summed over the tiles of block diagonal d and
the batch (and the heads of a shared table); a fourth kernel walks exactly those tiles, recomputes P and dP (two
products per tile) and adds dS up in registers, so no atomics and no [T, S] tensor. Its CTAs are (table head,
block diagonal, split): a diagonal's walk is cut into as many pieces as keep the SMs evenly busy
(`table_gradient_splits`). Each writes one f32 tile, splits*H'*(T+S)*128 floats (fewer diagonals under a causal
limit or a window); XLA adds the splits up and sums each tile along its diagonals into the window of offsets it
covers (`table_gradient`). The result is deterministic.

Masks follow `toeplitz_attention`: key id 0 = padding, query ids (when given) must equal key ids, causal
(k_pos <= q_pos), a local window (|k_pos - q_pos| <= window // 2). Tiles with no visible entry are skipped: a
visit list per CTA (`visit_lists`), computed in XLA from the blocks' id ranges, the causal limit and the window's
two sides, tells both the producer and the consumers which blocks to walk, so a local layer walks about
window / 128 + 2 blocks per CTA (and its table gradient as many block diagonals). Rows that see no key give
out = 0, logsumexp +inf and zero gradients. With a table, the causal limit and the window ride in the tiles (they
depend on the offset alone: NEG past them, `diagonal_tiles`), so no tile computes them from iotas.

Inputs are bf16 or f16 (f32 accumulation); head widths are padded with zero channels to a multiple of 64 (q and k
may be wider than v: folded low-rank factors). Wide heads leave no registers for a [64, 128] S and dP beside the
accumulators, so the dQ and dK/dV consumers then take each streamed block in two [64, 64] pieces (`Piece`,
`block_pieces`). Attention dropout drops the weights `dropout.keep_mask` drops: each kernel hashes its tile's keep
mask from the query rows' keys and the key indices (`keep_mask`), nothing stored. A pair term u_i . w_j of rank r
(a per-head segment table, `bias.segment_pair_factors`) enters every tile from r vectors per query and per key
(`with_pair`); its gradient du = dS w is a row sum in the dQ kernel.

Testing on a machine without a GPU: Pallas's Mosaic GPU interpreter runs these kernels thread by thread with
simulated shared memory, TMA and barriers (and finds races), but has no rule for wgmma with a transposed or
register operand, `plgpu.load` or layout casts. `Ops` is the one seam: under the interpreter a product is a
jnp.dot of the same operands and a layout load a plain read; everything else (copies, barriers, loops, visit
lists, masks, softmax, the tile arithmetic) is the compiled code. The compiled path is checked by lowering for
CUDA from the CPU (which runs Mosaic's layout inference and shared-memory accounting), not by ptxas.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxpos.attention.kernels.mosaic_gpu_backward import key_value_gradients, query_gradients, tile_gradients
from jaxpos.attention.kernels.mosaic_gpu_common import (BLOCK, LOG2E, NEG, BackwardInputs, MosaicGpuSpec,
                                                        Operands, Table, unsupported)
from jaxpos.attention.kernels.mosaic_gpu_forward import forward
from jaxpos.attention.kernels.mosaic_gpu_tiles import (diagonal_tiles, diagonal_visits, live_tiles,
                                                       live_within_limits, table_gradient, visit_lists)

__all__ = ["BLOCK", "LOG2E", "NEG", "MosaicGpuSpec", "block_pieces", "mosaic_gpu_attention", "table_gradient_splits",
           "unsupported"]


# --- the block choices of a call (read from this module at call time, so that tests can set them) --------------

def block_pieces(dim: int, dim_v: int) -> int:
    """How many pieces the dQ and dK/dV kernels take each streamed block in (`Piece`). A consumer thread holds its
    accumulators (dQ: dim/2 float32 registers; dK and dV: dim/2 + dim_v/2) and a tile's S and dP (64 each for 128
    rows) in its CONSUMER_REGISTERS: 256 at head width 128, where whole blocks spilled 20-590 B (ptxas,
    `bench/kernel_registers.py`) and [64, 64] pieces 0-60 B. Folded q and k 128 wide over v 64 keep whole blocks
    (dK/dV: 0 B at 240 registers; causal 168 B), which should cost less than wgmma at N = 64 (bench/RESULTS.md,
    item 13)."""
    return 2 if dim + dim_v > 192 else 1


def _streaming_multiprocessors(spec: MosaicGpuSpec) -> int:
    """The SMs the table-gradient kernel's grid is cut for: the GPU's; an H100's 132 when lowering from a host
    without one; 1 in the interpreter, which runs one CTA at a time."""
    if spec.interpret:
        return 1
    device = jax.devices()[0]
    return (getattr(device, "core_count", None) if device.platform == "gpu" else None) or 132


def table_gradient_splits(batch: int, heads: int, group: int, spec: MosaicGpuSpec) -> int:
    """CTAs per (table head, block diagonal) of the table-gradient kernel. A CTA walks its share of a diagonal's
    tiles one after another, and the main diagonal holds B*min(nq, nk)*group of them (at B = 32, T = 512: 128,
    where 132 SMs share 6144 tiles, 47 each): each diagonal is cut into as many pieces as make the longest at
    most half an SM's share, so that no CTA outlasts the others' work. Tiles past a causal limit or outside a
    window don't count."""
    live = live_within_limits(spec)  # tiles before any id skipping
    longest = max(int(np.trace(live, offset=d)) for d in range(1 - spec.nq, spec.nk)) * batch * group
    total = int(np.sum(live)) * batch * heads
    piece = max(1, math.floor(total / _streaming_multiprocessors(spec) / 2))  # tiles: half an SM's share
    return math.ceil(longest / piece)


# --- the differentiable call -----------------------------------------------------------------------------------

def _prepare(ext, q_pieces, k_pieces, dtype, spec: MosaicGpuSpec) -> tuple[Table | None, jax.Array]:
    """The table's tiles (None without a table) and the live tiles [B, nq, nk] of one call (XLA)."""
    upper = lower = None  # ext index of key - query = limit: the limit + T_pad - 1
    if spec.limits_in_tiles:
        upper = None if spec.upper is None else spec.upper + spec.t_pad - 1
        lower = None if spec.lower is None else spec.lower + spec.t_pad - 1
    table = None if ext is None else diagonal_tiles(ext, dtype, upper, lower, spec.diagonals)
    return table, live_tiles(q_pieces, k_pieces, spec)


@functools.partial(jax.custom_vjp, nondiff_argnums=(9,))
def _attention(q, k, v, ext, q_pieces, k_pieces, row_keys, pair_u, pair_w, spec):
    return _attention_fwd(q, k, v, ext, q_pieces, k_pieces, row_keys, pair_u, pair_w, spec)[0]


def _attention_fwd(q, k, v, ext, q_pieces, k_pieces, row_keys, pair_u, pair_w, spec):
    table, live = _prepare(ext, q_pieces, k_pieces, q.dtype, spec)
    x = Operands(q, k, v, q_pieces, k_pieces, row_keys, pair_u, pair_w)
    out, lse = forward(x, table, visit_lists(live), spec)
    return out, (q, k, v, ext, q_pieces, k_pieces, row_keys, pair_u, pair_w, out, lse)


def _attention_bwd(spec, residuals, do):
    q, k, v, ext, q_pieces, k_pieces, row_keys, pair_u, pair_w, out, lse = residuals
    table, live = _prepare(ext, q_pieces, k_pieces, q.dtype, spec)
    x = Operands(q, k, v, q_pieces, k_pieces, row_keys, pair_u, pair_w)
    delta = jnp.einsum("bthd,bthd->bht", out.astype(jnp.float32), do.astype(jnp.float32))
    grads = BackwardInputs(do.astype(q.dtype), lse, delta)
    dq = query_gradients(x, grads, table, visit_lists(live), spec)
    dq, du = dq if spec.pair_rank else (dq, None)
    table_t = None if table is None else Table(jnp.swapaxes(table.tiles, -1, -2), table.bases)
    dk, dv = key_value_gradients(x, grads, table_t, visit_lists(jnp.swapaxes(live, 1, 2)), spec)
    d_ext = None
    if ext is not None:
        tile_grads = tile_gradients(x, grads, table, diagonal_visits(live, spec), spec)
        d_ext = table_gradient(tile_grads, spec.diagonals[0], ext.shape[-1]).astype(ext.dtype)
    d_w = None if pair_w is None else jnp.zeros_like(pair_w)  # w: key features, not differentiated
    return dq, dk, dv, d_ext, None, None, None, du, d_w


_attention.defvjp(_attention_fwd, _attention_bwd)


def mosaic_gpu_attention(q, k, v, ext, q_pieces, k_pieces, *, scale: float, causal: bool, q_offset: int,
                         use_q_ids: bool, masked: bool, interpret: bool, half_window: int | None = None,
                         dropout_rate: float = 0.0,
                         row_keys: jax.Array | None = None, pair_u: jax.Array | None = None,
                         pair_w: jax.Array | None = None) -> jax.Array:
    """The Mosaic GPU kernels on padded inputs -> out [B, T_pad, H, Dv_pad].

    q [B, T_pad, H, D], k [B, S_pad, H, D], v [B, S_pad, H, Dv] in bf16/f16 with T_pad, S_pad multiples of 128
    and D, Dv multiples of 64; ext [H'|1, T_pad + S_pad] float32 (`api._offset_table`) or None;
    q_pieces [B, T_pad], k_pieces [B, S_pad] int32 (0: padding; query ids only compared when `use_q_ids`; `masked`: the
    ids can hide a key, else they are not read); `half_window`: keys with |j - i - q_offset| <= half_window only
    (a local layer; its tiles outside skipped); with `dropout_rate`, row_keys [B, H, T_pad] int32, the queries'
    `dropout.row_keys`; a pair term u_i . w_j (per-head segment tables) as pair_u [B, H, r, T_pad] and pair_w
    [B, r, S_pad] float32, differentiable in u only.
    """
    batch, t_pad, heads, dim = q.shape
    s_pad, dim_v = k.shape[1], v.shape[-1]
    if t_pad % BLOCK or s_pad % BLOCK or dim % 64 or dim_v % 64:
        raise ValueError(f"padded shapes expected (lengths multiples of {BLOCK}, head widths of 64): q {q.shape}, "
                         f"v {v.shape}")
    limited = causal or half_window is not None
    spec = MosaicGpuSpec(scale=float(scale), causal=causal, q_offset=int(q_offset) if limited else 0, t_pad=t_pad,
                         s_pad=s_pad, use_q_ids=use_q_ids, masked=masked, interpret=interpret,
                         dropout_rate=float(dropout_rate), pair_rank=0 if pair_u is None else pair_u.shape[2],
                         half_window=half_window, limits_in_tiles=limited and ext is not None,
                         pieces=block_pieces(dim, dim_v))
    if ext is not None:
        splits = table_gradient_splits(batch, heads, heads // ext.shape[0], spec)
        spec = dataclasses.replace(spec, table_splits=splits)
    if spec.dropout and (row_keys is None or row_keys.shape != (batch, heads, t_pad)):
        raise ValueError(f"attention dropout needs row_keys [B, H, T_pad] = {(batch, heads, t_pad)}")
    if pair_u is not None and (pair_u.shape != (batch, heads, spec.pair_rank, t_pad)
                               or pair_w is None or pair_w.shape != (batch, spec.pair_rank, s_pad)):
        raise ValueError(f"a pair term needs pair_u [B, H, r, T_pad] and pair_w [B, r, S_pad], got "
                         f"{pair_u.shape} and {None if pair_w is None else pair_w.shape}")
    return _attention(q, k, v, ext, q_pieces, k_pieces, row_keys if spec.dropout else None, pair_u, pair_w, spec)

