"""The loop adds nothing to the step: a run through Trainer.run reaches the parameters of the same jitted step
applied by hand to the same batches (the same program on the same inputs, so exactly), for one seed and for seeds
trained at once; the hooks fire at their own cadence."""

import jax
import numpy as np

from jaxpos.config.run import run_config
from jaxpos.models import BertForMaskedLM
from jaxpos.training.loop import Every, SeedRun, Trainer
from jaxpos.training.mlm import MaskedLMTask
from tests.training import synthetic

STEPS = 5


def bare_steps(workdirs: dict[int, str]):
    """The Trainer's own jitted step over its seeds' SyntheticData, with no loop around it."""
    run = run_config(synthetic.config(STEPS, checkpoint_every=100), task="mlm")
    runs = [SeedRun(seed, workdir) for seed, workdir in workdirs.items()]
    trainer = Trainer(run.train, runs if len(runs) > 1 else runs[0].workdir,
                      MaskedLMTask(BertForMaskedLM(run.model), synthetic.SEQ), log=False, mesh=synthetic.one_device())
    try:
        state = trainer._init(trainer.seeds.init_keys())
        data = [synthetic.SyntheticData(seed) for seed in workdirs]
        for _ in range(STEPS):
            state, _ = trainer.train_step(state, trainer.global_batch([next(d) for d in data]))
        return trainer.seed_states(state)
    finally:
        trainer.close()


def assert_same(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_run_is_its_steps(tmp_path):
    looped = synthetic.run(str(tmp_path / "loop"), STEPS, checkpoint_every=100)
    [bare] = bare_steps({0: str(tmp_path / "bare")})
    assert_same(looped.state.params, bare.params)


def test_seeds_at_once_are_their_steps(tmp_path):
    looped = synthetic.run_seeds({0: str(tmp_path / "a"), 2: str(tmp_path / "b")}, STEPS, checkpoint_every=100)
    bare = bare_steps({0: str(tmp_path / "c"), 2: str(tmp_path / "d")})
    for run, state in zip(looped, bare):
        assert_same(run.state.params, state.params)


def test_a_cadence_fires_every_n_steps_and_at_the_last():
    due = Every(steps=4, last=10)
    assert [step for step in range(1, 11) if due(step)] == [4, 8, 10]


def test_a_hook_added_to_seeds_at_once_sees_each_seeds_own_state(tmp_path):
    """`add_hook(fn, every=2)`: after steps 2, 4 and the last (5), once per seed, with that seed's state alone (no
    seed axis), its returned metrics that seed's; the states it saw at the last step are the results'."""
    run = run_config(synthetic.config(STEPS, checkpoint_every=100), task="mlm")
    runs = [SeedRun(0, str(tmp_path / "a")), SeedRun(2, str(tmp_path / "b"))]
    trainer = Trainer(run.train, runs, MaskedLMTask(BertForMaskedLM(run.model), synthetic.SEQ), log=False,
                      mesh=synthetic.one_device())
    seen = []

    def hook(step, state):
        seen.append((step, int(state.step), state.params))
        return {"hook_calls": len(seen)}

    trainer.add_hook(hook, every=2)
    try:
        results = trainer.run_seeds([synthetic.SyntheticData(seed) for seed in (0, 2)])
    finally:
        trainer.close()
    assert [(step, count) for step, count, _ in seen] == [(2, 2), (2, 2), (4, 4), (4, 4), (5, 5), (5, 5)]
    for (_, _, params), result in zip(seen[-2:], results):
        assert_same(params, result.state.params)
    assert [r.eval_metrics["hook_calls"] for r in results] == [5, 6]
