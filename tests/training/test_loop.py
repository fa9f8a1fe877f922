"""The shared training loop: kill-and-resume equality, NaN stop (never checkpointing a non-finite state),
corrupt-checkpoint fallback, accumulation."""

import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxpos.training import loop
from jaxpos.training.loop import TrainingDiverged, all_finite
from jaxpos.training.optim import make_optimizer
from tests.training import synthetic

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def leaves(state):
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(state.params))]


def test_loss_falls_on_learnable_data(tmp_path):
    result = synthetic.run(str(tmp_path), 80, checkpoint_every=100)
    unigram_entropy = np.log(synthetic.VOCAB - 5)  # targets are uniform over the 35 non-special tokens
    assert result.final_metrics["loss"] < unigram_entropy - 0.4


@pytest.mark.slow  # test_multiprocess.py kills a training process and resumes it to the same parameters
def test_sigkill_and_resume_reaches_the_same_parameters(tmp_path):
    steps = 24
    reference = synthetic.run(str(tmp_path / "straight"), steps, checkpoint_every=4)
    workdir = tmp_path / "killed"
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=jax.config.jax_compilation_cache_dir or "",
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5")
    proc = subprocess.Popen([sys.executable, "-m", "tests.training.synthetic", str(workdir), str(steps), "4"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    # Kill it as soon as a checkpoint past the first exists, while it is still training.
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        done = [d for d in os.listdir(workdir / "checkpoints")] if (workdir / "checkpoints").exists() else []
        if any(d.isdigit() and int(d) >= 8 for d in done):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed:\n" + proc.stdout.read()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    resumed = synthetic.run(str(workdir), steps, checkpoint_every=4)
    assert resumed.resumed_from is not None and 8 <= resumed.resumed_from < steps
    for a, b in zip(leaves(reference.state), leaves(resumed.state)):
        # bit for bit: the killed process compiled the same step (same config, flags and precision; synthetic.py)
        np.testing.assert_array_equal(a, b)


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    with pytest.raises(TrainingDiverged, match="loss is nan at step 8.*last good checkpoint is step 5"):
        synthetic.run(str(tmp_path), 20, checkpoint_every=5, poison_at=7)
    assert sorted(int(d) for d in os.listdir(tmp_path / "checkpoints") if d.isdigit()) == [5]


def test_corrupt_latest_checkpoint_falls_back_to_the_previous(tmp_path, capsys):
    synthetic.run(str(tmp_path), 10, checkpoint_every=5)
    latest = tmp_path / "checkpoints" / "10"
    for root, _, files in os.walk(latest):
        for name in files:
            with open(os.path.join(root, name), "wb") as f:
                f.write(b"\x00garbage")
    resumed = synthetic.run(str(tmp_path), 10, checkpoint_every=5)
    assert resumed.resumed_from == 5
    assert "checkpoint step 10" in capsys.readouterr().out


def test_a_checkpoint_of_another_shape_is_refused_and_left_in_place(tmp_path, monkeypatch):
    """A whole checkpoint of another model saved without its model config (as older jaxpos did) is refused when
    the Trainer is built, naming the first difference; it is not a corrupt step to move aside."""
    import orbax.checkpoint as ocp

    from jaxpos.config import model_config
    from jaxpos.config.run import run_config
    from jaxpos.models import BertForMaskedLM
    from jaxpos.sharding import make_mesh
    from jaxpos.training.checkpoint import _shapes
    from jaxpos.training.mlm import MaskedLMTask

    monkeypatch.setattr(loop, "model_config_dict", lambda model: None)  # checkpoints without their model config
    synthetic.run(str(tmp_path), 5, checkpoint_every=5)

    def trainer(mlp_dim):
        c = synthetic.config(10)
        c.model.mlp_dim = mlp_dim
        return loop.Trainer(run_config(c, task="mlm").train, str(tmp_path),
                            MaskedLMTask(BertForMaskedLM(model_config(c.model)), synthetic.SEQ), log=False,
                            mesh=make_mesh(devices=jax.devices()[:1]))

    same = trainer(64)
    saved = _shapes(ocp.PyTreeCheckpointHandler().metadata(same.checkpointer.directory / "5" / "state"))
    assert saved == _shapes(same.abstract_state)  # the same names and shapes for the same state
    same.close()
    with pytest.raises(ValueError, match=r"checkpoint step 5 .* was saved for another model \(opt_state/.*"
                                         r"mlp/wi/bias is shape \(64,\) in the checkpoint, shape \(48,\) in "
                                         r"this run\)"):
        trainer(48)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["5"] and not (tmp_path / "checkpoints_corrupt").exists()


def test_gradient_accumulation_matches_one_large_batch(tmp_path):
    c1 = synthetic.config(3)
    c1.model.dropout = c1.model.attention_dropout = 0.0
    from jaxpos.config.run import run_config
    from jaxpos.models import BertForMaskedLM
    from jaxpos.training.loop import Trainer
    from jaxpos.training.mlm import MaskedLMTask

    results = []
    for accum in (1, 4):
        c = synthetic.config(3, checkpoint_every=100, accum=accum)
        c.model.dropout = c.model.attention_dropout = 0.0
        run = run_config(c, task="mlm")
        trainer = Trainer(run.train, str(tmp_path / f"a{accum}"), MaskedLMTask(BertForMaskedLM(run.model),
                                                                                synthetic.SEQ), log=False)
        results.append(trainer.run(synthetic.SyntheticData()))
        trainer.close()
    for a, b in zip(leaves(results[0].state), leaves(results[1].state)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


def poisoned_at(inner: optax.GradientTransformation, poisoned_count: int) -> optax.GradientTransformation:
    """`inner`, except that its update number `poisoned_count` (from 0) is infinite."""

    def init(params):
        return inner.init(params), jnp.zeros([], jnp.int32)

    def update(updates, state, params=None):
        inner_state, count = state
        updates, inner_state = inner.update(updates, inner_state, params)
        scale = jnp.where(count == poisoned_count, jnp.inf, 1.0)
        return jax.tree.map(lambda u: u * scale, updates), (inner_state, count + 1)

    return optax.GradientTransformation(init, update)


def test_an_update_that_is_not_finite_is_never_checkpointed(tmp_path, monkeypatch):
    # The 10th update (a checkpoint step) makes the parameters infinite while its loss, computed before the
    # update, is finite: step 10 must not be saved, and the stop must name step 5 as the last good checkpoint.
    monkeypatch.setattr(loop, "make_optimizer", lambda tcfg: poisoned_at(make_optimizer(tcfg), 9))
    with pytest.raises(TrainingDiverged, match="parameters or optimizer state are not finite at step 10.*"
                                               "last good checkpoint is step 5"):
        synthetic.run(str(tmp_path), 20, checkpoint_every=5)
    assert sorted(int(d) for d in os.listdir(tmp_path / "checkpoints") if d.isdigit()) == [5]
    restored = synthetic.run(str(tmp_path), 5, checkpoint_every=5)  # resumes from step 5, trains nothing
    assert restored.resumed_from == 5
    assert all(np.isfinite(leaf).all() for leaf in leaves(restored.state))


def test_all_finite_flags_any_non_finite_floating_leaf():
    tree = {"a": np.ones((2, 3), np.float32), "b": np.arange(3), "c": np.zeros(4, np.float32)}
    assert float(all_finite(tree)) == 1.0
    for value in (np.nan, np.inf, -np.inf):
        tree["c"][1] = value
        assert float(all_finite(tree)) == 0.0


def test_batches_made_ahead_train_the_same_and_checkpoint_the_position_of_the_last_one_taken(tmp_path):
    """With train.prefetch_batches=2 a background thread makes batches ahead of the step: the run equals the one
    that makes each in turn, and each checkpoint saves the data position after the last batch a step took, not
    after the ones made ahead; an error of the data iterator stops the run where its batch would have been taken."""
    import json

    ahead = synthetic.run(str(tmp_path / "ahead"), 10, checkpoint_every=5, prefetch=2)
    in_turn = synthetic.run(str(tmp_path / "in_turn"), 10, checkpoint_every=5, prefetch=0)
    for a, b in zip(leaves(ahead.state), leaves(in_turn.state)):
        np.testing.assert_array_equal(a, b)  # the same compiled step on the same batches: only the thread differs
    for step in (5, 10):
        with open(tmp_path / "ahead" / "checkpoints" / str(step) / "data" / "metadata") as f:
            assert json.load(f)["index"] == step

    class Failing(synthetic.SyntheticData):
        def __next__(self):
            if self.index == 3:
                raise ValueError("the corpus shard 3 is unreadable")
            return super().__next__()

    with pytest.raises(ValueError, match="shard 3 is unreadable"):
        synthetic.run(str(tmp_path / "failing"), 10, checkpoint_every=100, prefetch=2, data=Failing())
