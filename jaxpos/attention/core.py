"""Attention implementations behind one function.

`attend` takes one layer's positional terms (jaxpos/attention/terms.py) and the implementation named by
`model.attention_impl`, or "auto"'s choice, computes them; each is a record of the registry
(jaxpos/attention/registry.py) declaring the kinds of terms it takes:
- "xla": the reference (einsum + softmax), every kind of term through its own reference application, the attention
  weights and logits kept for the analyses;
- "jax" / "cudnn": `jax.nn.dot_product_attention`, with the additive terms materialised once to [1, H, T, S] and
  low-rank factors and per-head segment tables (as u_i . w_j) folded into q and k, whose width is padded to a
  multiple of 8 (cuDNN's rule);
- "pallas": `kernels.toeplitz_attention`, the Toeplitz table read inside the kernel, low-rank factors folded into q
  and k, per-head segment tables as a rank G - 1 term, masks as piece ids (a local window's blocks outside it
  skipped), attention dropout; per device on a mesh (`sharding.per_shard`); other terms fall back to "cudnn" or
  "xla";
- "mosaic_gpu": the same path on the Hopper kernels of `kernels.mosaic_gpu` (wgmma, TMA; bf16/f16, attention
  dropout and per-head segment tables included);
- "auto" (the default): per call, the fastest measured path that can run it (`auto.choose_for`), logged once.
Terms of the "inputs" stage (RoPE's rotation, Linformer's projection) were applied by the layer before `attend`.
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp

from jaxpos.attention import auto, dropout
from jaxpos.attention.bias import PositionalBias, at_pieces, ensure_4d, kernel_pair, position_logits, stacked_table
from jaxpos.attention.kernels import toeplitz_attention
from jaxpos.attention.mask import AttentionMask
from jaxpos.attention.registry import (AUTO, EVERY_KIND, IMPLEMENTATIONS, Call, Implementation, attention_impls,
                                       can_take, lacks, names, platform_facts, register_implementation, suits)
from jaxpos.attention.terms import AttentionInputs, LowRankFactors, apply_rotary, fold_factors, project_keys
from jaxpos.sharding import HEADS, per_shard

__all__ = ["apply_rotary", "attend", "call_facts", "dot_product_attention", "fold_factors", "pre_softmax_logits",
           "project_keys", "reference_attention", "resolve", "toeplitz_kernel_attention"]


def attend(q_BTHD: jax.Array, k_BSHD: jax.Array, v_BSHD: jax.Array, *, bias: PositionalBias,
           q_pos: jax.Array, k_pos: jax.Array, mask: AttentionMask | None = None,
           q_types: jax.Array | None = None, k_types: jax.Array | None = None,
           implementation: str = "xla", content: bool = True, position: bool = True,
           dropout_rng: jax.Array | None = None, dropout_rate: float = 0.0, with_logits: bool = False):
    """Multi-head attention with positional terms. Returns (out [B, T, H, D], weights [B, H, T, S] or None), and
    with `with_logits` also the pre-softmax logits [B, H, T, S] (masked entries 0; the XLA path only, else None).

    `bias` is one layer's slice; `mask` the piece ids and causal flag (`AttentionMask`); q_types/k_types the
    token types used by a per-head segment table; q_pos [T], k_pos [S], or per example [B, T], [B, S] (packed
    cross-attention). `content=False` drops q.k, `position=False` drops every positional logit term. Attention
    dropout (`dropout_rng`, `dropout_rate`) drops the same weights on every path that has it (`dropout.keep_mask`).
    `implementation` names a registered implementation (jaxpos.attention.registry), or "auto"; `resolve` says which
    computes this call (an explicit choice hands the calls it cannot take to its fallbacks, noted once).
    """
    call = call_facts(q_BTHD, k_BSHD, bias, q_pos, k_pos, mask, content, position, dropout_rng, dropout_rate)
    name = resolve(implementation, call)
    out, weights, logits = IMPLEMENTATIONS[name].function(
        q_BTHD, k_BSHD, v_BSHD, bias=bias, q_pos=q_pos, k_pos=k_pos, mask=mask, q_types=q_types, k_types=k_types,
        content=content, position=position, dropout_rng=dropout_rng, dropout_rate=dropout_rate, implementation=name)
    return (out, weights, logits) if with_logits else (out, weights)


def call_facts(q_BTHD, k_BSHD, bias: PositionalBias, q_pos, k_pos, mask: AttentionMask | None = None,
               content: bool = True, position: bool = True, dropout_rng=None, dropout_rate: float = 0.0) -> Call:
    """The facts of one call of `attend` that decide its implementation (jaxpos.attention.registry.Call): the
    kinds of its terms (none when `position` is off but per-head segments, which stay), and the rest."""
    kinds = bias.kinds if position else bias.kinds & {"segment"}
    length, keys = q_BTHD.shape[1], k_BSHD.shape[1]
    return Call(**platform_facts(), low_precision=q_BTHD.dtype in (jnp.bfloat16, jnp.float16), terms=kinds,
                dropout=dropout_rng is not None and dropout_rate > 0.0, switches=not (content and position),
                per_example_positions=q_pos.ndim > 1 or k_pos.ndim > 1,
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
        raise ValueError(f"attention implementation {implementation!r}; choose {', '.join(attention_impls())}")
    record = IMPLEMENTATIONS[implementation]
    missing = lacks(record, call)
    if missing is None:
        return implementation
    fallback = next((f for f in record.fallbacks if suits(IMPLEMENTATIONS[f], call)), None)
    if fallback is None:
        raise ValueError(f"attention implementation {implementation!r} cannot compute this call: it lacks {missing}; "
                         f"use attention_impl={names(can_take(call))} (or 'auto')")
    verb = "hands this call to" if IMPLEMENTATIONS[fallback].function is record.function else "falls back to"
    _note_once(f"attention_impl={implementation!r} {verb} {fallback!r}: {missing}")
    return fallback


# --- the XLA reference ------------------------------------------------------------------------------------------

def reference_attention(q_BTHD, k_BSHD, v_BSHD, *, bias, q_pos, k_pos, mask, q_types, k_types, content, position,
                        dropout_rng, dropout_rate, implementation="xla"):
    """attend's "xla" path: exact logits (`pre_softmax_logits`), softmax (or a term of the weights stage in its
    place: a sink), dropout, the terms of the values stage (Shaw's r^V); returns the attention weights and the
    logits (masked entries 0) too, for the analyses."""
    dense_mask = None if mask is None else mask.dense(q_pos, k_pos)  # [B|1, 1, T, S] bool
    bias = at_pieces(bias).attending(dense_mask)  # packed rows; the fixed attenuated delta over attended keys
    inputs = _inputs(q_BTHD, k_BSHD, bias, q_pos, k_pos, q_types, k_types, dense_mask, content, position)
    logits = _logits(inputs, bias)
    if dense_mask is not None:
        logits = jnp.where(dense_mask, logits, jnp.finfo(logits.dtype).min)
    normaliser = next((t for t in bias.terms if t.stage == "weights"), None) if position else None
    weights = jax.nn.softmax(logits, axis=-1) if normaliser is None else normaliser.weights(logits, inputs)
    dropped = weights
    if dropout_rng is not None and dropout_rate > 0.0:  # the kernel's mask too (`dropout`)
        keep = dropout.keep_mask(dropout.seed_from_key(dropout_rng), *weights.shape, dropout_rate)
        dropped = jnp.where(keep, weights / (1.0 - dropout_rate), 0.0)
    dropped = dropped.astype(v_BSHD.dtype)
    out = jnp.einsum("bhts,bshd->bthd", dropped, v_BSHD)
    if position:
        for term in bias.terms:
            out = term.values(out, dropped, inputs)
    shown = logits if dense_mask is None else jnp.where(dense_mask, logits, 0.0)
    return out, weights, shown


def _inputs(q_BTHD, k_BSHD, bias, q_pos, k_pos, q_types, k_types, mask, content, position) -> AttentionInputs:
    """The XLA path's `AttentionInputs`: q and k with low-rank factors folded in where the term says so, the
    content logits scale * q.k before any switch."""
    head_dim = q_BTHD.shape[-1]
    scale = bias.content_scale * head_dim**-0.5
    factors = bias.get(LowRankFactors)
    if position and factors is not None and factors.fold:
        q_BTHD, k_BSHD = fold_factors(q_BTHD, k_BSHD, (factors.p_q, factors.p_k), scale)
        if not content:  # keep only the folded positional channels
            q_BTHD = q_BTHD.at[..., :head_dim].set(0)
    content_logits = jnp.einsum("bthd,bshd->bhts", q_BTHD, k_BSHD, preferred_element_type=jnp.float32) * scale
    return AttentionInputs(q=q_BTHD, k=k_BSHD, head_dim=head_dim, q_pos=q_pos, k_pos=k_pos, mask=mask,
                           q_types=q_types, k_types=k_types, scale=scale, content_logits=content_logits,
                           content=content, position=position)


def _logits(inputs: AttentionInputs, bias: PositionalBias) -> jax.Array:
    """The content logits, then every term of the logits stage in order, then the additive terms' sum, then the
    terms of the scale stage."""
    folded = inputs.position and (f := bias.get(LowRankFactors)) is not None and f.fold
    logits = inputs.content_logits
    if not inputs.content and not folded:
        logits = jnp.zeros_like(logits)
    if inputs.position:
        for term in bias.terms:
            if term.stage == "logits":
                logits = term.logits(logits, inputs)
    additive_bias = bias if inputs.position else bias.with_terms(t for t in bias.terms if t.kind == "segment")
    extra = position_logits(additive_bias, inputs.q_pos, inputs.k_pos, include_factors=not folded,
                            q_types=inputs.q_types, k_types=inputs.k_types)
    logits = logits if extra is None else logits + ensure_4d(extra).astype(jnp.float32)
    if inputs.position:
        for term in bias.terms:
            if term.stage == "scale":
                logits = term.logits(logits, inputs)
    return logits


def pre_softmax_logits(q_BTHD: jax.Array, k_BSHD: jax.Array, bias: PositionalBias, *, q_pos: jax.Array,
                       k_pos: jax.Array, q_types: jax.Array | None = None, k_types: jax.Array | None = None,
                       content: bool = True, position: bool = True, mask: jax.Array | None = None) -> jax.Array:
    """Pre-softmax logits [B, H, T, S] (float32, unmasked) of the "xla" path: scale * q.k (with low-rank factors
    folded in where they fold), the logits-stage terms in order, the additive terms. q [B, T, H, D], k [B, S, H, D]
    as attention sees them (rotated, Linformer-projected); `bias` one layer's slice after `at_pieces` and
    `attending`; `mask` [B|1, 1, T, S] bool the keys each query attends to, the only ones CoPE counts."""
    inputs = _inputs(q_BTHD, k_BSHD, bias, q_pos, k_pos, q_types, k_types, mask, content, position)
    return _logits(inputs, bias)


# --- the fast paths ---------------------------------------------------------------------------------------------

def dot_product_attention(q_BTHD, k_BSHD, v_BSHD, *, bias, q_pos, k_pos, mask, q_types, k_types, content, position,
                          dropout_rng, dropout_rate, implementation="jax"):
    """attend's "jax" / "cudnn" path: `jax.nn.dot_product_attention`, with the additive terms materialised once to
    [1, H, T, S], low-rank factors and per-head segment tables (as u_i . w_j) folded into q and k, whose width is
    padded to a multiple of 8 (cuDNN's rule)."""
    del content, position, dropout_rng, dropout_rate  # refused by the registry: this path has none of them
    dense_mask = None if mask is None else mask.dense(q_pos, k_pos)
    bias = at_pieces(bias).attending(dense_mask)
    head_dim = q_BTHD.shape[-1]
    scale = bias.content_scale * head_dim**-0.5
    factors = bias.get(LowRankFactors)
    if factors is not None:
        q_BTHD, k_BSHD = fold_factors(q_BTHD, k_BSHD, (factors.p_q, factors.p_k), scale)
    pairs = kernel_pair(bias, q_types, k_types)
    if pairs is not None:  # per-head segments as u_i . w_j folded into q.k: no [B, H, T, S] bias
        u, w = pairs
        q_BTHD, k_BSHD = fold_factors(q_BTHD, k_BSHD, (jnp.swapaxes(u, 1, 2), w[:, None]), scale)
        bias = bias.with_terms(t for t in bias.terms if t.kind != "segment")
    logits_bias = position_logits(bias, q_pos, k_pos, include_factors=False, q_types=q_types, k_types=k_types)
    if logits_bias is not None:
        logits_bias = ensure_4d(logits_bias).astype(jnp.float32).astype(q_BTHD.dtype)
    # Zero channels change no dot product: q, k, v share a head width that cuDNN takes (a multiple of 8).
    width = -(-q_BTHD.shape[-1] // 8) * 8
    q_BTHD, k_BSHD, v_BSHD = (jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, width - x.shape[-1])))
                              for x in (q_BTHD, k_BSHD, v_BSHD))
    out = jax.nn.dot_product_attention(q_BTHD, k_BSHD, v_BSHD, bias=logits_bias, mask=dense_mask, scale=scale,
                                       implementation=None if implementation == "jax" else implementation)
    return out[..., :head_dim], None, None


