"""Multi-head attention layer: projections, QK-norm, the terms of the inputs stage (RoPE, PoPE, Linformer), the
key/value cache, Llama 4's NoPE temperature, `attend` (with the layer's own sink and length-scale terms), the output
gate, the output projection."""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from jaxpos.attention.bias import AttentionSink, LayerOps, LengthScale, PositionalBias, at_pieces
from jaxpos.attention.core import attend
from jaxpos.attention.mask import AttentionMask
from jaxpos.config import ModelConfig
from jaxpos.config.rng import DROPOUT
from jaxpos.initializers import normal_init
from jaxpos.sharding import HEADS, HIDDEN, constrain


def nope_temperature(q_pos, cfg: ModelConfig):
    """Llama 4's query temperature at positions q_pos [T] (or [B, T]): log(⌊(i + 1) / floor⌋ + 1) · scale + 1."""
    i = q_pos.astype(jnp.float32)
    return jnp.log1p(jnp.floor((i + 1.0) / cfg.nope_temperature_floor)) * cfg.nope_temperature + 1.0


def dense(cfg: ModelConfig, features, axis, kernel_axes, bias_axes, name: str, use_bias: bool = True
          ) -> nn.DenseGeneral:
    """A DenseGeneral whose kernel and bias (without one where not `use_bias`) carry logical axis names."""
    return nn.DenseGeneral(
        features=features, axis=axis, name=name, use_bias=use_bias, dtype=jnp.dtype(cfg.dtype),
        param_dtype=jnp.dtype(cfg.param_dtype),
        kernel_init=nn.with_logical_partitioning(normal_init(cfg.init_std), kernel_axes),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, bias_axes))


