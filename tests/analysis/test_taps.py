"""Model taps: per-head value-output maps against numpy and against the attention module's output; the
embedding-to-hidden-state function against the model's own hidden states; attention logits against the model's
weights and numpy."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.analysis.taps import attention_logits, hidden_state_fn, layer_params, run_encoder, value_output_maps
from jaxpos.models import BertEncoder
from tests.analysis.encoders import attention_sublayer_outputs, perturbed_encoder_params
from tests.helpers import VARIANTS, tiny_config


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


IDS = np.random.default_rng(5).integers(4, 61, (2, 10))
TYPES = np.array([[0] * 4 + [1] * 6, [0] * 7 + [1] * 3])
PIECE_IDS = np.ones_like(IDS)
PIECE_IDS[1, 8:] = 0  # the second row ends in padding


@pytest.mark.parametrize("layer_norm", ["post", "pre"])
def test_value_output_maps_rebuild_the_attention_output(layer_norm):
    """sum_h A^h T^h + b_V W_O + b_O is the self-attention module's output (rows of A sum to 1); with pre-LN the
    values are read from LayerNorm(states), not from the states."""
    cfg = tiny_config(dict(kind="t5"), layer_norm=layer_norm)
    params = perturbed_encoder_params(cfg, IDS)
    weights, states = run_encoder(cfg, params, IDS)
    maps = value_output_maps(cfg, params, states)  # [L, B, H, T, d]
    want = np.asarray(attention_sublayer_outputs(cfg, params, IDS))  # [L, B, T, d]
    for layer in range(cfg.num_layers):
        attention = jax.tree.map(np.asarray, layer_params(cfg, params, layer)["self_attention"])
        bias = np.einsum("hk,hkd->d", attention["value"]["bias"], attention["out"]["kernel"]) + attention["out"]["bias"]
        got = np.einsum("bhts,bhsd->btd", np.asarray(weights[layer]), maps[layer]) + bias
        np.testing.assert_allclose(got, want[layer], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("position", [dict(kind="shaw", shaw=dict(clip=3, values=True)),
                                      dict(kind="diet_abs", diet_abs=dict(linformer_k=4))], ids=["shaw", "linformer"])
def test_value_output_maps_refuse_values_they_cannot_express(position):
    with pytest.raises(ValueError, match="Shaw relative value vectors|Linformer"):
        value_output_maps(tiny_config(position), None, None)


@pytest.mark.parametrize("position,extra", [
    (dict(kind="absolute"), dict(scale_embeddings=True)),  # tokens times sqrt(d_model), as BertEncoder does
    (dict(kind="diet_rel", segment="per_head"), {}),  # token types reach the per-head segment tables
    (dict(kind="absolute"), {}),  # token types embedded at the input
], ids=["scaled_embeddings", "per_head_segments", "input_types"])
def test_hidden_state_fn_matches_the_model(position, extra):
    cfg = tiny_config(position, **extra)
    params = perturbed_encoder_params(cfg, IDS)
    _, states = run_encoder(cfg, params, IDS, token_types=TYPES)
    table = params["token_embed"]["embedding"]
    for row in range(2):
        for layer in range(cfg.num_layers + 1):
            got = hidden_state_fn(cfg, params, layer, token_types=jnp.asarray(TYPES[row]))(table[IDS[row]])
            np.testing.assert_allclose(got, states[layer, row], rtol=1e-5, atol=1e-5)


LOGIT_CASES = [(name, position, "post") for name, position in VARIANTS] + [
    ("linformer", dict(kind="diet_abs", diet_abs=dict(linformer_k=5)), "post"),
    ("diet_abs_unfolded_content_only", dict(kind="diet_abs", diet_abs=dict(fold=False), content_only=True), "post"),
    ("diet_abs_position_only", dict(kind="diet_abs", position_only=True), "post"),
    ("t5_pre_ln", dict(kind="t5"), "pre"),
    ("rope_pre_ln", dict(kind="rope"), "pre"),
    ("rope_content_only", dict(kind="rope", content_only=True), "post"),
]


@pytest.mark.parametrize("name,position,layer_norm", LOGIT_CASES, ids=[case[0] for case in LOGIT_CASES])
def test_attention_logits_give_the_model_weights(name, position, layer_norm):
    """softmax of the logits over the attended keys is the model's own attention; masked entries are 0."""
    cfg = tiny_config(position, layer_norm=layer_norm)
    params = perturbed_encoder_params(cfg, IDS)
    logits = np.asarray(attention_logits(cfg, params, IDS, PIECE_IDS, TYPES), np.float64)
    weights, _ = run_encoder(cfg, params, IDS, PIECE_IDS, TYPES)
    weights = np.asarray(weights, np.float64)
    assert logits.shape == weights.shape
    attended = np.ones(logits.shape[-4:], bool) if name == "linformer" else PIECE_IDS[:, None, None, :].astype(bool)
    attended = np.broadcast_to(attended, logits.shape)
    assert np.all(logits[~attended] == 0)
    shifted = np.where(attended, logits - logits.max(-1, keepdims=True), -np.inf)
    softmax = np.exp(shifted) / np.exp(shifted).sum(-1, keepdims=True)
    queries = np.broadcast_to(PIECE_IDS[None, :, None, :, None].astype(bool), logits.shape)  # padding attends nowhere
    np.testing.assert_allclose(np.where(queries, softmax, 0), np.where(queries, weights, 0), rtol=1e-5, atol=1e-6)


def test_attention_logits_against_numpy():
    """Content q.k/sqrt(D) with projection biases, the DIET-Rel table R[h, j - i] and the per-head segment table
    E_S[h, g_i, g_j], entry by entry (row constants included, which softmax would hide)."""
    cfg = tiny_config(dict(kind="diet_rel", segment="per_head"))
    params = perturbed_encoder_params(cfg, IDS)
    p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)["encoder"]
    _, states = run_encoder(cfg, params, IDS, token_types=TYPES)
    got = np.asarray(attention_logits(cfg, params, IDS, token_types=TYPES))
    n, length = cfg.max_length, IDS.shape[1]
    offset = np.arange(length)[None, :] - np.arange(length)[:, None] + n - 1  # column of j - i
    for layer in range(cfg.num_layers):
        attention = p[f"layer_{layer}"]["self_attention"]
        x = np.asarray(states[layer], np.float64)
        q = np.einsum("btd,dhk->bhtk", x, attention["query"]["kernel"]) + attention["query"]["bias"][:, None]
        k = np.einsum("btd,dhk->bhtk", x, attention["key"]["kernel"]) + attention["key"]["bias"][:, None]
        want = np.einsum("bhtk,bhsk->bhts", q, k) / np.sqrt(cfg.head_dim)
        want = want + p["position"]["table"][layer][:, offset][None]
        segments = p["segments"]["table"][layer]  # [H, G, G]
        want = want + segments[:, TYPES[:, :, None], TYPES[:, None, :]].transpose(1, 0, 2, 3)
        np.testing.assert_allclose(got[layer], want, rtol=1e-5, atol=1e-5)
