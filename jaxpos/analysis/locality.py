"""Locality and symmetry of a positional weight matrix (Chen, Varoquaux, Suchanek, eq. 6-7), as the authors'
code computes them, and the attenuated encoding they are illustrated with (eq. 8, Fig. 3).

Locality: row score sum_j M[i, j] / 2^|i - j|, matrix score the mean over rows.
Symmetry: for row i with m = min(i, n - 1 - i) > 0, d_t = |M[i, i - t] - M[i, i + t]| for t = 1..m, min-max
normalised within the row (a constant d maps to 0); pooled over all rows; Sym = 1 - mean(pooled).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxpos.positions.attenuated import attenuated_delta


def _square(matrix, name: str) -> np.ndarray:
    m = np.asarray(matrix, np.float64)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise ValueError(f"{name} needs a square matrix [n, n], got shape {m.shape}")
    return m


def locality_rows(matrix) -> np.ndarray:
    """Per-row locality of a square matrix [n, n] -> [n]."""
    m = _square(matrix, "locality")
    n = m.shape[0]
    decay = 0.5 ** np.abs(np.arange(n)[None, :] - np.arange(n)[:, None])
    return (m * decay).sum(axis=1)


def locality(matrix) -> float:
    """Locality of a square matrix [n, n]: the mean of its row scores."""
    return float(locality_rows(matrix).mean())


def symmetry(matrix) -> float:
    """Symmetry of a square matrix [n, n], n >= 3 (rows with nothing on one side are skipped)."""
    m = _square(matrix, "symmetry")
    n = m.shape[0]
    if n <= 2:
        raise ValueError(f"symmetry is undefined for n <= 2 (no row has keys on both sides); got n = {n}")
    pooled = []
    for i in range(1, n - 1):
        t = np.arange(1, min(i, n - 1 - i) + 1)
        d = np.abs(m[i, i - t] - m[i, i + t])
        span = d.max() - d.min()
        pooled.append((d - d.min()) / span if span > 0 else np.zeros_like(d))
    return float(1.0 - np.concatenate(pooled).mean())


def attenuated_matrix(n: int, w: float, s: float) -> np.ndarray:
    """Chen eq. 8: delta[i, :] = softmax_j(alpha_ij) for positions 0..n-1 -> [n, n]."""
    positions = jnp.arange(n)
    return np.asarray(attenuated_delta(positions, positions, w, s), np.float64)


def attenuated_sweep(n: int, ws, ss) -> dict:
    """Locality and symmetry of the attenuated encoding over a grid of w and s (Chen Fig. 3).

    -> dict(locality=[len(ws), len(ss)], symmetry=[len(ws), len(ss)]).
    """
    ws, ss = np.atleast_1d(ws), np.atleast_1d(ss)
    loc = np.zeros((len(ws), len(ss)))
    sym = np.zeros((len(ws), len(ss)))
    for a, w in enumerate(ws):
        for b, s in enumerate(ss):
            delta = attenuated_matrix(n, float(w), float(s))
            loc[a, b], sym[a, b] = locality(delta), symmetry(delta)
    return dict(locality=loc, symmetry=sym)