def toeplitz_kernel_attention(q, k, v, *, bias, q_pos, k_pos, mask, q_types, k_types, content, position,
                              dropout_rng, dropout_rate, implementation="pallas"):
    """attend's "pallas" / "mosaic_gpu" path: the Toeplitz kernel (Pallas, or the Hopper kernels) on each device's
    shard of the batch and heads (`per_shard`), masks as piece ids; low-rank factors folded into q and k; a
    per-head segment table enters as a rank G - 1 pair term (`segment_pair_factors`); a local window's blocks
    outside it are skipped."""
    del content, position  # refused by the registry: the kernels compute every term
    scale = bias.content_scale * q.shape[-1] ** -0.5
    factors = at_pieces(bias).get(LowRankFactors)
    if factors is not None:  # low-rank P_Q P_K^T (DIET-Abs, TUPE) folded into q.k: v keeps its width
        q, k = fold_factors(q, k, (factors.p_q, factors.p_k), scale)
    rate = dropout_rate if dropout_rng is not None else 0.0
    mask = mask if mask is not None else AttentionMask()
    causal, window = mask.causal, mask.window
    batch, length, heads, _ = q.shape
    pair_u, pair_w = kernel_pair(bias, q_types, k_types) or (None, None)
    table = stacked_table(bias)
    # the Hopper kernels, or the Pallas kernel of the default backend (Triton on GPUs, Mosaic on TPUs)
    backend = "mosaic_gpu" if implementation == "mosaic_gpu" else None
    args = dict(q=q, k=k, v=v, table=table, q_piece_ids=mask.q_piece_ids, kv_piece_ids=mask.kv_piece_ids,
                pair_u=pair_u, pair_w=pair_w,
                # static 0 when causal or windowed: self-attention over one set of positions (a cache's T != S
                # goes to the fallbacks: `cached_causal`)
                q_offset=None if causal or window is not None else q_pos[0] - k_pos[0],
                # the global rows' keys, so that devices holding different rows drop different weights
                dropout_row_keys=dropout.row_keys(dropout.seed_from_key(dropout_rng), batch, heads, length)
                if rate else None)
    table_names = None if table is None else (None if table.shape[0] == 1 else "heads", None)
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
    return per_shard(kernel, given, {name: axes[name] for name in given}, HEADS), None, None


