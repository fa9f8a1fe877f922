"""DIET-Abs folded vs explicit in a whole model, and the Linformer variant against a direct computation."""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.attention.layer import MultiHeadAttention
from jaxpos.attention.mask import AttentionMask
from jaxpos.training.validate import check_packing
from jaxpos.models import BertForMaskedLM
from tests.helpers import bias_terms, tiny_config


def test_folded_diet_abs_equals_explicit_in_the_model():
    ids = jax.random.randint(jax.random.PRNGKey(0), (2, 12), 1, 61)
    piece_ids = jnp.ones((2, 12), jnp.int32).at[1, 9:].set(0)
    outs = []
    for fold in (True, False):
        cfg = tiny_config(dict(kind="diet_abs", diet_abs=dict(fold=fold, sharing="none")))
        model = BertForMaskedLM(cfg)
        params = model.init(jax.random.PRNGKey(1), ids)["params"]
        outs.append(model.apply({"params": params}, ids, piece_ids=piece_ids))
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)


def test_linformer_layer_matches_direct_computation():
    cfg = tiny_config(dict(kind="diet_abs", diet_abs=dict(linformer_k=5)))
    b, s, k, h, d = 2, 11, 5, cfg.num_heads, cfg.head_dim
    rng = np.random.default_rng(0)
    x = rng.normal(size=(b, s, cfg.d_model)).astype(np.float32)
    projection = rng.normal(size=(k, s)).astype(np.float32) / 3
    p_q = rng.normal(size=(h, s, 7)).astype(np.float32)
    p_k = rng.normal(size=(h, k, 7)).astype(np.float32)
    piece_ids = np.ones((b, s), np.int32)
    piece_ids[1, 8:] = 0
    pos = jnp.arange(s)
    bias = bias_terms(factors=(jnp.asarray(p_q), jnp.asarray(p_k)), kv_projection=jnp.asarray(projection))
    layer = MultiHeadAttention(cfg)
    mask = AttentionMask.within_pieces(jnp.asarray(piece_ids))
    kwargs = dict(bias=bias, q_pos=pos, k_pos=pos, mask=mask)
    params = layer.init(jax.random.PRNGKey(0), x, x, **kwargs)["params"]
    got = layer.apply({"params": params}, x, x, **kwargs)

    p = jax.tree.map(np.asarray, flax.linen.unbox(params))
    q = np.einsum("bsd,dhk->bshk", x, p["query"]["kernel"]) + p["query"]["bias"]
    key = np.einsum("bsd,dhk->bshk", x, p["key"]["kernel"]) + p["key"]["bias"]
    val = np.einsum("bsd,dhk->bshk", x, p["value"]["kernel"]) + p["value"]["bias"]
    valid = piece_ids[:, :, None, None]
    key, val = np.einsum("ks,bshd->bkhd", projection, key * valid), np.einsum("ks,bshd->bkhd", projection, val * valid)
    logits = np.einsum("bthd,bkhd->bhtk", q, key) / np.sqrt(d) + np.einsum("htr,hkr->htk", p_q, p_k)[None]
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    out = np.einsum("bhtk,bkhd->bthd", weights, val)
    want = np.einsum("bthd,hde->bte", out, p["out"]["kernel"]) + p["out"]["bias"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_linformer_in_a_bert_encoder_runs_and_learns_projection():
    cfg = tiny_config(dict(kind="diet_abs", diet_abs=dict(linformer_k=6)))
    model = BertForMaskedLM(cfg)
    ids = jnp.ones((2, 16), jnp.int32)
    params = model.init(jax.random.PRNGKey(0), ids)["params"]
    grads = jax.jit(jax.grad(lambda p: model.apply({"params": p}, ids).sum()))(params)
    g = flax.linen.unbox(grads)["bert"]["encoder"]["position"]["projection"]
    assert g.shape == (cfg.num_layers, 6, 16) and np.abs(np.asarray(g)).max() > 0


def test_linformer_takes_padded_rows_and_runs_refuse_packed_ones():
    """E projects keys and values along the whole row: the pieces of a packed row would see each other. Piece
    ids are traced under jit, so it is the run's config that refuses packed rows (check_packing)."""
    cfg = tiny_config(dict(kind="diet_abs", diet_abs=dict(linformer_k=6)))
    model = BertForMaskedLM(cfg)
    ids = jnp.ones((2, 16), jnp.int32)
    params = model.init(jax.random.PRNGKey(0), ids)["params"]
    one_piece = jnp.ones((2, 16), jnp.int32).at[1, 10:].set(0)  # padding is fine: padded keys are zeroed
    model.apply({"params": params}, ids, piece_ids=one_piece)
    check_packing(cfg.position, packed=False)
    with pytest.raises(ValueError, match="Linformer .*packed rows"):
        check_packing(cfg.position, packed=True)
