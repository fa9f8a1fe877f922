"""Model taps: per-head value-output maps against numpy; the embedding-to-hidden-state function against the
model's own hidden states."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxpos.analysis.taps import hidden_state_fn, run_encoder, value_output_maps
from jaxpos.models import BertEncoder
from tests.helpers import tiny_config


def test_taps_match_the_model():
    cfg = tiny_config(dict(kind="t5"))
    ids = jnp.asarray([[5, 6, 7, 8, 9], [9, 3, 11, 12, 13]])
    params = nn.unbox(BertEncoder(cfg).init(jax.random.PRNGKey(0), ids)["params"])
    weights, states = run_encoder(cfg, params, ids)
    assert weights.shape == (2, 2, cfg.num_heads, 5, 5) and states.shape == (3, 2, 5, cfg.d_model)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
    maps = value_output_maps(cfg, params, states)
    p = jax.tree.map(np.asarray, params)["encoder"]["layer_1"]["self_attention"]
    h = 2
    want = np.asarray(states[1]) @ p["value"]["kernel"][:, h, :] @ p["out"]["kernel"][h]
    np.testing.assert_allclose(maps[1, :, h], want, rtol=1e-5, atol=1e-6)
    for layer in range(2):
        fn = hidden_state_fn(cfg, params, layer + 1)
        x = params["token_embed"]["embedding"][ids[1]]
        np.testing.assert_allclose(fn(x), states[layer + 1, 1], rtol=1e-5, atol=1e-6)
    jacobian = jax.jacrev(hidden_state_fn(cfg, params, 2))(params["token_embed"]["embedding"][ids[0]])
    assert jacobian.shape == (5, cfg.d_model, 5, cfg.d_model) and np.all(np.isfinite(jacobian))
