"""The embedding table (float32 gather then cast; one-hot contraction for small tables) against numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.models.embedding import ONE_HOT_ROWS, Embed


@pytest.mark.parametrize("rows", [2, ONE_HOT_ROWS, 50])  # one-hot path, its largest table, gather path
def test_lookup_gradient_and_attend_match_numpy(rows):
    """Rows, the table gradient of sum(rows * g) (a brute-force scatter-add over hot ids) and the tied logits."""
    rng = np.random.default_rng(rows)
    ids = rng.integers(0, rows, (3, 40))
    ids[:, ::3] = 1  # a hot row, as [MASK] or token type 0
    module = Embed(rows, 8, dtype=jnp.float32)
    params = module.init(jax.random.PRNGKey(0), jnp.asarray(ids))
    table = np.asarray(params["params"]["embedding"], np.float64)
    g = rng.normal(size=ids.shape + (8,))

    out, vjp = jax.vjp(lambda p: module.apply(p, jnp.asarray(ids)), params)
    np.testing.assert_allclose(out, table[ids], rtol=1e-6, atol=1e-7)
    want = np.zeros_like(table)
    for index in np.ndindex(ids.shape):
        want[ids[index]] += g[index]
    got = vjp(jnp.asarray(g, jnp.float32))[0]["params"]["embedding"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    x = rng.normal(size=(2, 8))
    np.testing.assert_allclose(module.apply(params, jnp.asarray(x, jnp.float32), method="attend"), x @ table.T,
                               rtol=1e-5, atol=1e-5)


def test_bf16_compute_reads_float32_rows():
    """In bf16 the rows are the float32 rows rounded once (not a bf16 table), and the gradient stays float32."""
    module = Embed(40, 4, dtype=jnp.bfloat16)
    ids = jnp.asarray([[0, 5, 5, 39]])
    params = module.init(jax.random.PRNGKey(1), ids)
    table = params["params"]["embedding"]
    out = module.apply(params, ids)
    assert out.dtype == jnp.bfloat16 and table.dtype == jnp.float32
    np.testing.assert_array_equal(out, table[ids].astype(jnp.bfloat16))  # a one-hot product adds only zeros: exact
    grad = jax.grad(lambda p: jnp.sum(module.apply(p, ids).astype(jnp.float32)))(params)["params"]["embedding"]
    assert grad.dtype == jnp.float32 and float(grad[5, 0]) == 2.0 and float(grad[1, 0]) == 0.0
    with pytest.raises(ValueError, match="integers"):
        module.apply(params, jnp.zeros((1, 2)))
