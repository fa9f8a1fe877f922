"""Checkpoint directories: local paths are made absolute as before; URLs (gs://, s3://) reach orbax unchanged,
as etils.epath paths. Only the pass-through is tested here; tests/test_run.py restores runs from a fake gs://
bucket (tests/helpers.py's `fake_gcs`, which also stands in for orbax's own routes to a bucket)."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest
from etils import epath

from jaxpos.training import checkpoint
from jaxpos.training.checkpoint import Checkpointer, checkpoint_path


def test_local_paths_are_absolute_and_urls_unchanged(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert checkpoint_path("runs/a/checkpoints") == epath.Path(tmp_path / "runs/a/checkpoints")
    for url in ("gs://bucket/runs/a/checkpoints", "s3://bucket/a/checkpoints"):
        path = checkpoint_path(url)
        assert isinstance(path, epath.Path) and os.fspath(path) == url
        assert os.fspath(path / "3") == url + "/3"  # step directories stay under the URL


def test_a_url_directory_reaches_orbax_unchanged(monkeypatch):
    seen = {}

    class FakeManager:  # stands in for orbax.checkpoint.CheckpointManager, which would contact the bucket
        def __init__(self, directory, options=None, item_names=None):
            seen.update(directory=directory, items=item_names)

    monkeypatch.setattr(checkpoint.ocp, "CheckpointManager", FakeManager)
    ckpt = Checkpointer("gs://bucket/runs/tiny/checkpoints")
    assert os.fspath(seen["directory"]) == "gs://bucket/runs/tiny/checkpoints"
    assert os.fspath(ckpt.directory) == "gs://bucket/runs/tiny/checkpoints"
    assert seen["items"] == ("state", "data", "model")


def test_a_local_checkpoint_round_trips_with_its_model_config(tmp_path):
    state = {"w": jax.numpy.arange(6.0).reshape(2, 3), "step": jax.numpy.asarray(3)}
    ckpt = Checkpointer(os.path.relpath(tmp_path / "checkpoints"), async_save=False)
    ckpt.save(3, state, {"step": 3}, {"d_model": 8, "position": {"kind": "tisa"}})
    ckpt.close()
    ckpt = Checkpointer(str(tmp_path / "checkpoints"), read_only=True)
    assert ckpt.steps() == [3] and ckpt.saved_model_config() == (3, {"d_model": 8, "position": {"kind": "tisa"}})
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    step, restored, data = ckpt.restore_latest(abstract)
    np.testing.assert_array_equal(restored["w"], state["w"])
    assert (step, data) == (3, {"step": 3})
    with pytest.raises(ValueError, match=r"model.position.kind: 'tisa' in the checkpoint, 't5' in this run"):
        ckpt.check_model_config({"d_model": 8, "position": {"kind": "t5"}})
    ckpt.check_model_config({"d_model": 8, "position": {"kind": "tisa"}, "dropout": 0.3})  # may change
    # fields newer than the checkpoint read as their defaults
    ckpt.check_model_config({"d_model": 8, "position": {"kind": "tisa", "rope": {"local_base": None}}, "mlp": "plain"})
    with pytest.raises(ValueError, match=r"model.mlp: 'plain' in the checkpoint, 'geglu' in this run"):
        ckpt.check_model_config({"d_model": 8, "position": {"kind": "tisa"}, "mlp": "geglu"})
    ckpt.close()


def test_a_resume_compares_the_options_of_its_own_mechanism_only(tmp_path):
    """A RoPE run saved beside every kind's options block (as older runs were) resumes after an edit of T5's, and
    is refused after an edit of its own."""
    import jaxpos.positions  # noqa: F401 - the registry names the kinds whose blocks a resume leaves out

    saved = {"d_model": 8, "position": {"kind": "rope", "rope": {"base": 10_000.0}, "t5": {"num_buckets": 32}}}
    ckpt = Checkpointer(str(tmp_path / "checkpoints"), async_save=False)
    ckpt.save(1, {"w": jax.numpy.zeros(2)}, {"step": 1}, saved)
    ckpt.close()
    ckpt = Checkpointer(str(tmp_path / "checkpoints"), read_only=True)
    ckpt.check_model_config({"d_model": 8, "position": {"kind": "rope", "rope": {"base": 10_000.0},
                                                        "t5": {"num_buckets": 64}}})
    ckpt.check_model_config({"d_model": 8, "position": {"kind": "rope", "rope": {"base": 10_000.0}}})
    with pytest.raises(ValueError, match=r"model.position.rope.base: 10000.0 in the checkpoint, 500.0 in this run"):
        ckpt.check_model_config({"d_model": 8, "position": {"kind": "rope", "rope": {"base": 500.0}}})
    ckpt.close()
