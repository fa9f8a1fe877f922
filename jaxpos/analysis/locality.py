"""Locality and symmetry of a positional weight matrix (Chen, Varoquaux, Suchanek, eq. 6-7), as the authors'
code computes them, and the attenuated encoding they are illustrated with (eq. 8, Fig. 3).

Both take a square matrix [n, n] (row i the query at position i) or rows [rows, n] with their query positions.
Locality: row score sum_j M[i, j] / 2^|i - j|, matrix score the mean over rows.
Symmetry: for row i with m = min(i, n - 1 - i) > 0, d_t = |M[i, i - t] - M[i, i + t]| for t = 1..m, min-max
normalised within the row (a constant d maps to 0); pooled over all rows; Sym = 1 - mean(pooled).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxpos.positions.attenuated import attenuated_delta


def _rows(matrix, query_positions, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(rows [r, n] as float64, their query positions [r] as ints), checked; None means square, row i at i."""
    m = np.asarray(matrix, np.float64)
    if m.ndim != 2 or m.shape[0] == 0:
        raise ValueError(f"{name} needs a matrix of rows [rows, n] (rows >= 1), got shape {m.shape}")
    rows, n = m.shape
    if query_positions is None:
        if rows != n:
            raise ValueError(f"{name} of a matrix of shape {m.shape} that is not square needs query_positions "
                             "(one query position per row)")
        return m, np.arange(n)
    q = np.asarray(query_positions)
    if q.shape != (rows,) or not np.issubdtype(q.dtype, np.integer):
        raise ValueError(f"{name} needs one integer query position per row: shape ({rows},), got "
                         f"{q.dtype} of shape {q.shape}")
    if q.min() < 0 or q.max() >= n:
        raise ValueError(f"{name}: query positions must lie in [0, {n - 1}] for rows of length {n}; "
                         f"got {q.min()}..{q.max()}")
    return m, q


def locality_rows(matrix, query_positions=None) -> np.ndarray:
    """Per-row locality of rows [rows, n] whose queries sit at query_positions [rows] (default: square, row i
    at position i) -> [rows]."""
    m, q = _rows(matrix, query_positions, "locality")
    decay = 0.5 ** np.abs(np.arange(m.shape[1])[None, :] - q[:, None])
    return (m * decay).sum(axis=1)


def locality(matrix, query_positions=None) -> float:
    """Locality of rows [rows, n] at query_positions [rows] (default: square [n, n]): the mean row score."""
    return float(locality_rows(matrix, query_positions).mean())


def symmetry(matrix, query_positions=None) -> float:
    """Symmetry of rows [rows, n], n >= 3, at query_positions [rows] (default: square [n, n]); rows with nothing
    on one side of their query (position 0 or n - 1) are skipped, and at least one row must be left."""
    m, q = _rows(matrix, query_positions, "symmetry")
    n = m.shape[1]
    if n <= 2:
        raise ValueError(f"symmetry is undefined for n <= 2 (no row has keys on both sides); got n = {n}")
    pooled = []
    for row, i in zip(m, q):
        t = np.arange(1, min(i, n - 1 - i) + 1)
        if len(t) == 0:
            continue
        d = np.abs(row[i - t] - row[i + t])
        span = d.max() - d.min()
        pooled.append((d - d.min()) / span if span > 0 else np.zeros_like(d))
    if not pooled:
        raise ValueError(f"symmetry needs a row whose query has keys on both sides (0 < position < {n - 1}); "
                         f"got query positions {q.tolist()}")
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
