"""Identical-word probing: word selection and the averaged attention against direct per-sentence runs."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.analysis.probing import identical_word_attention, sample_probe_words, whole_word_ids
from jaxpos.models import BertEncoder
from jaxpos.positions.attenuated import attenuated_delta
from tests.helpers import tiny_config


def test_whole_words_only():
    sentencepiece = ["[PAD]", "[CLS]", "▁house", "▁a", "ing", "▁Tree", "▁3d", "<s>", "▁running", "s"]
    assert whole_word_ids(sentencepiece) == [2, 5, 8]
    wordpiece = ["[PAD]", "[CLS]", "house", "a", "##ing", "tree", "3d", "running", "[MASK]"]
    assert whole_word_ids(wordpiece) == [2, 5, 7]
    byte_level = ["[PAD]", "[CLS]", "Ġhouse", "house", "ing", "ĠTree", "Ġa", "Ġ3d", "Ġrunning"]  # "Ġ": after a space
    assert whole_word_ids(byte_level) == [2, 5, 8]
    chosen = sample_probe_words(wordpiece, count=2, seed=0)
    assert len(chosen) == 2 and set(chosen) <= {2, 5, 7}
    np.testing.assert_array_equal(chosen, sample_probe_words(wordpiece, count=2, seed=0))
    with pytest.raises(ValueError, match="no whole-word entries"):
        sample_probe_words(["[PAD]", "##a"])


def test_average_matches_per_sentence_runs():
    cfg = tiny_config(dict(kind="tisa"))
    model = BertEncoder(cfg)
    params = nn.unbox(model.init(jax.random.PRNGKey(0), jnp.ones((1, 8), jnp.int32))["params"])
    words = [7, 11, 23, 40, 52]
    got = identical_word_attention(cfg, params, words, length=10, batch_size=2)
    want = 0
    for w in words:
        _, state = model.apply({"params": params}, jnp.full((1, 10), w), mutable=["intermediates"])
        enc = state["intermediates"]["encoder"]
        want = want + np.stack([enc[f"layer_{i}"]["self_attention"]["attention_weights"][0][0] for i in range(2)])
    assert got.shape == (2, cfg.num_heads, 10, 10)
    np.testing.assert_allclose(got, want / len(words), rtol=1e-5, atol=1e-7)


def test_position_only_attenuated_model_gives_its_encoding():
    w, s = 0.2, 0.5
    cfg = tiny_config(dict(kind="attenuated", position_only=True, attenuated=dict(w=w, s=s)))
    params = nn.unbox(BertEncoder(cfg).init(jax.random.PRNGKey(0), jnp.ones((1, 8), jnp.int32))["params"])
    got = identical_word_attention(cfg, params, [5, 9], length=12)
    delta = np.asarray(attenuated_delta(jnp.arange(12), jnp.arange(12), w, s))
    want = np.exp(delta) / np.exp(delta).sum(-1, keepdims=True)  # softmax of the positional term alone
    np.testing.assert_allclose(got, np.broadcast_to(want, got.shape), rtol=1e-5)
