"""Attention implementations behind one function.

`attend` takes the compact positional terms (tables, low-rank factors, Shaw tables, per-head segment tables)
and chooses how to apply them:
- "xla": the reference (einsum + softmax), every term exact, attention weights available for analysis;
- "jax" / "cudnn": `jax.nn.dot_product_attention`, with position-only terms materialised once to [1, H, T, S]
  and low-rank factors and per-head segment tables (as u_i . w_j) folded into q and k, whose width is padded to
  a multiple of 8 (cuDNN's rule). Query-dependent Shaw terms and the analysis switches need "xla";
- "pallas": `kernels.toeplitz_attention`, the Toeplitz table read inside the kernel, low-rank factors
  folded into q and k, per-head segment tables as a rank G - 1 term, masks as piece ids (a local window's
  blocks outside it skipped), attention dropout;
  per device on a mesh (`sharding.per_shard`); other terms fall back to "cudnn" or "xla";
- "mosaic_gpu": the same path on the Hopper kernels of `kernels.mosaic_gpu` (wgmma, TMA; bf16/f16, attention
  dropout and per-head segment tables included);
- "auto" (the default): per call, the fastest measured path that can run it (`auto.choose_for`), logged once.
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp

from jaxpos.attention import auto, dropout
from jaxpos.attention.bias import (PositionalBias, at_pieces, clipped_offset_index, contextual_logits,
                                  disentangled_logits, expand_toeplitz, over_attended_keys, position_logits,
                                  segment_logits, segment_pair_factors)
from jaxpos.attention.kernels import toeplitz_attention
from jaxpos.attention.mask import AttentionMask
from jaxpos.config.attention import (ATTENTION_IMPLS, AUTO, IMPLEMENTATIONS, Call, can_take, lacks, names,
                                     platform_facts, suits)
from jaxpos.sharding import HEADS, per_shard


def fold_factors(q_BTHD, k_BSHD, factors, scale):
    """Appends P_Q/scale to q and P_K to k so that scale*q'.k' = scale*q.k + P_Q P_K^T, no [T, S] tensor.

    factors: P_Q [H'|1, T, r], P_K [H'|1, S, r], or per example (packed rows) [B, H'|1, T, r], [B, H'|1, S, r];
    scale: the content scale (1/sqrt(D) but for TUPE) -> q' [B, T, H, D + r], k' [B, S, H, D + r].
    """
    batch, _, heads, _ = q_BTHD.shape

    def per_token(p):  # [B|1, H'|1, T, r] -> [B, T, H, r]
        p = jnp.swapaxes(p if p.ndim == 4 else p[None], 1, 2)
        return jnp.broadcast_to(p, (batch, p.shape[1], heads, p.shape[-1]))

    p_q, p_k = map(per_token, factors)
    q = jnp.concatenate([q_BTHD, (p_q / scale).astype(q_BTHD.dtype)], axis=-1)
    k = jnp.concatenate([k_BSHD, p_k.astype(k_BSHD.dtype)], axis=-1)
    return q, k


def apply_rotary(x_BTHD: jax.Array, cos_TK: jax.Array, sin_TK: jax.Array) -> jax.Array:
    """Rotates channel pairs (x[..., k], x[..., k + D/2]) by the angle of their position (NeoX layout).

    cos, sin [T, D/2], or per example [B, T, D/2] (packed cross-attention) -> [B, T, H, D]."""
    half = x_BTHD.shape[-1] // 2
    x1, x2 = x_BTHD[..., :half], x_BTHD[..., half:]
    cos, sin = cos_TK[..., None, :], sin_TK[..., None, :]  # a head axis; [T] lines up with x's [B, T]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_BTHD.dtype)


def attend(q_BTHD: jax.Array, k_BSHD: jax.Array, v_BSHD: jax.Array, *, bias: PositionalBias,
           q_pos: jax.Array, k_pos: jax.Array, mask: AttentionMask | None = None,
           q_types: jax.Array | None = None, k_types: jax.Array | None = None,
           implementation: str = "xla", content: bool = True, position: bool = True,
           dropout_rng: jax.Array | None = None, dropout_rate: float = 0.0,
           ) -> tuple[jax.Array, jax.Array | None]:
    """Multi-head attention with positional terms. Returns (out [B, T, H, D], weights [B, H, T, S] or None).

    `bias` is one layer's slice; `mask` the piece ids and causal flag (`AttentionMask`); q_types/k_types the
    token types used by a per-head segment table; q_pos [T], k_pos [S], or per example [B, T], [B, S] (packed
    cross-attention). `content=False` drops q.k, `position=False` drops every positional logit term. Attention
    dropout (`dropout_rng`, `dropout_rate`) drops the same weights on every path that has it (`dropout.keep_mask`).
    `implementation` names a record of jaxpos.config.attention.IMPLEMENTATIONS, or "auto"; `resolve` says which
    computes this call (an explicit choice hands the calls it cannot take to its fallbacks, noted once).
    """
    call = call_facts(q_BTHD, k_BSHD, bias, q_pos, k_pos, mask, content, position, dropout_rng, dropout_rate)
    name = resolve(implementation, call)
    return IMPLEMENTATIONS[name].run()(q_BTHD, k_BSHD, v_BSHD, bias=bias, q_pos=q_pos, k_pos=k_pos, mask=mask,
                                       q_types=q_types, k_types=k_types, content=content, position=position,
                                       dropout_rng=dropout_rng, dropout_rate=dropout_rate, implementation=name)


def call_facts(q_BTHD, k_BSHD, bias: PositionalBias, q_pos, k_pos, mask: AttentionMask | None = None,
               content: bool = True, position: bool = True, dropout_rng=None, dropout_rate: float = 0.0) -> Call:
    """The facts of one call of `attend` that decide its implementation (jaxpos.config.attention.Call)."""
    shaw = position and (bias.rel_keys is not None or bias.rel_values is not None)
    contextual = position and bias.contextual is not None
    disentangled = position and bias.rel_index is not None
    if (shaw or contextual or disentangled or bias.dense is not None or bias.kv_projection is not None
            or (bias.table is not None and bias.table.ndim != 2)):
        form = "other"
    elif bias.table is not None:
        form = "table"
    elif bias.factors is not None or bias.segment_table is not None:
        form = "factors"  # per-head segment tables reach both fast paths as folded factors or a pair term
    else:
        form = "none"
    length, keys = q_BTHD.shape[1], k_BSHD.shape[1]
    return Call(**platform_facts(), low_precision=q_BTHD.dtype in (jnp.bfloat16, jnp.float16), form=form,
                dropout=dropout_rng is not None and dropout_rate > 0.0, shaw=shaw, contextual=contextual,
                disentangled=disentangled,
                switches=not (content and position),
                per_example_positions=q_pos.ndim > 1 or k_pos.ndim > 1, linformer=bias.kv_projection is not None,
                cached_causal=mask is not None and mask.causal and length != keys,
                window=mask is not None and mask.window is not None,
                odd_length=bool(length % 2 or keys % 2))


def resolve(implementation: str, call: Call) -> str:
    """The implementation that computes `call`: "auto"'s choice (`auto.choose_for`, logged once), or the named one,
    or else the first of its fallbacks that can (noted once); a named one without a fallback that can raises."""
    if implementation == AUTO:
        name, why = auto.choose_for(call)
        _note_once(f"attention_impl='auto' chose {name!r}: {why}", level=logging.INFO)
        return name
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"attention implementation {implementation!r}; choose {', '.join(ATTENTION_IMPLS)}")
    record = IMPLEMENTATIONS[implementation]
    missing = lacks(record, call)
    if missing is None:
        return implementation
    fallback = next((f for f in record.fallbacks if suits(IMPLEMENTATIONS[f], call)), None)
    if fallback is None:
        raise ValueError(f"attention implementation {implementation!r} cannot compute this call: it lacks {missing}; "
                         f"use attention_impl={names(can_take(call))} (or 'auto')")
    verb = "hands this call to" if IMPLEMENTATIONS[fallback].function == record.function else "falls back to"
    _note_once(f"attention_impl={implementation!r} {verb} {fallback!r}: {missing}")
    return fallback


def reference_attention(q_BTHD, k_BSHD, v_BSHD, *, bias, q_pos, k_pos, mask, q_types, k_types, content, position,
                        dropout_rng, dropout_rate, implementation="xla"):
    """attend's "xla" path: exact logits (`pre_softmax_logits`), softmax, dropout, Shaw's value vectors; returns the
    attention weights too, for the analyses."""
    dense_mask = None if mask is None else mask.dense(q_pos, k_pos)  # [B|1, 1, T, S] bool
    bias = over_attended_keys(at_pieces(bias), dense_mask)  # packed rows; the fixed attenuated delta
    logits = pre_softmax_logits(q_BTHD, k_BSHD, bias, q_pos=q_pos, k_pos=k_pos, q_types=q_types, k_types=k_types,
                                content=content, position=position, mask=dense_mask)
    if dense_mask is not None:
        logits = jnp.where(dense_mask, logits, jnp.finfo(logits.dtype).min)
    weights = jax.nn.softmax(logits, axis=-1)
    dropped = weights
    if dropout_rng is not None and dropout_rate > 0.0:  # the kernel's mask too (`dropout`)
        keep = dropout.keep_mask(dropout.seed_from_key(dropout_rng), *weights.shape, dropout_rate)
        dropped = jnp.where(keep, weights / (1.0 - dropout_rate), 0.0)
    dropped = dropped.astype(v_BSHD.dtype)
    out = jnp.einsum("bhts,bshd->bthd", dropped, v_BSHD)
    if position and bias.rel_values is not None:
        clip = (bias.rel_values.shape[0] - 1) // 2
        one_hot = jax.nn.one_hot(clipped_offset_index(q_pos, k_pos, clip), 2 * clip + 1, dtype=dropped.dtype)
        pairs = "btsw" if one_hot.ndim == 4 else "tsw"  # per-example offsets (packed cross-attention)
        per_offset = jnp.einsum(f"bhts,{pairs}->bhtw", dropped, one_hot)  # weight mass at each clipped offset
        out = out + jnp.einsum("bhtw,wd->bthd", per_offset, bias.rel_values.astype(dropped.dtype))
    return out, weights


def dot_product_attention(q_BTHD, k_BSHD, v_BSHD, *, bias, q_pos, k_pos, mask, q_types, k_types, content, position,
                          dropout_rng, dropout_rate, implementation="jax"):
    """attend's "jax" / "cudnn" path: `jax.nn.dot_product_attention`, with position-only terms materialised once to
    [1, H, T, S], low-rank factors and per-head segment tables (as u_i . w_j) folded into q and k, whose width is
    padded to a multiple of 8 (cuDNN's rule)."""
    del content, position, dropout_rng, dropout_rate  # refused by the registry: this path has none of them
    dense_mask = None if mask is None else mask.dense(q_pos, k_pos)
    bias = over_attended_keys(at_pieces(bias), dense_mask)
    head_dim = q_BTHD.shape[-1]
    scale = bias.content_scale * head_dim**-0.5
    if bias.factors is not None:
        q_BTHD, k_BSHD = fold_factors(q_BTHD, k_BSHD, bias.factors, scale)
    pairs = _segment_pairs(bias, q_types, k_types)
    if pairs is not None:  # per-head segments as u_i . w_j folded into q.k: no [B, H, T, S] bias
        u, w = pairs
        q_BTHD, k_BSHD = fold_factors(q_BTHD, k_BSHD, (jnp.swapaxes(u, 1, 2), w[:, None]), scale)
        bias = bias.replace(segment_table=None)
    logits_bias = _additive_terms(bias, q_pos, k_pos, q_types, k_types, include_factors=False, dtype=q_BTHD.dtype)
    # Zero channels change no dot product: q, k, v share a head width that cuDNN takes (a multiple of 8).
    width = -(-q_BTHD.shape[-1] // 8) * 8
    q_BTHD, k_BSHD, v_BSHD = (jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, width - x.shape[-1])))
                              for x in (q_BTHD, k_BSHD, v_BSHD))
    out = jax.nn.dot_product_attention(q_BTHD, k_BSHD, v_BSHD, bias=logits_bias, mask=dense_mask, scale=scale,
                                       implementation=None if implementation == "jax" else implementation)
    return out[..., :head_dim], None