class MultiHeadAttention(nn.Module):
    """Self- or cross-attention. With `decode`, self-attention keeps a key/value cache written at q_pos.

    inputs_q [B, T, d], inputs_kv [B, S, d] -> [B, T, d]. On the xla implementation the attention weights are sown
    as intermediates/attention_weights, and with the intermediates collection mutable (the analyses' taps) the
    pre-softmax logits as intermediates/attention_logits (masked entries 0).
    """

    cfg: ModelConfig
    self_attention: bool = True
    decode: bool = False
    nope: bool = False  # a NoPE layer of the plan: Llama 4's query temperature applies (model.nope_temperature)

    @nn.compact
    def __call__(self, inputs_q, inputs_kv, *, bias: PositionalBias, q_pos, k_pos,
                 mask: AttentionMask | None = None, q_types=None, k_types=None, deterministic: bool = True):
        """mask: the piece ids and causal flag (`AttentionMask`); q_pos [T], k_pos [S]; packed cross-attention
        passes positions within each pair, [B, T] and [B, S]."""
        cfg = self.cfg
        heads, head_dim = cfg.num_heads, cfg.head_dim
        def projection(name):
            return dense(cfg, (heads, head_dim), -1, ("embed", "heads", "kv"), ("heads", "kv"), name, cfg.use_bias)

        query, key = projection("query"), projection("key")
        q, k, v = query(inputs_q), key(inputs_kv), projection("value")(inputs_kv)
        # Batch over data x fsdp, heads over tensor (the fsdp-sharded kernels are gathered, not the activations);
        # named for model.remat="save_projections" (a no-op without it).
        q, k, v = (checkpoint_name(constrain(t, HEADS), name) for t, name in ((q, "query"), (k, "key"),
                                                                              (v, "value")))
        if cfg.qk_norm:  # each head's queries and keys normalised, before any rotation (Gemma 3, OLMo 2, Qwen 3)
            q, k = self._rms("q_norm", q), self._rms("k_norm", k)
        # Terms that act with this layer's own parameters or input (DeBERTa's projections, FoX's gates)
        hidden_dropout = nn.Dropout(cfg.dropout)
        bias = bias.in_layer(LayerOps(query=query, key=key, inputs=inputs_q,
                                      dropout=lambda x: hidden_dropout(x, deterministic=deterministic)))
        if self.decode and self.self_attention:  # terms read from the input keep the earlier steps' in the cache
            bias = bias.with_terms(term.decoding(lambda name, x: self._cached(f"cached_{name}", x, q_pos), q_pos[0])
                                   for term in bias.terms)
        pcfg = cfg.position
        bias = at_pieces(self._own_terms(bias))  # packed rows: each term read at its tokens' piece positions
        q, k, v, mask = self._inputs_stage(bias, q, k, v, mask, q_pos, k_pos, pcfg.content_only)
        if self.nope and cfg.nope_temperature:  # Llama 4: a temperature growing with the query's position
            q = (q.astype(jnp.float32) * nope_temperature(q_pos, cfg)[..., None, None]).astype(q.dtype)

        dropout_rng = None
        if not deterministic and cfg.attention_dropout > 0.0:  # runs refuse paths without it (check_training)
            dropout_rng = self.make_rng(DROPOUT)
        analysed = self.is_mutable_collection("intermediates")  # the analyses' taps: weights and logits
        out, weights, logits = attend(
            q, k, v, bias=bias, q_pos=q_pos, k_pos=k_pos, mask=mask, q_types=q_types, k_types=k_types,
            implementation=cfg.attention_impl, content=not pcfg.position_only, position=not pcfg.content_only,
            dropout_rng=dropout_rng, dropout_rate=cfg.attention_dropout, with_logits=True)
        if weights is not None:
            self.sow("intermediates", "attention_weights", weights)
        if analysed and logits is not None:
            self.sow("intermediates", "attention_logits", logits)
        out = constrain(out, HEADS)
        if cfg.output_gate:  # gated attention: each head's output times σ(x W_g), elementwise (Qwen3-Next)
            gate = dense(cfg, (heads, head_dim), -1, ("embed", "heads", "kv"), ("heads", "kv"), "gate",
                         cfg.use_bias)(inputs_q)
            out = out * jax.nn.sigmoid(gate.astype(jnp.float32)).astype(out.dtype)
        return constrain(
            dense(cfg, cfg.d_model, (-2, -1), ("heads", "kv", "embed"), ("embed",), "out", cfg.use_bias)(out),
            HIDDEN)

    def _rms(self, name: str, x):
        """An RMSNorm over each head's D channels with a learned scale [D] (initialised at 1)."""
        scale = self.param(name, nn.with_logical_partitioning(nn.initializers.ones, ("kv",)), (x.shape[-1],),
                           jnp.dtype(self.cfg.param_dtype))
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.cfg.layer_norm_eps)
        return (normed * scale).astype(x.dtype)

    def _own_terms(self, bias: PositionalBias) -> PositionalBias:
        """The layer's own terms beside the mechanism's: a sink logit per head, Scalable-Softmax's per-head s."""
        cfg = self.cfg
        if cfg.attention_sinks:
            sinks = self.param("sinks", nn.with_logical_partitioning(normal_init(cfg.init_std), ("heads",)),
                               (cfg.num_heads,), jnp.dtype(cfg.param_dtype))
            bias = bias.add(AttentionSink(logit=sinks))
        if cfg.length_scaled_logits:  # s·log n = 1 at n = max_length: the softmax as it is at the training length
            start = 1.0 / math.log(max(cfg.max_length, 2))
            s = self.param("length_scale", nn.with_logical_partitioning(nn.initializers.constant(start),
                                                                         ("heads",)),
                           (cfg.num_heads,), jnp.dtype(cfg.param_dtype))
            bias = bias.add(LengthScale(s=s))
        return bias

    def _inputs_stage(self, bias: PositionalBias, q, k, v, mask, q_pos, k_pos, content_only: bool):
        """The terms of the inputs stage applied to q, k, v (RoPE's rotation before the cache, whose new keys sit
        at the query positions; Linformer's projection, after which nothing is masked), and the cache."""
        for term in bias.terms:
            if term.stage == "inputs" and term.kind != "kv_projection":
                q, k, v, mask = term.on_inputs(q, k, v, mask, q_pos=q_pos, k_pos=k_pos,
                                               self_attention=self.self_attention, content_only=content_only)
        if self.decode and self.self_attention:
            k, v = self._cached("cached_key", k, q_pos), self._cached("cached_value", v, q_pos)
        for term in bias.terms:
            if term.stage == "inputs" and term.kind == "kv_projection":
                q, k, v, mask = term.on_inputs(q, k, v, mask, q_pos=q_pos, k_pos=k_pos,
                                               self_attention=self.self_attention, content_only=content_only)
        return q, k, v, mask

    def _cached(self, name: str, x, q_pos):
        """x [B, 1, ...] written to the cache at step q_pos[0], and the whole cached row [B, S, ...]; the first
        call (initialisation) sizes the cache from a full-length input and returns x."""
        initialised = self.has_variable("cache", name)
        cached = self.variable("cache", name, jnp.zeros, x.shape, x.dtype)
        if not initialised:
            return x
        if x.shape[1] != 1:
            raise ValueError(f"incremental decoding takes one token per step, got {x.shape[1]}")
        cached.value = jax.lax.dynamic_update_slice(cached.value, x, (0, q_pos[0]) + (0,) * (x.ndim - 2))
        return cached.value
