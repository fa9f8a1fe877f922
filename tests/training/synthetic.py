"""A tiny masked-LM run on synthetic, learnable data: used by the loop tests (and runnable as a script, so a
test can SIGKILL it)."""

from __future__ import annotations

import dataclasses
import sys

import jax
import ml_collections
import numpy as np

from jaxpos.config.defaults import mesh_block, model_block, train_block
from jaxpos.config.run import run_config
from jaxpos.models import BertForMaskedLM
from jaxpos.sharding import make_mesh
from jaxpos.training.loop import SeedRun, Trainer
from jaxpos.training.mlm import MaskedLMTask

VOCAB, SEQ, BATCH = 40, 16, 8


class SyntheticData:
    """Rows of repeated bigrams; 15% of tokens chosen for prediction, half of them replaced by [MASK] (=4)
    and half kept, so a model learns fast from the kept ones and slowly (from the twin) for the masked ones.
    Batch k is a pure function of (seed, k)."""

    def __init__(self, seed: int = 0, poison_at: int | None = None):
        self.seed, self.index, self.poison_at = seed, 0, poison_at

    def __next__(self):
        rng = np.random.default_rng([self.seed, self.index])
        first = rng.integers(5, VOCAB, (BATCH, SEQ // 2))
        targets = np.repeat(first, 2, axis=1).astype(np.int32)  # each token predicts its twin
        weights = (rng.random((BATCH, SEQ)) < 0.15).astype(np.float32)
        if self.poison_at is not None and self.index == self.poison_at:
            weights[0, 0] = np.nan
        self.index += 1
        masked = (weights > 0) & (rng.random((BATCH, SEQ)) < 0.5)
        return dict(input_ids=np.where(masked, 4, targets).astype(np.int32), targets=targets,
                    mask_weights=weights, piece_ids=np.ones_like(targets), token_types=np.zeros_like(targets))

    def get_state(self):
        return {"seed": self.seed, "index": self.index}

    def set_state(self, state):
        self.seed, self.index = state["seed"], state["index"]


def config(num_steps: int, checkpoint_every: int = 5, accum: int = 1, kind: str = "tisa", scan: bool = False,
           randomized: int | None = None):
    c = ml_collections.ConfigDict()
    c.model = model_block(vocab_size=VOCAB, d_model=32, num_layers=2, num_heads=4, mlp_dim=64, max_length=SEQ,
                          dropout=0.1, attention_dropout=0.1, scan_layers=scan)
    c.model.position.kind = kind
    c.model.position.randomized_max_length = randomized
    c.data = ml_collections.ConfigDict(dict(seq_len=SEQ))
    c.train = train_block(num_steps=num_steps, batch_size=BATCH, learning_rate=3e-3, log_every=5,
                          checkpoint_every=checkpoint_every, eval_every=10_000, grad_accum_steps=accum,
                          async_checkpoints=True)
    c.mesh = mesh_block()
    return c


def run(workdir: str, num_steps: int, checkpoint_every: int = 5, poison_at=None, accum: int = 1, log=False,
        kind: str = "tisa", prefetch: int = 0, data=None, seed: int = 0, stop_at: int | None = None,
        scan: bool = False, dropout: float = 0.1, randomized: int | None = None):
    """A Trainer's run on SyntheticData (or `data`); `prefetch`: train.prefetch_batches; `seed`: train.seed and the
    data's; `stop_at`: ends there (the schedule still that of `num_steps`), as a run stopped there would; `scan`:
    model.scan_layers; `dropout`: the model's dropout and attention dropout; `randomized`: the model's
    position.randomized_max_length."""
    c = config(num_steps, checkpoint_every, accum, kind, scan, randomized)
    c.train.update(prefetch_batches=prefetch, seed=seed)
    c.model.update(dropout=dropout, attention_dropout=dropout)
    run = run_config(c, task="mlm")
    trainer = Trainer(run.train, workdir, MaskedLMTask(BertForMaskedLM(run.model), SEQ), log=log, mesh=one_device())
    stopping(trainer, stop_at)
    try:
        return trainer.run(SyntheticData(seed, poison_at=poison_at) if data is None else data)
    finally:
        trainer.close()


def run_seeds(workdirs: dict[int, str], num_steps: int, checkpoint_every: int = 5, kind: str = "tisa",
              poison: dict[int, int] | None = None, prefetch: int = 0, stop_at: int | None = None):
    """The seeds of `workdirs` ({seed: workdir}) trained at once, each on its SyntheticData(seed) (`poison`:
    {seed: the batch whose weight is NaN}): their TrainResults in order."""
    c = config(num_steps, checkpoint_every, kind=kind)
    c.train.prefetch_batches = prefetch
    run = run_config(c, task="mlm")
    seed_runs = [SeedRun(seed, workdir) for seed, workdir in workdirs.items()]
    trainer = Trainer(run.train, seed_runs, MaskedLMTask(BertForMaskedLM(run.model), SEQ), log=False,
                      mesh=one_device())
    stopping(trainer, stop_at)
    try:
        return trainer.run_seeds([SyntheticData(seed, poison_at=(poison or {}).get(seed)) for seed in workdirs])
    finally:
        trainer.close()


def stopping(trainer: Trainer, step: int | None) -> None:
    """`trainer` ends at `step`, its learning-rate schedule (built already) still that of its train.num_steps."""
    if step is not None:
        trainer.train = dataclasses.replace(trainer.train, num_steps=step)


def one_device():
    # One device: these runs test the loop, whose sharded runs tests/training/test_mesh_training.py and
    # test_multiprocess.py check (8 simulated devices take a third longer to compile and step).
    return make_mesh(devices=jax.devices()[:1])


if __name__ == "__main__":
    # As tests/conftest.py: the killed run must compile the step the test's own runs compile.
    jax.config.update("jax_default_matmul_precision", "highest")
    run(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), log=True)
