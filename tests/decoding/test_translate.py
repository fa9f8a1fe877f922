"""The Translator (jitted beam search over the real EncoderDecoder): every returned score is what the full
teacher-forced model gives that sequence, so training and decoding agree on the start token, positions and
cache; greedy equals the argmax loop over full recomputation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.data.translation import EOS_ID
from jaxpos.decoding import length_penalty
from jaxpos.decoding.translate import Translator
from jaxpos.config.decode import DecodeConfig, decode_config
from jaxpos.models import EncoderDecoder
from tests.helpers import tiny_config

W = 7


@pytest.fixture(scope="module", params=["absolute", "tisa"])
def parts(request):
    cfg = tiny_config(dict(kind=request.param), num_layers=1, num_decoder_layers=2, max_length=W)
    rng = np.random.default_rng(0)
    inputs = rng.integers(5, cfg.vocab_size, (3, 6)).astype(np.int32)
    inputs[:, -1] = EOS_ID
    inputs[1, 3:] = 0
    inputs[1, 2] = EOS_ID  # a shorter, padded source
    model = EncoderDecoder(cfg)
    params = model.init(jax.random.PRNGKey(1), jnp.asarray(inputs), jnp.ones((3, W), jnp.int32))["params"]
    params = jax.tree_util.tree_map(lambda p: p * 2.5, params)  # peaked distributions: EOS comes early
    full = jax.jit(lambda source, target: jax.nn.log_softmax(model.apply({"params": params}, source, target)))
    return cfg, params, inputs, full


def sequence_log_probs(full, inputs, sequences):
    lengths = np.argmax(sequences == EOS_ID, axis=1) + 1
    logp = np.take_along_axis(np.asarray(full(jnp.asarray(inputs), jnp.asarray(sequences))),
                              sequences[..., None], -1)[..., 0]
    return (logp * (np.arange(sequences.shape[1]) < lengths[:, None])).sum(1), lengths


@pytest.mark.parametrize("beam_size", [1, 3])
def test_translator_scores_are_the_full_models(parts, beam_size):
    cfg, params, inputs, full = parts
    dcfg = DecodeConfig(beam_size=beam_size, alpha=0.6, max_length_b=W, target_width=W, batch_size=2)
    sequences, scores = Translator(cfg, params, None, dcfg, inputs.shape[1]).translate_ids(inputs,
                                                                                            with_scores=True)
    assert sequences.shape == (3, W) and np.all(np.any(sequences == EOS_ID, axis=1))
    logp, lengths = sequence_log_probs(full, inputs, sequences)
    np.testing.assert_allclose(scores, logp / length_penalty(lengths, 0.6), rtol=1e-4, atol=1e-4)


def test_greedy_translation_is_the_argmax_loop(parts):
    cfg, params, inputs, full = parts
    dcfg = DecodeConfig(beam_size=1, alpha=0.0, max_length_b=W, target_width=W, batch_size=3)
    sequences = Translator(cfg, params, None, dcfg, inputs.shape[1]).translate_ids(inputs)
    expected = np.zeros((3, W), np.int32)
    for t in range(W):
        expected[:, t] = np.argmax(np.asarray(full(jnp.asarray(inputs), jnp.asarray(expected)))[:, t], -1)
        if t == W - 1:
            expected[:, t] = EOS_ID  # the last position admits only EOS
        after_eos = np.cumsum(expected == EOS_ID, 1) - (expected == EOS_ID) > 0
        expected[after_eos] = 0
    np.testing.assert_array_equal(sequences, expected)


def test_decode_config_rejects_unknown_fields():
    assert decode_config({"beam_size": 10}).beam_size == 10
    with pytest.raises(ValueError, match="unknown config field decode.beams"):
        decode_config({"beams": 10})


def test_decoding_progress_in_a_log_has_no_redraws(parts, capsys):
    cfg, params, inputs, _ = parts
    dcfg = DecodeConfig(beam_size=2, alpha=0.6, max_length_b=W, target_width=W, batch_size=1)
    translator = Translator(cfg, params, None, dcfg, inputs.shape[1])
    quiet = translator.translate_ids(inputs)
    capsys.readouterr()
    np.testing.assert_array_equal(translator.translate_ids(inputs, progress=True), quiet)
    captured = capsys.readouterr()  # pytest's capture is not a terminal, as a redirected log
    for text in (captured.out, captured.err):
        assert "\r" not in text and "\x1b" not in text, repr(text)
