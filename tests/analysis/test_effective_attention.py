"""Effective attention: the test vector of docs/conventions.md, A_eff T = A T, identity when T has full row rank,
the correlation, and a tiny jaxpos encoder end to end."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.analysis.effective_attention import attention_correlation, effective_attention, left_null_space
from jaxpos.analysis.taps import run_encoder, value_output_maps
from jaxpos.models import BertEncoder
from tests.helpers import tiny_config


def test_reference_vector():
    t = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    null = left_null_space(t)
    assert null.shape == (3, 1)
    np.testing.assert_allclose(null.T @ t, 0, atol=1e-12)
    np.testing.assert_allclose(abs(null[:, 0]), np.ones(3) / np.sqrt(3), atol=1e-12)
    a = np.array([[1.0, 0.0, 0.0], [1 / 3, 1 / 3, 1 / 3], [0.0, 0.5, 0.5]])
    eff = effective_attention(a, t)
    np.testing.assert_allclose(eff[0], [2 / 3, -1 / 3, 1 / 3], atol=1e-12)
    np.testing.assert_allclose(eff[1], [2 / 9, 2 / 9, 4 / 9], atol=1e-12)


def test_random_low_rank_maps():
    rng = np.random.default_rng(0)
    seq, d, rank = 9, 6, 3
    t = rng.normal(size=(2, 4, seq, rank)) @ rng.normal(size=(2, 4, rank, d))  # [B, H, T, d] of rank 3
    a = rng.random((2, 4, seq, seq))
    a /= a.sum(-1, keepdims=True)
    eff = effective_attention(a, t)
    assert eff.shape == a.shape
    np.testing.assert_allclose(eff @ t, a @ t, atol=1e-10)
    for idx in np.ndindex(2, 4):  # against the per-matrix definition A - A N N^T
        null = left_null_space(t[idx])
        assert null.shape == (seq, seq - rank)
        np.testing.assert_allclose(null.T @ null, np.eye(seq - rank), atol=1e-10)
        np.testing.assert_allclose(eff[idx], a[idx] - a[idx] @ null @ null.T, atol=1e-10)
    # Nothing is left of the null-space part: A_eff N = 0, and the change lies in the null space.
    assert np.abs(eff - a).max() > 1e-2
    # The default tolerance (max(T, d) x float32 eps of the largest singular value) treats a tiny extra direction
    # as null; a tolerance below it keeps the direction.
    t_eps = t[0, 0] + 1e-7 * rng.normal(size=(seq, d))
    assert left_null_space(t_eps).shape[1] == seq - rank
    assert left_null_space(t_eps, rtol=1e-12).shape[1] == seq - d
    with pytest.raises(ValueError, match="rtol"):
        left_null_space(t_eps, rtol=-1.0)


def test_float32_maps_cast_to_float64():
    """T = E W_V W_O computed in float32 has rank D < T; cast to float64 before the SVD it must still give the
    effective attention of the float32 path and of the exact range of E W_V (QR of the float64 factors)."""
    rng = np.random.default_rng(4)
    seq, d, head_dim = 24, 48, 8
    e, w_v, w_o = rng.normal(size=(seq, d)), rng.normal(size=(d, head_dim)), rng.normal(size=(head_dim, d))
    t32 = (e.astype(np.float32) @ w_v.astype(np.float32)) @ w_o.astype(np.float32)
    a32 = rng.random((seq, seq)).astype(np.float32)
    a32 /= a32.sum(-1, keepdims=True)
    q, _ = np.linalg.qr(e @ w_v)  # [T, D]: orthonormal basis of range(T), W_O having full row rank
    exact = a32.astype(np.float64) @ q @ q.T
    eff32 = effective_attention(a32, t32)
    eff64 = effective_attention(a32.astype(np.float64), t32.astype(np.float64))
    assert eff32.dtype == np.float32 and eff64.dtype == np.float64
    np.testing.assert_allclose(eff64, exact, atol=1e-7)  # the dtype-derived tolerance was off by 0.1 here
    np.testing.assert_allclose(eff64, eff32, atol=1e-7)
    np.testing.assert_allclose(eff64 @ t32, a32 @ t32.astype(np.float64), atol=1e-5 * np.abs(a32 @ t32).max())
    assert left_null_space(t32.astype(np.float64)).shape == (seq, seq - head_dim)
    assert np.abs(eff64 - a32).max() > 0.1  # a real projection, not the identity


def test_full_row_rank_keeps_attention():
    rng = np.random.default_rng(1)
    t = rng.normal(size=(3, 5, 8)).astype(np.float32)  # T = 5 <= d = 8
    a = rng.random((3, 5, 5)).astype(np.float32)
    eff = effective_attention(a, t)
    assert eff.dtype == np.float32
    np.testing.assert_allclose(eff, a, atol=1e-6)
    assert left_null_space(t[0]).shape == (5, 0)
    np.testing.assert_allclose(attention_correlation(a, eff), 1.0, atol=1e-6)


def test_correlation():
    rng = np.random.default_rng(2)
    a, e = rng.random((2, 3, 4, 4)), rng.normal(size=(2, 3, 4, 4))
    r = attention_correlation(a, e)
    assert r.shape == (2, 3)
    for idx in np.ndindex(2, 3):
        assert r[idx] == pytest.approx(np.corrcoef(a[idx].ravel(), e[idx].ravel())[0, 1], abs=1e-12)
    np.testing.assert_allclose(attention_correlation(a, a), 1.0)
    np.testing.assert_allclose(attention_correlation(a, -2 * a + 1), -1.0)
    tokens = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool)  # padding mask [B, T] -> entries [B, 1, T, T]
    mask = (tokens[:, :, None] & tokens[:, None, :])[:, None]
    r = attention_correlation(a, e, mask)
    for b, h in np.ndindex(2, 3):
        keep = mask[b, 0]
        assert r[b, h] == pytest.approx(np.corrcoef(a[b, h][keep], e[b, h][keep])[0, 1], abs=1e-12)


def test_tiny_encoder_end_to_end():
    cfg = tiny_config(dict(kind="absolute"))
    ids = jnp.asarray(np.random.default_rng(3).integers(4, cfg.vocab_size, size=(2, 12)))
    params = nn.unbox(jax.jit(BertEncoder(cfg).init)(jax.random.PRNGKey(0), ids)["params"])
    weights, states = jax.jit(lambda p, i: run_encoder(cfg, p, i))(params, ids)  # jitted: faster than eager
    maps = value_output_maps(cfg, params, states)  # [L, B, H, T, d], each of rank <= D = 8 < T = 12
    weights = np.asarray(weights)
    eff = effective_attention(weights, maps)
    assert eff.shape == weights.shape == (2, 2, cfg.num_heads, 12, 12)
    scale = np.abs(weights @ maps).max()
    np.testing.assert_allclose(eff @ maps, weights @ maps, atol=1e-5 * scale)
    assert np.abs(eff - weights).max() > 1e-3  # T > D: the raw weights are not identifiable
    r = attention_correlation(weights, eff)
    assert r.shape == (2, 2, cfg.num_heads) and np.all(np.isfinite(r)) and np.all(r < 1 - 1e-4)
