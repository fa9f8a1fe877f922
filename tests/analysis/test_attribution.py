"""Hidden token attribution: shares sum to one, match finite differences on a tiny
model, the embedding layer attributes each token to itself; the summary against a hand-computed example."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.analysis.attribution import attribution_summary, token_contributions
from jaxpos.analysis.taps import hidden_state_fn
from jaxpos.models import BertEncoder
from tests.helpers import tiny_config


@pytest.fixture(scope="module")
def tiny():
    cfg = tiny_config(dict(kind="absolute"))
    ids = jnp.asarray([[5, 6, 7, 8, 9]])
    params = nn.unbox(jax.jit(BertEncoder(cfg).init)(jax.random.PRNGKey(0), ids)["params"])
    # Larger attention weights than the initialisation's, so that tokens mix visibly after one layer.
    params = jax.tree_util.tree_map_with_path(
        lambda path, w: 6 * w if "self_attention" in jax.tree_util.keystr(path) else w, params)
    return cfg, params, params["token_embed"]["embedding"][ids[0]]


def shares(norms):
    return norms / norms.sum(axis=1, keepdims=True)


def test_contributions(tiny):
    cfg, params, x = tiny
    c = token_contributions(cfg, params, x, chunk_size=8)  # chunks of 8: the remainder-free batched path
    assert c.shape == (cfg.num_layers + 1, 5, 5)
    np.testing.assert_allclose(c.sum(axis=1), 1.0, atol=1e-6)
    # The embedding layer acts per token: every hidden state comes from its own input only.
    np.testing.assert_allclose(c[0], np.eye(5), atol=1e-6)
    assert c[1:].min() > 1e-2 and np.all(np.diagonal(c[1:], axis1=1, axis2=2) < 0.9)  # attention mixes

    def stacked(v):
        return jnp.stack([hidden_state_fn(cfg, params, layer)(v) for layer in range(cfg.num_layers + 1)])

    # Central finite differences in float32 at h = 3e-3 agree to ~1e-5 (transposing c would be off by 0.06).
    h, (tokens, width) = 3e-3, x.shape
    steps = h * jnp.eye(tokens * width).reshape(-1, tokens, width)
    diff = jax.jit(jax.vmap(lambda u: (stacked(x + u) - stacked(x - u)) / (2 * h)))(steps)
    diff = np.asarray(diff, np.float64).reshape(tokens, width, *diff.shape[1:])  # [T_in, E, L, T_out, d]
    numeric = shares(np.sqrt((diff**2).sum(axis=(1, 4))).transpose(1, 0, 2))
    np.testing.assert_allclose(c, numeric, atol=1e-4)
    np.testing.assert_allclose(token_contributions(cfg, params, x, layers=[2]), c[2:], atol=1e-6)


def test_summary_by_hand():
    c = np.array([[[0.6, 0.1, 0.3],
                   [0.3, 0.5, 0.3],
                   [0.1, 0.4, 0.4]]])  # columns j sum to one over inputs i
    summary = attribution_summary(c)
    np.testing.assert_allclose(summary["own_share"], [(0.6 + 0.5 + 0.4) / 3])
    # Token 0: 0.6 is the largest; token 1: 0.5 > 0.4; token 2: 0.4 > 0.3.
    np.testing.assert_allclose(summary["top_contributor"], [1.0])
    c[0, 2, 1] = 0.6
    assert attribution_summary(c)["top_contributor"][0] == pytest.approx(2 / 3)
    # Distance 0: the diagonal; 1: c[0,1], c[1,0], c[1,2], c[2,1]; 2: c[0,2], c[2,0].
    by_distance = attribution_summary(c)["by_distance"]
    np.testing.assert_allclose(by_distance[0], [(0.6 + 0.5 + 0.4) / 3, (0.1 + 0.3 + 0.6 + 0.3) / 4,
                                                (0.3 + 0.1) / 2])
    layered = attribution_summary(np.stack([np.eye(4), np.full((4, 4), 0.25)]))
    np.testing.assert_allclose(layered["own_share"], [1.0, 0.25])
    np.testing.assert_allclose(layered["top_contributor"], [1.0, 1.0])  # ties count as top
    np.testing.assert_allclose(layered["by_distance"], [[1, 0, 0, 0], [0.25] * 4])
