"""The training loop's hooks: what runs after a step, each at its own cadence. The loop body is the step and then
`Hooks.after_step`, in order: the training log (`TrainLog`, every train.log_every steps), the held-out evaluation
(`Evaluation`, every train.eval_every), the user's hooks (`UserHook`, each every N steps: `Trainer.add_hook`), the
checkpoint (`Saving`, every train.checkpoint_every and when a signal stops the run) and the interrupt check
(`StopCheck`, which ends the loop once the stopping step is saved). With seeds trained at once every hook sees each
seed: a user hook is called with each seed's own state (no seed axis) and logs to that seed's run.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxpos.training.flops import throughput
from jaxpos.training.metrics import MetricWriter
from jaxpos.training.state import TrainState

if TYPE_CHECKING:
    from jaxpos.training.loop import Trainer

IN_FLIGHT_STEPS = 8  # steps dispatched ahead of the oldest unfinished one (each holds its batch on the device)


class TrainingDiverged(RuntimeError):
    """The loss, the gradient norm or the updated state became NaN or infinite; the last good checkpoint is kept."""


@dataclasses.dataclass
class StepContext:
    """What the hooks see after a step: the step just done, every seed's state (a seed axis where several), the data
    position of the batch it took (None: the iterators' own), whether a signal is stopping the run, and `end`, which
    a hook sets to end the loop after this step."""

    step: int
    state: TrainState
    position: Any = None
    stopping: bool = False
    end: bool = False


@jax.jit
def _stacked(metrics: list[dict]) -> dict:
    """Steps' metric dicts -> one dict of [steps] arrays, to read them in a transfer a metric. Compiles once a
    window length: the log interval, and the few shorter windows that evaluations and checkpoints cut."""
    return jax.tree.map(lambda *values: jnp.stack(values), *metrics)


@dataclasses.dataclass(frozen=True)
class Every:
    """A hook's cadence: every `steps` steps and at the run's last step."""

    steps: int
    last: int

    def __call__(self, step: int) -> bool:
        return step % self.steps == 0 or step == self.last


class Hook:
    """A hook of the loop: `every` steps (and at the run's last step), `__call__(context)` after the step. Hooks
    that run while the run stops (`when_stopping`) do so at the stopping step whatever their cadence; the others
    leave it to the resumed run."""

    every: int = 1
    when_stopping: bool = False

    def due(self, context: StepContext, last: int) -> bool:
        if context.stopping:
            return self.when_stopping
        return context.step % self.every == 0 or context.step == last

    def __call__(self, context: StepContext) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """At the loop's end, whatever ended it."""


class TrainLog(Hook):
    """The training metrics of every seed: kept on the device as the steps run ahead, read in one transfer a metric
    (`read`: before every log line, evaluation and checkpoint), checked finite (a diverged run stops), then averaged
    over the window since the last line and written with the speed (`write`)."""

    def __init__(self, trainer: Trainer, start: int, resumed: int | None):
        self.trainer, tcfg, seeds = trainer, trainer.train, trainer.seeds
        self.every = tcfg.log_every
        self.writers = [MetricWriter(run.workdir, tcfg.num_steps, start, console=k == 0,
                                     enabled=trainer.log and jax.process_index() == 0)
                        for k, run in enumerate(seeds.runs)]
        if trainer.log and seeds.header():
            self.writers[0].write(seeds.header())
        if resumed is not None and trainer.log:
            self.writers[0].write(f"resumed from checkpoint step {resumed} in {trainer.workdir}/checkpoints"
                                  + (" and the other seeds'" if seeds.count > 1 else ""))
        self.final = [{} for _ in range(seeds.count)]
        self.pending: list[tuple[int, dict]] = []  # (step, device metrics) not read yet
        self.windows: list[list[dict]] = [[] for _ in range(seeds.count)]  # each seed's since the last line
        self.in_flight = collections.deque(maxlen=IN_FLIGHT_STEPS)
        task = trainer.task
        self.tokens_per_step = tcfg.batch_size * task.tokens_per_example  # each seed's own; the FLOPs count all
        self.step_flops = seeds.count * task.step_flops(tcfg.batch_size) if hasattr(task, "step_flops") else None
        self.compute_dtype = task.model.cfg.dtype
        self.tick = time.perf_counter()

    def record(self, step: int, metrics: dict) -> None:
        """Keeps a step's device metrics; the host stays a few steps ahead of the device, never the whole window."""
        self.pending.append((step, metrics))
        if len(self.in_flight) == self.in_flight.maxlen:
            jax.block_until_ready(self.in_flight[0])
        self.in_flight.append(metrics)
        for writer in self.writers:
            writer.advance()

    def read(self) -> None:
        """Host copies of the unread steps' metrics, in one transfer (the steps ran ahead meanwhile); stops the run
        at the first step whose loss, gradient norm or updated state is not finite. A state not read finite is
        never saved (hooks, which run every step, may see one not yet read)."""
        if not self.pending:
            return
        stacked = jax.device_get(_stacked([m for _, m in self.pending]))  # a transfer a metric, not one a step
        for i, (step, _) in enumerate(self.pending):
            for k, window in enumerate(self.windows):
                host = {name: float(np.reshape(values[i], -1)[k]) for name, values in stacked.items()}
                state_finite = host.pop("state_finite") == 1.0
                if not (math.isfinite(host["loss"]) and math.isfinite(host["grad_norm"]) and state_finite):
                    raise self.diverged(host, state_finite, step, k)
                window.append(host)
        self.pending.clear()

    def write(self, step: int) -> None:
        """Each seed's means since the last line, with the step time and throughput of the window."""
        self.read()
        elapsed, self.tick = time.perf_counter() - self.tick, time.perf_counter()
        step_time = elapsed / len(self.windows[0])  # a step of every seed at once
        trainer = self.trainer
        speed = dict(step_time=step_time, tokens_per_s=self.tokens_per_step / step_time,
                     **throughput(self.step_flops, step_time, trainer.mesh.size,
                                  trainer.mesh.devices.flat[0].device_kind, self.compute_dtype))
        for k, (writer, window) in enumerate(zip(self.writers, self.windows)):
            final = {name: float(np.mean([m[name] for m in window])) for name in window[-1]}
            final.update(speed)
            writer.postfix(loss=final["loss"])
            if step == trainer.train.num_steps:
                writer.finish_bar()
            writer.scalars(step, final)
            self.final[k] = final
            window.clear()

    def diverged(self, host: dict, state_finite: bool, step: int, seed_index: int = 0) -> TrainingDiverged:
        """The error that stops a run whose step `step` read `host` (its metrics) and `state_finite`."""
        if not math.isfinite(host["loss"]):
            what = f"loss is {host['loss']}"
        elif not math.isfinite(host["grad_norm"]):
            what = f"gradient norm is {host['grad_norm']}"
        else:
            what = "the updated parameters or optimizer state are not finite"
        trainer = self.trainer
        run = trainer.seed_runs[seed_index]
        saved = trainer.checkpointers[seed_index].steps()  # only states read finite are ever saved
        last = f"The last good checkpoint is step {saved[-1]}" if saved else "There is no checkpoint"
        return TrainingDiverged(f"{what}{trainer.seeds.seed_words(seed_index)} at step {step}; stopping. {last} "
                                f"in {run.workdir}")

    def __call__(self, context: StepContext) -> None:
        self.write(context.step)

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


class Evaluation(Hook):
    """At its steps, each seed's held-out evaluation (`eval_batches`), written to each seed's log; `metrics` keeps
    each seed's latest (the user's hooks add theirs)."""

    def __init__(self, trainer: Trainer, eval_batches, log: TrainLog):
        self.trainer, self.log, self.every = trainer, log, trainer.train.eval_every
        self.metrics = [{} for _ in range(trainer.seeds.count)]
        self.batches = None if eval_batches is None else (
            (lambda: eval_batches[0]()) if trainer.seeds.count == 1 else (lambda: zip(*(fn() for fn in eval_batches))))

    def __call__(self, context: StepContext) -> None:
        if self.batches is None:
            return
        self.log.read()
        self.metrics = self.trainer.evaluate(context.state.params, self.batches())
        for writer, evaluated in zip(self.log.writers, self.metrics):
            writer.scalars(context.step, evaluated, prefix="eval")


class UserHook(Hook):
    """`fn(step, state) -> dict | None` every `every` steps (and at the last step; not while stopping), called with
    each seed's own state in turn; what it returns is that seed's evaluation metrics of the step."""

    def __init__(self, fn: Callable[[int, TrainState], dict | None], every: int, trainer: Trainer, log: TrainLog,
                 evaluation: Evaluation):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"a hook runs every N >= 1 steps, got every={every!r}")
        self.fn, self.every, self.trainer, self.log, self.evaluation = fn, every, trainer, log, evaluation

    def __call__(self, context: StepContext) -> None:
        states = self.trainer.seed_states(context.state) if self.trainer.seeds.count > 1 else [context.state]
        for k, state in enumerate(states):
            extra = self.fn(context.step, state)
            if extra:
                self.log.writers[k].scalars(context.step, extra, prefix="eval")
                self.evaluation.metrics[k].update(extra)


class Saving(Hook):
    """Each seed's checkpoint of a step, with its data position; only once the step's metrics read finite."""

    when_stopping = True

    def __init__(self, trainer: Trainer, log: TrainLog, data):
        self.trainer, self.log, self.data, self.every = trainer, log, data, trainer.train.checkpoint_every
        for checkpointer in trainer.checkpointers:
            checkpointer.writable()

    def __call__(self, context: StepContext) -> None:
        self.save(context.step, context.state, context.position)

    def save(self, step: int, state: TrainState, positions) -> None:
        self.log.read()  # never checkpoint a state not known to be finite
        positions = positions if positions is not None else self.data.get_state()
        trainer = self.trainer
        for checkpointer, seed_state, position in zip(trainer.checkpointers, trainer.seed_states(state), positions):
            if step not in checkpointer.steps():  # a seed that saved it before the batch was stopped keeps it
                checkpointer.save(step, seed_state, position, trainer.model_config)

    def close(self) -> None:
        for checkpointer in self.trainer.checkpointers:
            checkpointer.wait()


class StopCheck(Hook):
    """Ends the loop at the step a signal stopped, once the hooks before it saved that step."""

    when_stopping = True

    def due(self, context: StepContext, last: int) -> bool:
        return context.stopping

    def __call__(self, context: StepContext) -> None:
        context.end = True


@dataclasses.dataclass
class Hooks:
    """The loop's hooks in order, run after each step at their cadences (`after_step`)."""

    hooks: Sequence[Hook]
    last: int  # the run's last step (train.num_steps)

    def after_step(self, context: StepContext) -> StepContext:
        for hook in self.hooks:
            if hook.due(context, self.last):
                hook(context)
        return context

    def close(self) -> None:
        for hook in reversed(self.hooks):
            hook.close()
