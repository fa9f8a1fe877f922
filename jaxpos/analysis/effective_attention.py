"""Effective attention (Brunner et al., "On Identifiability in Transformers", section 3).

A head's output is A T with T = E W_V^h W_O^h [T, d]. Any component of an attention row in the left null space
of T (all x with x^T T = 0) leaves the output unchanged, so only A_eff = A - A N N^T matters, N an orthonormal
basis of that null space. Equivalently A_eff = A U_r U_r^T, U_r the left singular vectors of T with singular
values above the rank tolerance. Attention is not identifiable whenever the sequence is longer than rank(T).

The tolerance is relative to T's largest singular value: by default max(T, d) · eps of the dtype T was computed
in (`compute_dtype`, float32 unless said; see `jaxpos.analysis.rank`), not of the dtype it arrives in: float64's
eps would find no null space in float32 maps cast to float64, whose rounding noise sits far above it.
"""

from __future__ import annotations

import numpy as np

from jaxpos.analysis.rank import COMPUTE_DTYPE, above_tolerance, default_rtol


def _column_space(t: np.ndarray, rtol: float) -> tuple[np.ndarray, np.ndarray]:
    """Left singular vectors U [..., T, T] of t [..., T, d] and a mask [..., T] of those above the tolerance."""
    u, s, _ = np.linalg.svd(t, full_matrices=True)
    keep = above_tolerance(s, rtol)
    pad = np.zeros(keep.shape[:-1] + (t.shape[-2] - keep.shape[-1],), bool)  # d < T: the rest is null space
    return u, np.concatenate([keep, pad], axis=-1)


def _float_dtype(*arrays):
    dtype = np.result_type(*[np.asarray(a).dtype for a in arrays])
    return dtype if np.issubdtype(dtype, np.inexact) else np.dtype(np.float64)


def left_null_space(t, rtol: float | None = None, compute_dtype=COMPUTE_DTYPE) -> np.ndarray:
    """Orthonormal basis N [T, T - rank] of {x : x^T t = 0} for t [T, d]: singular values at or below
    rtol * S.max count as zero (default rtol: `jaxpos.analysis.rank.default_rtol` for `compute_dtype`)."""
    a = np.asarray(t)
    if a.ndim != 2:
        raise ValueError(f"expected a value-output map [T, d], got shape {a.shape}")
    rtol = default_rtol(a.shape, compute_dtype) if rtol is None else rtol
    u, keep = _column_space(a.astype(np.float64), rtol)
    return u[:, ~keep]


def effective_attention(weights, value_maps, rtol: float | None = None, compute_dtype=COMPUTE_DTYPE) -> np.ndarray:
    """A_eff = A - A N N^T of attention weights [..., T, T] given value-output maps [..., T, d] -> [..., T, T].

    Leading dims broadcast, e.g. weights [L, B, H, T, T] with maps [L, B, H, T, d] from
    `jaxpos.analysis.taps.value_output_maps`. N spans the left null space at relative tolerance `rtol` (default:
    `default_rtol` of the maps' shape and `compute_dtype`; the rank it keeps is `numerical_rank(value_maps, rtol,
    compute_dtype)`). Computed in float64, returned in the inputs' float dtype.
    """
    a, t = np.asarray(weights), np.asarray(value_maps)
    if a.ndim < 2 or t.ndim < 2 or a.shape[-1] != t.shape[-2]:
        raise ValueError(f"weights [..., T, T] and value maps [..., T, d] disagree: {a.shape} vs {t.shape}")
    rtol = default_rtol(t.shape, compute_dtype) if rtol is None else rtol
    u, keep = _column_space(t.astype(np.float64), rtol)
    basis = u * keep[..., None, :]  # zero the null-space columns: basis basis^T projects onto range(T)
    projector = basis @ np.swapaxes(basis, -1, -2)
    return (a.astype(np.float64) @ projector).astype(_float_dtype(a, t))


def attention_correlation(weights, effective, mask=None) -> np.ndarray:
    """Pearson correlation of raw and effective attention over the entries of each [T, T] matrix -> [...].

    `mask` (bool, broadcastable to weights [..., T, T]) keeps only its True entries, e.g. for padding
    `m[..., :, None] & m[..., None, :]` from a token mask m; a constant matrix gives NaN.
    """
    a = np.asarray(weights, np.float64)
    e = np.asarray(effective, np.float64)
    if a.shape != e.shape:
        raise ValueError(f"weights and effective attention differ in shape: {a.shape} vs {e.shape}")
    keep = np.ones(a.shape, bool) if mask is None else np.broadcast_to(np.asarray(mask, bool), a.shape)
    axes = (-2, -1)
    count = keep.sum(axis=axes, keepdims=True)
    da = np.where(keep, a - np.where(keep, a, 0).sum(axis=axes, keepdims=True) / count, 0)
    de = np.where(keep, e - np.where(keep, e, 0).sum(axis=axes, keepdims=True) / count, 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = (da * de).sum(axis=axes) / np.sqrt((da**2).sum(axis=axes) * (de**2).sum(axis=axes))
    return np.clip(r, -1.0, 1.0)  # rounding can step just past +-1
