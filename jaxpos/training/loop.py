"""The training loop shared by every task: sharded jitted steps that never wait for the host (metrics read at each
log line, evaluation and checkpoint; batches optionally made ahead, `Prefetcher`), evaluation, checkpoints with the
data position, automatic resume, NaN stop.

A task supplies the model-specific parts (see `Task`); the loop owns everything else.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Callable, Iterable, Protocol, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from jaxpos.config.position import config_dict
from jaxpos.config.run import MeshConfig, TrainConfig
from jaxpos.models.layout import relayout
from jaxpos.progress import status
from jaxpos.sharding import (activation_sharding, batch_sharding, check_batch_divisible, logical_sharding, make_mesh,
                             make_global_batch, replicated)
from jaxpos.training.checkpoint import CheckpointError, Checkpointer, abstract_like
from jaxpos.training.hooks import (IN_FLIGHT_STEPS, Evaluation, Every, Hooks, Saving, StepContext, StopCheck,
                                   TrainingDiverged, TrainLog, UserHook)
from jaxpos.training.interrupt import RunStopped, deferred_stop
from jaxpos.training.optim import learning_rate_schedule, make_optimizer
from jaxpos.training.prefetch import Prefetcher
from jaxpos.training.seeds import SeedRun, check_seed_runs, seed_layout
from jaxpos.training.state import TrainState, init_state

__all__ = ["Every", "IN_FLIGHT_STEPS", "SeedRun", "Task", "TrainResult", "Trainer", "TrainingDiverged",
           "check_seed_runs", "make_global_batch", "model_config_dict", "train_step"]


class Task(Protocol):
    """What a task gives the loop. Losses are sums over tokens, so accumulation and sharding stay exact."""

    model: nn.Module  # a jaxpos model: `model.cfg` is its ModelConfig (saved with every checkpoint)
    tokens_per_example: int  # tokens in one row of a batch, for throughput

    def init_inputs(self) -> tuple[tuple, dict]:
        """(args, kwargs) for model.init with a batch of one."""

    def loss(self, params, batch: dict, rng: jax.Array | None, train: bool) -> tuple[jax.Array, dict]:
        """(summed loss, dict of sums incl. 'weight' = number of predicted tokens)."""

    def summarize(self, sums: dict) -> dict:
        """Means from sums: loss, accuracy, perplexity..."""

    def step_flops(self, batch_size: int) -> float:
        """Model FLOPs of a training step on `batch_size` rows (jaxpos.training.flops); optional."""


def train_step(state: TrainState, batch: dict, *, task: Task, tx: optax.GradientTransformation,
               schedule: optax.Schedule, accum_steps: int) -> tuple[TrainState, dict]:
    """One optimiser step on a global batch; with accum_steps > 1 the batch is split into micro-batches whose
    gradient sums are accumulated (same result as one large batch, less memory)."""
    rng = jax.random.fold_in(state.rng, state.step)
    grad_fn = jax.grad(task.loss, has_aux=True)

    if accum_steps == 1:
        grads, sums = grad_fn(state.params, batch, rng, True)
    else:
        micro = jax.tree.map(lambda x: x.reshape((accum_steps, x.shape[0] // accum_steps) + x.shape[1:]), batch)

        def body(carry, inputs):
            grads_acc, sums_acc = carry
            mb, index = inputs
            g, s = grad_fn(state.params, mb, jax.random.fold_in(rng, index), True)
            return (jax.tree.map(jnp.add, grads_acc, g), jax.tree.map(jnp.add, sums_acc, s)), None

        zeros_g = jax.tree.map(jnp.zeros_like, state.params)
        zeros_s = jax.eval_shape(lambda: grad_fn(state.params, jax.tree.map(lambda x: x[0], micro), rng, True)[1])
        zeros_s = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), zeros_s)
        (grads, sums), _ = jax.lax.scan(body, (zeros_g, zeros_s), (micro, jnp.arange(accum_steps)))

    weight = jnp.maximum(sums["weight"], 1.0)
    grads = jax.tree.map(lambda g: g / weight, grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(task.summarize(sums), grad_norm=optax.tree.norm(grads), learning_rate=schedule(state.step),
                   state_finite=all_finite((params, opt_state)))
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def all_finite(tree) -> jax.Array:
    """1.0 when every floating-point leaf of `tree` is finite, else 0.0: a scalar computed on device."""
    flags = [jnp.isfinite(x).all() for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.stack(flags).all().astype(jnp.float32) if flags else jnp.float32(1.0)


def eval_sums(params, batch, *, task: Task) -> dict:
    return task.loss(params, batch, None, False)[1]


def with_activation_sharding(fn: Callable, mesh) -> Callable:
    """`fn`, traced inside `activation_sharding(mesh)`, so that the models' activation constraints apply."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with activation_sharding(mesh):
            return fn(*args, **kwargs)

    return wrapped


