"""Scanned layers and rematerialisation change how the stack is compiled, never what it computes: the same loss
and gradients as the unscanned, unrematerialised model from the same parameters, for every mechanism."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.core import meta

from jaxpos.models import BertForMaskedLM
from jaxpos.models.layout import to_scanned, to_unscanned
from tests.helpers import VARIANTS, tiny_config

SEQ = 16


def batch(seed: int = 0):
    rng = np.random.default_rng(seed)
    ids = jnp.asarray(rng.integers(5, 61, (2, SEQ)))
    pieces = jnp.asarray([[1] * 10 + [2] * 6, [1] * 13 + [0] * 3])  # packed pieces and padding
    return ids, dict(piece_ids=pieces, token_types=jnp.asarray(rng.integers(0, 2, (2, SEQ))))


def loss_and_grads(cfg, params):
    ids, inputs = batch()
    targets = jnp.roll(ids, 1, axis=1)

    def loss(p):
        logits = BertForMaskedLM(cfg).apply({"params": p}, ids, **inputs)
        log_probs = jax.nn.log_softmax(logits)
        return -jnp.take_along_axis(log_probs, targets[..., None], -1).mean()

    return jax.jit(jax.value_and_grad(loss))(params)


def assert_trees_close(a, b, rtol=2e-5, atol=2e-6):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol,
                                   err_msg=jax.tree_util.keystr(path))


def assert_scanned_equals_unscanned(cfg, scanned_cfg):
    """`scanned_cfg`'s scanned stack against `cfg`'s unscanned one from the same initialisation: the layout of its
    own initialisation, the loss and the gradients. Returns (scanned parameters, loss, gradients)."""
    ids, inputs = batch()
    params = meta.unbox(BertForMaskedLM(cfg).init(jax.random.PRNGKey(0), ids, **inputs)["params"])
    scanned = to_scanned(params, cfg.scan_group)
    # the scanned model builds the same tree: its own initialisation has the converted layout
    init = meta.unbox(BertForMaskedLM(scanned_cfg).init(jax.random.PRNGKey(0), ids, **inputs)["params"])
    assert jax.tree.map(jnp.shape, init) == jax.tree.map(jnp.shape, scanned)
    loss, grads = loss_and_grads(cfg, params)
    scanned_loss, scanned_grads = loss_and_grads(scanned_cfg, scanned)
    assert float(scanned_loss) == pytest.approx(float(loss), rel=1e-6)
    assert_trees_close(to_unscanned(scanned_grads), grads)
    assert_trees_close(to_unscanned(scanned), params, rtol=0, atol=0)  # the conversion round-trips exactly
    return scanned, loss, grads


@pytest.mark.parametrize("name,position", VARIANTS, ids=[name for name, _ in VARIANTS])
def test_scanned_and_rematerialised_equal_unscanned(name, position):
    cfg = tiny_config(position, num_layers=3)
    scanned_cfg = dataclasses.replace(cfg, scan_layers=True)
    scanned, loss, grads = assert_scanned_equals_unscanned(cfg, scanned_cfg)
    # and rematerialised (every policy for one mechanism below): the same gradients
    remat_loss, remat_grads = loss_and_grads(dataclasses.replace(scanned_cfg, remat="full"), scanned)
    assert float(remat_loss) == pytest.approx(float(loss), rel=1e-6)
    assert_trees_close(to_unscanned(remat_grads), grads)


@pytest.mark.parametrize("policy", ["full", "save_dots", "save_projections"])
@pytest.mark.parametrize("scan", [False, True])
def test_rematerialised_gradients_equal_the_plain_ones(policy, scan):
    cfg = dataclasses.replace(tiny_config(dict(kind="tisa"), num_layers=3), scan_layers=scan)
    ids, inputs = batch()
    params = meta.unbox(BertForMaskedLM(cfg).init(jax.random.PRNGKey(0), ids, **inputs)["params"])
    loss, grads = loss_and_grads(cfg, params)
    remat_loss, remat_grads = loss_and_grads(dataclasses.replace(cfg, remat=policy), params)
    assert float(remat_loss) == pytest.approx(float(loss), rel=1e-6)
    assert_trees_close(remat_grads, grads)


def test_remat_recomputes_what_it_does_not_save():
    """The residuals the backward pass keeps (the leaves of jax.vjp's closure): fewer under each policy."""
    cfg = tiny_config(dict(kind="tisa"), num_layers=2)
    ids, inputs = batch()
    params = meta.unbox(BertForMaskedLM(cfg).init(jax.random.PRNGKey(0), ids, **inputs)["params"])

    def saved(policy):
        model = BertForMaskedLM(dataclasses.replace(cfg, remat=policy))
        _, vjp = jax.vjp(lambda p: model.apply({"params": p}, ids, **inputs), params)
        return sum(np.size(x) for x in jax.tree.leaves(vjp) if hasattr(x, "shape"))

    sizes = {policy: saved(policy) for policy in ("none", "save_projections", "full")}
    assert sizes["full"] < sizes["save_projections"] < sizes["none"], sizes


def test_bad_layouts_are_refused_in_one_line():
    with pytest.raises(ValueError, match="model.remat='some'; choose one of none, full, save_dots, save_projections"):
        tiny_config(dict(kind="tisa"), remat="some")
    with pytest.raises(ValueError, match="scan_layers stacks each layer's own parameters; with share_layers"):
        tiny_config(dict(kind="tisa"), scan_layers=True, share_layers=True)
    with pytest.raises(ValueError, match="no stack to scan"):
        to_scanned({"layer_0": {"w": jnp.ones(2)}, "layer_2": {"w": jnp.ones(2)}})


def test_a_scanned_run_reads_and_exports_as_unscanned_and_resumes_under_another_policy(tmp_path):
    """`jaxpos train` with scanned, rematerialised layers; the run reads as an unscanned model (the same outputs
    from the converted parameters), exports for Hugging Face, and resumes with another remat policy."""
    from jaxpos import cli
    from jaxpos.run import Run
    from jaxpos.training.checkpoint import abstract_like, read_run_params
    from tests.helpers import SMALL_MLM, TINY_MLM_CONFIG, one_device_training

    workdir = str(tmp_path / "scanned")
    flags = [*SMALL_MLM, "--config.model.num_layers=2", "--config.model.position.kind=absolute",
             "--config.train.num_steps=2", "--config.train.checkpoint_every=2", "--config.train.eval_every=2"]
    with one_device_training():
        assert cli.main(["train", "--config", TINY_MLM_CONFIG, "--workdir", workdir, *flags,
                         "--config.model.scan_layers=True", "--config.model.remat=full"]) == 0
        assert cli.main(["train", "--config", TINY_MLM_CONFIG, "--workdir", workdir, *flags,
                         "--config.model.scan_layers=True", "--config.model.remat=save_dots",
                         "--config.train.num_steps=3"]) == 0  # resumed under another policy
    run = Run.open(workdir)
    assert run.config.model.scan_layers and not run.model_config.scan_layers
    step, params = run.params()
    assert step == 3 and {"layer_0", "layer_1"} <= set(params["bert"]["encoder"])
    scanned_cfg = dataclasses.replace(run.config.model, remat="none")
    model = BertForMaskedLM(scanned_cfg)
    ids, inputs = batch()
    ids = ids % scanned_cfg.vocab_size
    boxed = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), ids, **inputs))["params"]
    shardings = jax.tree.map(lambda _: jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0]), meta.unbox(boxed))
    _, raw = read_run_params(workdir, abstract_like(meta.unbox(boxed), shardings))
    np.testing.assert_allclose(np.asarray(BertForMaskedLM(run.model_config).apply({"params": params}, ids, **inputs)),
                               np.asarray(model.apply({"params": raw}, ids, **inputs)), rtol=1e-5, atol=1e-5)
    assert cli.main(["export", "--workdir", workdir, "--out", str(tmp_path / "hf"), "--format", "huggingface"]) == 0
    assert (tmp_path / "hf" / "config.json").exists()


