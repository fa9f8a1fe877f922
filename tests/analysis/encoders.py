"""A tiny `BertEncoder` with every parameter perturbed, so that biases, LayerNorm gains and shifts are all
non-trivial (at initialisation they are 0 and 1, which hides a left-out bias or norm)."""

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxpos.models import BertEncoder


def perturbed_encoder_params(cfg, ids, seed: int = 0, noise: float = 0.1):
    """`BertEncoder(cfg)` parameters (unboxed) with N(0, noise^2) added to every entry."""
    params = nn.unbox(jax.jit(BertEncoder(cfg).init)(jax.random.PRNGKey(seed), jnp.asarray(ids))["params"])
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(seed + 1), len(leaves))
    return jax.tree.unflatten(tree, [x + noise * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)])


def attention_sublayer_outputs(cfg, params, ids, piece_ids=None, token_types=None):
    """[L, B, T, d]: what each layer's self-attention module returns (W_O (A V) + b_O), from the model's forward."""
    piece_ids = jnp.ones_like(jnp.asarray(ids)) if piece_ids is None else jnp.asarray(piece_ids)
    _, state = BertEncoder(cfg).apply(
        {"params": params}, jnp.asarray(ids), piece_ids=piece_ids, token_types=token_types,
        capture_intermediates=lambda module, method: method == "__call__" and module.name == "self_attention",
        mutable=["intermediates"])
    encoder = state["intermediates"]["encoder"]
    if cfg.share_layers:
        return jnp.stack(encoder["layer_shared"]["self_attention"]["__call__"])
    return jnp.stack([encoder[f"layer_{i}"]["self_attention"]["__call__"][0] for i in range(cfg.num_layers)])
