"""KERPLE (logarithmic) and FIRE against numpy formulas of their papers, at and beyond the training length."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.positions.fire import FirePosition
from jaxpos.positions.kerple import KerplePosition
from tests.helpers import tiny_config


def bias_of(module, length: int, params=None):
    positions = jnp.arange(length)
    if params is None:
        params = module.init(jax.random.PRNGKey(0), positions, positions)
    return params, module.apply(params, positions, positions)


def with_values(params, **values):
    """`params` with some leaves replaced (numpy arrays of the same shapes)."""
    inner = jax.tree.map(lambda x: x, params)
    for name, value in values.items():
        box = inner["params"][name]
        inner["params"][name] = box.replace_boxed(jnp.asarray(value, jnp.float32)) if hasattr(box, "replace_boxed") \
            else jnp.asarray(value, jnp.float32)
    return inner


def test_kerple_is_minus_r1_log_of_one_plus_r2_distance():
    cfg = tiny_config(dict(kind="kerple"))
    module = KerplePosition(cfg, num_layers=2)
    params, _ = bias_of(module, 16)
    rng = np.random.default_rng(0)
    r1, r2 = rng.uniform(0.0, 2.0, (2, 4)), rng.uniform(0.0, 1.0, (2, 4))
    r1[0, 0], r2[1, 3] = 1e-4, -0.5  # below the clamp: read as 1e-2
    params = with_values(params, r1=r1, r2=r2)
    for length in (16, 64):  # the training length and four times it: the same function of the distance
        _, bias = bias_of(module, length, params)
        offset = np.arange(-(length - 1), length)
        expected = -np.maximum(r1, 1e-2)[..., None] * np.log(1 + np.maximum(r2, 1e-2)[..., None] * np.abs(offset))
        np.testing.assert_allclose(np.asarray(bias.term("table").table), expected, rtol=1e-6, atol=1e-6)
    shared = KerplePosition(tiny_config(dict(kind="kerple", kerple=dict(sharing="layer"))), num_layers=2)
    assert bias_of(shared, 8)[1].term("table").table.shape == (1, 4, 15)


def numpy_mlp(x, p):
    return np.maximum(x[..., None] * p["w1"] + p["b1"], 0) @ p["w2"]


def fire_values(params) -> dict:
    return {k: np.asarray(jax.tree.leaves(v)[0] if hasattr(v, "unbox") else v, np.float64)
            for k, v in params["params"].items()}


@pytest.mark.parametrize("length", [16, 48])
def test_fire_in_an_encoder_is_a_table_of_the_progressively_normalised_offset(length):
    cfg = tiny_config(dict(kind="fire", fire=dict(c=0.3)))
    module = FirePosition(cfg, num_layers=2)
    params, _ = bias_of(module, 16)
    rng = np.random.default_rng(1)
    params = with_values(params, w2=rng.normal(size=(32, 4)), b1=rng.normal(size=32) * 0.1, threshold=20.0)
    p = fire_values(params)
    _, bias = bias_of(module, length, params)
    assert bias.term("dense") is None and bias.term("table").table.shape == (1, 4, 2 * length - 1)
    offset = np.arange(-(length - 1), length)
    x = np.sign(offset) * np.log1p(0.3 * np.abs(offset)) / np.log1p(0.3 * max(20.0, length))
    assert np.abs(x).max() <= 1.0  # bounded at any length
    np.testing.assert_allclose(np.asarray(bias.term("table").table[0]), numpy_mlp(x, p).T, rtol=1e-5, atol=1e-5)


def test_fire_in_a_causal_stack_depends_on_the_query_position():
    cfg = tiny_config(dict(kind="fire"))
    module = FirePosition(cfg, num_layers=2, causal=True)
    params, _ = bias_of(module, 16)
    rng = np.random.default_rng(2)
    params = with_values(params, w2=rng.normal(size=(32, 4)), c=0.5, threshold=4.0)
    p = fire_values(params)
    length = 24
    _, bias = bias_of(module, length, params)
    assert bias.term("table") is None and bias.term("dense").matrix.shape == (1, 4, length, length)
    i, j = np.meshgrid(np.arange(length), np.arange(length), indexing="ij")
    x = np.log1p(0.5 * np.maximum(i - j, 0)) / np.log1p(0.5 * np.maximum(4.0, i))
    expected = np.moveaxis(numpy_mlp(x, p), -1, 0)
    np.testing.assert_allclose(np.asarray(bias.term("dense").matrix[0]), expected, rtol=1e-5, atol=1e-5)
    # past the threshold the same offset is scored differently by queries further on: not a Toeplitz matrix
    assert not np.allclose(expected[:, 10, 9], expected[:, 20, 19])
