"""The one public entry of the Toeplitz attention kernels, `toeplitz_attention`, and what its backends share.

`toeplitz_attention(q, k, v, table)` computes softmax(q.k/sqrt(D) + table[j - i] + mask) v without a [T, S]
bias: every mechanism whose bias depends on the offset j - i only (TISA, DIET-Rel, T5, ALiBi, attenuated offset
tables) builds its table [H'|1, 2*span - 1] once per step, and autodiff through that construction turns the table
gradient returned here into parameter gradients.

Masks: `kv_piece_ids` [B, S] with 0 = padding (never attended), `q_piece_ids` [B, T] (queries attend only to
keys of the same non-zero id), `causal` (key position <= query position), `window` (a local layer's keys,
|key position - query position| <= window // 2): `mask.AttentionMask`'s convention. A tile whose query and key id
ranges do not overlap, or that lies wholly past the causal limit or outside the window, is skipped (Mosaic reads
the blocks' id ranges from SMEM, `pallas_common.call_kernel`): a local layer costs O(T * window), not O(T * S).
Fully masked rows (padding queries) give out = 0 and zero gradients; the XLA reference gives the mean of v there
(softmax of equal logits), a value no loss should read.

Backends, a module each: `pallas` (Pallas Triton on GPUs and Pallas Mosaic on TPUs: one set of kernels with
per-backend switches) and `mosaic_gpu` (the Hopper kernels). Here: the argument checks, the choice of backend,
padding to its blocks and head widths, and the inputs every backend reads alike: the offset table
(`_offset_table`), piece ids and dropout's row keys.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxpos.attention import dropout
from jaxpos.attention.kernels import mosaic_gpu as mgpu
from jaxpos.attention.kernels.pallas import PallasSpec, default_dq_group, pallas_attention


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _offset_table(table, q_offset, t_pad: int, s_pad: int):
    """ext [H'|1, T_pad + S_pad] with ext[:, (j - i) + T_pad - 1] = table at offset k_pos[j] - q_pos[i].

    k_pos[j] - q_pos[i] = (j - i) - q_offset; columns follow `expand_toeplitz`: centre (W - 1) / 2, clipped.
    The last column (never read) keeps the length even.
    """
    width = table.shape[-1]
    if width % 2 != 1:
        raise ValueError(f"a Toeplitz table has an odd number of offset columns, got {width}")
    local = jnp.arange(t_pad + s_pad, dtype=jnp.int32) - (t_pad - 1)
    index = jnp.clip(local - q_offset + (width - 1) // 2, 0, width - 1)
    return jnp.take(table.astype(jnp.float32), index, axis=-1)


def toeplitz_attention(q: jax.Array, k: jax.Array, v: jax.Array, table: jax.Array | None = None, *,
                       q_piece_ids: jax.Array | None = None, kv_piece_ids: jax.Array | None = None,
                       causal: bool = False, window: int | None = None, q_offset: int | jax.Array = 0,
                       block_q: int | None = None, block_k: int | None = None, block_dq: int | None = None,
                       dq_group: int | None = None,
                       table_grad: str = "tiles", scale: float | None = None, dropout_rate: float = 0.0,
                       dropout_seed: jax.Array | None = None, dropout_row_keys: jax.Array | None = None,
                       pair_bias: tuple[jax.Array, jax.Array] | None = None, interpret: bool | None = None,
                       backend: str | None = None, num_warps: int = 4, num_stages: int = 3) -> jax.Array:
    """Attention with a Toeplitz bias from a table, differentiable in q, k, v and the table. -> out [B, T, H, Dv].

    q [B, T, H, D], k [B, S, H, D] and v [B, S, H, Dv] (D > Dv for folded low-rank factors); table [H|1, W]
    float32 (W = 2*span - 1 odd; column (k_pos - q_pos) + (W - 1)/2, offsets beyond the table clip to its ends,
    as `expand_toeplitz`) or None. Positions are q_pos = q_offset + arange(T), k_pos = arange(S); q_offset may be
    traced unless `causal` (key visible when k_pos <= q_pos) or `window` (key visible when |k_pos - q_pos| <=
    window // 2; both may be given). Piece ids: 0 = padding (module docstring). Logits are scale*q.k + bias
    (scale None: 1/sqrt(D)), accumulated in float32 whatever the input dtype; the table gradient is float32.
    Block sizes are powers of two (None: 64, 64 and 32 on Triton, 128 on Mosaic TPU, where the three must be
    equal multiples of 128); T and S are padded to them (padded keys are masked). `dq_group`: query blocks per
    program of the dq / table-gradient kernel (None: `pallas.default_dq_group`, 1 up to T = S = 2048 at D = 64,
    which bounds the table-gradient rows by twice q's size; it must divide the padded T / block_dq).
    `table_grad` (Triton): "tiles", the dq kernel sums each tile's dS along its diagonals (a skew per tile, rows
    as above), or "diagonals", a kernel per (head, block diagonal) recomputes dS and sums it over the batch before
    one skew (H*(T + S)*(b + 2) floats; dS computed twice); Mosaic sums in the dq kernel. Attention dropout at
    `dropout_rate` drops the weights that `dropout.keep_mask(dropout_seed, B, H, T, S, rate)` drops (the XLA
    path's mask), recomputed per tile; a caller holding a shard of the batch or heads passes the global
    `dropout.row_keys` of its rows [B, H, T] as `dropout_row_keys` instead of the seed. `pair_bias` (u [B, T, H,
    r], w [B, S, r]), r small: adds u[b, i, h] . w[b, j] to the logits, differentiable in u only (w: key
    features, such as the one-hot token types of a per-head segment table). `interpret` None: the Pallas
    interpreter when the backend is the CPU. `backend` "triton" (GPU; num_warps, num_stages apply) or
    "mosaic_tpu"; None: from the default backend. "mosaic_gpu": the Hopper kernels of `mosaic_gpu`
    (bf16/f16; blocks of 128, so none of the block or table-gradient options).
    """
    batch, t, heads, dim = q.shape
    s, dim_v = k.shape[1], v.shape[-1]
    if k.shape != (batch, s, heads, dim) or v.shape != (batch, s, heads, dim_v):
        raise ValueError(f"q {q.shape}, k {k.shape} and v {v.shape} must share batch and heads, q and k their "
                         "head dim, k and v their length")
    if table is not None and (table.ndim != 2 or table.shape[0] not in (1, heads)):
        raise ValueError(f"table must be [H|1, W] with H = {heads}, got {table.shape}")
    if (causal or window is not None) and not isinstance(q_offset, int):
        raise ValueError("a causal mask or a window needs a static (Python int) q_offset")
    half_window = _half_window(window, q_offset, t, s)
    dropout.keep_threshold(dropout_rate)  # validates the rate
    if dropout_rate and (dropout_seed is None) == (dropout_row_keys is None):
        raise ValueError("attention dropout needs exactly one of dropout_seed and dropout_row_keys")
    if interpret is None:
        interpret = jax.default_backend() == "cpu"
    if backend is None:
        backend = "mosaic_tpu" if jax.default_backend() == "tpu" else "triton"
    if backend not in ("triton", "mosaic_tpu", "mosaic_gpu"):
        raise ValueError(f"backend={backend!r}; choose triton, mosaic_tpu or mosaic_gpu")
    if pair_bias is not None:
        u, w = pair_bias
        if u.ndim != 4 or u.shape[:3] != (batch, t, heads) or w.shape != (batch, s, u.shape[-1]):
            raise ValueError(f"pair_bias must be u [B, T, H, r] = {(batch, t, heads)} + (r,) and w [B, S, r] with "
                             f"S = {s}, got {u.shape} and {w.shape}")
    if backend == "mosaic_gpu":
        return _mosaic_gpu(q, k, v, table, q_piece_ids, kv_piece_ids, causal, half_window, q_offset, scale,
                           dropout_rate, dropout_seed, dropout_row_keys, pair_bias, interpret,
                           dict(block_q=block_q, block_k=block_k, block_dq=block_dq, dq_group=dq_group,
                                table_grad=table_grad))
    if table_grad not in ("tiles", "diagonals") or (table_grad == "diagonals" and backend == "mosaic_tpu"):
        raise ValueError(f"table_grad={table_grad!r}; choose tiles or (Triton only) diagonals")
    tpu = backend == "mosaic_tpu"
    defaults = (128, 128, 128) if tpu else (64, 64, 32)
    block_q, block_k, block_dq = (d if x is None else x for x, d in zip((block_q, block_k, block_dq), defaults))
    for name, size in (("block_q", block_q), ("block_k", block_k), ("block_dq", block_dq)):
        if size < 16 or size & (size - 1):
            raise ValueError(f"{name}={size} must be a power of two >= 16")
    if tpu and not (block_q == block_k == block_dq and block_q % 128 == 0):
        raise ValueError(f"Mosaic TPU blocks must be equal multiples of 128 (one tile per block diagonal, lanes of "
                         f"128), got block_q={block_q}, block_k={block_k}, block_dq={block_dq}")
    if not tpu:  # small problems take smaller blocks (down to 16, the least a tensor-core dot takes)
        block_q, block_dq = (min(x, max(16, _next_pow2(t))) for x in (block_q, block_dq))
        block_k, block_dq = min(block_k, max(16, _next_pow2(s))), min(block_dq, max(16, _next_pow2(s)))
    t_pad = -(-t // max(block_q, block_dq)) * max(block_q, block_dq)
    s_pad = -(-s // max(block_k, block_dq)) * max(block_k, block_dq)
    def width(n):  # head widths padded with zero channels, which change no dot product
        return max(16, _next_pow2(n))

    def pad(x, length):
        x = jnp.pad(x, ((0, 0), (0, length - x.shape[1]), (0, 0), (0, width(x.shape[-1]) - x.shape[-1])))
        return x.transpose(0, 2, 1, 3) if tpu else x  # the kernels' layout (PallasSpec.heads_major)

    use_q = q_piece_ids is not None
    q_pieces, k_pieces = _padded_piece_ids(q_piece_ids, kv_piece_ids, (batch, t, s), t_pad, s_pad)
    q_pieces, k_pieces = q_pieces[:, :, None], k_pieces[:, None, :]  # columns, rows
    ext = None if table is None else _offset_table(table, q_offset, t_pad, s_pad)
    keys = _padded_row_keys(dropout_rate, dropout_seed, dropout_row_keys, (batch, heads, t), t_pad)
    keys = None if keys is None else keys[..., None]  # columns
    u = w = None
    if pair_bias is not None:  # u as columns [B, H, T_pad, r'], w as rows [B, r', S_pad]; r' a power of two
        u, w = pair_bias
        rank = _next_pow2(u.shape[-1])
        u = jnp.pad(u.astype(jnp.float32), ((0, 0), (0, t_pad - t), (0, 0), (0, rank - u.shape[-1])))
        u = u.transpose(0, 2, 1, 3)
        w = jnp.pad(w.astype(jnp.float32), ((0, 0), (0, s_pad - s), (0, rank - w.shape[-1]))).transpose(0, 2, 1)
    if dq_group is None:
        rows_of_sums = table is not None and table_grad == "tiles"  # what a group > 1 keeps within 2*T*D floats
        dq_group = default_dq_group(t_pad, s_pad, block_dq, width(dim)) if rows_of_sums else 1
    elif dq_group < 1 or (t_pad // block_dq) % dq_group:
        raise ValueError(f"dq_group={dq_group} must divide the {t_pad // block_dq} query blocks of {block_dq} rows")
    limited = causal or half_window is not None
    st = PallasSpec(scale=dim**-0.5 if scale is None else float(scale), causal=causal,
                    q_offset=q_offset if limited else 0, half_window=half_window, block_q=block_q, block_k=block_k,
                    block_dq=block_dq, dq_group=dq_group, table_grad=table_grad, t_pad=t_pad, s_pad=s_pad,
                    use_q_pieces=use_q, masked=use_q or kv_piece_ids is not None or limited or s_pad != s,
                    skip_tiles=use_q or kv_piece_ids is not None, dropout_rate=float(dropout_rate),
                    interpret=bool(interpret), backend=backend,
                    num_warps=num_warps, num_stages=num_stages)
    out = pallas_attention(pad(q, t_pad), pad(k, s_pad), pad(v, s_pad), ext, q_pieces, k_pieces, keys, u, w, st)
    if tpu:
        out = out.transpose(0, 2, 1, 3)
    return out[:, :t, :, :dim_v]


def _half_window(window: int | None, q_offset, t: int, s: int) -> int | None:
    """The keys a side of a query, window // 2; None without a window or where it covers every offset k_pos -
    q_pos of the call (a global layer: no mask arithmetic)."""
    if window is None:
        return None
    if not isinstance(window, int) or window < 0:
        raise ValueError(f"window={window!r} must be a non-negative int (keys |k_pos - q_pos| <= window // 2)")
    half = window // 2
    return None if half >= max(abs(q_offset + t - 1), abs(s - 1 - q_offset)) else half


def _padded_piece_ids(q_piece_ids, kv_piece_ids, sizes, t_pad, s_pad) -> tuple[jax.Array, jax.Array]:
    """Query ids [B, T_pad] and key ids [B, S_pad] int32 (1 where not given; padded keys 0: never attended)."""
    batch, t, s = sizes
    q_pieces = jnp.ones((batch, t), jnp.int32) if q_piece_ids is None else q_piece_ids.astype(jnp.int32)
    k_pieces = jnp.ones((batch, s), jnp.int32) if kv_piece_ids is None else kv_piece_ids.astype(jnp.int32)
    return jnp.pad(q_pieces, ((0, 0), (0, t_pad - t))), jnp.pad(k_pieces, ((0, 0), (0, s_pad - s)))


def _padded_row_keys(rate, seed, row_keys, rows_shape, t_pad) -> jax.Array | None:
    """The dropout keys of a call's query rows, [B, H, T_pad] int32 (padded rows 0), or None without dropout."""
    if not rate:
        return None
    keys = dropout.row_keys(seed, *rows_shape) if row_keys is None else row_keys
    if keys.shape != rows_shape:
        raise ValueError(f"dropout_row_keys must be [B, H, T] = {rows_shape}, got {keys.shape}")
    return jnp.pad(keys.astype(jnp.int32), ((0, 0), (0, 0), (0, t_pad - rows_shape[-1])))


def _mosaic_gpu(q, k, v, table, q_piece_ids, kv_piece_ids, causal, half_window, q_offset, scale, dropout_rate,
                dropout_seed, dropout_row_keys, pair_bias, interpret, options):
    """toeplitz_attention on the Mosaic GPU backend: inputs padded to its blocks and head widths."""
    reason = mgpu.unsupported(q.dtype)
    if reason is not None:
        raise ValueError(f"the mosaic_gpu backend does not take {reason}; use backend='triton'")
    given = [name for name, value in options.items() if value not in (None, "tiles")]
    if given:
        raise ValueError(f"the mosaic_gpu backend has fixed blocks of {mgpu.BLOCK} and its own table gradient: "
                         f"drop {', '.join(given)}")
    batch, t, heads, dim = q.shape
    s, dim_v = k.shape[1], v.shape[-1]
    t_pad, s_pad = (-(-n // mgpu.BLOCK) * mgpu.BLOCK for n in (t, s))

    def pad(x, length):  # zero channels up to a multiple of 64 change no dot product
        return jnp.pad(x, ((0, 0), (0, length - x.shape[1]), (0, 0), (0, -x.shape[-1] % 64)))

    use_q = q_piece_ids is not None
    ext = None if table is None else _offset_table(table, q_offset, t_pad, s_pad)
    u = w = None
    if pair_bias is not None:  # u [B, H, r, T_pad] and w [B, r, S_pad]: one vector per channel and head
        u, w = pair_bias
        u = jnp.pad(u.astype(jnp.float32), ((0, 0), (0, t_pad - t), (0, 0), (0, 0))).transpose(0, 2, 3, 1)
        w = jnp.pad(w.astype(jnp.float32), ((0, 0), (0, s_pad - s), (0, 0))).transpose(0, 2, 1)
    out = mgpu.mosaic_gpu_attention(
        pad(q, t_pad), pad(k.astype(q.dtype), s_pad), pad(v.astype(q.dtype), s_pad), ext,
        *_padded_piece_ids(q_piece_ids, kv_piece_ids, (batch, t, s), t_pad, s_pad),
        scale=dim**-0.5 if scale is None else float(scale), causal=causal, half_window=half_window,
        q_offset=q_offset,
        use_q_ids=use_q, masked=use_q or kv_piece_ids is not None or s_pad != s, interpret=interpret,
        dropout_rate=float(dropout_rate),
        row_keys=_padded_row_keys(dropout_rate, dropout_seed, dropout_row_keys, (batch, heads, t), t_pad),
        pair_u=u, pair_w=w)
    return out[:, :t, :, :dim_v]
