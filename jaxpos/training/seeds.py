"""The runs a Trainer trains in one program: one seed, or several stacked on a leading seed axis.

`SeedLayout` is everything that differs between the two, so that the loop never asks how many seeds it trains:
how the step is batched (`jax.vmap` over a stack), the shardings, the initial keys, a global batch, each seed's own
state (without the seed axis, as a run trained alone holds it), the seeds' evaluation sums and how the logs name a
seed. `restore` is one policy for both: the newest step that every seed's checkpoints restore.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jaxpos.training.checkpoint import CheckpointError, Checkpointer
from jaxpos.training.state import TrainState


@dataclasses.dataclass(frozen=True)
class SeedRun:
    """One seed of a batch trained in one program: its `train.seed` (initialisation, dropout) and its own workdir
    (checkpoints, TensorBoard), as if it were trained alone."""

    seed: int
    workdir: str
    init_from: str = ""  # a run folder whose newest parameters start this seed (train.init_from)


def check_seed_runs(seed_runs: Sequence[SeedRun]) -> None:
    """Raises ValueError for no seed, a seed twice, or two seeds sharing a workdir."""
    if not seed_runs:
        raise ValueError("no seed to train")
    seeds, folders = [r.seed for r in seed_runs], [r.workdir for r in seed_runs]
    if len(set(seeds)) < len(seeds) or len(set(folders)) < len(folders):
        raise ValueError(f"each seed trains once, in its own workdir: seeds {seeds}, workdirs {folders}")


def with_seed_axis(sharding: NamedSharding) -> NamedSharding:
    """`sharding` of an array with a leading seed axis added, whole on every device: [S, ...]."""
    return NamedSharding(sharding.mesh, PartitionSpec(None, *sharding.spec))


class SeedLayout:
    """One seed: the step as it is, its state as the checkpoints hold it."""

    def __init__(self, runs: Sequence[SeedRun]):
        self.runs = list(runs)

    @property
    def count(self) -> int:
        return len(self.runs)

    def batched(self, fn: Callable) -> Callable:
        """`fn` of one seed's state (and batch) made a function of the layout's."""
        return fn

    def shardings(self, seed_state, batch):
        """(state, batch) shardings of the layout from one seed's."""
        return seed_state, batch

    def init_keys(self) -> jax.Array:
        return jax.random.PRNGKey(self.runs[0].seed)

    def host_batch(self, local: dict | Sequence[dict]) -> dict:
        """This process's rows of the step's batch: one seed's, or the seeds' stacked [S, B, ...]."""
        return local[0] if isinstance(local, (list, tuple)) else local

    def compile(self, seed_state_shardings, state_shardings) -> None:
        """Compiles the moves between the layout's state and the seeds' own (`split`, `join`)."""

    def split(self, state: TrainState) -> list[TrainState]:
        """Each seed's own state (no seed axis), in the order of the runs."""
        return [state]

    def join(self, states: Sequence[TrainState]) -> TrainState:
        return states[0]

    def by_seed(self, tree) -> list:
        """Each seed's part of a tree of [S]-leading (or single-seed) arrays."""
        return [tree]

    def first_step(self, state: TrainState) -> int:
        return int(np.asarray(jax.device_get(state.step)).reshape(-1)[0])

    def header(self) -> str | None:
        """The log's first line, where the lines below are one seed's of several."""
        return None

    def seed_words(self, index: int) -> str:
        """How an error names seed `index` (nothing for a lone seed)."""
        return ""

    def restore(self, checkpointers: Sequence[Checkpointer], abstract, place: Callable):
        """(state, step, each seed's data position) of the newest step every seed's checkpoints restore, each
        state `place`d (put in this model's layout); None when there is no checkpoint at all. A corrupt copy is moved
        aside and an older step tried (`Checkpointer.restore_good`); an unreadable one stops the run."""
        saved = [set(checkpointer.steps()) for checkpointer in checkpointers]
        if not any(saved):
            return None
        for step in sorted(set.intersection(*saved), reverse=True):
            restored = [checkpointer.restore_good(step, abstract) for checkpointer in checkpointers]
            if all(copy is not None for copy in restored):
                return self.join([place(state) for state, _ in restored]), step, [data for _, data in restored]
        if self.count == 1:
            raise CheckpointError(f"no checkpoint in {checkpointers[0].directory} could be restored (tried steps "
                                  f"{sorted(saved[0], reverse=True)}); move the directory away to start afresh")
        listed = "; ".join(f"{run.workdir}: {sorted(steps) or 'none'}" for run, steps in zip(self.runs, saved))
        raise CheckpointError(f"the seeds' checkpoints have no step in common that restores ({listed}); resume "
                              "each seed alone, or move their checkpoints away to start afresh")


class SeedStack(SeedLayout):
    """Several seeds in one program: every parameter and moment with a leading seed axis, the step vmapped."""

    def batched(self, fn: Callable) -> Callable:
        return jax.vmap(fn)

    def shardings(self, seed_state, batch):
        return jax.tree.map(with_seed_axis, seed_state), with_seed_axis(batch)

    def init_keys(self) -> jax.Array:
        return jnp.stack([jax.random.PRNGKey(run.seed) for run in self.runs])

    def host_batch(self, local: Sequence[dict]) -> dict:
        return {key: np.stack([np.asarray(b[key]) for b in local]) for key in local[0]}

    def compile(self, seed_state_shardings, state_shardings) -> None:
        count = self.count
        self._split = jax.jit(lambda state: [jax.tree.map(lambda x: x[k], state) for k in range(count)],
                              out_shardings=[seed_state_shardings] * count)
        self._join = jax.jit(lambda states: jax.tree.map(lambda *xs: jnp.stack(xs), *states),
                             out_shardings=state_shardings)

    def split(self, state: TrainState) -> list[TrainState]:
        return self._split(state)

    def join(self, states: Sequence[TrainState]) -> TrainState:
        return self._join(list(states))

    def by_seed(self, tree) -> list:
        return [jax.tree.map(lambda x: x[k], tree) for k in range(self.count)]

    def header(self) -> str:
        return (f"training {self.count} seeds at once ({', '.join(str(r.seed) for r in self.runs)}); the lines "
                f"below are seed {self.runs[0].seed}'s (its loss and tokens/s; step time, TFLOP/s and MFU count "
                "every seed's work), every seed's are in its workdir's TensorBoard")

    def seed_words(self, index: int) -> str:
        return f" for seed {self.runs[index].seed} (every seed trained with it stops)"


def seed_layout(runs: Sequence[SeedRun]) -> SeedLayout:
    """The layout of `runs`: one seed, or a stack."""
    check_seed_runs(runs)
    return SeedStack(runs) if len(runs) > 1 else SeedLayout(runs)
