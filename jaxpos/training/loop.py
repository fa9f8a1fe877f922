"""The training loop shared by every task: sharded jitted steps that never wait for the host (metrics read at each
log line, evaluation and checkpoint; batches optionally made ahead, `Prefetcher`), evaluation, checkpoints with the
data position, automatic resume, NaN stop.

A task supplies the model-specific parts (see `Task`); the loop owns everything else.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import math
import time
from typing import Callable, Iterable, Protocol, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxpos.config.run import MeshConfig, TrainConfig
from jaxpos.models.layout import relayout
from jaxpos.sharding import (activation_sharding, batch_sharding, check_batch_divisible, logical_sharding, make_mesh,
                             replicated)
from jaxpos.training.checkpoint import Checkpointer, abstract_like
from jaxpos.training.flops import throughput
from jaxpos.training.interrupt import RunStopped, deferred_stop
from jaxpos.training.metrics import MetricWriter
from jaxpos.training.optim import learning_rate_schedule, make_optimizer
from jaxpos.training.prefetch import Prefetcher
from jaxpos.training.seeds import SeedRun, check_seed_runs, seed_layout
from jaxpos.training.state import TrainState, init_state

__all__ = ["IN_FLIGHT_STEPS", "SeedRun", "Task", "TrainResult", "Trainer", "TrainingDiverged", "check_seed_runs",
           "make_global_batch", "model_config_dict", "train_step"]


IN_FLIGHT_STEPS = 8  # steps dispatched ahead of the oldest unfinished one (each holds its batch on the device)


class TrainingDiverged(RuntimeError):
    """The loss, the gradient norm or the updated state became NaN or infinite; the last good checkpoint is kept."""


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
    return json.loads(json.dumps(dataclasses.asdict(model.cfg)))


def make_global_batch(local: dict, sharding: NamedSharding) -> dict:
    """Global arrays [B, ...] from each process's rows: process p of P gives rows [p·B/P, (p+1)·B/P) as numpy
    arrays [B/P, ...] (the split of jaxpos.data.order.host_slice), so each process reads only its share.

    When the mesh gives each process exactly those rows (one process; or the batch axes span the processes in
    process order, as make_mesh lays them out) the arrays are assembled in place. Otherwise (e.g. tensor
    parallelism across hosts, where every process needs every row) they are assembled split by process and
    then resharded on the devices, which moves rows between processes."""
    count, index = jax.process_count(), jax.process_index()
    if count == 1:  # every row is this process's: one batched transfer for the whole batch
        return jax.device_put({key: np.asarray(value) for key, value in local.items()}, sharding)
    out = {}
    for key, value in local.items():
        value = np.asarray(value)
        shape = (value.shape[0] * count,) + value.shape[1:]
        if _holds_rows(sharding, shape[0], index * value.shape[0], (index + 1) * value.shape[0]):
            out[key] = jax.make_array_from_process_local_data(sharding, value, shape)
        else:
            by_process = jax.make_array_from_process_local_data(_process_sharding(sharding.mesh), value, shape)
            out[key] = _reshard(sharding)(by_process)
    return out


@functools.lru_cache(maxsize=None)
def _holds_rows(sharding: NamedSharding, rows: int, start: int, stop: int) -> bool:
    """Whether this process's devices hold exactly rows [start, stop) of a [rows, ...] array."""
    held = np.zeros(rows, bool)
    for index in sharding.addressable_devices_indices_map((rows,)).values():
        held[index[0]] = True
    return bool(held[start:stop].all()) and int(held.sum()) == stop - start


@functools.lru_cache(maxsize=None)
def _process_sharding(mesh) -> NamedSharding:
    """Rows split over processes in process order, replicated over each process's devices."""
    devices = sorted(mesh.devices.flat, key=lambda d: (d.process_index, d.id))
    grid = np.asarray(devices, dtype=object).reshape(jax.process_count(), -1)
    return NamedSharding(Mesh(grid, ("process", "local")), PartitionSpec("process"))


@jax.jit
def _stacked(metrics: list[dict]) -> dict:
    """Steps' metric dicts -> one dict of [steps] arrays, to read them in a transfer a metric. Compiles once a
    window length: the log interval, and the few shorter windows that evaluations and checkpoints cut."""
    return jax.tree.map(lambda *values: jnp.stack(values), *metrics)


@functools.lru_cache(maxsize=None)
def _reshard(sharding: NamedSharding) -> Callable:
    return jax.jit(lambda x: x, out_shardings=sharding)


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


