"""What the analyses read from a jaxpos encoder: attention weights and logits, hidden states, per-head
value-output maps, and a layer's hidden states as a function of the input token embeddings."""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxpos.attention.bias import at_pieces, over_attended_keys
from jaxpos.attention.core import apply_rotary, pre_softmax_logits, project_keys
from jaxpos.attention.mask import AttentionMask
from jaxpos.config import ModelConfig
from jaxpos.models import BertEncoder
from jaxpos.models.layers import layer_norm
from jaxpos.positions.absolute import sinusoidal_table


def attention_weights(intermediates, cfg: ModelConfig) -> jax.Array:
    """[L, B, H, T, S] attention weights an encoder sowed (a shared layer sows once per application)."""
    encoder = intermediates["encoder"]
    if cfg.share_layers:
        return jnp.stack(encoder["layer_shared"]["self_attention"]["attention_weights"])
    return jnp.stack([encoder[f"layer_{i}"]["self_attention"]["attention_weights"][0]
                      for i in range(cfg.num_layers)])


def hidden_states(intermediates) -> jax.Array:
    """[L+1, B, T, d]: the input of the first layer, then every layer's output."""
    return jnp.stack(intermediates["encoder"]["hidden_states"])


@functools.lru_cache(maxsize=32)
def _encoder_taps(cfg: ModelConfig):
    """The forward pass with its taps, jitted once per config (op-by-op dispatch of a new input shape costs
    several times one compilation)."""

    def run(params, ids, piece_ids, token_types):
        _, state = BertEncoder(cfg).apply({"params": params}, ids, piece_ids=piece_ids, token_types=token_types,
                                          mutable=["intermediates"])
        return attention_weights(state["intermediates"], cfg), hidden_states(state["intermediates"])

    return jax.jit(run)


def run_encoder(cfg: ModelConfig, params, input_ids, piece_ids=None, token_types=None):
    """(attention weights [L, B, H, T, T], hidden states [L+1, B, T, d]) of a `BertEncoder`."""
    ids = jnp.asarray(input_ids)
    piece_ids = jnp.ones_like(ids) if piece_ids is None else jnp.asarray(piece_ids)
    return _encoder_taps(cfg)(params, ids, piece_ids, None if token_types is None else jnp.asarray(token_types))


_LOGIT_INPUTS = ("query", "key", "position", "segments")  # modules whose outputs the logits are formed from


def _captures_logit_inputs(module: nn.Module, method_name: str) -> bool:
    return method_name == "__call__" and module.name in _LOGIT_INPUTS


def _layer_logits(cfg: ModelConfig, q, k, bias, positions, mask, types) -> jax.Array:
    """Pre-softmax logits [B, H, T, S] of one layer from its projected q [B, T, H, D], k [B, T, H, D] and bias
    slice: rotated and Linformer-projected as `MultiHeadAttention` does, then `pre_softmax_logits`; masked entries
    are 0."""
    pcfg = cfg.position
    bias = at_pieces(bias)
    if bias.rotary is not None and not pcfg.content_only:  # as the model: content-only logits carry no rotation
        q, k = apply_rotary(q, *bias.rotary), apply_rotary(k, *bias.rotary)
    if bias.kv_projection is not None:
        k, mask = project_keys(bias.kv_projection, k, mask), None
    logits = pre_softmax_logits(q, k, over_attended_keys(bias, mask), q_pos=positions, k_pos=positions,
                                q_types=types, k_types=types, content=not pcfg.position_only,
                                position=not pcfg.content_only, mask=mask)
    return logits if mask is None else jnp.where(mask, logits, 0.0)


@functools.lru_cache(maxsize=32)
def _logits_fn(cfg: ModelConfig):
    """Jitted (params, ids, piece_ids, token_types) -> logits [L, B, H, T, S], from the model's own q, k and bias."""

    def run(params, ids, piece_ids, token_types):
        _, state = BertEncoder(cfg).apply({"params": params}, ids, piece_ids=piece_ids, token_types=token_types,
                                          capture_intermediates=_captures_logit_inputs, mutable=["intermediates"])
        encoder = state["intermediates"]["encoder"]
        bias = encoder["position"]["__call__"][0]
        if "segments" in encoder:  # per-head segment attention, as the stack adds it
            bias = bias.replace(segment_table=encoder["segments"]["__call__"][0])
        types = jnp.zeros_like(ids) if token_types is None else token_types
        positions = jnp.arange(ids.shape[1], dtype=jnp.int32)
        mask = AttentionMask.within_pieces(piece_ids, causal=cfg.causal)
        logits = []
        for layer in range(cfg.num_layers):
            window = cfg.local_window if cfg.is_local(layer) else None
            layer_mask = mask.replace(window=window).dense(positions, positions)
            attention = encoder["layer_shared" if cfg.share_layers else f"layer_{layer}"]["self_attention"]
            call = layer if cfg.share_layers else 0  # a shared layer records one output per application
            # DeBERTa's layers also project the relative embeddings [R, H, D] (3-d) beside the tokens (4-d)
            (q, rel_q), (k, rel_k) = (_by_rank(attention[name]["__call__"], call) for name in ("query", "key"))
            layer_bias = bias.for_layer(layer)
            if layer_bias.rel_embeddings is not None:
                layer_bias = layer_bias.replace(rel_embeddings=None, rel_projections=(rel_q, rel_k))
            logits.append(_layer_logits(cfg, q, k, layer_bias, positions, layer_mask, types))
        return jnp.stack(logits)

    return jax.jit(run)


