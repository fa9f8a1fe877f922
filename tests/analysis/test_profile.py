"""The positional profile F-hat_P against a per-entry evaluation of TISA's eq. 12."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.analysis.profile import positional_profile
from jaxpos.models import BertEncoder
from tests.helpers import tiny_config


@pytest.mark.parametrize("extra", [{}, dict(embedding_dim=8, share_layers=True), dict(scale_embeddings=True)],
                         ids=["plain", "factorised", "scaled_embeddings"])
def test_profile_matches_the_formula_entry_by_entry(extra):
    cfg = tiny_config(dict(kind="absolute"), **extra)
    params = nn.unbox(BertEncoder(cfg).init(jax.random.PRNGKey(0), jnp.ones((1, 4), jnp.int32))["params"])
    got = positional_profile(cfg, params)
    p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    enc = p["encoder"]
    factorised = "embedding_dim" in extra
    positions, words = enc["position"]["embedding"], p["token_embed"]["embedding"]
    if cfg.scale_embeddings:  # the word embeddings as the model adds them: times sqrt(d_model)
        words = words * np.sqrt(cfg.d_model)
    if factorised:
        positions, words = positions @ enc["embed_projection"]["kernel"], words @ enc["embed_projection"]["kernel"]
    w_bar = words.mean(0)
    layer = enc["layer_shared" if factorised else "layer_0"]["self_attention"]
    n, heads, d = cfg.max_length, cfg.num_heads, cfg.head_dim
    assert got.shape == (heads, n, n)
    for h in range(heads):
        wq = layer["query"]["kernel"][:, h, :]
        wk = layer["key"]["kernel"][:, h, :]
        m = wq @ wk.T
        for i in (0, 5, n - 1):
            for j in (0, 3, n - 1):
                want = (w_bar @ m @ positions[j] + positions[i] @ m @ w_bar + positions[i] @ m @ positions[j])
                assert got[h, i, j] == pytest.approx(want / np.sqrt(d), rel=1e-9, abs=1e-12)


def test_profile_needs_input_positions():
    cfg = tiny_config(dict(kind="diet_rel"))
    with pytest.raises(ValueError, match="needs learned input position embeddings"):
        positional_profile(cfg, {})
