"""The `jax.nn.dot_product_attention` path of a whole model equals the XLA reference path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.models import BertForMaskedLM
from tests.helpers import tiny_config

CASES = [dict(kind="tisa"), dict(kind="diet_abs"), dict(kind="t5"), dict(kind="rope"),
         dict(kind="attenuated"), dict(kind="diet_rel", segment="per_head")]


@pytest.mark.parametrize("position", CASES, ids=lambda p: p["kind"] + "_" + p.get("segment", "input"))
def test_jax_attention_matches_xla(position):
    ids = jax.random.randint(jax.random.PRNGKey(0), (2, 12), 1, 61)
    segs = jnp.ones((2, 12), jnp.int32).at[1, 7:].set(2)  # two packed pieces in the second row
    types = (jnp.arange(12) >= 6).astype(jnp.int32)[None].repeat(2, 0)
    outs = []
    for impl in ("xla", "jax"):
        model = BertForMaskedLM(tiny_config(position, attention_impl=impl))
        params = model.init(jax.random.PRNGKey(1), ids)["params"]
        outs.append(model.apply({"params": params}, ids, segment_ids=segs, token_types=types))
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-5)


def test_shaw_needs_the_reference_path():
    model = BertForMaskedLM(tiny_config(dict(kind="shaw"), attention_impl="jax"))
    with pytest.raises(ValueError, match="use attention_impl='xla'"):
        model.init(jax.random.PRNGKey(0), jnp.ones((1, 8), jnp.int32))