def _by_rank(outputs, call: int):
    """(token projection [B, T, H, D], relative-embedding projection [R, H, D] or None) of application `call`
    among a projection's captured outputs."""
    relative = [x for x in outputs if x.ndim == 3]
    return [x for x in outputs if x.ndim == 4][call], relative[call] if relative else None


def attention_logits(cfg: ModelConfig, params, input_ids, piece_ids=None, token_types=None) -> jax.Array:
    """Pre-softmax self-attention logits [L, B, H, T, S] of a `BertEncoder` (S = T, or Linformer's k): content,
    positional and segment terms, with each row's constant that softmax ignores; masked entries are 0.

    q and k are the model's own projections (captured in its forward pass), the positional terms its own bias.
    """
    ids = jnp.asarray(input_ids)
    piece_ids = jnp.ones_like(ids) if piece_ids is None else jnp.asarray(piece_ids)
    return _logits_fn(cfg)(params, ids, piece_ids, None if token_types is None else jnp.asarray(token_types))


def has_learned_input_positions(cfg: ModelConfig) -> bool:
    """Does the model add a learned position table to its token embeddings (BERT; TISA with input positions)?"""
    kind = cfg.position.kind
    return kind == "absolute" or (kind == "tisa" and cfg.position.tisa.input_positions)


def token_embedding_scale(cfg: ModelConfig) -> float:
    """The factor `BertEncoder` multiplies token embeddings by: sqrt(d_model) with model.scale_embeddings, else 1."""
    return math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0


def input_position_embedding(cfg: ModelConfig, encoder_params, length: int) -> np.ndarray | None:
    """What the mechanism adds to the token embeddings at the input ([T, E]: learned or sinusoidal), or None."""
    if has_learned_input_positions(cfg):
        return np.asarray(encoder_params["position"]["embedding"][:length])
    if cfg.position.kind == "sinusoidal":
        return np.asarray(sinusoidal_table(np.arange(length), cfg.embed_width))
    return None


def layer_params(cfg: ModelConfig, params, layer: int):
    encoder = params["encoder"]
    return encoder["layer_shared"] if cfg.share_layers else encoder[f"layer_{layer}"]


def value_path_problem(cfg: ModelConfig) -> str | None:
    """Why a head's output is not A (E W_V^h) W_O^h with E the tokens' states (None: it is). Effective attention
    and the additive decomposition rest on that form."""
    pcfg = cfg.position
    if pcfg.kind == "shaw" and pcfg.shaw.values:
        return "Shaw relative value vectors (position.shaw.values) add a positional term to the values"
    if pcfg.kind == "diet_abs" and pcfg.diet_abs.linformer_k:
        return "Linformer (position.diet_abs.linformer_k) projects keys and values along the sequence"
    return None


def _attention_inputs(cfg: ModelConfig, params, states) -> jax.Array:
    """What each layer's self-attention reads: states [L+1, B, T, d] -> [L, B, T, d], the layer inputs, or their
    LayerNorm (the layer's self_attention_norm) in pre-LN layers."""
    inputs = []
    for layer in range(cfg.num_layers):
        x = jnp.asarray(states[layer])
        if cfg.layer_norm == "pre" and cfg.has_attention_norm(layer):
            norm = layer_params(cfg, params, layer)["self_attention_norm"]
            x = layer_norm(cfg, "self_attention_norm").apply({"params": norm}, x)
        inputs.append(x)
    return jnp.stack(inputs)


def value_output_maps(cfg: ModelConfig, params, states) -> np.ndarray:
    """Per layer and head, T = E W_V^h W_O^h (value projection, then the head's slice of the output projection),
    without biases, for E what the layer's attention reads (`_attention_inputs`): states [L+1, B, T, d] ->
    [L, B, H, T, d]. Refuses models whose head outputs take another form (`value_path_problem`)."""
    problem = value_path_problem(cfg)
    if problem is not None:
        raise ValueError(f"value-output maps do not describe this model: {problem}")
    maps = []
    for layer, inputs in enumerate(_attention_inputs(cfg, params, states)):
        attention = layer_params(cfg, params, layer)["self_attention"]
        values = jnp.einsum("btd,dhk->bhtk", inputs, attention["value"]["kernel"])
        maps.append(jnp.einsum("bhtk,hke->bhte", values, attention["out"]["kernel"]))
    return np.asarray(jnp.stack(maps))


def hidden_state_fn(cfg: ModelConfig, params, layer: int, token_types=None):
    """x [T, E] token embeddings of one sentence (rows of the token table) -> the hidden states after `layer`
    layers [T, d] (0 = the embedding layer's output). The model's own forward pass with its token look-up
    replaced by x: embedding scale, positions and token types (`token_types` [T]) are applied as in the model."""
    model = BertEncoder(cfg)
    types = None if token_types is None else jnp.asarray(token_types)[None]

    def fn(x):
        def given_token_embeddings(next_fun, args, kwargs, context):
            if context.module.name == "token_embed" and context.method_name == "__call__":
                return x[None].astype(jnp.dtype(cfg.dtype))
            return next_fun(*args, **kwargs)

        ids = jnp.zeros((1, x.shape[0]), jnp.int32)  # placeholders: the look-up is replaced
        with nn.intercept_methods(given_token_embeddings):
            _, state = model.apply({"params": params}, ids, piece_ids=jnp.ones_like(ids), token_types=types,
                                   mutable=["intermediates"])
        return state["intermediates"]["encoder"]["hidden_states"][layer][0]

    return fn
