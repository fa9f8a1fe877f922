"""Numerical rank: numpy's matrix_rank on constructed low-rank matrices; the DIET rank bounds."""

import numpy as np
import pytest

from jaxpos.analysis.rank import numerical_rank


def low_rank(rng, n, m, r, dtype=np.float64):
    return (rng.normal(size=(n, r)) @ rng.normal(size=(r, m))).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matches_numpy(dtype):
    rng = np.random.default_rng(0)
    for n, m, r in [(8, 8, 3), (12, 5, 2), (6, 20, 6), (10, 10, 10)]:
        a = low_rank(rng, n, m, r, dtype)
        assert numerical_rank(a) == np.linalg.matrix_rank(a) == r
        assert isinstance(numerical_rank(a), int)
    assert numerical_rank(np.zeros((4, 3))) == 0
    assert numerical_rank(np.eye(3, dtype=int)) == 3
    # The tolerance is relative to the largest singular value: the default (3 x float32 eps = 3.6e-7) drops 1e-9,
    # keeps 1e-3.
    a = np.diag([1.0, 1e-3, 1e-9])
    assert numerical_rank(a) == 2 and numerical_rank(a, rtol=1e-12) == 3 and numerical_rank(a, rtol=1e-2) == 1
    assert numerical_rank(2e5 * a) == 2 and numerical_rank(a.astype(np.float32)) == 2
    with pytest.raises(ValueError, match="rtol"):
        numerical_rank(a, rtol=1.5)


def test_float32_product_cast_to_float64():
    """The rank does not depend on the dtype a float32-computed matrix arrives in: rounding noise (about 1e-8
    of the largest singular value here) stays below the default (float32) tolerance after a cast to float64."""
    rng = np.random.default_rng(3)
    for n, m, r in [(16, 32, 4), (64, 96, 8), (40, 40, 12)]:
        a32 = rng.normal(size=(n, r)).astype(np.float32) @ rng.normal(size=(r, m)).astype(np.float32)
        assert numerical_rank(a32) == numerical_rank(a32.astype(np.float64)) == r
        s = np.linalg.svd(a32.astype(np.float64), compute_uv=False)
        assert 0 < s[r] / s[0] < 1e-6  # the noise the dtype-derived tolerance (max(n, m) * 2.2e-16) counted


def with_singular_values(rng, n, m, values):
    """An n x m matrix with the given nonzero singular values: the SVD of a product of Gaussian factors [n, r] and
    [r, m], r = len(values), its singular values replaced."""
    u, _, vt = np.linalg.svd(rng.normal(size=(n, len(values))) @ rng.normal(size=(len(values), m)),
                             full_matrices=False)
    return (u[:, :len(values)] * np.asarray(values)) @ vt[:len(values)]


@pytest.mark.parametrize("smallest", [3e-5, 1e-5])
@pytest.mark.parametrize("shape", [(30, 50), (50, 30)])
def test_a_small_true_singular_value_is_kept_as_numpy_keeps_it(smallest, shape):
    """A float32 matrix of true rank 30 whose smallest singular value is far above float32's rounding noise
    (about 1e-7 relative) counts all 30, as numpy.linalg.matrix_rank does in float32 and in float64."""
    rng = np.random.default_rng(5)
    a32 = with_singular_values(rng, *shape, np.geomspace(1.0, smallest, 30)).astype(np.float32)
    s = np.linalg.svd(a32.astype(np.float64), compute_uv=False)
    assert s[29] / s[0] == pytest.approx(smallest, rel=1e-2)
    assert np.linalg.matrix_rank(a32) == np.linalg.matrix_rank(a32.astype(np.float64)) == 30
    assert numerical_rank(a32) == numerical_rank(a32.astype(np.float64)) == 30
    assert numerical_rank(np.stack([a32, a32[::-1]])).tolist() == [30, 30]


def test_default_tolerance_is_numpys_with_the_compute_dtype():
    from jaxpos.analysis.rank import default_rtol

    for n, m in [(30, 50), (50, 30), (7, 7)]:
        assert default_rtol((2, n, m)) == max(n, m) * np.finfo(np.float32).eps
        assert default_rtol((n, m), "float64") == max(n, m) * np.finfo(np.float64).eps
    assert default_rtol((16, 8), "bfloat16") == 16 * 2.0 ** -7
    # A last singular value of 1e-9 relative: numpy counts it in float64 (20 x 2.2e-16), and so does a float64
    # compute dtype; float32's tolerance (20 x 1.2e-7) drops it.
    a = with_singular_values(np.random.default_rng(6), 12, 20, np.r_[np.geomspace(1.0, 1e-3, 11), 1e-9])
    assert numerical_rank(a, compute_dtype=np.float64) == np.linalg.matrix_rank(a) == 12
    float32_tolerance = 20 * np.finfo(np.float32).eps * np.linalg.norm(a, 2)
    assert numerical_rank(a) == np.linalg.matrix_rank(a, tol=float32_tolerance) == 11
    assert numerical_rank(a, rtol=0.6) == 1  # an explicit rtol overrides the default
    with pytest.raises(ValueError, match="compute_dtype"):
        numerical_rank(a, compute_dtype="int32")


def test_batched():
    rng = np.random.default_rng(1)
    a = np.stack([low_rank(rng, 9, 7, r) for r in range(1, 7)]).reshape(2, 3, 9, 7)
    ranks = numerical_rank(a)
    assert ranks.shape == (2, 3)
    np.testing.assert_array_equal(ranks.ravel(), np.arange(1, 7))
    np.testing.assert_array_equal(ranks, np.linalg.matrix_rank(a))


def test_absolute_position_logits_and_diet_abs():
    rng = np.random.default_rng(2)
    n, d, head_dim, r = 24, 16, 4, 3
    x = rng.normal(size=(n, d)) + rng.normal(size=(n, d))  # token + position embeddings, rank d > D
    assert numerical_rank(x) == d
    w_q, w_k = rng.normal(size=(d, head_dim)), rng.normal(size=(d, head_dim))
    logits = (x @ w_q) @ (x @ w_k).T / np.sqrt(head_dim)
    assert numerical_rank(logits) == head_dim  # input APE: rank <= D
    p_q, p_k = rng.normal(size=(n, r)), rng.normal(size=(n, r))
    biased = logits + p_q @ p_k.T  # DIET-Abs per-head term of rank r
    assert head_dim < numerical_rank(biased) <= head_dim + r
    assert numerical_rank(biased) == head_dim + r  # generic factors reach the bound
    assert numerical_rank(biased.astype(np.float32)) == head_dim + r