def pre_softmax_logits(q_BTHD: jax.Array, k_BSHD: jax.Array, bias: PositionalBias, *, q_pos: jax.Array,
                       k_pos: jax.Array, q_types: jax.Array | None = None, k_types: jax.Array | None = None,
                       content: bool = True, position: bool = True, mask: jax.Array | None = None) -> jax.Array:
    """Pre-softmax logits [B, H, T, S] (float32, unmasked) of the "xla" path: scale * q.k (with low-rank factors
    folded in when `bias.fold_factors`), Shaw's q_i . r^K_{clip(j - i)}, DeBERTa's c2p and p2c (from the
    `rel_projections` the layer made), CoPE's q_i . e[p_ij], the position-only terms and the per-head segment
    terms. q [B, T, H, D], k [B, S, H, D] as attention sees them (rotated, Linformer-projected); `bias` one layer's
    slice after `at_pieces` and `over_attended_keys`; `mask` [B|1, 1, T, S] bool the keys each query attends to, the
    only ones CoPE counts (None: all). The analyses read the model's logits through it.
    """
    head_dim = q_BTHD.shape[-1]
    scale = bias.content_scale * head_dim**-0.5
    fold = position and bias.factors is not None and bias.fold_factors
    if fold:
        q_BTHD, k_BSHD = fold_factors(q_BTHD, k_BSHD, bias.factors, scale)
        if not content:  # keep only the folded positional channels
            q_BTHD = q_BTHD.at[..., :head_dim].set(0)
    logits = jnp.einsum("bthd,bshd->bhts", q_BTHD, k_BSHD, preferred_element_type=jnp.float32) * scale
    contextual = None
    if position and bias.contextual is not None:  # CoPE gates with the content logits: before any switch drops them
        contextual = contextual_logits(logits, q_BTHD[..., :head_dim], bias.contextual, q_pos, k_pos, mask)
    if not content and not fold:
        logits = jnp.zeros_like(logits)
    if position and bias.rel_keys is not None:
        index = clipped_offset_index(q_pos, k_pos, (bias.rel_keys.shape[0] - 1) // 2)  # [T, S] or [B, T, S]
        per_offset = jnp.einsum("bthd,wd->bhtw", q_BTHD[..., :head_dim], bias.rel_keys.astype(q_BTHD.dtype),
                                preferred_element_type=jnp.float32) * scale
        index = index[:, None] if index.ndim == 3 else index  # per example: under the head axis
        logits = logits + jnp.take_along_axis(per_offset, jnp.broadcast_to(index, logits.shape), axis=-1)
    if position and bias.rel_index is not None:  # DeBERTa's c2p and p2c, at the content term's scale
        rows = expand_toeplitz(bias.rel_index, q_pos, k_pos)  # [T, S] or per example [B, T, S]
        logits = logits + disentangled_logits(q_BTHD[..., :head_dim], k_BSHD[..., :head_dim],
                                              *bias.rel_projections, rows) * scale
    if contextual is not None:
        logits = logits + contextual
    position_bias = bias if position else PositionalBias(segment_table=bias.segment_table)
    extra = _additive_terms(position_bias, q_pos, k_pos, q_types, k_types,
                            include_factors=not fold, dtype=jnp.float32)
    return logits if extra is None else logits + extra


def project_keys(projection_KS: jax.Array, k_BSHD: jax.Array, mask: jax.Array | None) -> jax.Array:
    """Linformer: keys (or values) of padded positions zeroed (`mask` [B|1, 1, T, S]), then projected along the
    sequence to K rows: [B, S, H, D] -> [B, K, H, D]."""
    if mask is not None:
        k_BSHD = k_BSHD * jnp.any(mask, axis=(1, 2))[:, :, None, None].astype(k_BSHD.dtype)
    return jnp.einsum("ks,bshd->bkhd", projection_KS.astype(k_BSHD.dtype), k_BSHD)


def toeplitz_kernel_attention(q, k, v, *, bias, q_pos, k_pos, mask, q_types, k_types, content, position,
                              dropout_rng, dropout_rate, implementation="pallas"):
    """attend's "pallas" / "mosaic_gpu" path: the Toeplitz kernel (Pallas, or the Hopper kernels) on each device's
    shard of the batch and heads (`per_shard`), masks as piece ids; low-rank factors folded into q and k; a
    per-head segment table enters as a rank G - 1 pair term (`segment_pair_factors`); a local window's blocks
    outside it are skipped."""
    del content, position  # refused by the registry: the kernels compute every term
    scale = bias.content_scale * q.shape[-1] ** -0.5
    if bias.factors is not None:  # low-rank P_Q P_K^T (DIET-Abs, TUPE) folded into q.k: v keeps its width
        q, k = fold_factors(q, k, at_pieces(bias).factors, scale)
    rate = dropout_rate if dropout_rng is not None else 0.0
    mask = mask if mask is not None else AttentionMask()
    causal, window = mask.causal, mask.window
    batch, length, heads, _ = q.shape
    pair_u, pair_w = _segment_pairs(bias, q_types, k_types) or (None, None)
    # the Hopper kernels, or the Pallas kernel of the default backend (Triton on GPUs, Mosaic on TPUs)
    backend = "mosaic_gpu" if implementation == "mosaic_gpu" else None
    args = dict(q=q, k=k, v=v, table=bias.table, q_piece_ids=mask.q_piece_ids, kv_piece_ids=mask.kv_piece_ids,
                pair_u=pair_u, pair_w=pair_w,
                # static 0 when causal or windowed: self-attention over one set of positions (a cache's T != S
                # goes to the fallbacks: `cached_causal`)
                q_offset=None if causal or window is not None else q_pos[0] - k_pos[0],
                # the global rows' keys, so that devices holding different rows drop different weights
                dropout_row_keys=dropout.row_keys(dropout.seed_from_key(dropout_rng), batch, heads, length)
                if rate else None)
    table_names = None if bias.table is None else (None if bias.table.shape[0] == 1 else "heads", None)
    axes = dict(q=HEADS, k=HEADS, v=HEADS, table=table_names, q_piece_ids=("batch", None),
                kv_piece_ids=("batch", None), q_offset=(), dropout_row_keys=("batch", "heads", None),
                pair_u=HEADS, pair_w=("batch", "length", None))

    def kernel(q, k, v, table=None, q_piece_ids=None, kv_piece_ids=None, q_offset=0, dropout_row_keys=None,
               pair_u=None, pair_w=None):
        return toeplitz_attention(q, k, v, table, scale=scale, q_piece_ids=q_piece_ids,
                                  kv_piece_ids=kv_piece_ids, causal=causal, window=window, q_offset=q_offset,
                                  dropout_rate=rate, dropout_row_keys=dropout_row_keys,
                                  pair_bias=None if pair_u is None else (pair_u, pair_w), backend=backend)

    given = {name: x for name, x in args.items() if x is not None}
    return per_shard(kernel, given, {name: axes[name] for name in given}, HEADS), None


def _segment_pairs(bias, q_types, k_types) -> tuple[jax.Array, jax.Array] | None:
    """A per-head segment table as the rank G - 1 pair (u [B, T, H, G-1], w [B, S, G-1]) of
    `segment_pair_factors`; None without one (or with one type: a constant, which softmax ignores)."""
    if bias.segment_table is None or bias.segment_table.shape[-1] == 1:
        return None
    if q_types is None or k_types is None:
        raise ValueError("per-head segment attention needs token types for queries and keys")
    return segment_pair_factors(bias.segment_table, q_types, k_types)


def _additive_terms(bias, q_pos, k_pos, q_types, k_types, *, include_factors, dtype):
    """Sum of position-only terms [B|1, H'|1, T, S] and per-head segment terms [B, H, T, S], or None."""
    total = position_logits(bias, q_pos, k_pos, include_factors=include_factors)
    if total is not None:
        total = (total if total.ndim == 4 else total[None]).astype(jnp.float32)
    if bias.segment_table is not None:
        if q_types is None or k_types is None:
            raise ValueError("per-head segment attention needs token types for queries and keys")
        seg = segment_logits(bias.segment_table, q_types, k_types)
        total = seg if total is None else total + seg
    return None if total is None else total.astype(dtype)


_NOTED: set[str] = set()


def _note_once(message: str, level: int = logging.WARNING) -> None:
    """Logs a note once per distinct message (attend runs once per layer and trace)."""
    if message not in _NOTED:
        _NOTED.add(message)
        logging.getLogger(__name__).log(level, message)