_NOTED: set[str] = set()


def _note_once(message: str, level: int = logging.WARNING) -> None:
    """Logs a note once per distinct message (attend runs once per layer and trace)."""
    if message not in _NOTED:
        _NOTED.add(message)
        logging.getLogger(__name__).log(level, message)


# --- the registry's records ---------------------------------------------------------------------------------------

# What the fast paths take: the layer's input terms (RoPE's rotation applied before attend; Linformer's projected
# keys, which need no mask), and the additive terms they read compactly or materialise.
_MATERIALISED = frozenset({"rotary", "kv_projection", "table", "factors", "dense", "segment"})
_KERNEL = frozenset({"rotary", "table", "factors", "segment"})

for _implementation in (
        Implementation("xla", reference_attention,
                       "einsum and softmax: every term exact, the attention weights kept for the analyses",
                       platforms=("cpu", "gpu", "tpu"), terms=frozenset({EVERY_KIND}), dropout=True, switches=True,
                       per_example_positions=True, cached_causal=True, window=True,
                       step_ms={("none", True): 45.6, ("table", True): 54.7, ("factors", True): 49.1}, tie_rank=1),
        Implementation("jax", dot_product_attention,
                       "jax.nn.dot_product_attention, XLA's choice of kernel; position-only terms materialised once",
                       platforms=("cpu", "gpu", "tpu"), terms=_MATERIALISED, per_example_positions=True,
                       cached_causal=True, window=True, tie_rank=4),
        Implementation("cudnn", dot_product_attention,
                       "jax.nn.dot_product_attention on cuDNN's fused kernel; position-only terms materialised once",
                       platforms=("gpu",), terms=_MATERIALISED, per_example_positions=True, cached_causal=True,
                       window=True, low_precision_only=True, even_lengths=True,
                       step_ms={("none", False): 35.5, ("table", False): 39.2, ("factors", False): 41.9}, tie_rank=0),
        Implementation("pallas", toeplitz_kernel_attention,
                       "the Toeplitz kernel in Pallas (Triton on GPUs, Mosaic on TPUs), the table read inside it",
                       platforms=("cpu", "gpu", "tpu"), terms=_KERNEL, dropout=True, window=True,
                       fallbacks=("cudnn", "xla"), tie_rank=3),
        Implementation("mosaic_gpu", toeplitz_kernel_attention,
                       "the Toeplitz kernel for Hopper GPUs (wgmma, TMA), the table read inside it",
                       platforms=("cpu", "gpu"), terms=_KERNEL, dropout=True, window=True, hopper_only=True,
                       low_precision_only=True, one_cpu_device=True, fallbacks=("pallas", "cudnn", "xla"),
                       step_ms={("none", False): 34.2, ("table", False): 38.2, ("factors", False): 37.4,
                                ("none", True): 38.6, ("table", True): 41.5, ("factors", True): 40.0}, tie_rank=2)):
    register_implementation(_implementation)
