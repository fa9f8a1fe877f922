"""Numerical rank of attention logit and positional matrices (DIET, Chen et al., Fig. 2 and 8).

Input absolute positions give logits (X W_Q)(X W_K)^T of rank <= D per head; a per-head positional term of
rank d_p can lift it to D + d_p.

The rank tolerance is explicit and relative to the largest singular value, never taken from the array's dtype:
the matrices analysed here are computed in float32 (often cast to float64 afterwards), so their rounding noise
is that of float32 whatever dtype they arrive in.
"""

from __future__ import annotations

import numpy as np

RTOL = 1e-4
"""Default rank tolerance, relative to the largest singular value, for matrices computed in float32.

Rounding a float32 product leaves spurious singular values below 1e-7 of the largest (value-output maps
E W_V W_O computed in float32, T=16..512, d=32..1024: 2e-8 to 5e-8), so 1e-4 sits a thousandfold above that
noise, while a direction below it changes the matrix by under 1e-4 of its largest singular value. Matrices
computed in bfloat16 (which rounds at 4e-3) need a larger one; exact float64 computations can use a far smaller one.
"""


def above_tolerance(singular_values, rtol: float = RTOL) -> np.ndarray:
    """Mask [..., k] of the singular values [..., k] (descending, as the SVD returns them) above rtol * S.max."""
    if not 0 <= rtol < 1:
        raise ValueError(f"rtol is relative to the largest singular value and must lie in [0, 1); got {rtol}")
    s = np.asarray(singular_values)
    return s > rtol * s[..., :1]  # an all-zero matrix keeps nothing


def numerical_rank(matrix, rtol: float = RTOL):
    """Number of singular values above rtol * S.max of [..., n, m]: an int, or an int array [...].

    `rtol` is relative to the largest singular value and does not depend on the dtype (see `RTOL`).
    """
    a = np.asarray(matrix)
    if a.ndim < 2:
        raise ValueError(f"expected a matrix [..., n, m], got shape {a.shape}")
    if not np.issubdtype(a.dtype, np.inexact):
        a = a.astype(np.float64)
    rank = above_tolerance(np.linalg.svd(a, compute_uv=False), rtol).sum(axis=-1)
    return int(rank) if rank.ndim == 0 else rank
