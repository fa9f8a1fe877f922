"""Logical axis rules map every parameter onto a (data, fsdp, tensor) mesh; a sharded forward pass equals the
single-device one."""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.models import BertForMaskedLM
from jaxpos.sharding import batch_sharding, check_batch_divisible, logical_sharding, make_mesh
from tests.helpers import VARIANTS, tiny_config


def test_every_parameter_has_logical_names():
    for _, position in VARIANTS:
        cfg = tiny_config(position, num_decoder_layers=0)
        boxed = jax.eval_shape(BertForMaskedLM(cfg).init, jax.random.PRNGKey(0), jnp.ones((1, 8), jnp.int32))
        leaves = jax.tree.leaves(boxed["params"], is_leaf=lambda x: isinstance(x, flax.linen.Partitioned))
        unnamed = [x for x in leaves if not isinstance(x, flax.linen.Partitioned)]
        assert not unnamed, f"{position}: parameters without logical axis names"


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
def test_sharded_forward_matches_single_device():
    cfg = tiny_config(dict(kind="tisa"), vocab_size=64)  # vocab split over tensor=2
    model = BertForMaskedLM(cfg)
    ids = jax.random.randint(jax.random.PRNGKey(0), (8, 16), 1, cfg.vocab_size)
    boxed = model.init(jax.random.PRNGKey(1), ids)
    params = flax.linen.unbox(boxed["params"])
    want = model.apply({"params": params}, ids)
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    shardings = logical_sharding(boxed["params"], mesh)
    sharded = jax.device_put(params, shardings)
    kernel = sharded["bert"]["encoder"]["layer_0"]["self_attention"]["query"]["kernel"]
    assert kernel.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)
    forward = jax.jit(lambda p, x: model.apply({"params": p}, x), in_shardings=(shardings, batch_sharding(mesh)))
    got = forward(sharded, jax.device_put(ids, batch_sharding(mesh)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
def test_bad_mesh_and_batch_are_clear_errors():
    mesh = make_mesh(data=4, fsdp=2)
    check_batch_divisible(16, mesh)
    with pytest.raises(ValueError, match="batch size 12 is not divisible by the 8 data-parallel devices"):
        check_batch_divisible(12, mesh)
    with pytest.raises(ValueError, match="needs 12 devices, have 8"):
        make_mesh(data=3, fsdp=2, tensor=2)