def model_config_dict(model: nn.Module) -> dict:
    """The typed config of a jaxpos model (`model.cfg`) as a JSON-ready dict, saved with every checkpoint."""
    return json.loads(json.dumps(config_dict(model.cfg)))


@dataclasses.dataclass
class TrainResult:
    state: TrainState  # this run's (a seed's own, without the seed axis)
    final_metrics: dict
    eval_metrics: dict
    resumed_from: int | None


class _Zipped:
    """The data iterators of a batch of seeds as one: `next` gives a list of their batches, the state a list."""

    def __init__(self, iterators: Sequence):
        self.iterators = list(iterators)

    def __iter__(self):
        return self

    def __next__(self) -> list[dict]:
        return [next(it) for it in self.iterators]

    def get_state(self) -> list[dict]:
        return [it.get_state() for it in self.iterators]

    def set_state(self, states: Sequence[dict]) -> None:
        for it, state in zip(self.iterators, states):
            it.set_state(state)


class Trainer:
    """Builds the mesh, shardings and jitted steps for a task, then runs and resumes training.

    `workdir` is one run's folder, or several `SeedRun`s: those seeds train in one program, every parameter and
    optimiser moment with a leading seed axis [S, ...] and the step `vmap`ped over it, each seed with its own data
    order, masking and initialisation, and its own checkpoints (without the seed axis, as a run trained alone
    saves them: analysis, fine-tuning and export read them as any). Small models are latency-bound, so S seeds
    cost a device little more than one. What differs between one seed and several is `seeds`, a SeedLayout."""

    def __init__(self, train: TrainConfig, workdir: str | Sequence[SeedRun], task: Task, *,
                 mesh: MeshConfig | Mesh | None = None, log: bool = True):
        """`train`: the run's checked train block (`train.seed` unused with SeedRuns); `mesh`: a Mesh, or the sizes
        of one over every device of every process (None: MeshConfig's defaults). Refuses, before anything is
        written or compiled, a batch the mesh cannot split and a workdir whose newest checkpoint holds another
        model: the checkpoints are only read until `run` has restored them and the data position (`on_start`)."""
        self.seeds = seed_layout([SeedRun(train.seed, workdir)] if isinstance(workdir, str) else list(workdir))
        self.user_hooks: list[tuple[Callable, int]] = []  # `add_hook`
        self.seed_runs = self.seeds.runs
        self.train, self.workdir, self.task, self.log = train, self.seed_runs[0].workdir, task, log
        self.mesh = mesh if isinstance(mesh, Mesh) else make_mesh(**dataclasses.asdict(mesh or MeshConfig()))
        self._check_hosts()
        self.checkpointers = []
        try:  # a model that does not build, or a checkpoint of another model, is refused before anything is written
            init = self._abstract_state()
            self._check_checkpoints()
        except BaseException:
            self.close()
            raise
        self._compile(init)

    def _check_hosts(self) -> None:
        """Refuses a batch the mesh cannot split and what runs on one process only on several."""
        tcfg = self.train
        check_batch_divisible(tcfg.batch_size, self.mesh, jax.process_count(), tcfg.grad_accum_steps)
        if tcfg.prefetch_batches and jax.process_count() > 1:
            raise ValueError("train.prefetch_batches makes batches on a thread of one process; a run of "
                             f"{jax.process_count()} processes makes each in turn: set it to 0")
        if self.seeds.count > 1 and jax.process_count() > 1:
            raise ValueError(f"seeds trained at once run on one process; this run has {jax.process_count()}: "
                             "train one seed per run")

    def _abstract_state(self) -> Callable:
        """The optimiser, one seed's abstract state and shardings; returns the (unjitted) initialiser."""
        self.model_config = model_config_dict(self.task.model)
        self.tx = make_optimizer(self.train)
        self.schedule = learning_rate_schedule(self.train)
        args, kwargs = self.task.init_inputs()
        init = functools.partial(init_state, self.task.model, self.tx, init_args=args, init_kwargs=kwargs)
        boxed = jax.eval_shape(init, jax.random.PRNGKey(0))
        self.seed_state_shardings = logical_sharding(boxed, self.mesh)  # one seed's, as its checkpoints hold it
        self.abstract_state = nn.unbox(boxed)
        return init

    def _check_checkpoints(self) -> None:
        """Opens each seed's checkpoints read-only and refuses another model's (converting another layer layout)."""
        tcfg = self.train
        for run in self.seed_runs:
            self.checkpointers.append(Checkpointer(f"{run.workdir}/checkpoints", keep=tcfg.keep_checkpoints,
                                                   async_save=tcfg.async_checkpoints, read_only=True,
                                                   set_aside=True))
        # A checkpoint of the other layer layout (model.scan_layers changed on resume) is converted as restored.
        self.scanned = self.task.model.cfg.scan_layers
        self.scan_group = self.task.model.cfg.scan_group  # what a scanned layout stacks (ModelConfig.scan_group)
        self.other_layout = None  # the state in the other layout, where there are checkpoints to compare with
        if any(checkpointer.steps() for checkpointer in self.checkpointers):
            self.other_layout = jax.eval_shape(functools.partial(relayout, scanned=not self.scanned,
                                                                 group=self.scan_group),
                                               self.abstract_state)
        layouts = set()
        for checkpointer in self.checkpointers:
            checkpointer.check_model_config(self.model_config)
            layouts.add(checkpointer.check_state(self.abstract_state, other_layout=self.other_layout))
        if len(layouts) > 1:
            raise ValueError("the seeds' checkpoints hold their layers in different layouts (model.scan_layers); "
                             "resume each seed alone")
        self.restore_other_layout = layouts == {True}
        self._check_init_sources()

    def _check_init_sources(self) -> None:
        """Opens each seed's `init_from` run's checkpoints read-only (a seed with checkpoints of its own resumes
        from them instead) and refuses parameters of other paths or shapes, naming the first."""
        self.init_sources = []
        for run, own in zip(self.seed_runs, self.checkpointers):
            if not run.init_from or own.steps():
                self.init_sources.append(None)
                continue
            source = Checkpointer(f"{run.init_from}/checkpoints", read_only=True)
            self.init_sources.append(source)
            steps = source.steps()
            if not steps:
                raise ValueError(f"train.init_from: {run.init_from} has no checkpoint to start from")
            mismatch = source.params_mismatch(steps[-1], self.abstract_state.params)
            if mismatch:
                hint = " (a learned position table cannot be lengthened: extend a mechanism without one, such as " \
                       "RoPE or ALiBi)" if "position" in mismatch.split(" is ")[0] else ""
                raise ValueError(f"train.init_from: step {steps[-1]} of {run.init_from} holds other parameters than "
                                 f"this model: {mismatch}{hint}; continued pretraining may change what has no "
                                 "parameters (the row length, RoPE's base and rules, windows), not the model's shapes")

    def _compile(self, init: Callable) -> None:
        """The jitted initialiser, train and evaluation steps, batched over the seeds' layout."""
        on_mesh = functools.partial(with_activation_sharding, mesh=self.mesh)
        step = functools.partial(on_mesh(train_step), task=self.task, tx=self.tx, schedule=self.schedule,
                                 accum_steps=self.train.grad_accum_steps)
        evaluate = functools.partial(on_mesh(eval_sums), task=self.task)
        init, step, evaluate = (self.seeds.batched(fn) for fn in (init, step, evaluate))
        self.state_shardings, self.batch_sharding = self.seeds.shardings(self.seed_state_shardings,
                                                                         batch_sharding(self.mesh))
        self.seeds.compile(self.seed_state_shardings, self.state_shardings)
        self._init = jax.jit(lambda rng: nn.unbox(init(rng)), out_shardings=self.state_shardings)
        self.train_step = jax.jit(step, in_shardings=(self.state_shardings, self.batch_sharding),
                                  out_shardings=(self.state_shardings, replicated(self.mesh)), donate_argnums=(0,))
        self.eval_step = jax.jit(evaluate, in_shardings=(self.state_shardings.params, self.batch_sharding),
                                 out_shardings=replicated(self.mesh))

    @property
    def checkpointer(self) -> Checkpointer:
        """The first seed's (the only one's) checkpoints."""
        return self.checkpointers[0]

    def global_batch(self, local: dict | Sequence[dict]) -> dict:
        """This process's rows of a global batch (jaxpos.data.order.host_slice) -> global arrays sharded over
        the mesh; see `make_global_batch`. With several seeds, their batches (one each, in order) stacked [S, B, ...]
        in one transfer."""
        return make_global_batch(self.seeds.host_batch(local), self.batch_sharding)

    def seed_states(self, state: TrainState) -> list[TrainState]:
        """Each seed's own state (no seed axis), in the order of the SeedRuns."""
        return self.seeds.split(state)

    def initial_state(self, data) -> tuple[TrainState, int | None]:
        """(state, the step it was restored from, or None when initialised); the data position restored with it
        (`data`: the seeds' iterators as one, `_Zipped`). Seeds resume from the newest step they all saved."""
        abstract = abstract_like(self.abstract_state, self.seed_state_shardings)
        if self.restore_other_layout:  # restored whole on this host's CPU, converted, then placed
            cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
            abstract = abstract_like(self.other_layout, jax.tree.map(lambda _: cpu, self.other_layout))
        restored = self.seeds.restore(self.checkpointers, abstract, self._in_this_layout)
        if restored is None:
            return self._initial_params(self._init(self.seeds.init_keys())), None
        state, step, positions = restored
        data.set_state(positions)
        return state, step

    def _initial_params(self, state: TrainState) -> TrainState:
        """A fresh state with each seed's parameters from its `init_from` run's newest checkpoint that restores (the
        optimiser and step stay fresh)."""
        if not any(self.init_sources):
            return state
        abstract = abstract_like(self.abstract_state.params, self.seed_state_shardings.params)
        states = self.seeds.split(state)
        for index, (run, source) in enumerate(zip(self.seed_runs, self.init_sources)):
            if source is None:
                continue
            restored = source.restore_latest_params(abstract)
            if restored is None:
                raise CheckpointError(f"train.init_from: no checkpoint of {run.init_from} restores")
            step, params = restored
            states[index] = states[index].replace(params=params)
            status(f"seed {run.seed}: parameters from step {step} of {run.init_from} (train.init_from); a fresh "
                   "optimiser from step 0")
        return self.seeds.join(states)

    def _in_this_layout(self, state: TrainState) -> TrainState:
        """A restored seed's state in this model's layer layout, placed as training places it."""
        if not self.restore_other_layout:
            return state
        return jax.device_put(relayout(state, scanned=self.scanned, group=self.scan_group), self.seed_state_shardings)

    def evaluate(self, params, batches: Iterable) -> list[dict]:
        """Each seed's held-out metrics (a list of one without a seed axis) over `batches` (as `global_batch` takes
        them: a seed's batch, or a list of the seeds')."""
        total = None
        for batch in batches:
            sums = self.eval_step(params, self.global_batch(batch))
            total = sums if total is None else jax.tree.map(jnp.add, total, sums)
        if total is None:
            raise ValueError("the evaluation data yielded no batch")
        return [{k: float(v) for k, v in self.task.summarize(sums).items()}
                for sums in self.seeds.by_seed(jax.device_get(total))]

    def add_hook(self, fn: Callable[[int, TrainState], dict | None], every: int = 1) -> None:
        """`fn(step, state)` after every `every`-th step and the run's last (not while a signal stops the run), for
        the runs of this trainer from now on; with seeds trained at once, called with each seed's own state (no
        seed axis). What it returns is logged as that seed's evaluation metrics of the step."""
        self.user_hooks.append((fn, every))

    def run(self, data, eval_batches: Callable[[], Iterable[dict]] | None = None,
            hooks: Iterable[Callable[[int, TrainState], dict | None]] = (),
            on_start: Callable[[], None] | None = None) -> TrainResult:
        """Trains the one run to train.num_steps from wherever its checkpoints left off (`run_seeds` for several);
        see `run_seeds`. `hooks`: functions of (step, state) called after every step, which choose their own steps
        (`add_hook(fn, every=1)` for this run)."""
        if self.seeds.count > 1:
            raise ValueError(f"this trainer trains {self.seeds.count} seeds: call run_seeds")
        return self.run_seeds([data], None if eval_batches is None else [eval_batches], on_start, hooks)[0]

    def run_seeds(self, data: Sequence, eval_batches: Sequence[Callable[[], Iterable[dict]]] | None = None,
                  on_start: Callable[[], None] | None = None,
                  hooks: Iterable[Callable[[int, TrainState], dict | None]] = ()) -> list[TrainResult]:
        """Trains every seed to train.num_steps from wherever its checkpoints left off: `data` and `eval_batches`
        hold one iterator / one callable per SeedRun, in order. `on_start` runs once the state and the data
        position are restored (or initialised) and before anything is written: the last point at which a run can
        be refused with its workdir untouched. SIGTERM or SIGINT during the loop checkpoints the step in progress
        and raises `RunStopped` (jaxpos.training.interrupt). A run resumed at its last step trains nothing and
        evaluates that step again. Returns each seed's result.

        The loop body is the step, then the hooks in order, each at its own cadence (jaxpos/training/hooks.py): the
        training log, the evaluation, the user's hooks (`add_hook`; `hooks` here: every step), the checkpoint and
        the interrupt check."""
        tcfg = self.train
        self._check_inputs(data, eval_batches)
        data = _Zipped(data)
        state, resumed = self.initial_state(data)
        start = self.seeds.first_step(state)
        if on_start is not None:
            on_start()
        log = TrainLog(self, start, resumed)
        evaluation = Evaluation(self, eval_batches, log)
        saving = Saving(self, log, data)
        users = [UserHook(fn, every, self, log, evaluation) for fn, every in
                 [*self.user_hooks, *((fn, 1) for fn in hooks)]]
        loop = Hooks([log, evaluation, *users, saving, StopCheck()], tcfg.num_steps)
        if tcfg.checkpoint_initial and resumed is None and start == 0:  # the initialisation, as step 0
            saving.save(0, state, None)
        batches = None
        with deferred_stop() as stop:
            try:
                batches = Prefetcher(data, self.global_batch, tcfg.prefetch_batches)
                if start >= tcfg.num_steps and not stop:  # resumed at the end: the last step's evaluation again
                    for hook in (evaluation, *users):
                        hook(StepContext(start, state))
                for step in range(start, tcfg.num_steps):
                    batch, position = next(batches)  # made ahead, a batch carries its data position
                    state, metrics = self.train_step(state, batch)
                    log.record(step + 1, metrics)
                    if loop.after_step(StepContext(step + 1, state, position, stopping=bool(stop))).end:
                        break
            finally:
                if batches is not None:
                    batches.close()
                loop.close()
        if stop:  # the step in progress was checkpointed (or the run had just ended): say so instead of going on
            raise self._stopped(stop.signum)
        return [TrainResult(seed_state, final, evaluated, resumed) for seed_state, final, evaluated
                in zip(self.seed_states(state), log.final, evaluation.metrics)]

    def _check_inputs(self, data: Sequence, eval_batches) -> None:
        count = self.seeds.count
        if len(data) != count or (eval_batches is not None and len(eval_batches) != count):
            raise ValueError(f"{count} seed(s) need as many data iterators and evaluation sets")

    def _stopped(self, signum: int) -> RunStopped:
        """The error that ends a run stopped by a signal, naming the step it saved."""
        saved, count = self.checkpointer.steps(), self.seeds.count
        where = f"{self.workdir}/checkpoints" + (f" and the other {count - 1} seeds'" if count > 1 else "")
        return RunStopped(signum, saved[-1] if saved else None, where)

    def close(self):
        for checkpointer in self.checkpointers + [c for c in getattr(self, "init_sources", []) if c is not None]:
            checkpointer.close()


