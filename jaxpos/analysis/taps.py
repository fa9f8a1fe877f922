"""What the analyses read from a jaxpos encoder: attention weights and logits, hidden states, per-head
value-output maps, and a layer's hidden states as a function of the input token embeddings."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxpos import positions
from jaxpos.config import ModelConfig
from jaxpos.models import BertEncoder
from jaxpos.models.layers import layer_norm


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


def sown_logits(intermediates, cfg: ModelConfig) -> jax.Array:
    """[L, B, H, T, S] pre-softmax logits the encoder's layers sowed (their own, masked entries 0; a shared layer
    sows once per application)."""
    encoder = intermediates["encoder"]
    if cfg.share_layers:
        return jnp.stack(encoder["layer_shared"]["self_attention"]["attention_logits"])
    return jnp.stack([encoder[f"layer_{i}"]["self_attention"]["attention_logits"][0]
                      for i in range(cfg.num_layers)])


@functools.lru_cache(maxsize=32)
def _logits_fn(cfg: ModelConfig):
    """Jitted (params, ids, piece_ids, token_types) -> logits [L, B, H, T, S], as the model's layers computed
    them."""

    def run(params, ids, piece_ids, token_types):
        _, state = BertEncoder(cfg).apply({"params": params}, ids, piece_ids=piece_ids, token_types=token_types,
                                          mutable=["intermediates"])
        return sown_logits(state["intermediates"], cfg)

    return jax.jit(run)


def attention_logits(cfg: ModelConfig, params, input_ids, piece_ids=None, token_types=None) -> jax.Array:
    """Pre-softmax self-attention logits [L, B, H, T, S] of a `BertEncoder` (S = T, or Linformer's k): content,
    positional and segment terms, with each row's constant that softmax ignores; masked entries are 0. Each
    layer's own (sown by its attention on the XLA path: `cfg.attention_impl` 'xla', as the analyses load models).
    """
    ids = jnp.asarray(input_ids)
    piece_ids = jnp.ones_like(ids) if piece_ids is None else jnp.asarray(piece_ids)
    return _logits_fn(cfg)(params, ids, piece_ids, None if token_types is None else jnp.asarray(token_types))


def token_embedding_scale(cfg: ModelConfig) -> float:
    """The factor `BertEncoder` multiplies token embeddings by (its mechanism's, or sqrt(d_model) with
    model.scale_embeddings, else 1)."""
    return positions.token_embedding_scale(cfg)[1]


def input_position_embedding(cfg: ModelConfig, encoder_params, length: int) -> np.ndarray | None:
    """What the mechanism adds to the token embeddings at the input ([T, E]: learned or sinusoidal), or None: its
    module's own `embed`, with the run's parameters."""
    module = positions.make_position(cfg, cfg.num_layers, cfg.causal)
    variables = {"params": encoder_params["position"]} if "position" in encoder_params else {}
    table = module.apply(variables, jnp.arange(length, dtype=jnp.int32), method=module.embed)
    return None if table is None else np.asarray(table)


def has_learned_input_positions(cfg: ModelConfig) -> bool:
    """Does the model add a learned position table (its parameter `embedding`) to its token embeddings (BERT;
    TISA with input positions)? Its module traced abstractly."""
    module = positions.make_position(cfg, cfg.num_layers, cfg.causal)
    params = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), jnp.arange(2), jnp.arange(2)))
    embedded = jax.eval_shape(lambda p: module.apply(p, jnp.arange(2), method=module.embed), params)
    return embedded is not None and "embedding" in params.get("params", {})


def layer_params(cfg: ModelConfig, params, layer: int):
    encoder = params["encoder"]
    return encoder["layer_shared"] if cfg.share_layers else encoder[f"layer_{layer}"]


def value_path_problem(cfg: ModelConfig) -> str | None:
    """Why a head's output is not A (E W_V^h) W_O^h with E the tokens' states (None: it is). Effective attention
    and the additive decomposition rest on that form."""
    terms = {t.kind: t for t in _layer_terms(cfg)}
    shaw = terms.get("shaw")
    if shaw is not None and shaw.rel_values is not None:
        return "Shaw relative value vectors (position.shaw.values) add a positional term to the values"
    if "kv_projection" in terms:
        return "Linformer (position.diet_abs.linformer_k) projects keys and values along the sequence"
    return None


def _layer_terms(cfg: ModelConfig):
    """The terms (abstract arrays) of the mechanism's bias of a whole stack."""
    module = positions.make_position(cfg, cfg.num_layers, cfg.causal)
    pos = jnp.arange(2, dtype=jnp.int32)
    return jax.eval_shape(lambda: module.init_with_output(jax.random.PRNGKey(0), pos, pos)[0]).terms


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
