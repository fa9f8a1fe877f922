"""Seeds trained at once (a leading seed axis, the step vmapped over it) against the same seeds trained alone."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxpos.training.checkpoint import Checkpointer
from jaxpos.training.loop import SeedRun, Trainer, TrainingDiverged
from tests.training import synthetic

STEPS = 6


def assert_same_params(a, b, atol=2e-5):
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=atol,
                                   err_msg=jax.tree_util.keystr(path))


def largest_difference(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(jax.tree.leaves(a),
                                                                                  jax.tree.leaves(b)))


@pytest.mark.parametrize("kind", ["tisa", "diet_abs"])
def test_a_seed_trained_in_a_batch_equals_it_trained_alone(tmp_path, kind):
    """Initialisation, data order, masking and dropout are each seed's own: the batch changes nothing but the
    program (dropout 0.1 in both)."""
    batched = synthetic.run_seeds({3: str(tmp_path / "s3"), 7: str(tmp_path / "s7")}, STEPS, checkpoint_every=3,
                                  kind=kind)
    alone = [synthetic.run(str(tmp_path / f"alone{seed}"), STEPS, checkpoint_every=3, kind=kind, seed=seed)
             for seed in (3, 7)]
    for in_batch, by_itself in zip(batched, alone):
        assert int(in_batch.state.step) == STEPS
        assert_same_params(in_batch.state.params, by_itself.state.params)
        assert in_batch.final_metrics["loss"] == pytest.approx(by_itself.final_metrics["loss"], rel=1e-5)
    # the tolerance tells the seeds apart: a batch that mixed them up would fail
    assert largest_difference(alone[0].state.params, alone[1].state.params) > 100 * 2e-5


def test_each_seed_checkpoints_alone_and_a_stopped_batch_resumes_as_if_straight(tmp_path):
    straight = synthetic.run_seeds({0: str(tmp_path / "a0"), 1: str(tmp_path / "a1")}, STEPS, checkpoint_every=3)
    workdirs = {0: str(tmp_path / "b0"), 1: str(tmp_path / "b1")}
    synthetic.run_seeds(workdirs, STEPS, checkpoint_every=3, stop_at=3)
    resumed = synthetic.run_seeds(workdirs, STEPS, checkpoint_every=3)
    assert [r.resumed_from for r in resumed] == [3, 3]
    for a, b in zip(straight, resumed):
        assert_same_params(a.state.params, b.state.params, atol=1e-6)
    # a seed's checkpoints are a plain run's: the seed alone resumes from them (nothing left to train)
    alone = synthetic.run(workdirs[1], STEPS, checkpoint_every=3, seed=1)
    assert alone.resumed_from == STEPS
    assert_same_params(alone.state.params, resumed[1].state.params, atol=0)  # restored from the batch's file: exact
    checkpointer = Checkpointer(f"{workdirs[0]}/checkpoints", read_only=True)
    try:
        assert checkpointer.steps() == [3, 6]
    finally:
        checkpointer.close()


def test_seeds_resume_from_the_newest_step_they_all_saved(tmp_path):
    """A batch stopped while saving: one seed has a step the other lacks; both resume from the step they share,
    and the step one of them already holds is kept."""
    workdirs = {0: str(tmp_path / "c0"), 1: str(tmp_path / "c1")}
    synthetic.run_seeds(workdirs, 5, checkpoint_every=3, stop_at=3)
    synthetic.run(workdirs[0], 5, checkpoint_every=4, seed=0, stop_at=4)  # seed 0 alone saves step 4
    resumed = synthetic.run_seeds(workdirs, 5, checkpoint_every=4)
    assert [r.resumed_from for r in resumed] == [3, 3]
    straight = synthetic.run(str(tmp_path / "straight1"), 5, checkpoint_every=4, seed=1)
    assert_same_params(resumed[1].state.params, straight.state.params)


def test_a_diverging_seed_stops_the_batch_and_is_named(tmp_path):
    workdirs = {0: str(tmp_path / "d0"), 1: str(tmp_path / "d1")}
    with pytest.raises(TrainingDiverged, match=r"for seed 1 .* at step 3; .*step 2 in .*d1"):
        synthetic.run_seeds(workdirs, STEPS, checkpoint_every=2, poison={1: 2})


def test_seed_runs_are_checked(tmp_path):
    run = synthetic.run_config(synthetic.config(2), task="mlm")
    task = synthetic.MaskedLMTask(synthetic.BertForMaskedLM(run.model), synthetic.SEQ)
    with pytest.raises(ValueError, match="each seed trains once, in its own workdir"):
        Trainer(run.train, [SeedRun(0, str(tmp_path)), SeedRun(1, str(tmp_path))], task, log=False)
    trainer = Trainer(run.train, [SeedRun(0, str(tmp_path / "e0")), SeedRun(1, str(tmp_path / "e1"))], task,
                      log=False, mesh=synthetic.one_device())
    try:
        with pytest.raises(ValueError, match="call run_seeds"):
            trainer.run(synthetic.SyntheticData())
        with pytest.raises(ValueError, match="2 seed"):
            trainer.run_seeds([synthetic.SyntheticData()])
    finally:
        trainer.close()
    assert not (tmp_path / "e0").exists()


def test_the_initial_state_is_saved_as_step_0_when_asked(tmp_path):
    """train.checkpoint_initial: a fresh run's initialisation is checkpoint 0 (the reproduction's reference for its
    analyses over training); the batch and the lone run save the same step 0 for a seed."""
    from jaxpos.config.run import run_config
    from jaxpos.models import BertForMaskedLM
    from jaxpos.training.checkpoint import abstract_like
    from jaxpos.training.mlm import MaskedLMTask

    c = synthetic.config(4, checkpoint_every=4)
    c.train.checkpoint_initial = True
    run = run_config(c, task="mlm")
    task = MaskedLMTask(BertForMaskedLM(run.model), synthetic.SEQ)
    trainer = Trainer(run.train, [SeedRun(0, str(tmp_path / "a0")), SeedRun(1, str(tmp_path / "a1"))], task,
                      log=False, mesh=synthetic.one_device())
    try:
        trainer.run_seeds([synthetic.SyntheticData(0), synthetic.SyntheticData(1)])
        initial = trainer.seed_states(trainer._init(jax.numpy.stack([jax.random.PRNGKey(0), jax.random.PRNGKey(1)])))
    finally:
        trainer.close()
    for k in (0, 1):
        checkpointer = Checkpointer(str(tmp_path / f"a{k}" / "checkpoints"), read_only=True)
        try:
            assert checkpointer.steps() == [0, 4]
            state, position = checkpointer.restore(0, abstract_like(trainer.abstract_state,
                                                                    trainer.seed_state_shardings))
        finally:
            checkpointer.close()
        assert position == {"seed": k, "index": 0} and int(state.step) == 0
        assert_same_params(state.params, initial[k].params, atol=0)  # the same init program and keys, read back
