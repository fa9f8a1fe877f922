"""What the Pallas kernels of `pallas` share: the spec of a call, the arrays they read, the query-block group of
the dq kernel, and the frame of a pallas_call (grid order, block specs, interpreter and compiler parameters, the
blocks' id ranges that Mosaic reads from SMEM)."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from jaxpos.attention.kernels.limits import VisibleOffsets

_BIG_ID = 2**30  # above every piece id: the smallest id of a block that is all padding


@dataclasses.dataclass(frozen=True)
class PallasSpec(VisibleOffsets):
    """Static settings of one call (hashable: a nondiff argument of the custom VJP)."""

    scale: float
    causal: bool
    q_offset: int  # causal: key j is visible to query i when j - i <= q_offset (q_pos[i] - k_pos[j] >= 0)
    half_window: int | None  # a local window: key j visible to query i when |j - i - q_offset| <= half_window
    block_q: int
    block_k: int
    block_dq: int  # square tiles of the dq / table-gradient kernel
    dq_group: int  # query blocks per dq program: the table-gradient rows are B*H*T*(S + G*b)/(G*b) floats
    table_grad: str  # "tiles": the dq kernel sums each tile's diagonals; "diagonals": a kernel per block diagonal
    t_pad: int
    s_pad: int
    use_q_pieces: bool
    masked: bool  # any mask at all (key ids, query ids, causal, a window or padded keys); else no mask arithmetic
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


class Operands(NamedTuple):
    """A call's padded inputs in the kernels' layout (`pallas.pallas_attention`); the last three None without
    dropout or a pair term."""

    q: jax.Array  # [B, T_pad, H, D] ([B, H, T_pad, D] where heads_major)
    k: jax.Array  # [B, S_pad, H, D]
    v: jax.Array  # [B, S_pad, H, Dv]
    ext: jax.Array | None  # [H'|1, T_pad + S_pad] float32: the offset table
    q_pieces: jax.Array  # [B, T_pad, 1] int32 query ids
    k_pieces: jax.Array  # [B, 1, S_pad] int32 key ids (0: padding)
    keys: jax.Array | None  # [B, H, T_pad, 1] int32: dropout's row keys
    u: jax.Array | None  # [B, H, T_pad, r] float32: a pair term's per-query factors
    w: jax.Array | None  # [B, r, S_pad] float32: its per-key features


class BackwardInputs(NamedTuple):
    """What the backward kernels read per query row beside the operands."""

    do: jax.Array  # like q's first three axes, v's head width
    lse: jax.Array  # [B, H, T_pad, 1] float32: the forward's logsumexp
    delta: jax.Array  # [B, H, T_pad, 1] float32: rowsum(dO * out)


def tpu_module():
    """Pallas's TPU module, for the mosaic_tpu backend."""
    from jax.experimental.pallas import tpu  # lazy: 0.14 s at import, which no CPU or GPU run needs
    return tpu


def triton_module():
    """Pallas's Triton module, for the triton backend."""
    from jax.experimental.pallas import triton  # lazy: 0.07 s at import, which no CPU or TPU run needs
    return triton


