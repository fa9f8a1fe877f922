"""TISA kernel regression (TISA App. C): diagonal means of profiles; known kernels recovered as functions;
a Toeplitz profile made from known kernels round-trips."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.analysis.tisa_fit import fit_tisa_kernels, profile_rows_to_offsets
from jaxpos.attention.bias import expand_toeplitz, offsets
from jaxpos.positions.tisa import tisa_scores

# Three heads of five bumps each: mixed signs, widths from ~0.6 to ~4 offsets, centres at least 3 apart.
A = np.array([[1.0, -0.6, 0.8, 0.3, -0.4], [0.5, 1.2, -0.7, 0.6, 0.9], [2.0, -1.0, 0.5, 0.7, -0.3]])
B = np.array([[0.5, 0.1, 1.0, 0.05, 0.3], [0.2, 0.8, 0.08, 0.4, 0.04], [1.5, 0.3, 0.1, 0.6, 0.06]])
C = np.array([[-1.0, -6, 2, 8, -12], [0, -4, 5, 10, -10], [1, -2, -8, 5, 11]])


def f(k, a, b, c):
    """f(k) in float64: a, b, c [H, S], k [K] -> [H, K]."""
    return np.einsum("hs,hsk->hk", a, np.exp(-np.abs(b)[..., None] * (k[None, None, :] - c[..., None]) ** 2))


def assert_same_function(fit, k, a, b, c):
    want = f(k, a, b, c)
    got = f(k, fit["a"], fit["b"], fit["c"])
    peak = np.abs(want).max(axis=1, keepdims=True)
    assert np.all(np.abs(got - want) < 1e-3 * peak), np.abs(got - want).max(axis=1) / peak[:, 0]
    np.testing.assert_allclose(fit["r2"], 1.0, atol=1e-6)
    assert fit["a"].shape == fit["b"].shape == fit["c"].shape == (len(a), 5) and np.all(fit["b"] > 0)


def test_profile_rows_to_offsets():
    p = np.arange(9.0).reshape(1, 3, 3)  # diagonals by j - i = -2..2: {6}, {3, 7}, {0, 4, 8}, {1, 5}, {2}
    np.testing.assert_allclose(profile_rows_to_offsets(p), [[6, 5, 4, 3, 2]])
    with pytest.raises(ValueError, match=r"\(3, 4\)"):
        profile_rows_to_offsets(np.ones((3, 4)))


def test_recovers_known_kernels():
    k = np.arange(-15, 16).astype(float)
    fit = fit_tisa_kernels(f(k, A, B, C), k, num_kernels=5)
    assert_same_function(fit, k, A, B, C)
    # Fewer true bumps than fitted ones, amplitudes in other units: still the same function.
    fit = fit_tisa_kernels(30 * f(k, A[:, :3], B[:, :3], C[:, :3]), k, num_kernels=5)
    assert_same_function(fit, k, 30 * A[:, :3], B[:, :3], C[:, :3])


def test_profile_round_trip():
    n = 16
    table = tisa_scores(offsets(n), jnp.asarray(A, jnp.float32), jnp.asarray(B, jnp.float32),
                        jnp.asarray(C, jnp.float32))  # [H, 2n - 1]
    profile = np.asarray(expand_toeplitz(table, jnp.arange(n), jnp.arange(n)))  # F[h, i, j] = f_h(j - i)
    assert profile.shape == (3, n, n)
    np.testing.assert_allclose(profile[1, 3, 5], f(np.array([2.0]), A, B, C)[1, 0], rtol=1e-5)
    scores = profile_rows_to_offsets(profile)
    k = np.arange(-(n - 1), n).astype(float)
    np.testing.assert_allclose(scores, np.asarray(table), rtol=1e-6, atol=1e-7)
    assert_same_function(fit_tisa_kernels(scores, k), k, A, B, C)


def test_tisa_model_initialised_from_an_absolute_model():
    import flax.linen as nn
    import jax

    from jaxpos.analysis.profile import positional_profile
    from jaxpos.analysis.tisa_fit import tisa_init_from_profile
    from jaxpos.models import BertEncoder
    from jaxpos.positions import make_position
    from tests.helpers import tiny_config

    absolute = tiny_config(dict(kind="absolute"))
    ids = jnp.ones((1, absolute.max_length), jnp.int32)
    params = nn.unbox(BertEncoder(absolute).init(jax.random.PRNGKey(0), ids)["params"])
    profile = positional_profile(absolute, params)
    init, r2 = tisa_init_from_profile(profile, absolute.num_layers)
    tisa = tiny_config(dict(kind="tisa"))
    tisa_params = nn.unbox(BertEncoder(tisa).init(jax.random.PRNGKey(1), ids)["params"])
    assert {k: v.shape for k, v in init.items()} == {k: tisa_params["encoder"]["position"][k].shape for k in "abc"}
    tisa_params["encoder"]["position"] = {k: jnp.asarray(v) for k, v in init.items()}
    n = absolute.max_length
    k = np.arange(-(n - 1), n)
    target = profile_rows_to_offsets(profile)  # [H, 2n-1]
    fitted = np.asarray(tisa_scores(jnp.asarray(k), *(jnp.asarray(init[x][0]) for x in "abc")))
    rss = ((fitted - target) ** 2).sum(1)
    tss = ((target - target.mean(1, keepdims=True)) ** 2).sum(1)
    np.testing.assert_allclose(1 - rss / tss, r2, rtol=1e-3, atol=1e-4)  # r2 describes the installed kernels
    positions = jnp.arange(n)
    table = make_position(tisa, tisa.num_layers, False).apply({"params": init}, positions, positions).term("table").table
    np.testing.assert_allclose(np.asarray(table)[0], fitted, rtol=1e-5, atol=1e-5)  # what the model now adds
    assert np.all(np.isfinite(BertEncoder(tisa).apply({"params": tisa_params}, ids)))