@pytest.mark.parametrize("first,then", [(False, True), (True, False)], ids=["unscanned_then_scanned",
                                                                            "scanned_then_unscanned"])
def test_a_run_resumes_in_the_other_layout_as_if_it_had_not_changed(tmp_path, first, then):
    """Parameters, Adam's moments, step, RNG and data position convert as they restore; without dropout's stream
    (scanned layers split it per layer) the resumed run ends where a straight run in the first layout does."""
    from tests.training import synthetic

    def run(workdir, scan, stop_at=None):
        return synthetic.run(str(workdir), 6, checkpoint_every=3, kind="diet_rel", scan=scan, stop_at=stop_at,
                             dropout=0.0)

    straight = run(tmp_path / "straight", first)
    run(tmp_path / "switched", first, stop_at=3)
    resumed = run(tmp_path / "switched", then)
    assert resumed.resumed_from == 3 and int(resumed.state.step) == 6
    convert = to_unscanned if first is False else to_scanned
    assert_trees_close(convert(resumed.state.params), straight.state.params, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("kind", ["t5", "diet_abs", "fire"])
def test_a_scanned_encoder_decoder_equals_the_unscanned_one_and_decodes_with_its_cache(kind):
    """Both stacks scanned (the decoder's cross-attention and its key/value cache stacked on the layer axis):
    the same logits as the unscanned model, and cached one-token steps give the full pass's."""
    from jaxpos.models import EncoderDecoder
    from tests.models.test_decode import assert_cached_steps_match_full_pass

    cfg = tiny_config(dict(kind=kind), num_decoder_layers=2, cross_attention_position=kind == "t5")
    inputs = jax.random.randint(jax.random.PRNGKey(2), (2, 9), 1, cfg.vocab_size).at[1, 6:].set(0)
    targets = jax.random.randint(jax.random.PRNGKey(3), (2, 7), 1, cfg.vocab_size)
    params = meta.unbox(EncoderDecoder(cfg).init(jax.random.PRNGKey(4), inputs, targets)["params"])
    scanned_cfg = dataclasses.replace(cfg, scan_layers=True)
    np.testing.assert_allclose(np.asarray(EncoderDecoder(scanned_cfg).apply({"params": to_scanned(params)}, inputs,
                                                                            targets)),
                               np.asarray(EncoderDecoder(cfg).apply({"params": params}, inputs, targets)),
                               rtol=1e-5, atol=1e-5)
    assert_cached_steps_match_full_pass(scanned_cfg, to_scanned(params), inputs, targets, kind)


def test_scanned_layers_shard_over_a_mesh_as_unscanned_ones_do(tmp_path):
    """Two steps on a (data 2, fsdp 2, tensor 2) mesh of simulated devices equal two on one device; the layer
    axis stays whole and each stacked parameter is split as its layer's would be."""
    from jaxpos.config.run import run_config
    from jaxpos.sharding import make_mesh
    from jaxpos.training.loop import Trainer
    from jaxpos.training.mlm import MaskedLMTask
    from tests.training import synthetic

    if jax.device_count() < 8:
        pytest.skip("needs 8 (simulated) devices")
    run = run_config(synthetic.config(2, checkpoint_every=2, scan=True), task="mlm")
    results = []
    for name, mesh in (("one", make_mesh(devices=jax.devices()[:1])), ("mesh", make_mesh(2, 2, 2))):
        trainer = Trainer(run.train, str(tmp_path / name), MaskedLMTask(BertForMaskedLM(run.model), synthetic.SEQ),
                          log=False, mesh=mesh)
        try:
            results.append(trainer.run(synthetic.SyntheticData()))
            spec = trainer.state_shardings.params["bert"]["encoder"]["layers"]["layer"]["mlp"]["wi"]["kernel"].spec
            assert spec[0] is None  # the layer axis
        finally:
            trainer.close()
    assert spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
    assert_trees_close(results[1].state.params, results[0].state.params, rtol=1e-4, atol=1e-5)
