"""Multi-head attention layer: projections, RoPE, Linformer projection, key/value cache, then `attend`."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from jaxpos.attention.bias import LayerOps, PositionalBias, at_pieces
from jaxpos.attention.core import attend
from jaxpos.attention.mask import AttentionMask
from jaxpos.config import ModelConfig
from jaxpos.config.rng import DROPOUT
from jaxpos.initializers import normal_init
from jaxpos.sharding import HEADS, HIDDEN, constrain


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
        # Terms that act with this layer's own parameters (DeBERTa's projections of its relative embeddings)
        hidden_dropout = nn.Dropout(cfg.dropout)
        bias = bias.in_layer(LayerOps(query=query, key=key,
                                      dropout=lambda x: hidden_dropout(x, deterministic=deterministic)))
        pcfg = cfg.position
        bias = at_pieces(bias)  # packed rows: each term read at its tokens' piece positions
        q, k, v, mask = self._inputs_stage(bias, q, k, v, mask, q_pos, k_pos, pcfg.content_only)

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
        return constrain(
            dense(cfg, cfg.d_model, (-2, -1), ("heads", "kv", "embed"), ("embed",), "out", cfg.use_bias)(out),
            HIDDEN)

    def _inputs_stage(self, bias: PositionalBias, q, k, v, mask, q_pos, k_pos, content_only: bool):
        """The terms of the inputs stage applied to q, k, v (RoPE's rotation before the cache, whose new keys sit
        at the query positions; Linformer's projection, after which nothing is masked), and the cache."""
        for term in bias.terms:
            if term.stage == "inputs" and term.kind != "kv_projection":
                q, k, v, mask = term.on_inputs(q, k, v, mask, q_pos=q_pos, k_pos=k_pos,
                                               self_attention=self.self_attention, content_only=content_only)
        if self.decode and self.self_attention:
            k, v = self._update_cache(k, v, q_pos)
        for term in bias.terms:
            if term.stage == "inputs" and term.kind == "kv_projection":
                q, k, v, mask = term.on_inputs(q, k, v, mask, q_pos=q_pos, k_pos=k_pos,
                                               self_attention=self.self_attention, content_only=content_only)
        return q, k, v, mask

    def _update_cache(self, k, v, q_pos):
        """First call (initialisation) sizes the cache from a full-length input; later calls write step q_pos."""
        initialised = self.has_variable("cache", "cached_key")
        cached_key = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
        cached_value = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
        if not initialised:
            return k, v
        if k.shape[1] != 1:
            raise ValueError(f"incremental decoding takes one token per step, got {k.shape[1]}")
        start = (0, q_pos[0], 0, 0)
        cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, k, start)
        cached_value.value = jax.lax.dynamic_update_slice(cached_value.value, v, start)
        return cached_key.value, cached_value.value
