"""Locality and symmetry (Chen et al.): the test vectors of docs/conventions.md, a brute-force double loop, the
attenuated encoding sweep, and bad inputs."""

import numpy as np
import pytest

from jaxpos.analysis.locality import (attenuated_matrix, attenuated_sweep, locality, locality_rows,
                                      symmetry)


def loop_locality(m, positions=None):
    positions = range(len(m)) if positions is None else positions
    n = len(m[0])
    return sum(sum(row[j] / 2 ** abs(i - j) for j in range(n)) for row, i in zip(m, positions)) / len(m)


def loop_symmetry(m, positions=None):
    positions = range(len(m)) if positions is None else positions
    n, pooled = len(m[0]), []
    for row, i in zip(m, positions):
        k = min(i, n - 1 - i)
        if k == 0:
            continue
        d = [abs(row[i - t] - row[i + t]) for t in range(1, k + 1)]
        lo, hi = min(d), max(d)
        pooled += [(x - lo) / (hi - lo) if hi > lo else 0.0 for x in d]
    return 1 - sum(pooled) / len(pooled)


def test_reference_vectors():
    first = np.zeros((5, 5))
    first[0] = [1, 0, 0, 0, 0]
    assert locality_rows(first)[0] == 1.0
    first[0] = [0, 0, 0, 0, 1]
    assert locality_rows(first)[0] == 1 / 16
    assert locality(np.eye(5)) == 1.0
    # Uniform rows: (2 * 0.3875 + 2 * 0.475 + 0.5) / 5.
    assert locality(np.full((5, 5), 0.2)) == pytest.approx(0.445, abs=1e-12)
    centre = np.zeros((5, 5))
    centre[2] = [0.1, 0.2, 0.4, 0.2, 0.1]
    assert symmetry(centre) == 1.0
    rows = np.tile([0.1, 0.3, 0.2, 0.5, 0.4], (5, 1))
    assert symmetry(rows) == pytest.approx(0.75, abs=1e-12)
    assert locality(rows) == pytest.approx(0.67375, abs=1e-12)


def test_reference_single_rows():
    assert locality([[1, 0, 0, 0, 0]], query_positions=[0]) == 1.0
    assert locality([[0, 0, 0, 0, 1]], query_positions=[0]) == 1 / 16
    assert symmetry([[0.1, 0.2, 0.4, 0.2, 0.1]], query_positions=[2]) == 1.0
    np.testing.assert_array_equal(locality_rows([[1, 0, 0, 0, 0], [0, 0, 0, 0, 1]], [0, 0]), [1, 1 / 16])
    rows = np.tile([0.1, 0.3, 0.2, 0.5, 0.4], (5, 1))  # explicit positions 0..n-1 are the square default
    assert symmetry(rows, np.arange(5)) == symmetry(rows) and locality(rows, np.arange(5)) == locality(rows)


@pytest.mark.parametrize("rows, n", [(1, 3), (2, 5), (7, 4), (6, 11)])
def test_rows_at_query_positions_against_double_loop(rows, n):
    rng = np.random.default_rng(10 * rows + n)
    for _ in range(3):
        m = rng.random((rows, n))
        m /= m.sum(1, keepdims=True)
        positions = rng.integers(0, n, size=rows)
        positions[0] = rng.integers(1, n - 1)  # one row with keys on both sides: symmetry is defined
        assert locality(m, positions) == pytest.approx(loop_locality(m.tolist(), positions.tolist()), abs=1e-12)
        assert symmetry(m, positions) == pytest.approx(loop_symmetry(m.tolist(), positions.tolist()), abs=1e-12)
        np.testing.assert_allclose(locality_rows(m, positions),
                                   [loop_locality([r], [i]) for r, i in zip(m.tolist(), positions.tolist())],
                                   rtol=0, atol=1e-12)


@pytest.mark.parametrize("n", [3, 4, 7, 10])
def test_against_double_loop(n):
    rng = np.random.default_rng(n)
    for _ in range(3):
        m = rng.random((n, n))
        m /= m.sum(1, keepdims=True)
        assert locality(m) == pytest.approx(loop_locality(m.tolist()), abs=1e-12)
        assert symmetry(m) == pytest.approx(loop_symmetry(m.tolist()), abs=1e-12)
        np.testing.assert_allclose(locality_rows(m).mean(), locality(m))


def test_attenuated_matrix_and_sweep():
    delta = attenuated_matrix(6, 0.5, 2.0)
    np.testing.assert_allclose(delta.sum(1), 1.0, rtol=1e-6)
    k = np.arange(6)[None, :] - np.arange(6)[:, None]
    alpha = np.where(k >= 0, -2.0 * 0.5 * k**2, -0.5 * k**2)
    want = np.exp(alpha) / np.exp(alpha).sum(1, keepdims=True)
    np.testing.assert_allclose(delta, want, rtol=1e-5, atol=1e-7)

    ws, ss = [0.01, 0.1, 0.5, 2.0], [0.0, 0.5, 1.0, 3.0]
    sweep = attenuated_sweep(12, ws, ss)
    assert sweep["locality"].shape == sweep["symmetry"].shape == (4, 4)
    assert np.all(np.diff(sweep["locality"], axis=0) > 0)  # sharper decay -> more local
    np.testing.assert_allclose(sweep["symmetry"][:, 2], 1.0)  # s = 1: alpha is even in j - i
    assert np.all(sweep["symmetry"][:, [0, 1, 3]] < 1)
    assert sweep["symmetry"][1, 2] == symmetry(attenuated_matrix(12, 0.1, 1.0))


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"n = 2"):
        symmetry(np.eye(2))
    for fn in (locality, locality_rows, symmetry):
        with pytest.raises(ValueError, match=r"\(3, 4\)"):
            fn(np.ones((3, 4)))
        with pytest.raises(ValueError, match=r"\(2, 3, 3\)"):
            fn(np.ones((2, 3, 3)))
        with pytest.raises(ValueError, match=r"one integer query position per row: shape \(3,\)"):
            fn(np.ones((3, 4)), [0, 1])
        with pytest.raises(ValueError, match=r"one integer query position per row"):
            fn(np.ones((3, 4)), [0.0, 1.0, 2.0])
        with pytest.raises(ValueError, match=r"must lie in \[0, 3\].*got -1\.\.2"):
            fn(np.ones((3, 4)), [0, -1, 2])
        with pytest.raises(ValueError, match=r"must lie in \[0, 3\].*got 0\.\.4"):
            fn(np.ones((3, 4)), [0, 4, 2])
        with pytest.raises(ValueError, match=r"rows >= 1"):
            fn(np.ones((0, 4)), [])
    with pytest.raises(ValueError, match=r"keys on both sides.*\[0, 4, 0\]"):
        symmetry(np.ones((3, 5)), [0, 4, 0])
