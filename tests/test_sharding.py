"""Logical axis rules map every parameter onto a (data, fsdp, tensor) mesh; a sharded forward pass equals the
single-device one."""

import contextlib
import functools

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxpos.models import BertForMaskedLM
from jaxpos.sharding import (HEADS, HIDDEN, LOGICAL_AXIS_RULES, MLP_HIDDEN, activation_sharding, batch_sharding,
                             check_batch_divisible, constrain, fit_spec, logical_sharding, make_mesh, per_shard)
from jaxpos.training.loop import make_global_batch
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
    check_batch_divisible(16, mesh, process_count=2, accum_steps=2)
    with pytest.raises(ValueError, match=r"batch size 12 \(train.batch_size\) is not divisible by the 8 "
                                         r"data-parallel devices \(data x fsdp\) of mesh"):
        check_batch_divisible(12, mesh)
    with pytest.raises(ValueError, match=r"batch size 24 \(train.batch_size\) is not divisible by the 16 processes"):
        check_batch_divisible(24, make_mesh(data=1, fsdp=1, tensor=8), process_count=16)
    with pytest.raises(ValueError, match=r"does not split into train.grad_accum_steps=3 micro-batches on each of 2"):
        check_batch_divisible(16, mesh, process_count=2, accum_steps=3)
    with pytest.raises(ValueError, match="config.mesh data=3 x fsdp=2 x tensor=2 needs 12 devices, have 8"):
        make_mesh(data=3, fsdp=2, tensor=2)
    with pytest.raises(ValueError, match="config.mesh fsdp=3 x tensor=1 does not divide the devices: have 8"):
        make_mesh(fsdp=3)
    with pytest.raises(ValueError, match="config.mesh sizes must be positive"):
        make_mesh(data=8, fsdp=0)


def test_activation_layouts_follow_the_rule_table():
    to_mesh = lambda names: flax.linen.logical_to_mesh_axes(names, LOGICAL_AXIS_RULES)  # noqa: E731
    batch = ("data", "fsdp")  # the features of activations stay whole: fsdp is taken by the batch
    assert to_mesh(HIDDEN) == jax.sharding.PartitionSpec(batch, None, None)
    assert to_mesh(HEADS) == jax.sharding.PartitionSpec(batch, None, "tensor", None)
    assert to_mesh(MLP_HIDDEN) == jax.sharding.PartitionSpec(batch, None, "tensor")
    assert to_mesh(("embed", "mlp")) == jax.sharding.PartitionSpec("fsdp", "tensor")  # parameters: fsdp


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
def test_constraints_apply_only_inside_activation_sharding():
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    x = jnp.ones((8, 4, 16))
    outside = jax.jit(lambda x: constrain(x, HIDDEN) * 2).lower(x).as_text()
    assert "sharding_constraint" not in outside and "mhlo.sharding" not in outside

    def inside(x):
        with activation_sharding(mesh):
            return constrain(x, HIDDEN) * 2

    text = jax.jit(inside).lower(x).as_text()
    assert "sharding_constraint" in text and '"data", "fsdp"' in text


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
def test_global_batch_of_one_process():
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    local = {"ids": np.arange(32).reshape(8, 4)}
    batch = make_global_batch(local, batch_sharding(mesh))["ids"]
    assert batch.sharding == batch_sharding(mesh)
    assert [s.data.shape for s in batch.addressable_shards] == [(2, 4)] * 8
    np.testing.assert_array_equal(np.asarray(batch), local["ids"])


