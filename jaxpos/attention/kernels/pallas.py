"""Flash attention in Pallas with a Toeplitz bias computed inside the kernel, and its table gradient: the kernels
of `api.toeplitz_attention` on its "triton" and "mosaic_tpu" backends. This module is their differentiable entry,
`pallas_attention`; the kernels live beside it: `pallas_common` (the call's `PallasSpec`, the arrays the kernels
read, the frame of a pallas_call), `pallas_tiles` (a tile's arithmetic), `pallas_forward` and `pallas_backward`
(dK/dV, dQ and the table gradient).

How the table enters the kernels. Outside them, one small gather (`api._offset_table`) re-indexes the table by the
local offset of the padded problem: ext[h, (j - i) + Tp - 1] = table[h, clip(k_pos[j] - q_pos[i] + centre)] (the
convention of `bias.expand_toeplitz`, clipping included), so a (query block, key block) tile reads a contiguous
window of bq + bk - 1 entries of ext that depends on the block diagonal alone. The gradient goes the other way: the
dq kernel sums each tile's dS along its diagonals (a window of partial sums), chains the windows of a group of G
query blocks into one row, and a reshape-and-sum in XLA (`pallas_backward`) adds the rows of all groups and the
batch; autodiff of the gather then folds clipped offsets back onto the table's ends. No atomics and no [T, S]
tensor: the partial rows take B*H*T*(S + G*b)/(G*b) floats (b = dq block), and G (`default_dq_group`) grows with S
so that they stay within twice the size of q, 2*B*H*T*D: linear in T. The table is H*(T + S). On Mosaic the rows
go straight into each head's table gradient, H*(T + S) floats (a block that stays in VMEM while the grid runs over
the batch and the query groups), with no XLA reduction after. Triton's alternative, `table_grad="diagonals"`: a
kernel per (head, block diagonal) recomputes the diagonal's dS tiles for every batch row, adds them up in registers
and skews once (H*(T + S)*(b + 2) floats, independent of the batch; one skew per diagonal instead of one per tile,
at the price of the q.k and dO.v products computed once more).

Attention dropout: the weights `dropout.keep_mask` drops (the XLA path's mask), decided per tile from per-row keys
[B, H, T] (one int32 per query row, read like the logsumexp) and the key index; the logsumexp stays the
undropped softmax's, so the backward recomputes P as without dropout and masks P and dP.

A pair term u_i . w_j of small rank r (a per-head segment table: `bias.segment_pair_factors`) is added by r
broadcast products per tile from columns u [B, H, T, r] and rows w [B, r, S]; the dq kernel also returns
du = dS w^T, row sums it has at hand.

Backends: Pallas Triton on GPUs, Pallas Mosaic on TPUs, the Pallas interpreters where `interpret` (by default on
the CPU; the Mosaic kernels then run in the TPU interpreter). One set of kernels; what differs by backend is
`bias_tile` and `diagonal_sums` (Triton: gathers, through a scratch tile for the skew; Mosaic, which has no vector
gather: strided rolls of per-diagonal windows of the table), where the dq kernel puts the sums (above), the layout
of q, k, v ([B, T, H, D] for Triton, [B, H, T, D] for Mosaic's (8, 128) block tiling), the grid order
(`kernel_grid`), the block sizes (128 on Mosaic) and where a tile's id ranges come from (`call_kernel`). On the TPU
the lowering is checked from the CPU and the kernels run in the TPU interpreter; they have not run on a TPU.
"""

from __future__ import annotations

import functools

import jax

from jaxpos.attention.kernels.pallas_backward import backward
from jaxpos.attention.kernels.pallas_common import Operands, PallasSpec, default_dq_group
from jaxpos.attention.kernels.pallas_forward import forward

__all__ = ["PallasSpec", "default_dq_group", "pallas_attention"]


@functools.partial(jax.custom_vjp, nondiff_argnums=(9,))
def pallas_attention(q, k, v, ext, q_pieces, k_pieces, keys, u, w, st: PallasSpec):
    """The Pallas kernels on padded inputs -> out [B, T_pad, H, Dv_pad] ([B, H, T_pad, Dv_pad] where
    `st.heads_major`, as q, k and v are then).

    q [B, T_pad, H, D], k [B, S_pad, H, D], v [B, S_pad, H, Dv]; ext [H'|1, T_pad + S_pad] float32
    (`api._offset_table`) or None; q_pieces [B, T_pad, 1] and k_pieces [B, 1, S_pad] int32; keys [B, H, T_pad, 1]
    int32 (dropout's row keys) or None; a pair term as u [B, H, T_pad, r] and w [B, r, S_pad] float32, or None.
    """
    return forward(Operands(q, k, v, ext, q_pieces, k_pieces, keys, u, w), st)[0]


def _pallas_attention_fwd(q, k, v, ext, q_pieces, k_pieces, keys, u, w, st):
    x = Operands(q, k, v, ext, q_pieces, k_pieces, keys, u, w)
    out, lse = forward(x, st)
    return out, (x, out, lse)


def _pallas_attention_bwd(st, residuals, do):
    x, out, lse = residuals
    dq, dk, dv, d_ext, du = backward(x, out, lse, do, st)
    return dq, dk, dv, d_ext, None, None, None, du, None  # w (key features) takes no gradient


pallas_attention.defvjp(_pallas_attention_fwd, _pallas_attention_bwd)
