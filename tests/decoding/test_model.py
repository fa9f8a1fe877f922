"""Beam search driving the real EncoderDecoder through its key/value cache: greedy equals recomputing the full
model each step, and every beam's score is what the full model gives its sequence (so the cache followed it)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.decoding import beam_search, greedy_decode, length_penalty, tile_beams
from jaxpos.models import EncoderDecoder
from tests.helpers import tiny_config

EOS, B, K, T = 3, 2, 3, 6


@pytest.fixture(scope="module")
def parts():
    cfg = tiny_config(dict(kind="diet_rel"), num_layers=1, num_decoder_layers=1, max_length=T)
    inputs = jax.random.randint(jax.random.PRNGKey(0), (B, 5), 4, cfg.vocab_size).at[1, 3:].set(0)  # padded
    model, stepper = EncoderDecoder(cfg), EncoderDecoder(cfg, decode=True)
    targets = jnp.ones((B, T), jnp.int32)
    params = model.init(jax.random.PRNGKey(1), inputs, targets)["params"]
    params = jax.tree_util.tree_map(lambda p: p * 3.0, params)  # peaked distributions: EOS gets chosen early
    encoded = model.apply({"params": params}, inputs, method="encode")
    full = jax.jit(lambda source, target: model.apply({"params": params}, source, target))

    def decoder(beam_size):
        cache = stepper.init(jax.random.PRNGKey(1), inputs, targets)["cache"]  # [B, ...]: beam_search tiles it
        enc, inp = tile_beams(encoded, beam_size), tile_beams(inputs, beam_size)

        def tokens_to_logits(ids, c):
            logits, mutated = stepper.apply({"params": params, "cache": c}, enc, inp, ids, method="decode_logits",
                                            mutable=["cache"])
            return logits, mutated["cache"]
        # the decoder's `positions` table is [T] and its step counter a scalar: shared, not per beam
        return tokens_to_logits, cache, lambda path, x: x.ndim >= 1 and "positions" not in jax.tree_util.keystr(path)

    def full_log_probs(sequences):  # [N, T] with the source rows of each: log p of every token, full pass
        rows = np.repeat(np.arange(B), sequences.shape[0] // B)
        logits = full(inputs[rows], sequences)
        return jnp.take_along_axis(jax.nn.log_softmax(logits), sequences[..., None], -1)[..., 0]

    return decoder, full_log_probs, full, inputs


def test_greedy_with_the_cache_equals_full_recomputation(parts):
    decoder, full_log_probs, full, inputs = parts
    tokens_to_logits, cache, batched = decoder(1)
    seqs, logp = greedy_decode(tokens_to_logits, cache, B, EOS, T, is_batched=batched)
    expected = np.zeros((B, T), np.int32)
    for t in range(T):  # plain greedy: the full model on the prefix, argmax (EOS forced at the limit)
        logits = full(inputs, jnp.asarray(expected))
        expected[:, t] = np.where(t == T - 1, EOS, np.argmax(logits[:, t], -1))
        done = np.cumsum(expected == EOS, 1) - (expected == EOS) > 0  # after the first EOS
        expected[done] = 0
    np.testing.assert_array_equal(seqs, expected)
    mask = np.cumsum(expected == EOS, 1) - (expected == EOS) == 0  # tokens up to and including EOS
    np.testing.assert_allclose(logp, (full_log_probs(jnp.asarray(expected)) * mask).sum(1), rtol=1e-4, atol=1e-4)


def test_every_beam_scores_what_the_full_model_gives_it(parts):
    decoder, full_log_probs, *_ = parts
    tokens_to_logits, cache, batched = decoder(K)
    seqs, scores = beam_search(tokens_to_logits, cache, B, K, 0.6, EOS, T, is_batched=batched)
    flat = np.asarray(seqs).reshape(B * K, T)
    lengths = np.argmax(flat == EOS, 1) + 1
    assert np.all(np.any(flat == EOS, 1)) and len({tuple(r) for r in flat[:K]}) == K  # distinct hypotheses
    mask = np.arange(T)[None] < lengths[:, None]
    logp = np.asarray((full_log_probs(jnp.asarray(flat)) * mask).sum(1))
    np.testing.assert_allclose(np.asarray(scores).reshape(-1), logp / length_penalty(lengths, 0.6), rtol=1e-4,
                               atol=1e-4)
