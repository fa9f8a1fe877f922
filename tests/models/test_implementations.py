"""The `jax.nn.dot_product_attention` path of a whole model equals the XLA reference path."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.models import BertForMaskedLM
from tests.helpers import tiny_config

# diet_abs rank 3 with per-head segments: both folded into q.k (D 8 + 3 + 1 channels, padded to 16 for cuDNN).
CASES = [dict(kind="tisa"), dict(kind="diet_abs"), dict(kind="t5"), dict(kind="rope"),
         dict(kind="rope", rope=dict(scaling="yarn", factor=4.0, fraction=0.5)),
         dict(kind="attenuated"), dict(kind="diet_rel", segment="per_head"),
         dict(kind="diet_abs", segment="per_head", diet_abs=dict(rank=3))]


@pytest.mark.parametrize("position", CASES, ids=lambda p: p["kind"] + "_" + p.get("segment", "input"))
def test_jax_attention_matches_xla(position, monkeypatch):
    """jax.nn.dot_product_attention (the cuDNN path's call) gives the reference's logits; it gets q, k, v of one
    width, a multiple of 8 (cuDNN's rule), and no per-example bias (segment terms are folded into q.k)."""
    ids = jax.random.randint(jax.random.PRNGKey(0), (2, 12), 1, 61)
    piece_ids = jnp.ones((2, 12), jnp.int32).at[1, 7:].set(2)  # two packed pieces in the second row
    types = (jnp.arange(12) >= 6).astype(jnp.int32)[None].repeat(2, 0)
    calls = []

    def spy(q, k, v, bias=None, **kwargs):
        calls.append((q.shape[-1], k.shape[-1], v.shape[-1], None if bias is None else bias.shape))
        return dot_product_attention(q, k, v, bias=bias, **kwargs)

    dot_product_attention = jax.nn.dot_product_attention
    monkeypatch.setattr(jax.nn, "dot_product_attention", spy)
    outs = []
    for impl in ("xla", "jax"):
        model = BertForMaskedLM(tiny_config(position, attention_impl=impl))
        params = model.init(jax.random.PRNGKey(1), ids)["params"]
        outs.append(model.apply({"params": params}, ids, piece_ids=piece_ids, token_types=types))
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    assert calls
    for q_width, k_width, v_width, bias_shape in calls:
        assert q_width == k_width == v_width and q_width % 8 == 0, calls
        # The fixed attenuated softmax runs over each row's attended keys, so its matrix is per example.
        assert bias_shape is None or bias_shape[0] == 1 or position["kind"] == "attenuated", calls


def test_shaw_needs_the_reference_path():
    model = BertForMaskedLM(tiny_config(dict(kind="shaw"), attention_impl="jax"))
    with pytest.raises(ValueError, match="use attention_impl='xla'"):
        model.init(jax.random.PRNGKey(0), jnp.ones((1, 8), jnp.int32))


# The causal case repeats, at model level, what tests/attention/test_toeplitz_kernel.py checks for causal masks.
@pytest.mark.parametrize("position, causal, attention_dropout", [
    (dict(kind="tisa"), False, 0.2), (dict(kind="diet_abs", segment="per_head"), False, 0.1),
    pytest.param(dict(kind="diet_rel"), True, 0.0, marks=pytest.mark.slow)],
    ids=["tisa_padded_packed_dropout", "diet_recipe_padded_packed", "diet_rel_causal"])
def test_pallas_kernel_in_a_model_matches_xla(position, causal, attention_dropout, caplog):
    """The model passes its piece ids and causal flag to the Toeplitz kernel (interpret mode here), DIET-Abs its
    factors folded into q and k at each piece's positions, a training step's attention dropout (each layer its own
    seed) and DIET's per-head segment attention (a pair term from the token types): logits and parameter gradients
    at real positions equal the XLA path's (padding queries see no key there by design)."""
    ids = jax.random.randint(jax.random.PRNGKey(0), (2, 13), 1, 61)
    piece_ids = jnp.ones((2, 13), jnp.int32).at[1, 6:].set(2).at[0, 10:].set(0)  # packed pieces; padding
    real = (piece_ids != 0)[..., None]
    types = (jnp.arange(13)[None] % 5 >= 2).astype(jnp.int32).repeat(2, 0)  # both types in every piece
    weight = jax.random.normal(jax.random.PRNGKey(2), (2, 13, 61)) * real
    results = []
    caplog.set_level(logging.WARNING, logger="jaxpos.attention.core")
    for impl in ("xla", "pallas"):
        model = BertForMaskedLM(tiny_config(position, attention_impl=impl, causal=causal, dropout=0.0,
                                            attention_dropout=attention_dropout))
        params = model.init(jax.random.PRNGKey(1), ids)["params"]

        def loss(p):
            logits = model.apply({"params": p}, ids, piece_ids=piece_ids, token_types=types,
                                 deterministic=not attention_dropout,
                                 rngs={"dropout": jax.random.PRNGKey(3)})
            return jnp.sum(logits * weight), logits

        (_, logits), grads = jax.value_and_grad(loss, has_aux=True)(params)
        results.append((logits * real, grads))
    assert "falls back" not in caplog.text  # the kernel ran in every layer
    (want, want_grads), (got, got_grads) = results
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    for path, g in jax.tree_util.tree_leaves_with_path(got_grads):
        w = dict(jax.tree_util.tree_leaves_with_path(want_grads))[path]
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=max(1e-4 * float(np.abs(w).max()), 1e-7),
                                   err_msg=jax.tree_util.keystr(path))
