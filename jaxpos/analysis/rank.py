"""Numerical rank of attention logit and positional matrices (DIET, Chen et al., Fig. 2 and 8).

Input absolute positions give logits (X W_Q)(X W_K)^T of rank <= D per head; a per-head positional term of
rank d_p can lift it to D + d_p.
"""

from __future__ import annotations

import numpy as np


def numerical_rank(matrix, rtol: float | None = None):
    """Number of singular values above rtol * S.max of [..., n, m]: an int, or an int array [...].

    The default rtol = max(n, m) * eps of the input's float dtype, as numpy's `matrix_rank`.
    """
    a = np.asarray(matrix)
    if a.ndim < 2:
        raise ValueError(f"expected a matrix [..., n, m], got shape {a.shape}")
    if not np.issubdtype(a.dtype, np.inexact):
        a = a.astype(np.float64)
    if rtol is None:
        rtol = max(a.shape[-2:]) * np.finfo(a.dtype).eps
    s = np.linalg.svd(a, compute_uv=False)
    if s.shape[-1] == 0:
        rank = np.zeros(a.shape[:-2], np.int64)
    else:
        rank = (s > rtol * s.max(axis=-1, keepdims=True)).sum(axis=-1)
    return int(rank) if rank.ndim == 0 else rank
