"""Beam search against hand-computed results and brute-force enumeration; greedy against a plain loop."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.decoding import beam_search, greedy_decode, length_penalty, max_decode_lengths, tile_beams

BOS, EOS = 0, 1

# A Markov toy: P[previous token, next token]. Greedy takes 2 (0.6) then EOS (0.4): P = 0.24; beam search finds
# 3 (0.4) then EOS (0.9): P = 0.36.
TABLE = np.array([[0.0, 0.0, 0.60, 0.40],  # after BOS
                  [0.25, 0.25, 0.25, 0.25],  # after EOS (never used)
                  [0.0, 0.40, 0.35, 0.25],  # after 2
                  [0.0, 0.90, 0.05, 0.05]])  # after 3


def markov(table):
    """tokens_to_logits of a model whose next-token log-probabilities depend only on the last token."""
    log_table = jnp.log(jnp.asarray(table, jnp.float32))  # log 0 = -inf: tokens the model rules out
    calls = []

    def tokens_to_logits(ids, cache):
        jax.debug.callback(lambda: calls.append(1))
        return log_table[ids[:, 0]], cache

    return tokens_to_logits, calls


def test_length_penalty_values():
    assert length_penalty(1, 0.6) == pytest.approx(1.0)
    assert length_penalty(7, 0.6) == pytest.approx(2 ** 0.6) == pytest.approx(1.515717)
    assert length_penalty(13, 1.0) == pytest.approx(3.0)
    assert length_penalty(40, 0.0) == 1.0
    np.testing.assert_allclose(length_penalty(jnp.array([1.0, 7.0]), 0.6), [1.0, 1.515717], rtol=1e-6)


def test_max_decode_lengths_follow_the_source():
    np.testing.assert_array_equal(max_decode_lengths(jnp.array([3, 10, 100]), 64), [53, 60, 64])  # +50, capped
    np.testing.assert_array_equal(max_decode_lengths(np.array([0, 4]), 64, a=1.5, b=0.2), [1, 7])  # ceil, >= 1


def test_beam_finds_the_better_sequence_that_greedy_misses():
    model, calls = markov(TABLE)
    seqs, scores = beam_search(model, {}, 1, 2, 0.6, EOS, 6, bos_id=BOS)
    lp2 = ((5 + 2) / 6) ** 0.6
    np.testing.assert_array_equal(seqs[0], [[3, 1, 0, 0, 0, 0], [2, 1, 0, 0, 0, 0]])
    np.testing.assert_allclose(scores[0], [math.log(0.4 * 0.9) / lp2, math.log(0.6 * 0.4) / lp2], rtol=1e-6)
    # Step 3's best live prefix (2, 2, 2), P = 0.0735, can reach at most log(0.0735) / lp(6) = -1.81 < the 2nd
    # finished score -1.30, so the search stops after 3 of its 6 steps.
    assert len(calls) == 3
    greedy, greedy_score = greedy_decode(model, {}, 1, EOS, 6, bos_id=BOS)
    np.testing.assert_array_equal(greedy[0], [2, 1, 0, 0, 0, 0])
    np.testing.assert_allclose(greedy_score[0], math.log(0.24), rtol=1e-6)


def test_greedy_ignores_an_eos_that_is_not_its_argmax():
    """EOS second best after BOS (0.3) beats the whole greedy path (0.5 * 0.45 * 0.2 = 0.045), yet greedy decoding
    (and beam size 1) never holds it: only EOS candidates within the top K leave the beam."""
    trap = np.array([[0.0, 0.3, 0.5, 0.2], [0.25] * 4, [0.0, 0.2, 0.45, 0.35], [0.0, 0.2, 0.45, 0.35]])
    seqs, logp = greedy_decode(markov(trap)[0], {}, 1, EOS, 3, bos_id=BOS)
    np.testing.assert_array_equal(seqs[0], [2, 2, 1])
    np.testing.assert_allclose(logp[0], math.log(0.045), rtol=1e-6)
    seqs, scores = beam_search(markov(trap)[0], {}, 1, 2, 0.0, EOS, 3, bos_id=BOS)  # K = 2 holds it
    np.testing.assert_array_equal(seqs[0, 0], [1, 0, 0])
    np.testing.assert_allclose(scores[0, 0], math.log(0.3), rtol=1e-6)


def test_eos_first_and_forced_eos_at_the_limit():
    eager = np.full((4, 4), 0.05)
    eager[:, EOS] = 0.85  # EOS right away is best
    seqs, scores = beam_search(markov(eager)[0], {}, 2, 3, 0.6, EOS, 5, bos_id=BOS)
    np.testing.assert_array_equal(seqs[:, 0], [[1, 0, 0, 0, 0]] * 2)
    np.testing.assert_allclose(scores[:, 0], [math.log(0.85)] * 2, rtol=1e-6)  # lp(1) = 1
    reluctant = np.full((4, 4), 0.3)
    reluctant[:, EOS] = 0.1  # EOS is never in the top K = 1: only the limit ends the hypothesis
    seqs, scores = beam_search(markov(reluctant)[0], {}, 2, 1, 0.6, EOS, jnp.array([2, 4]), bos_id=BOS)
    assert seqs.shape == (2, 1, 4)
    for b, limit in enumerate([2, 4]):
        row = np.asarray(seqs[b, 0])
        assert row[limit - 1] == EOS and np.all(row[:limit - 1] != EOS) and np.all(row[limit:] == 0)
        expected = (math.log(0.3) * (limit - 1) + math.log(0.1)) / length_penalty(limit, 0.6)
        np.testing.assert_allclose(scores[b, 0], expected, rtol=1e-6)


# A model that remembers its whole history in the cache: its next-token distribution depends on every token fed
# so far (read from the cache, not from `ids`) and on a per-example leaf, so a cache reordered wrongly, or tiled
# in the wrong order, gives other sequences than enumeration does.
V, W = 4, 3


def history_logits(history, example):
    """Logits [V] after the tokens `history` (BOS first) of example `example` (numpy, float32)."""
    code = np.float32(sum((token + 1) * 5 ** j for j, token in enumerate(history)))
    return np.float32(3.0) * np.sin(np.float32(0.37) * code + np.float32(1.3 * example)
                                    + np.float32(2.1) * np.arange(V, dtype=np.float32))


def history_model(ids, cache):
    t = cache["step"]
    history = cache["history"].at[:, t].set(ids[:, 0] + 1)  # +1: 0 marks "not fed yet"
    code = jnp.sum(history * 5 ** jnp.arange(W + 1), axis=1).astype(jnp.float32)
    logits = 3.0 * jnp.sin(0.37 * code[:, None] + 1.3 * cache["example"][:, None].astype(jnp.float32)
                           + 2.1 * jnp.arange(V, dtype=jnp.float32))
    return logits, dict(cache, history=history, step=t + 1)


def history_cache(batch):
    return dict(history=jnp.zeros((batch, W + 1), jnp.int32), example=jnp.arange(batch, dtype=jnp.int32) * 3,
                step=jnp.zeros((), jnp.int32),  # shared: no batch dimension
                shared_table=jnp.arange(W, dtype=jnp.float32))  # [W], W != B: shared too


def log_softmax(x):
    x = x.astype(np.float64)
    return x - x.max() - np.log(np.exp(x - x.max()).sum())


def enumerate_hypotheses(example, limit, alpha):
    """Every hypothesis (tokens, EOS last) of at most `limit` tokens with its score, best first."""
    found = []
    for n in range(1, limit + 1):
        for prefix in itertools.product([t for t in range(V) if t != EOS], repeat=n - 1):
            tokens, history, logp = list(prefix) + [EOS], [BOS], 0.0
            for token in tokens:
                logp += log_softmax(history_logits(history, example))[token]
                history.append(token)
            found.append((logp / length_penalty(n, alpha), tokens))
    return sorted(found, key=lambda item: -item[0])


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_exhaustive_beam_equals_enumeration_and_gathers_the_cache(alpha):
    limits = np.array([3, 2])
    seqs, scores = beam_search(history_model, history_cache(2), 2, 36, alpha, EOS, limits, bos_id=BOS)
    # K = 36 holds all 9 * V candidates of a step: the search is exhaustive and must list every hypothesis
    for b, limit in enumerate(limits):
        expected = enumerate_hypotheses(3 * b, limit, alpha)
        valid = np.isfinite(np.asarray(scores[b]))
        assert valid.sum() == len(expected) == (13 if limit == 3 else 4)
        got = [list(np.asarray(row)[:list(row).index(EOS) + 1]) for row in seqs[b][valid]]
        assert got == [tokens for _, tokens in expected]
        np.testing.assert_allclose(scores[b][valid], [score for score, _ in expected], rtol=1e-5)


def test_small_beam_keeps_a_consistent_history_per_beam():
    """With K = 3 the beams are reordered every step; each returned sequence's score must be the one its own
    token history gives (a cache gathered from the wrong beam would score another history)."""
    seqs, scores = beam_search(history_model, history_cache(2), 2, 3, 0.6, EOS, W, bos_id=BOS)
    for b in range(2):
        for row, score in zip(np.asarray(seqs[b]), np.asarray(scores[b])):
            tokens = list(row[:list(row).index(EOS) + 1])
            history, logp = [BOS], 0.0
            for token in tokens:
                logp += log_softmax(history_logits(history, 3 * b))[token]
                history.append(token)
            # float32 log-probabilities summed over up to W steps (a history from another beam changes the score
            # itself, not its last digits)
            np.testing.assert_allclose(score, logp / length_penalty(len(tokens), 0.6), rtol=1e-4)
    assert np.all(np.diff(np.asarray(scores), axis=1) <= 0)  # sorted best first


def greedy_loop(example, limit):
    """Plain greedy decoding of the history model: argmax until EOS, EOS forced at the limit."""
    history, tokens, logp = [BOS], [], 0.0
    for n in range(1, limit + 1):
        scores = log_softmax(history_logits(history, example))
        token = EOS if n == limit else int(np.argmax(scores))
        tokens.append(token)
        logp += scores[token]
        history.append(token)
        if token == EOS:
            break
    return tokens, logp


def test_greedy_and_beam_of_one_equal_a_greedy_loop():
    limits = jnp.array([3, 1, 2, 3])
    seqs, logps = greedy_decode(history_model, history_cache(4), 4, EOS, limits, bos_id=BOS)
    beam_seqs, _ = beam_search(history_model, history_cache(4), 4, 1, 0.0, EOS, limits, bos_id=BOS)
    np.testing.assert_array_equal(seqs, beam_seqs[:, 0])
    for b, limit in enumerate([3, 1, 2, 3]):
        tokens, logp = greedy_loop(3 * b, limit)
        assert list(np.asarray(seqs[b])) == tokens + [0] * (W - len(tokens))
        np.testing.assert_allclose(logps[b], logp, rtol=1e-5)


def test_jit_with_traced_limits_matches_eager():
    def run(cache, limits):
        return beam_search(history_model, cache, 2, 3, 0.6, EOS, limits, bos_id=BOS, decode_width=W)

    limits = jnp.array([3, 2])
    eager = run(history_cache(2), limits)
    jitted = jax.jit(run)(history_cache(2), limits)
    np.testing.assert_array_equal(eager[0], jitted[0])
    np.testing.assert_allclose(eager[1], jitted[1], rtol=1e-6)
    with pytest.raises(ValueError, match="pass decode_width"):
        jax.jit(lambda c, l: beam_search(history_model, c, 2, 3, 0.6, EOS, l))(history_cache(2), limits)


def test_tile_beams_layout():
    np.testing.assert_array_equal(tile_beams(jnp.array([[1, 2], [3, 4]]), 3),
                                  [[1, 2], [1, 2], [1, 2], [3, 4], [3, 4], [3, 4]])  # row b*K + k


def test_logits_with_a_length_axis_and_bad_arguments():
    log_table = jnp.log(jnp.asarray(TABLE, jnp.float32))
    seqs, _ = beam_search(lambda ids, c: (log_table[ids], c), {}, 1, 2, 0.6, EOS, 6)  # [B*K, 1, V]
    np.testing.assert_array_equal(seqs[0, 0, :2], [3, 1])
    with pytest.raises(ValueError, match="beam_size=0"):
        beam_search(markov(TABLE)[0], {}, 1, 0, 0.6, EOS, 6)
    with pytest.raises(ValueError, match="alpha=-0.5"):
        beam_search(markov(TABLE)[0], {}, 1, 2, -0.5, EOS, 6)
