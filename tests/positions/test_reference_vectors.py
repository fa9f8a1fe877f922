"""The test vectors of docs/conventions.md and direct formulas for the position-only functions."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.attention.bias import expand_toeplitz, offsets
from jaxpos.positions.absolute import sinusoidal_table
from jaxpos.positions.alibi import alibi_slopes
from jaxpos.positions.attenuated import attenuated_delta
from jaxpos.attention.core import apply_rotary
from jaxpos.positions.rope import inverse_frequencies, rotary_tables
from jaxpos.positions.t5 import t5_bucket
from jaxpos.positions.tisa import tisa_scores


def test_tisa_reference_matrix():
    one = jnp.ones((1,))
    table = tisa_scores(offsets(3), one, one, jnp.zeros((1,)))
    got = expand_toeplitz(table, jnp.arange(3), jnp.arange(3))
    want = [[1, .3679, .0183], [.3679, 1, .3679], [.0183, .3679, 1]]
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_tisa_scores_match_direct_sum():
    rng = np.random.default_rng(0)
    a, b, c = rng.normal(size=(3, 4, 5))
    k = np.arange(-7, 8)
    want = np.array([[sum(a[h, s] * math.exp(-abs(b[h, s]) * (kk - c[h, s]) ** 2) for s in range(5)) for kk in k]
                     for h in range(4)])
    np.testing.assert_allclose(tisa_scores(jnp.asarray(k), a, b, c), want, rtol=1e-5, atol=1e-6)


def test_toeplitz_expansion_matches_double_loop():
    rng = np.random.default_rng(1)
    table = rng.normal(size=(3, 2 * 9 - 1))
    q_pos, k_pos = np.array([0, 3, 8, 5]), np.arange(9)
    got = np.asarray(expand_toeplitz(jnp.asarray(table), jnp.asarray(q_pos), jnp.asarray(k_pos)))
    for h in range(3):
        for t, i in enumerate(q_pos):
            for s, j in enumerate(k_pos):
                assert got[h, t, s] == pytest.approx(table[h, (j - i) + 8])


T5_BIDIRECTIONAL = [(range(0, 8), None), (range(8, 12), 8), (range(12, 16), 9), (range(16, 23), 10),
                    (range(23, 32), 11), (range(32, 46), 12), (range(46, 64), 13), (range(64, 91), 14),
                    (range(91, 400), 15)]


def test_t5_buckets_bidirectional_reference():
    distance = np.arange(400)
    before = np.asarray(t5_bucket(jnp.asarray(-distance), bidirectional=True))  # key before the query: j - i = -d
    after = np.asarray(t5_bucket(jnp.asarray(distance), bidirectional=True))
    for distances, bucket in T5_BIDIRECTIONAL:
        d = np.asarray(list(distances))
        np.testing.assert_array_equal(before[d], d if bucket is None else bucket)
        d = d[d > 0]
        np.testing.assert_array_equal(after[d], (d if bucket is None else bucket) + 16)


def test_t5_buckets_causal_reference():
    rel = jnp.asarray([1, 5, 100, -16, -32, -64, -128, -500, 0, -3])
    np.testing.assert_array_equal(t5_bucket(rel, bidirectional=False), [0, 0, 0, 16, 21, 26, 31, 31, 0, 3])


def test_t5_buckets_match_transformers():
    torch = pytest.importorskip("torch")
    from transformers.models.t5.modeling_t5 import T5Attention

    rel = np.arange(-300, 301)
    for bidirectional in (True, False):
        want = T5Attention._relative_position_bucket(torch.tensor(rel), bidirectional=bidirectional,
                                                     num_buckets=32, max_distance=128).numpy()
        np.testing.assert_array_equal(t5_bucket(jnp.asarray(rel), bidirectional=bidirectional), want)


def test_alibi_slopes():
    np.testing.assert_allclose(alibi_slopes(8), [2.0 ** -(i + 1) for i in range(8)])
    twelve = alibi_slopes(12)  # the paper's rule: 8 slopes, then every other slope of 16
    np.testing.assert_allclose(twelve[:8], alibi_slopes(8))
    np.testing.assert_allclose(twelve[8:], alibi_slopes(16)[0::2][:4])


def test_sinusoidal_matches_vaswani_formula():
    pos, d = np.arange(7), 10
    want = np.zeros((7, d))
    for p in pos:
        for i in range(0, d, 2):
            want[p, i] = math.sin(p / 10000 ** (i / d))
            want[p, i + 1] = math.cos(p / 10000 ** (i / d))
    np.testing.assert_allclose(sinusoidal_table(jnp.asarray(pos), d), want, atol=1e-5)


def test_rope_matches_complex_rotation_and_is_relative():
    rng = np.random.default_rng(2)
    d, base = 8, 10000.0
    x = rng.normal(size=(1, 5, 1, d)).astype(np.float32)
    pos = np.arange(5)
    cos, sin = rotary_tables(jnp.asarray(pos), inverse_frequencies(d, base))
    got = np.asarray(apply_rotary(jnp.asarray(x), cos, sin))
    freq = base ** (-np.arange(0, d, 2) / d)
    z = (x[..., : d // 2] + 1j * x[..., d // 2:]) * np.exp(1j * pos[None, :, None, None] * freq)
    np.testing.assert_allclose(got, np.concatenate([z.real, z.imag], -1), atol=1e-5)
    # q.k after rotation depends on the offset only.
    q, k = rng.normal(size=(2, d)).astype(np.float32)

    def score(i, j):
        cq, sq = rotary_tables(jnp.asarray([i]), inverse_frequencies(d, base))
        ck, sk = rotary_tables(jnp.asarray([j]), inverse_frequencies(d, base))
        return float(jnp.sum(apply_rotary(jnp.asarray(q)[None, None, None], cq, sq)
                             * apply_rotary(jnp.asarray(k)[None, None, None], ck, sk)))

    assert score(2, 5) == pytest.approx(score(10, 13), rel=1e-4)


def test_attenuated_matches_formula():
    w, s, n = 0.3, 0.5, 6
    alpha = np.array([[-s * w * (j - i) ** 2 if i <= j else -w * (j - i) ** 2 for j in range(n)] for i in range(n)])
    want = np.exp(alpha) / np.exp(alpha).sum(1, keepdims=True)
    np.testing.assert_allclose(attenuated_delta(jnp.arange(n), jnp.arange(n), w, s), want, rtol=1e-5)