def pallas_loss_and_grads(model, params, ids, piece_ids, mesh=None, shardings=None):
    """Loss and gradients of a training-mode forward (attention dropout on), on one device or jitted on `mesh`."""
    def loss(p, ids, piece_ids):
        logits = model.apply({"params": p}, ids, piece_ids=piece_ids, deterministic=False,
                             rngs={"dropout": jax.random.PRNGKey(3)})
        return jnp.sum(jnp.where((piece_ids != 0)[..., None], logits, 0.0) ** 2)

    if mesh is None:
        return jax.jit(jax.value_and_grad(loss))(params, ids, piece_ids), None

    def on_mesh(p, ids, piece_ids):
        with activation_sharding(mesh):
            return jax.value_and_grad(loss)(p, ids, piece_ids)

    jaxpr = str(jax.make_jaxpr(on_mesh)(params, ids, piece_ids))
    step = jax.jit(on_mesh, in_shardings=(shardings, batch_sharding(mesh), batch_sharding(mesh)))
    return step(jax.device_put(params, shardings), ids, piece_ids), jaxpr


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
def test_pallas_kernel_runs_per_shard_on_a_mesh():
    """On a (data 2, fsdp 2, tensor 2) mesh the Toeplitz kernel runs inside shard_map on each device's rows and
    heads (a Pallas call is opaque to XLA's partitioner), with the dropout keys of its global rows: loss and every
    gradient (the table's summed over devices) equal one device's."""
    batch = 8
    cfg = tiny_config(dict(kind="tisa"), attention_impl="pallas", vocab_size=64, attention_dropout=0.2, num_layers=1)
    model = BertForMaskedLM(cfg)
    ids = jax.random.randint(jax.random.PRNGKey(0), (batch, 16), 1, cfg.vocab_size)
    piece_ids = jnp.ones((batch, 16), jnp.int32).at[1, 6:].set(2).at[0, 10:].set(0)  # packed pieces; padding
    boxed = model.init(jax.random.PRNGKey(1), ids)
    params = flax.linen.unbox(boxed["params"])
    (want_loss, want), _ = pallas_loss_and_grads(model, params, ids, piece_ids)
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    (got_loss, got), jaxpr = pallas_loss_and_grads(model, params, ids, piece_ids, mesh,
                                                   logical_sharding(boxed["params"], mesh))
    assert "shard_map" in jaxpr
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
    scale = max(float(np.abs(x).max()) for x in jax.tree.leaves(want))
    for path, g in jax.tree_util.tree_leaves_with_path(got):
        w = dict(jax.tree_util.tree_leaves_with_path(want))[path]
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * scale, err_msg=jax.tree_util.keystr(path))


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
def test_per_shard_maps_only_what_the_mesh_divides():
    """per_shard: fn on each device's block under a mesh; a mesh axis that does not divide an argument splits
    nothing (the other axes stay split, the same in every spec); fn itself outside a mesh or when nothing splits."""
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    names = dict(x=("batch", "heads"), w=(None,))

    def fn(x, w):
        return x * jnp.sum(w)

    def run(x):
        with activation_sharding(mesh):
            return per_shard(fn, dict(x=x, w=jnp.arange(3.0)), names, ("batch", "heads"))

    batch, heads = ("data", "fsdp"), "tensor"
    for shape, split in (((8, 4), P(batch, heads)), ((6, 4), P(None, heads)), ((8, 3), P(batch, None)),
                         ((6, 3), None)):
        x = jnp.ones(shape)
        maps = [e for e in jax.make_jaxpr(run)(x).jaxpr.eqns if e.primitive.name == "shard_map"]
        if split is None:
            assert not maps, shape
        else:
            (w_spec, x_spec), (out_spec,) = maps[0].params["in_specs"], maps[0].params["out_specs"]
            assert (x_spec, out_spec, w_spec) == (split, split, P(None)), (shape, maps[0].params)
        # a jit given no shardings compiles too (shard_map gets the concrete mesh)
        np.testing.assert_allclose(jax.jit(run)(x), 3.0 * np.ones(shape))
        # gradients: of split arguments, of the replicated one (summed over devices), and of outputs that a
        # dropped axis computes redundantly (their cotangents scaled by shard_map's transpose)
        x, w, ct = (jax.random.normal(jax.random.PRNGKey(i), s) for i, s in enumerate((shape, (3,), shape)))

        def loss(x, w, split):
            with activation_sharding(mesh) if split else contextlib.nullcontext():
                return jnp.sum(ct * per_shard(lambda x, w: jnp.sin(x) * w.sum(), dict(x=x, w=w), names,
                                              ("batch", "heads")))

        grads = jax.grad(loss, argnums=(0, 1))
        split = jax.jit(functools.partial(grads, split=True))(x, w)
        for got, want in zip(split, jax.jit(functools.partial(grads, split=False))(x, w)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=str(shape))
    assert "shard_map" not in str(jax.make_jaxpr(lambda x: per_shard(fn, dict(x=x, w=x[0]), names,
                                                                     ("batch", "heads")))(jnp.ones((8, 4))))


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
def test_sharded_step_gathers_weights_not_activations():
    """The compiled gradient step on a (data 2, fsdp 2, tensor 2) mesh all-gathers parameters only: no all-gather
    returns an array with the sequence axis (T = 20, a size no parameter has). The token look-up used to keep the
    table's fsdp-split features, gather the whole batch's ids and reshard [B, T, d] ("involuntary full
    rematerialization")."""
    import re

    cfg = tiny_config(dict(kind="tisa"), vocab_size=64)
    model = BertForMaskedLM(cfg)
    ids = jax.random.randint(jax.random.PRNGKey(0), (8, 20), 1, cfg.vocab_size)
    boxed = model.init(jax.random.PRNGKey(1), ids)
    mesh = make_mesh(data=2, fsdp=2, tensor=2)

    def loss(p, ids):
        with activation_sharding(mesh):
            return jnp.sum(model.apply({"params": p}, ids) ** 2)

    shardings = logical_sharding(boxed["params"], mesh)
    step = jax.jit(jax.grad(loss), in_shardings=(shardings, batch_sharding(mesh)))
    hlo = step.lower(flax.linen.unbox(boxed["params"]), ids).compile().as_text()
    gathered = re.findall(r"= \w+\[([\d,]*)\]\S* all-gather(?:-start)?\(", hlo)
    assert gathered  # the fsdp weights are gathered
    assert not [dims for dims in gathered if "20" in dims.split(",")], gathered


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
def test_sizes_the_mesh_does_not_divide_stay_whole(caplog):
    """A vocabulary of 63 on tensor = 2 (a tokenizer trained on a small corpus gives such sizes): the table keeps
    its vocab axis whole (one logged line), features still over fsdp; the sharded forward equals one device's."""
    assert fit_spec(jax.sharding.PartitionSpec("tensor", "fsdp"), (63, 32), dict(tensor=2, fsdp=2)) == \
        jax.sharding.PartitionSpec(None, "fsdp")
    assert fit_spec(jax.sharding.PartitionSpec(("data", "fsdp")), (6, 4), dict(data=2, fsdp=2)) == \
        jax.sharding.PartitionSpec(None, None)
    cfg = tiny_config(dict(kind="tisa"), vocab_size=63)
    model = BertForMaskedLM(cfg)
    ids = jax.random.randint(jax.random.PRNGKey(0), (8, 16), 1, cfg.vocab_size)
    boxed = model.init(jax.random.PRNGKey(1), ids)
    params = flax.linen.unbox(boxed["params"])
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    with caplog.at_level("WARNING", logger="jaxpos.sharding"):
        shardings = logical_sharding(boxed["params"], mesh)
    assert "stay whole" in caplog.text and "token_embed" in caplog.text
    table = shardings["bert"]["token_embed"]["embedding"]
    assert table.spec == jax.sharding.PartitionSpec(None, "fsdp")

    def forward(p, x):
        with activation_sharding(mesh):
            return model.apply({"params": p}, x)

    got = jax.jit(forward, in_shardings=(shardings, batch_sharding(mesh)))(jax.device_put(params, shardings), ids)
    np.testing.assert_allclose(got, model.apply({"params": params}, ids), rtol=1e-5, atol=1e-5)
