"""What the analyses read from a jaxpos encoder: attention weights, hidden states, per-head value-output maps,
and a layer's hidden states as a function of the input token embeddings."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxpos.config import ModelConfig
from jaxpos.models import BertEncoder


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

    def run(params, ids, segs, token_types):
        _, state = BertEncoder(cfg).apply({"params": params}, ids, segment_ids=segs, token_types=token_types,
                                          mutable=["intermediates"])
        return attention_weights(state["intermediates"], cfg), hidden_states(state["intermediates"])

    return jax.jit(run)


def run_encoder(cfg: ModelConfig, params, input_ids, segment_ids=None, token_types=None):
    """(attention weights [L, B, H, T, T], hidden states [L+1, B, T, d]) of a `BertEncoder`."""
    ids = jnp.asarray(input_ids)
    segs = jnp.ones_like(ids) if segment_ids is None else jnp.asarray(segment_ids)
    return _encoder_taps(cfg)(params, ids, segs, None if token_types is None else jnp.asarray(token_types))


def has_learned_input_positions(cfg: ModelConfig) -> bool:
    """Does the model add a learned position table to its token embeddings (BERT; TISA with input positions)?"""
    kind = cfg.position.kind
    return kind == "absolute" or (kind == "tisa" and cfg.position.tisa.input_positions)


def input_position_embedding(cfg: ModelConfig, encoder_params, length: int) -> np.ndarray | None:
    """What the mechanism adds to the token embeddings at the input ([T, E]: learned or sinusoidal), or None."""
    from jaxpos.positions.absolute import sinusoidal_table

    if has_learned_input_positions(cfg):
        return np.asarray(encoder_params["position"]["embedding"][:length])
    if cfg.position.kind == "sinusoidal":
        return np.asarray(sinusoidal_table(np.arange(length), cfg.embed_width))
    return None


def layer_params(cfg: ModelConfig, params, layer: int):
    encoder = params["encoder"]
    return encoder["layer_shared"] if cfg.share_layers else encoder[f"layer_{layer}"]


def value_output_maps(cfg: ModelConfig, params, states) -> np.ndarray:
    """Per layer and head, T = E W_V^h W_O^h (value projection, then the head's slice of the output projection),
    without biases, for E the layer's input: states [L+1, B, T, d] -> [L, B, H, T, d]."""
    maps = []
    for layer in range(cfg.num_layers):
        attention = layer_params(cfg, params, layer)["self_attention"]
        values = jnp.einsum("btd,dhk->bhtk", states[layer], attention["value"]["kernel"])
        maps.append(jnp.einsum("bhtk,hke->bhte", values, attention["out"]["kernel"]))
    return np.asarray(jnp.stack(maps))


def hidden_state_fn(cfg: ModelConfig, params, layer: int, token_types=None):
    """x [T, E] token embeddings of one sentence -> the hidden states after `layer` layers [T, d] (0 = the
    embedding layer's output). Positions and token types are added inside, as in the model."""
    model = BertEncoder(cfg)

    def embed_and_encode(module, x):
        if cfg.position.segment == "input" and cfg.type_vocab_size > 0:
            types = jnp.zeros(x.shape[:2], jnp.int32) if token_types is None else token_types[None]
            x = x + module.type_embed(types)
        return module.stack(x, segment_ids=jnp.ones(x.shape[:2], jnp.int32))

    def fn(x):
        _, state = model.apply({"params": params}, x[None], method=embed_and_encode, mutable=["intermediates"])
        return state["intermediates"]["encoder"]["hidden_states"][layer][0]

    return fn
