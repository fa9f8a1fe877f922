"""The additive decomposition e = i + h + f + c sums to the model's real hidden states at every layer."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.analysis.decomposition import decompose
from jaxpos.models import BertEncoder
from tests.analysis.encoders import perturbed_encoder_params
from tests.helpers import tiny_config


def encoder_params(cfg, ids):
    return nn.unbox(BertEncoder(cfg).init(jax.random.PRNGKey(0), jnp.asarray(ids))["params"])


IDS = np.random.default_rng(0).integers(5, 61, (2, 12))
PIECE_IDS = np.ones_like(IDS)
PIECE_IDS[1, 9:] = 0


@pytest.mark.parametrize("position", [dict(kind="absolute"), dict(kind="tisa"), dict(kind="diet_abs")],
                         ids=lambda p: p["kind"])
def test_terms_sum_to_hidden_states_in_float32(position):
    cfg = tiny_config(position, num_layers=3)
    params = encoder_params(cfg, IDS)
    result = decompose(cfg, params, IDS, piece_ids=PIECE_IDS)
    assert result.terms.shape == (4, 4, 2, 12, cfg.d_model)
    np.testing.assert_allclose(result.terms.sum(axis=1), result.hidden, atol=1e-5)
    mu = result.importance()
    np.testing.assert_allclose(mu.sum(axis=1), 1.0, atol=1e-9)
    assert np.all(np.abs(result.terms[1:, 1]).max(axis=(1, 2, 3)) > 0)  # attention terms appear after layer 0
    if position["kind"] == "absolute":  # i carries the position embeddings: a direct check of the first term
        p = jax.tree.map(np.asarray, params)
        x = p["token_embed"]["embedding"][IDS] + p["type_embed"]["embedding"][0] + p["encoder"]["position"][
            "embedding"][:12]
        scale = p["encoder"]["embed_norm"]["scale"] / np.sqrt(x.var(-1, keepdims=True) + cfg.layer_norm_eps)
        np.testing.assert_allclose(result.terms[0, 0], scale * x, rtol=1e-5, atol=1e-6)


def test_terms_sum_exactly_in_float64():
    with jax.enable_x64(True):
        cfg = tiny_config(dict(kind="absolute"), num_layers=2, dtype="float64", param_dtype="float64")
        params = encoder_params(cfg, IDS)
        result = decompose(cfg, params, IDS, piece_ids=PIECE_IDS)
        assert result.hidden.dtype == np.float64
        np.testing.assert_allclose(result.terms.sum(axis=1), result.hidden, atol=1e-10)


def test_albert_style_encoder_and_refusals():
    cfg = tiny_config(dict(kind="absolute"), embedding_dim=8, share_layers=True, activation="gelu_tanh")
    result = decompose(cfg, encoder_params(cfg, IDS), IDS)
    np.testing.assert_allclose(result.terms.sum(axis=1), result.hidden, atol=1e-5)
    with pytest.raises(ValueError, match="post-LN"):
        decompose(tiny_config(dict(kind="absolute"), layer_norm="pre"), None, IDS)


def test_feedforward_linear_fit_r2_matches_direct_least_squares():
    cfg = tiny_config(dict(kind="absolute"), num_layers=2)
    result = decompose(cfg, encoder_params(cfg, IDS), IDS, piece_ids=PIECE_IDS)
    r2 = result.feedforward_linear_r2()
    assert r2.shape == (2,) and np.all((0 <= r2) & (r2 <= 1))
    z, out = result.feedforward_io[1]
    x, y = z[result.mask], out[result.mask]
    x1 = np.hstack([x, np.ones((len(x), 1))])
    fit = x1 @ np.linalg.pinv(x1) @ y  # projection onto the column space: the least-squares fit
    want = 1 - ((y - fit) ** 2).sum() / ((y - y.mean(0)) ** 2).sum()
    assert r2[1] == pytest.approx(want, rel=1e-6)
    # a purely linear "feed-forward" map is fitted perfectly
    result.feedforward_io = [(z, z @ np.random.default_rng(1).normal(size=(cfg.d_model, 5)) + 3.0)]
    assert result.feedforward_linear_r2()[0] == pytest.approx(1.0, abs=1e-9)


def test_scaled_token_embeddings():
    """model.scale_embeddings multiplies the token embeddings by sqrt(d_model) (Vaswani): i carries that scale,
    and the terms still sum to the model's hidden states at every layer."""
    cfg = tiny_config(dict(kind="absolute"), scale_embeddings=True)
    params = perturbed_encoder_params(cfg, IDS)
    result = decompose(cfg, params, IDS, piece_ids=PIECE_IDS)
    np.testing.assert_allclose(result.terms.sum(axis=1), result.hidden, atol=1e-5)
    p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    x = np.sqrt(cfg.d_model) * p["token_embed"]["embedding"][IDS] + p["type_embed"]["embedding"][0] + p["encoder"][
        "position"]["embedding"][:12]
    norm = p["encoder"]["embed_norm"]
    scale = norm["scale"] / np.sqrt(x.var(-1, keepdims=True) + cfg.layer_norm_eps)
    np.testing.assert_allclose(result.terms[0, 0], scale * x, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("position,named", [
    (dict(kind="shaw", shaw=dict(clip=3)), "Shaw"),
    (dict(kind="diet_abs", diet_abs=dict(linformer_k=4)), "Linformer"),
], ids=["shaw_values", "linformer"])
def test_refuses_values_with_a_positional_or_sequence_mix(position, named):
    with pytest.raises(ValueError, match=named):
        decompose(tiny_config(position), None, IDS)
