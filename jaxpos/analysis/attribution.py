"""Hidden token attribution (Brunner et al., "On Identifiability in Transformers", section 5).

c[l, i, j] = ||d e_j^l / d x_i||_F / sum_k ||d e_j^l / d x_k||_F: the share of input token i in the hidden
state of token j after l layers, from the Frobenius norms of the [d, E] blocks of the Jacobian of the
embedding-to-hidden-state map (`jaxpos.analysis.taps.hidden_state_fn`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxpos.analysis.taps import hidden_state_fn
from jaxpos.config import ModelConfig


@functools.lru_cache(maxsize=16)
def _block_norms_fn(cfg: ModelConfig, layers: tuple[int, ...], chunk_size: int):
    """Jitted (params, x [T, E], token_types) -> ||d e_j^l / d x_i||_F as [L, T_in, T_out]."""

    def block_norms(params, x, token_types):
        fns = [hidden_state_fn(cfg, params, layer, token_types) for layer in layers]
        # One linearisation of all requested layers; XLA merges the shared forward computation.
        _, push = jax.linearize(lambda v: jnp.stack([f(v) for f in fns]), x)  # tangent [T, E] -> [L, T, d]
        tokens, width = x.shape

        def from_input(i):
            def squared(e):  # one Jacobian column: the response to input coordinate (i, e)
                return jnp.sum(push(jnp.zeros_like(x).at[i, e].set(1.0)) ** 2, axis=-1)  # [L, T_out]

            # Chunks of coordinates bound the memory to chunk_size forward-mode passes at a time.
            return jax.lax.map(squared, jnp.arange(width), batch_size=min(chunk_size, width)).sum(0)

        squares = jax.lax.map(from_input, jnp.arange(tokens))  # [T_in, L, T_out]
        return jnp.sqrt(jnp.moveaxis(squares, 0, 1))

    return jax.jit(block_norms)


def token_contributions(cfg: ModelConfig, params, token_embeddings, layers=None, token_types=None,
                        chunk_size: int = 64) -> np.ndarray:
    """Contributions c [L, T_in, T_out] of the input tokens of one sentence to its hidden states.

    token_embeddings [T, E] (the word embeddings, before positions and types are added); `layers` indexes the
    hidden states as `hidden_state_fn` does (0 = the embedding layer's output), default every one of
    0..cfg.num_layers (L = num_layers + 1). Column j sums to one over the inputs i.
    """
    layers = tuple(range(cfg.num_layers + 1)) if layers is None else tuple(int(l) for l in np.atleast_1d(layers))
    x = jnp.asarray(token_embeddings)
    if x.ndim != 2:
        raise ValueError(f"expected the token embeddings of one sentence [T, E], got shape {x.shape}")
    types = None if token_types is None else jnp.asarray(token_types, jnp.int32)
    norms = np.asarray(_block_norms_fn(cfg, layers, int(chunk_size))(params, x, types), np.float64)
    return norms / norms.sum(axis=1, keepdims=True)


def attribution_summary(contributions) -> dict:
    """Summaries of contributions [L, T, T] (inputs i, outputs j):

    own_share [L]: mean over tokens j of c[l, j, j], the share of the token itself;
    top_contributor [L]: fraction of tokens j whose own share is the largest (ties count as top);
    by_distance [L, T]: mean of c[l, i, j] over the pairs with |i - j| = k, k = 0..T-1.
    """
    c = np.asarray(contributions, np.float64)
    if c.ndim < 2 or c.shape[-1] != c.shape[-2]:
        raise ValueError(f"expected contributions [L, T, T], got shape {c.shape}")
    tokens = c.shape[-1]
    own = np.diagonal(c, axis1=-2, axis2=-1)  # [L, T]
    distance = np.abs(np.arange(tokens)[:, None] - np.arange(tokens)[None, :])
    by_distance = np.stack([c[..., distance == k].mean(axis=-1) for k in range(tokens)], axis=-1)
    return dict(own_share=own.mean(axis=-1),
                top_contributor=(own >= c.max(axis=-2)).mean(axis=-1),
                by_distance=by_distance)
