"""Numerical rank of attention logit and positional matrices (DIET, Chen et al., Fig. 2 and 8).

Input absolute positions give logits (X W_Q)(X W_K)^T of rank <= D per head; a per-head positional term of
rank d_p can lift it to D + d_p.

The default rank tolerance is numpy.linalg.matrix_rank's, max(M, N) · eps · S.max for an M x N matrix, with eps
that of the dtype the matrix was computed in (`compute_dtype`, float32 by default: jaxpos's analyses run the model
in float32), not of the dtype it arrives in: a float32 product cast to float64 keeps float32's rounding noise
(about 1e-8 to 1e-7 of the largest singular value), which float64's eps would count as rank. An explicit `rtol`
(relative to the largest singular value) overrides it.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

COMPUTE_DTYPE = "float32"
"""The dtype jaxpos's analyses compute logits and value-output maps in (jaxpos.analysis.loading sets it)."""


def default_rtol(shape, compute_dtype=COMPUTE_DTYPE) -> float:
    """max(M, N) · eps(compute_dtype) for matrices [..., M, N]: numpy.linalg.matrix_rank's tolerance, relative to
    the largest singular value, with the eps of the precision the values were computed in."""
    if len(shape) < 2:
        raise ValueError(f"expected a matrix shape [..., M, N], got {tuple(shape)}")
    try:
        eps = float(ml_dtypes.finfo(compute_dtype).eps)
    except (TypeError, ValueError) as err:
        raise ValueError(f"compute_dtype must be a floating-point dtype such as 'float32'; got {compute_dtype!r}") \
            from err
    return max(shape[-2], shape[-1]) * eps


def above_tolerance(singular_values, rtol: float) -> np.ndarray:
    """Mask [..., k] of the singular values [..., k] (descending, as the SVD returns them) above rtol * S.max."""
    if not 0 <= rtol < 1:
        raise ValueError(f"rtol is relative to the largest singular value and must lie in [0, 1); got {rtol}")
    s = np.asarray(singular_values)
    return s > rtol * s[..., :1]  # an all-zero matrix keeps nothing


def numerical_rank(matrix, rtol: float | None = None, compute_dtype=COMPUTE_DTYPE):
    """Number of singular values above rtol * S.max of [..., M, N]: an int, or an int array [...].

    `rtol` defaults to `default_rtol(matrix.shape, compute_dtype)`: max(M, N) · eps of the dtype the values were
    computed in (float32 unless said), whatever dtype the array has now.
    """
    a = np.asarray(matrix)
    if a.ndim < 2:
        raise ValueError(f"expected a matrix [..., n, m], got shape {a.shape}")
    if rtol is None:
        rtol = default_rtol(a.shape, compute_dtype)
    if not np.issubdtype(a.dtype, np.inexact):
        a = a.astype(np.float64)
    rank = above_tolerance(np.linalg.svd(a, compute_uv=False), rtol).sum(axis=-1)
    return int(rank) if rank.ndim == 0 else rank
