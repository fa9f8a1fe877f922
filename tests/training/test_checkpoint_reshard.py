"""Checkpoints across meshes and bad resumes: a state saved on one (data, fsdp, tensor) mesh restores onto other
mesh shapes, optimizer state included (across process counts: test_multiprocess.py); a run whose model config
differs from its checkpoint's, a mesh that does not fit the devices and a batch that does not divide over them
are refused before anything is traced or compiled, naming both sides."""

from __future__ import annotations

import contextlib
import dataclasses

import jax
import numpy as np
import pytest

from jaxpos.config import model_config
from jaxpos.config.run import MeshConfig, run_config
from jaxpos.models import BertForMaskedLM
from jaxpos.sharding import make_mesh
from jaxpos.training.checkpoint import abstract_like
from jaxpos.training.loop import Trainer
from jaxpos.training.mlm import MaskedLMTask
from tests.training import synthetic

needs_8 = pytest.mark.skipif(jax.device_count() != 8, reason="needs 8 (simulated) devices")


def trainer(workdir, mesh_shape=None, **model):
    config = synthetic.config(10, kind=model.pop("kind", "tisa"))
    config.model.update(model)
    mesh = None
    if mesh_shape is not None:
        mesh = make_mesh(*mesh_shape, devices=jax.devices()[:int(np.prod(mesh_shape))])
    run = run_config(config, task="mlm")
    return Trainer(run.train, str(workdir), MaskedLMTask(BertForMaskedLM(run.model), synthetic.SEQ), log=False,
                   mesh=mesh)


def random_state(t: Trainer):
    """A state of `t`'s shapes with random values (every leaf distinct), placed by its shardings; no compilation."""
    rng = np.random.default_rng(0)
    leaves, treedef = jax.tree.flatten(t.abstract_state)
    values = [rng.standard_normal(x.shape).astype(x.dtype) if np.issubdtype(x.dtype, np.floating)
              else rng.integers(0, 1000, x.shape).astype(x.dtype) for x in leaves]
    return jax.device_put(jax.tree.unflatten(treedef, values), t.state_shardings)


@contextlib.contextmanager
def no_compilation():
    """Fails if anything is lowered for compilation inside the block."""
    events = []
    listener = lambda event, duration, **kwargs: events.append(event)  # noqa: E731
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert "/jax/core/compile/jaxpr_to_mlir_module_duration" not in events


@pytest.mark.slow  # orbax's first save on 8 devices costs ~8 s; test_multiprocess.py restores across meshes by default
@needs_8
def test_a_checkpoint_restores_onto_other_meshes_with_the_optimizer_state(tmp_path):
    saver = trainer(tmp_path, (2, 2, 2))
    state = random_state(saver)
    saver.checkpointer.save(7, state, {"step": 7}, saver.model_config)
    saver.close()
    want = jax.device_get(state)
    for shape in ((8, 1, 1), (1, 2, 4)):  # (1, 8, 1) and (1, 1, 1): test_multiprocess.py
        t = trainer(tmp_path, shape)
        step, restored, data_state = t.checkpointer.restore_latest(abstract_like(t.abstract_state, t.state_shardings))
        t.close()
        assert step == 7 and data_state == {"step": 7}
        for (path, got), expected in zip(jax.tree_util.tree_flatten_with_path(restored)[0], jax.tree.leaves(want)):
            assert got.sharding.mesh.devices.shape == shape, jax.tree_util.keystr(path)
            # read back from the file it was written to: exact
            np.testing.assert_array_equal(np.asarray(got), expected, err_msg=f"{shape} {jax.tree_util.keystr(path)}")
        # The optimizer moments are sharded like their parameters on the new mesh.
        kernel = ["bert", "encoder", "layer_0", "mlp", "wi", "kernel"]
        moments = [leaf for p, leaf in jax.tree_util.tree_flatten_with_path(restored.opt_state)[0]
                   if [getattr(k, "key", None) for k in p[-6:]] == kernel]
        assert len(moments) == 2  # Adam's mu and nu
        param = restored.params
        for k in kernel:
            param = param[k]
        assert all(m.sharding == param.sharding for m in moments)


def test_a_checkpoint_of_another_model_is_refused_before_compiling(tmp_path):
    saver = trainer(tmp_path, (1, 1, 1))
    state = random_state(saver)
    saver.checkpointer.save(4, state, {"step": 4}, saver.model_config)
    saver.close()
    with no_compilation():
        with pytest.raises(ValueError) as err:
            trainer(tmp_path, (1, 1, 1), kind="t5", num_layers=3)
    message = str(err.value)
    assert "checkpoint step 4" in message and str(tmp_path / "checkpoints") in message
    assert "model.position.kind: 'tisa' in the checkpoint, 't5' in this run" in message
    assert "model.num_layers: 2 in the checkpoint, 3 in this run" in message
    assert "d_model" not in message
    # How the model is computed may change on resume: the checkpoint of dropout 0.1 and attention 'auto' restores
    # into a run of dropout 0 on 'xla', whose own config is what its next checkpoints record.
    t = trainer(tmp_path, (1, 1, 1), dropout=0.0, attention_impl="xla")
    try:
        step, saved = t.checkpointer.saved_model_config()
        assert step == 4 and (saved["dropout"], saved["attention_impl"]) == (0.1, "auto")
        assert (t.model_config["dropout"], t.model_config["attention_impl"]) == (0.0, "xla")
        step, restored, data_state = t.checkpointer.restore_latest(abstract_like(t.abstract_state, t.state_shardings))
    finally:
        t.close()
    assert step == 4 and data_state == {"step": 4}
    # read back from the file it was written to: exact
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), jax.device_get(state))


@needs_8
def test_a_bad_mesh_or_batch_is_refused_before_compiling(tmp_path):
    config = synthetic.config(10)
    task = MaskedLMTask(BertForMaskedLM(model_config(config.model)), synthetic.SEQ)
    with no_compilation():
        run = run_config(config, task="mlm")
        with pytest.raises(ValueError, match=r"config.mesh data=3 x fsdp=2 x tensor=2 needs 12 devices, have 8"):
            Trainer(run.train, str(tmp_path), task, log=False, mesh=MeshConfig(data=3, fsdp=2, tensor=2))
        with pytest.raises(ValueError, match=r"config.mesh fsdp=3 x tensor=1 does not divide the devices: have 8"):
            Trainer(run.train, str(tmp_path), task, log=False, mesh=MeshConfig(data=-1, fsdp=3, tensor=1))
        # 8 data-parallel devices
        with pytest.raises(ValueError, match=r"global batch size 12 \(train.batch_size\) is not divisible by the 8 "
                                             r"data-parallel devices \(data x fsdp\)"):
            Trainer(dataclasses.replace(run.train, batch_size=12), str(tmp_path), task, log=False)
