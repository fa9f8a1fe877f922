"""Incremental decoding with a key/value cache gives the logits of the full computation, for every
mechanism, in both models."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.models import BertForMaskedLM, EncoderDecoder, shift_right
from tests.helpers import VARIANTS, tiny_config

T = 7


@pytest.mark.parametrize("name,position", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_causal_encoder_decodes_like_full_pass(name, position):
    cfg = tiny_config(position, causal=True)
    ids = jax.random.randint(jax.random.PRNGKey(0), (2, T), 1, cfg.vocab_size)
    types = (jnp.arange(T)[None, :] >= 4).astype(jnp.int32).repeat(2, 0)
    model, stepper = BertForMaskedLM(cfg), BertForMaskedLM(cfg, decode=True)
    params = model.init(jax.random.PRNGKey(1), ids, token_types=types)["params"]
    full = model.apply({"params": params}, ids, token_types=types)
    cache = stepper.init(jax.random.PRNGKey(1), ids, token_types=types)["cache"]
    step = jax.jit(lambda c, tok, typ: stepper.apply({"params": params, "cache": c}, tok, token_types=typ,
                                                     mutable=["cache"]))
    for t in range(T):
        logits, mutated = step(cache, ids[:, t:t + 1], types[:, t:t + 1])
        cache = mutated["cache"]
        np.testing.assert_allclose(logits[:, 0], full[:, t], rtol=1e-4, atol=1e-4, err_msg=f"{name} step {t}")


# Every mechanism once (the sharing/form variants share their code path with the causal-encoder test above).
KINDS = [v for v in VARIANTS if v[0] == v[1]["kind"] or v[0] == "diet_rel_per_head_segments"]


@pytest.mark.parametrize("name,position", KINDS, ids=[v[0] for v in KINDS])
def test_encoder_decoder_decodes_like_full_pass(name, position):
    cfg = tiny_config(position, num_decoder_layers=2, cross_attention_position=name in ("t5", "tisa", "rope"))
    inputs = jax.random.randint(jax.random.PRNGKey(2), (2, 9), 1, cfg.vocab_size).at[1, 6:].set(0)  # padded
    targets = jax.random.randint(jax.random.PRNGKey(3), (2, T), 1, cfg.vocab_size)
    params = EncoderDecoder(cfg).init(jax.random.PRNGKey(4), inputs, targets)["params"]
    assert_cached_steps_match_full_pass(cfg, params, inputs, targets, name)


def assert_cached_steps_match_full_pass(cfg, params, inputs, targets, name):
    """Cached one-token decoder steps give the teacher-forced full pass's logits at every target position."""
    model, stepper = EncoderDecoder(cfg), EncoderDecoder(cfg, decode=True)
    full = model.apply({"params": params}, inputs, targets)
    cache = stepper.init(jax.random.PRNGKey(4), inputs, targets)["cache"]
    encoded = model.apply({"params": params}, inputs, method="encode")
    decoder_inputs = shift_right(targets)
    step = jax.jit(lambda c, tok: stepper.apply({"params": params, "cache": c}, encoded, inputs, tok,
                                                method="decode_logits", mutable=["cache"]))
    for t in range(targets.shape[1]):
        logits, mutated = step(cache, decoder_inputs[:, t:t + 1])
        cache = mutated["cache"]
        np.testing.assert_allclose(logits[:, 0], full[:, t], rtol=1e-4, atol=1e-4, err_msg=f"{name} step {t}")


def test_linformer_is_refused_in_a_causal_stack():
    """Refused by the config, before any model is built: a causal encoder, or an encoder-decoder's decoder."""
    for overrides in (dict(causal=True), dict(num_decoder_layers=1)):
        with pytest.raises(ValueError, match="linformer_k .*cannot be causal"):
            tiny_config(dict(kind="diet_abs", diet_abs=dict(linformer_k=4)), **overrides)


def test_encoder_decoder_padding_does_not_leak():
    """Changing padded source tokens ((id 0 -> piece id 0)) must not change the logits."""
    cfg = tiny_config(dict(kind="diet_rel"), num_decoder_layers=1)
    inputs = jnp.asarray([[5, 6, 7, 0, 0]])
    targets = jnp.asarray([[3, 4, 9]])
    model = EncoderDecoder(cfg)
    params = model.init(jax.random.PRNGKey(0), inputs, targets)["params"]
    piece_ids = (inputs != 0).astype(jnp.int32)
    a = model.apply({"params": params}, inputs, targets, input_piece_ids=piece_ids)
    b = model.apply({"params": params}, inputs.at[0, 3:].set(11), targets, input_piece_ids=piece_ids)
    np.testing.assert_allclose(a, b, rtol=1e-6)


# Mechanisms whose cross-attention term is a table over offsets j - i: the cached step reads it at its own position.
CROSS_TABLES = [dict(kind="tisa"), dict(kind="t5"), dict(kind="diet_rel"), dict(kind="alibi"),
                dict(kind="attenuated", attenuated=dict(form="offset", s=0.5))]


@pytest.mark.parametrize("position", CROSS_TABLES, ids=lambda p: p["kind"])
def test_cross_attention_bias_decodes_past_the_source_length(position):
    """Decoder steps at positions >= the source length read offsets beyond -(S_enc - 1) in the cross table."""
    cfg = tiny_config(position, num_decoder_layers=2, cross_attention_position=True)
    source_length, target_length = 4, 11
    inputs = jax.random.randint(jax.random.PRNGKey(2), (2, source_length), 1, cfg.vocab_size).at[1, 3:].set(0)
    targets = jax.random.randint(jax.random.PRNGKey(3), (2, target_length), 1, cfg.vocab_size)
    params = EncoderDecoder(cfg).init(jax.random.PRNGKey(4), inputs, targets)["params"]
    leaves, tree = jax.tree.flatten(params)  # perturbed, so that no table starts flat along the offsets
    keys = jax.random.split(jax.random.PRNGKey(5), len(leaves))
    params = jax.tree.unflatten(tree, [x + 0.3 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
    assert_cached_steps_match_full_pass(cfg, params, inputs, targets, position["kind"])
