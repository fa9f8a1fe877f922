"""Toeplitzness of a matrix (TISA, Wennberg & Henter, App. B).

The least-squares Toeplitz fit of A keeps the mean of each diagonal (offset j - i); its quality is
R^2 = 1 - RSS/TSS with TSS taken about the mean of all entries. Applied to the position Gram matrix
P = E_P E_P^T and to positional attention matrices.
"""

from __future__ import annotations

import numpy as np


def _diagonal_index(n: int, m: int) -> np.ndarray:
    """[n, m] index of each entry's diagonal: (j - i) + (n - 1), from 0 (offset -(n-1)) to n + m - 2."""
    return np.arange(m)[None, :] - np.arange(n)[:, None] + (n - 1)


def diagonal_means(matrix) -> np.ndarray:
    """Mean of each diagonal of [..., n, m], by offset j - i from -(n-1) to m-1: -> [..., n + m - 1]."""
    a = np.asarray(matrix, np.float64)
    if a.ndim < 2:
        raise ValueError(f"expected a matrix [..., n, m], got shape {a.shape}")
    n, m = a.shape[-2:]
    lead = a.shape[:-2]
    width = n + m - 1
    index = _diagonal_index(n, m).ravel()
    flat = a.reshape(-1, n * m)
    # One bincount over all matrices at once: matrix b's diagonals occupy bins [b*width, (b+1)*width).
    bins = (index[None, :] + width * np.arange(flat.shape[0])[:, None]).ravel()
    sums = np.bincount(bins, weights=flat.ravel(), minlength=flat.shape[0] * width).reshape(-1, width)
    counts = np.bincount(index, minlength=width)
    return (sums / counts).reshape(lead + (width,))


def toeplitz_fit(matrix) -> np.ndarray:
    """Best (least-squares) Toeplitz approximation of [..., n, m]: each diagonal replaced by its mean."""
    a = np.asarray(matrix, np.float64)
    n, m = a.shape[-2:]
    return diagonal_means(a)[..., _diagonal_index(n, m)]


def toeplitz_r2(matrix):
    """R^2 = 1 - RSS/TSS of the best Toeplitz fit of [..., n, m]; a float for one matrix, else an array [...].

    A constant matrix (TSS = 0) is Toeplitz (RSS = 0) and scores 1.
    """
    a = np.asarray(matrix, np.float64)
    rss = ((a - toeplitz_fit(a)) ** 2).sum(axis=(-2, -1))
    tss = ((a - a.mean(axis=(-2, -1), keepdims=True)) ** 2).sum(axis=(-2, -1))
    # A constant matrix leaves TSS and RSS at rounding level, whose ratio is noise: count it as fully explained.
    n, m = a.shape[-2:]
    noise = n * m * (16 * np.finfo(np.float64).eps * np.abs(a).max(axis=(-2, -1), initial=0.0)) ** 2
    varies = tss > noise
    r2 = np.where(varies, 1.0 - rss / np.where(varies, tss, 1.0), 1.0)
    return float(r2) if r2.ndim == 0 else r2


def position_gram(embeddings) -> np.ndarray:
    """P = E_P E_P^T of position embeddings [n, d] -> [n, n]."""
    e = np.asarray(embeddings, np.float64)
    if e.ndim != 2:
        raise ValueError(f"expected position embeddings [n, d], got shape {e.shape}")
    return e @ e.T
