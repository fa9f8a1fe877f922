"""Sinusoidal positions at their source's scale (Vaswani et al.; fairseq): token embeddings drawn at std E^-1/2 and
multiplied by sqrt(E), so a token's channels and the table's (amplitude 1) are alike in size; `scale=none` keeps the
tokens as the model draws them (std `model.init_std`), which the table swamps."""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.models import BertEncoder
from tests.helpers import tiny_config

IDS = jnp.asarray(np.random.default_rng(0).integers(5, 61, (2, 12)))


def embedding_output(cfg, params):
    """What layer 0 reads (the summed input embeddings; no embedding LayerNorm here)."""
    _, taps = BertEncoder(cfg).apply({"params": params}, IDS, mutable=["intermediates"])
    return np.asarray(taps["intermediates"]["encoder"]["hidden_states"][0], np.float64)


@pytest.mark.parametrize("scale", ["source", "none"])
def test_the_token_table_is_drawn_at_the_scales_std(scale):
    cfg = tiny_config(dict(kind="sinusoidal", sinusoidal=dict(scale=scale)), embed_layer_norm=False,
                      vocab_size=4000)
    params = nn.unbox(BertEncoder(cfg).init(jax.random.PRNGKey(0), IDS)["params"])
    table = np.asarray(params["token_embed"]["embedding"])
    want = cfg.d_model ** -0.5 if scale == "source" else cfg.init_std
    assert abs(table.std() / want - 1) < 0.05  # 128,000 draws: the std's own error is 0.2%


def test_source_scale_multiplies_the_tokens_by_the_square_root_of_the_width():
    source = tiny_config(dict(kind="sinusoidal"), embed_layer_norm=False)
    none = dataclasses.replace(source, position=dataclasses.replace(
        source.position, options=dataclasses.replace(source.position.options, scale="none")))
    params = nn.unbox(BertEncoder(source).init(jax.random.PRNGKey(0), IDS)["params"])
    table = np.asarray(params["token_embed"]["embedding"], np.float64)[np.asarray(IDS)]  # [B, T, E]
    difference = embedding_output(source, params) - embedding_output(none, params)
    np.testing.assert_allclose(difference, table * (math.sqrt(source.d_model) - 1), rtol=1e-5, atol=1e-6)
    # at the source's scale a token's channels are of the table's size, not 50 times smaller
    tokens = table * math.sqrt(source.d_model)
    assert 0.5 < np.sqrt((tokens ** 2).mean()) < 2.0