@dataclasses.dataclass(frozen=True)
class Every:
    """A hook's cadence: every `steps` steps and at the run's last step."""

    steps: int
    last: int

    def __call__(self, step: int) -> bool:
        return step % self.steps == 0 or step == self.last


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
            return self._init(self.seeds.init_keys()), None
        state, step, positions = restored
        data.set_state(positions)
        return state, step

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

    def run(self, data, eval_batches: Callable[[], Iterable[dict]] | None = None,
            hooks: Iterable[Callable[[int, TrainState], dict | None]] = (),
            on_start: Callable[[], None] | None = None) -> TrainResult:
        """Trains the one run to train.num_steps from wherever its checkpoints left off (`run_seeds` for several);
        see `run_seeds`. `hooks` run after every step (and a resumed run's evaluation of its last step) with the step
        and the state, and choose their own steps; what they return is logged as evaluation metrics."""
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

        The loop body is the step, then the hooks, each at its own cadence: the training log (`_TrainLog`, every
        train.log_every steps), the evaluation and the user's hooks (`_Evaluation`, every train.eval_every), the
        checkpoint (`_Saving`, every train.checkpoint_every and when a signal stops the run)."""
        tcfg = self.train
        self._check_inputs(data, eval_batches, hooks)
        data = _Zipped(data)
        state, resumed = self.initial_state(data)
        start = self.seeds.first_step(state)
        if on_start is not None:
            on_start()
        log = _TrainLog(self, start, resumed)
        evaluation = _Evaluation(self, eval_batches, hooks, log)
        saving = _Saving(self, log, data)
        due = {name: Every(every, tcfg.num_steps) for name, every in
               (("log", tcfg.log_every), ("eval", tcfg.eval_every), ("save", tcfg.checkpoint_every))}
        if tcfg.checkpoint_initial and resumed is None and start == 0:  # the initialisation, as step 0
            saving(0, state, None)
        batches = None
        with deferred_stop() as stop:
            try:
                batches = Prefetcher(data, self.global_batch, tcfg.prefetch_batches)
                if start >= tcfg.num_steps and not stop:  # resumed at the end: the last step's evaluation again
                    evaluation(start, state, evaluate=True)
                for step in range(start, tcfg.num_steps):
                    batch, position = next(batches)  # made ahead, a batch carries its data position
                    state, metrics = self.train_step(state, batch)
                    done = step + 1
                    log.record(done, metrics)
                    if due["log"](done):
                        log.write(done)
                    if not stop:  # a stopping run saves its step and leaves its evaluation to the resumed one
                        evaluation(done, state, evaluate=due["eval"](done))
                    if due["save"](done) or stop:
                        saving(done, state, position)
                    if stop:
                        break
            finally:
                if batches is not None:
                    batches.close()
                saving.close()
                log.close()
        if stop:  # the step in progress was checkpointed (or the run had just ended): say so instead of going on
            raise self._stopped(stop.signum)
        return [TrainResult(seed_state, final, evaluated, resumed) for seed_state, final, evaluated
                in zip(self.seed_states(state), log.final, evaluation.metrics)]

    def _check_inputs(self, data: Sequence, eval_batches, hooks) -> None:
        count = self.seeds.count
        if len(data) != count or (eval_batches is not None and len(eval_batches) != count):
            raise ValueError(f"{count} seed(s) need as many data iterators and evaluation sets")
        if hooks and count > 1:
            raise ValueError("hooks see one run's state: train seeds with hooks one at a time")

    def _stopped(self, signum: int) -> RunStopped:
        """The error that ends a run stopped by a signal, naming the step it saved."""
        saved, count = self.checkpointer.steps(), self.seeds.count
        where = f"{self.workdir}/checkpoints" + (f" and the other {count - 1} seeds'" if count > 1 else "")
        return RunStopped(signum, saved[-1] if saved else None, where)

    def close(self):
        for checkpointer in self.checkpointers:
            checkpointer.close()


class _TrainLog:
    """The training metrics of every seed: kept on the device as the steps run ahead, read in one transfer a metric
    (`read`: before every log line, evaluation and checkpoint), checked finite (a diverged run stops), then averaged
    over the window since the last line and written with the speed (`write`)."""

    def __init__(self, trainer: Trainer, start: int, resumed: int | None):
        self.trainer, tcfg, seeds = trainer, trainer.train, trainer.seeds
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

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


class _Evaluation:
    """At its steps, each seed's held-out evaluation (`eval_batches`), then the user's hooks (one seed), written to
    each seed's log; `metrics` keeps each seed's latest."""

    def __init__(self, trainer: Trainer, eval_batches, hooks, log: _TrainLog):
        self.trainer, self.hooks, self.log = trainer, list(hooks), log
        self.metrics = [{} for _ in range(trainer.seeds.count)]
        self.batches = None if eval_batches is None else (
            (lambda: eval_batches[0]()) if trainer.seeds.count == 1 else (lambda: zip(*(fn() for fn in eval_batches))))

    def __call__(self, step: int, state: TrainState, evaluate: bool) -> None:
        if evaluate and self.batches is not None:
            self.log.read()
            self.metrics = self.trainer.evaluate(state.params, self.batches())
            for writer, evaluated in zip(self.log.writers, self.metrics):
                writer.scalars(step, evaluated, prefix="eval")
        for hook in self.hooks:  # one seed only
            extra = hook(step, state)
            if extra:
                self.log.writers[0].scalars(step, extra, prefix="eval")
                self.metrics[0].update(extra)


class _Saving:
    """Each seed's checkpoint of a step, with its data position; only once the step's metrics read finite."""

    def __init__(self, trainer: Trainer, log: _TrainLog, data: _Zipped):
        self.trainer, self.log, self.data = trainer, log, data
        for checkpointer in trainer.checkpointers:
            checkpointer.writable()

    def __call__(self, step: int, state: TrainState, positions) -> None:
        self.log.read()  # never checkpoint a state not known to be finite
        positions = positions if positions is not None else self.data.get_state()
        trainer = self.trainer
        for checkpointer, seed_state, position in zip(trainer.checkpointers, trainer.seed_states(state), positions):
            if step not in checkpointer.steps():  # a seed that saved it before the batch was stopped keeps it
                checkpointer.save(step, seed_state, position, trainer.model_config)

    def close(self) -> None:
        for checkpointer in self.trainer.checkpointers:
            checkpointer.wait()
