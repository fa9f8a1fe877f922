"""Toeplitzness R^2: exact on Toeplitz matrices, equal to a brute-force least-squares fit, batched."""

import numpy as np
import pytest

from jaxpos.analysis.toeplitz import diagonal_means, position_gram, toeplitz_fit, toeplitz_r2


def brute_force_r2(a):
    """Least squares on an indicator design: one column per diagonal j - i."""
    n, m = a.shape
    offsets = (np.arange(m)[None, :] - np.arange(n)[:, None]).ravel()
    design = (offsets[:, None] == np.arange(-(n - 1), m)[None, :]).astype(float)
    coef, *_ = np.linalg.lstsq(design, a.ravel(), rcond=None)
    fit = (design @ coef).reshape(n, m)
    rss = ((a - fit) ** 2).sum()
    tss = ((a - a.mean()) ** 2).sum()
    return fit, 1 - rss / tss


def test_toeplitz_matrix_scores_one():
    rng = np.random.default_rng(0)
    table = rng.normal(size=2 * 6 - 1)  # offsets -5..5
    a = table[np.arange(6)[None, :] - np.arange(6)[:, None] + 5]
    np.testing.assert_allclose(toeplitz_fit(a), a, atol=1e-12)
    assert toeplitz_r2(a) == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(diagonal_means(a), table, atol=1e-12)
    assert toeplitz_r2(np.full((4, 4), 0.1)) == 1.0  # constant: TSS = 0


@pytest.mark.parametrize("shape", [(5, 5), (4, 7), (7, 3)])
def test_random_matrix_matches_least_squares(shape):
    a = np.random.default_rng(1).normal(size=shape)
    fit, r2 = brute_force_r2(a)
    np.testing.assert_allclose(toeplitz_fit(a), fit, atol=1e-10)
    assert toeplitz_r2(a) == pytest.approx(r2, abs=1e-10)
    assert 0 < r2 < 1


def test_hand_computed_example():
    a = np.array([[1.0, 2.0], [4.0, 3.0]])
    # Diagonals: offset -1 {4}, 0 {1, 3} -> mean 2, offset 1 {2}; RSS = 2, TSS about 2.5 = 5.
    np.testing.assert_allclose(toeplitz_fit(a), [[2, 2], [4, 2]])
    assert toeplitz_r2(a) == pytest.approx(1 - 2 / 5)


def test_batch_dimensions():
    rng = np.random.default_rng(2)
    a = rng.normal(size=(2, 3, 5, 6))
    r2 = toeplitz_r2(a)
    assert r2.shape == (2, 3)
    for idx in np.ndindex(2, 3):
        assert r2[idx] == pytest.approx(brute_force_r2(a[idx])[1], abs=1e-10)
        np.testing.assert_allclose(toeplitz_fit(a)[idx], brute_force_r2(a[idx])[0], atol=1e-10)


def test_position_gram():
    e = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 2.0]])
    np.testing.assert_allclose(position_gram(e), [[1, 1, 0], [1, 2, 2], [0, 2, 4]])
    # Sinusoidal positions have an exactly Toeplitz Gram matrix: sum_k cos(w_k (i - j)).
    pos, freq = np.arange(12)[:, None], 1 / 10000 ** (np.arange(4) / 4)[None, :]
    sinusoid = np.concatenate([np.sin(pos * freq), np.cos(pos * freq)], axis=1)
    assert toeplitz_r2(position_gram(sinusoid)) == pytest.approx(1.0, abs=1e-10)
    with pytest.raises(ValueError, match=r"\(3,\)"):
        position_gram(np.ones(3))