def default_dq_group(t_pad: int, s_pad: int, b: int, dim: int, limit: int = 16) -> int:
    """Query blocks per dq program: the least power of two dividing T_pad / b (at most `limit`, which bounds the
    registers a program carries) whose table-gradient rows fit in 2*T*D floats per (batch, head)."""
    nq, group = t_pad // b, 1
    while (group * 2 <= limit and nq % (group * 2) == 0
           and (nq // group) * (s_pad + group * b) > 2 * t_pad * dim):
        group *= 2
    return group


def piece_id_range(ids, axis=None):
    """(smallest, largest) non-zero id of a block (along `axis`); (BIG, 0) when it is all padding."""
    return jnp.min(jnp.where(ids != 0, ids, _BIG_ID), axis=axis), jnp.max(ids, axis=axis)


# --- the frame of a pallas_call ----------------------------------------------------------------------------------

def interpret_params(st: PallasSpec):
    """pallas_call's `interpret`: Mosaic kernels run in the TPU interpreter (which also checks their reads stay in
    bounds), the others in the generic one."""
    if not st.interpret:
        return False
    if st.backend == "mosaic_tpu":
        return tpu_module().InterpretParams()
    return True


def compiler_params(st: PallasSpec, reduces: bool = False):
    """`reduces`: Mosaic's grid (head, batch, block) accumulates an output over its last two axes, which must then
    run in order on one core."""
    if st.interpret:
        return None
    if st.backend == "mosaic_tpu":
        inner = "arbitrary" if reduces else "parallel"
        return tpu_module().CompilerParams(dimension_semantics=("parallel", inner, inner))
    return triton_module().CompilerParams(num_warps=st.num_warps, num_stages=st.num_stages)


def kernel_grid(st: PallasSpec, batch: int, heads: int, blocks: int):
    """Triton: (batch, head, block). Mosaic: (head, batch, block), so that a per-head output (the table gradient)
    can stay resident over the batch and the blocks. Kernels read the block as program_id(2) either way."""
    return (heads, batch, blocks) if st.heads_major else (batch, heads, blocks)


def block_spec(st: PallasSpec, shape, index):
    """BlockSpec whose index map takes the grid point as (batch, head, block) whatever `kernel_grid`'s order (and
    ignores the scalar-prefetch refs that Mosaic passes after it)."""
    if st.heads_major:
        return pl.BlockSpec(shape, lambda h, b, i, *_: index(b, h, i))
    return pl.BlockSpec(shape, lambda b, h, i, *_: index(b, h, i))


def _block_ranges(ids, block: int):
    """Ids [B, L] -> flat int32 [B * L/block * 2]: (smallest non-zero, largest) id of each block, for SMEM."""
    lo, hi = piece_id_range(ids.reshape(ids.shape[0], -1, block), axis=-1)
    return jnp.stack([lo, hi], axis=-1).reshape(-1)


def call_kernel(kernel, args, st: PallasSpec, *, grid, in_specs, out_specs, out_shape, name, q_pieces, k_pieces,
                reduces=False):
    """pallas_call of `kernel` on `args`. Mosaic with tile skipping: the blocks' id ranges come by scalar prefetch
    (SMEM) and the kernel's `id_range` reads them there, since a branch cannot hang on a vector reduced in a
    Mosaic kernel; Triton reduces the ids it has loaded."""
    params = dict(out_shape=out_shape, interpret=interpret_params(st), compiler_params=compiler_params(st, reduces),
                  name=name)
    if not (st.backend == "mosaic_tpu" and st.skip_tiles):
        return pl.pallas_call(kernel, grid=grid, in_specs=in_specs, out_specs=out_specs, **params)(*args)
    pltpu = tpu_module()
    b = st.block_q  # Mosaic's blocks are all equal

    def with_ranges(q_ranges_ref, k_ranges_ref, *refs):
        def prefetched_id_range(side, block, ids):
            del ids
            ref, blocks = (q_ranges_ref, st.t_pad // b) if side == "q" else (k_ranges_ref, st.s_pad // b)
            at = (pl.program_id(1) * blocks + block) * 2  # program_id(1): the batch row (`kernel_grid`)
            return ref[at], ref[at + 1]

        kernel(*refs, id_range=prefetched_id_range)

    spec = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=2, grid=grid, in_specs=in_specs, out_specs=out_specs)
    ranges = _block_ranges(q_pieces[:, :, 0], b), _block_ranges(k_pieces[:, 0, :], b)
    return pl.pallas_call(with_ranges, grid_spec=spec, **params)(*ranges, *args)


# --- block specs of the kernels' inputs and outputs --------------------------------------------------------------

def table_spec(ext, st: PallasSpec):
    """BlockSpec of the offset table (or its windows): the whole of the program's head (or the shared one)."""
    if ext is None:
        return None
    shared = ext.shape[0] == 1
    return block_spec(st, (None, *ext.shape[1:]), lambda b, h, i: (0 if shared else h,) + (0,) * (ext.ndim - 1))


def _diagonal_windows(ext, b: int):
    """Offset table [H', T_pad + S_pad] -> windows [H', (T_pad + S_pad) / b, 2b]: window d = ext[d*b : d*b + 2b]
    (zeros past the end) serves every tile on block diagonal d = j - i + T_pad/b - 1 (Mosaic reads it as a row)."""
    heads, length = ext.shape
    chunks = jnp.pad(ext, ((0, 0), (0, b))).reshape(heads, length // b + 1, b)
    return jnp.concatenate([chunks[:, :-1], chunks[:, 1:]], axis=-1)


def kernel_table(ext, st: PallasSpec):
    """The table as the kernels read it: the offset row (Triton's gather) or its diagonal windows (Mosaic)."""
    if ext is None or st.backend != "mosaic_tpu":
        return ext
    return _diagonal_windows(ext, st.block_q)


def seq_spec(st: PallasSpec, rows: int, dim: int, block=lambda i: i):
    """BlockSpec of `rows` positions of q, k, v or their gradients for grid point (batch, head, i)."""
    if st.heads_major:
        return block_spec(st, (None, None, rows, dim), lambda b, h, i: (b, h, block(i), 0))
    return block_spec(st, (None, rows, None, dim), lambda b, h, i: (b, block(i), h, 0))


def column_spec(st: PallasSpec, rows: int, block=lambda i: i):
    """BlockSpec of per-query quantities [B, H, T, 1] (logsumexp, delta) as columns [rows, 1]."""
    return block_spec(st, (None, None, rows, 1), lambda b, h, i: (b, h, block(i), 0))


def ids_specs(st: PallasSpec, q_rows: int, k_cols: int, q_block=lambda i: i, k_block=lambda i: i):
    """BlockSpecs of query ids [B, T, 1] (columns) and key ids [B, 1, S] (rows)."""
    return (block_spec(st, (None, q_rows, 1), lambda b, h, i: (b, q_block(i), 0)),
            block_spec(st, (None, 1, k_cols), lambda b, h, i: (b, 0, k_block(i))))


def kernel_dims(q, st: PallasSpec):
    """(batch, heads, length, dim) of q, k or v in the kernel's layout."""
    batch, a, c, dim = q.shape
    return (batch, a, c, dim) if st.heads_major else (batch, c, a, dim)


def keys_spec(keys, st: PallasSpec, rows: int, block=lambda i: i):
    """BlockSpec of dropout's row keys [B, H, T_pad, 1] (None without dropout)."""
    return None if keys is None else column_spec(st, rows, block)


def u_spec(u, st: PallasSpec, rows: int, block=lambda i: i):
    """BlockSpec of a pair term's per-query factors u [B, H, T_pad, r] (or their gradient) as [rows, r]."""
    return None if u is None else block_spec(st, (None, None, rows, u.shape[-1]),
                                             lambda b, h, i: (b, h, block(i), 0))


def w_spec(w, st: PallasSpec, cols: int, block=lambda i: i):
    """BlockSpec of a pair term's per-key features w [B, r, S_pad] as [r, cols]."""
    return None if w is None else block_spec(st, (None, w.shape[1], cols), lambda b, h, i: (b, 0, block(i)))
