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
from jaxpos.training.checkpoint import CheckpointError, Checkpointer, abstract_like
from jaxpos.training.flops import throughput
from jaxpos.training.interrupt import RunStopped, deferred_stop
from jaxpos.training.metrics import MetricWriter
from jaxpos.training.optim import learning_rate_schedule, make_optimizer
from jaxpos.training.prefetch import Prefetcher
from jaxpos.training.state import TrainState, init_state


IN_FLIGHT_STEPS = 8  # steps dispatched ahead of the oldest unfinished one (each holds its batch on the device)


class TrainingDiverged(RuntimeError):
    """The loss, the gradient norm or the updated state became NaN or infinite; the last good checkpoint is kept."""


class Task(Protocol):
    """What a task gives the loop. Losses are sums over tokens, so accumulation and sharding stay exact."""

    model: nn.Module
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


def model_config_dict(model: nn.Module) -> dict | None:
    """The typed config of a jaxpos model (`model.cfg`) as a JSON-ready dict, saved with every checkpoint."""
    cfg = getattr(model, "cfg", None)
    return json.loads(json.dumps(dataclasses.asdict(cfg))) if dataclasses.is_dataclass(cfg) else None


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


def with_seed_axis(sharding: NamedSharding) -> NamedSharding:
    """`sharding` of an array with a leading seed axis added, whole on every device: [S, ...]."""
    return NamedSharding(sharding.mesh, PartitionSpec(None, *sharding.spec))


@dataclasses.dataclass(frozen=True)
class SeedRun:
    """One seed of a batch trained in one program: its `train.seed` (initialisation, dropout) and its own workdir
    (checkpoints, TensorBoard), as if it were trained alone."""

    seed: int
    workdir: str


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
    cost a device little more than one."""

    def __init__(self, train: TrainConfig, workdir: str | Sequence[SeedRun], task: Task, *,
                 mesh: MeshConfig | Mesh | None = None, log: bool = True):
        """`train`: the run's checked train block (`train.seed` unused with SeedRuns); `mesh`: a Mesh, or the sizes
        of one over every device of every process (None: MeshConfig's defaults). Refuses, before anything is
        written or compiled, a batch the mesh cannot split and a workdir whose newest checkpoint holds another
        model: the checkpoints are only read until `run` has restored them and the data position (`on_start`)."""
        self.seed_runs = [SeedRun(train.seed, workdir)] if isinstance(workdir, str) else list(workdir)
        check_seed_runs(self.seed_runs)
        self.stacked = len(self.seed_runs) > 1
        self.train, self.workdir, self.task = train, self.seed_runs[0].workdir, task
        tcfg = train
        self.mesh = mesh if isinstance(mesh, Mesh) else make_mesh(**dataclasses.asdict(mesh or MeshConfig()))
        check_batch_divisible(tcfg.batch_size, self.mesh, jax.process_count(), tcfg.grad_accum_steps)
        if tcfg.prefetch_batches and jax.process_count() > 1:
            raise ValueError("train.prefetch_batches makes batches on a thread of one process; a run of "
                             f"{jax.process_count()} processes makes each in turn: set it to 0")
        if self.stacked and jax.process_count() > 1:
            raise ValueError(f"seeds trained at once run on one process; this run has {jax.process_count()}: "
                             "train one seed per run")
        self.checkpointers = []
        try:  # a model that does not build, or a checkpoint of another model, is refused before anything is written
            for run in self.seed_runs:
                self.checkpointers.append(Checkpointer(f"{run.workdir}/checkpoints", keep=tcfg.keep_checkpoints,
                                                       async_save=tcfg.async_checkpoints, read_only=True))
            self.model_config = model_config_dict(task.model)
            self.tx = make_optimizer(tcfg)
            self.schedule = learning_rate_schedule(tcfg)
            args, kwargs = task.init_inputs()
            init = functools.partial(init_state, task.model, self.tx, init_args=args, init_kwargs=kwargs)
            boxed = jax.eval_shape(init, jax.random.PRNGKey(0))
            self.seed_state_shardings = logical_sharding(boxed, self.mesh)  # one seed's, as its checkpoints hold it
            self.abstract_state = nn.unbox(boxed)
            # A checkpoint of the other layer layout (model.scan_layers changed on resume) is converted as restored.
            self.scanned = getattr(getattr(task.model, "cfg", None), "scan_layers", False)
            self.other_layout = None  # the state in the other layout, where there are checkpoints to compare with
            if any(checkpointer.steps() for checkpointer in self.checkpointers):
                self.other_layout = jax.eval_shape(functools.partial(relayout, scanned=not self.scanned),
                                                   self.abstract_state)
            layouts = set()
            for checkpointer in self.checkpointers:
                if self.model_config is not None:
                    checkpointer.check_model_config(self.model_config)
                layouts.add(checkpointer.check_state(self.abstract_state, other_layout=self.other_layout))
            if len(layouts) > 1:
                raise ValueError("the seeds' checkpoints hold their layers in different layouts (model.scan_layers); "
                                 "resume each seed alone")
            self.restore_other_layout = layouts == {True}
        except BaseException:
            self.close()
            raise
        on_mesh = functools.partial(with_activation_sharding, mesh=self.mesh)
        step = functools.partial(on_mesh(train_step), task=task, tx=self.tx, schedule=self.schedule,
                                 accum_steps=tcfg.grad_accum_steps)
        evaluate = functools.partial(on_mesh(eval_sums), task=task)
        self.batch_sharding = batch_sharding(self.mesh)
        self.state_shardings = self.seed_state_shardings
        if self.stacked:
            init, step, evaluate = jax.vmap(init), jax.vmap(step), jax.vmap(evaluate)
            self.state_shardings = jax.tree.map(with_seed_axis, self.seed_state_shardings)
            self.batch_sharding = with_seed_axis(self.batch_sharding)
        self._init = jax.jit(lambda rng: nn.unbox(init(rng)), out_shardings=self.state_shardings)
        self.train_step = jax.jit(step, in_shardings=(self.state_shardings, self.batch_sharding),
                                  out_shardings=(self.state_shardings, replicated(self.mesh)), donate_argnums=(0,))
        self.eval_step = jax.jit(evaluate, in_shardings=(self.state_shardings.params, self.batch_sharding),
                                 out_shardings=replicated(self.mesh))
        count = len(self.seed_runs)
        self._seeds_of = jax.jit(lambda state: [jax.tree.map(lambda x: x[k], state) for k in range(count)],
                                 out_shardings=[self.seed_state_shardings] * count)
        self._stack = jax.jit(lambda states: jax.tree.map(lambda *xs: jnp.stack(xs), *states),
                              out_shardings=self.state_shardings)
        self.log = log

    @property
    def checkpointer(self) -> Checkpointer:
        """The first seed's (the only one's) checkpoints."""
        return self.checkpointers[0]

    def global_batch(self, local: dict | Sequence[dict]) -> dict:
        """This process's rows of a global batch (jaxpos.data.order.host_slice) -> global arrays sharded over
        the mesh; see `make_global_batch`. With several seeds, their batches (one each, in order) stacked [S, B, ...]
        in one transfer."""
        if self.stacked:  # one process (the constructor refuses more): one transfer
            return make_global_batch({key: np.stack([np.asarray(b[key]) for b in local]) for key in local[0]},
                                     self.batch_sharding)
        return make_global_batch(local[0] if isinstance(local, (list, tuple)) else local, self.batch_sharding)

    def seed_states(self, state: TrainState) -> list[TrainState]:
        """Each seed's own state (no seed axis), in the order of the SeedRuns."""
        return self._seeds_of(state) if self.stacked else [state]

    def initial_state(self, data) -> tuple[TrainState, int | None]:
        """(state, the step it was restored from, or None when initialised); the data position restored with it
        (`data`: the seeds' iterators as one, `_Zipped`). Seeds resume from the newest step they all
        saved."""
        abstract = abstract_like(self.abstract_state, self.seed_state_shardings)
        if self.restore_other_layout:  # restored whole on this host's CPU, converted, then placed
            cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
            abstract = abstract_like(self.other_layout, jax.tree.map(lambda _: cpu, self.other_layout))
        if not self.stacked:
            restored = self.checkpointer.restore_latest(abstract)
            if restored is None:
                return self._init(jax.random.PRNGKey(self.seed_runs[0].seed)), None
            step, state, data_state = restored
            data.set_state([data_state])
            return self._in_this_layout(state), step
        saved = [set(checkpointer.steps()) for checkpointer in self.checkpointers]
        if not any(saved):
            return self._init(jnp.stack([jax.random.PRNGKey(run.seed) for run in self.seed_runs])), None
        for step in sorted(set.intersection(*saved), reverse=True):
            # the single run's policy for each copy: a corrupt one is moved aside, an unreadable one stops the run
            restored = [checkpointer.restore_good(step, abstract) for checkpointer in self.checkpointers]
            if any(copy is None for copy in restored):  # an older step that every seed saved
                continue
            data.set_state([data_state for _, data_state in restored])
            return self._stack([self._in_this_layout(state) for state, _ in restored]), step
        listed = "; ".join(f"{run.workdir}: {sorted(steps) or 'none'}" for run, steps in zip(self.seed_runs, saved))
        raise CheckpointError(f"the seeds' checkpoints have no step in common that restores ({listed}); resume "
                              "each seed alone, or move their checkpoints away to start afresh")

    def _in_this_layout(self, state: TrainState) -> TrainState:
        """A restored seed's state in this model's layer layout, placed as training places it."""
        if not self.restore_other_layout:
            return state
        return jax.device_put(relayout(state, scanned=self.scanned), self.seed_state_shardings)

    def evaluate(self, params, batches: Iterable) -> list[dict]:
        """Each seed's held-out metrics (a list of one without a seed axis) over `batches` (as `global_batch` takes
        them: a seed's batch, or a list of the seeds')."""
        total = None
        for batch in batches:
            sums = self.eval_step(params, self.global_batch(batch))
            total = sums if total is None else jax.tree.map(jnp.add, total, sums)
        if total is None:
            raise ValueError("the evaluation data yielded no batch")
        total = jax.device_get(total)
        by_seed = [jax.tree.map(lambda x: x[k], total) for k in range(len(self.seed_runs))] if self.stacked \
            else [total]
        return [{k: float(v) for k, v in self.task.summarize(sums).items()} for sums in by_seed]

    def run(self, data, eval_batches: Callable[[], Iterable[dict]] | None = None,
            hooks: Iterable[Callable[[int, TrainState], dict | None]] = (),
            on_start: Callable[[], None] | None = None) -> TrainResult:
        """Trains the one run to train.num_steps from wherever its checkpoints left off (`run_seeds` for several);
        see `run_seeds`. `hooks` run after every step (and a resumed run's evaluation of its last step) with the step
        and the state, and choose their own steps; what they return is logged as evaluation metrics."""
        if self.stacked:
            raise ValueError(f"this trainer trains {len(self.seed_runs)} seeds: call run_seeds")
        return self.run_seeds([data], None if eval_batches is None else [eval_batches], on_start, hooks)[0]

    def run_seeds(self, data: Sequence, eval_batches: Sequence[Callable[[], Iterable[dict]]] | None = None,
                  on_start: Callable[[], None] | None = None,
                  hooks: Iterable[Callable[[int, TrainState], dict | None]] = ()) -> list[TrainResult]:
        """Trains every seed to train.num_steps from wherever its checkpoints left off: `data` and `eval_batches`
        hold one iterator / one callable per SeedRun, in order. `on_start` runs once the state and the data
        position are restored (or initialised) and before anything is written: the last point at which a run can
        be refused with its workdir untouched. SIGTERM or SIGINT during the loop checkpoints the step in progress
        and raises `RunStopped` (jaxpos.training.interrupt). A run resumed at its last step trains nothing and
        evaluates that step again. Returns each seed's result."""
        tcfg, seeds = self.train, len(self.seed_runs)
        if len(data) != seeds or (eval_batches is not None and len(eval_batches) != seeds):
            raise ValueError(f"{seeds} seed(s) need as many data iterators and evaluation sets")
        if hooks and self.stacked:
            raise ValueError("hooks see one run's state: train seeds with hooks one at a time")
        data = _Zipped(data)
        state, resumed = self.initial_state(data)
        start = int(np.asarray(jax.device_get(state.step)).reshape(-1)[0])
        if on_start is not None:
            on_start()
        for checkpointer in self.checkpointers:
            checkpointer.writable()
        writers = [MetricWriter(run.workdir, tcfg.num_steps, start, enabled=self.log and jax.process_index() == 0,
                                console=k == 0) for k, run in enumerate(self.seed_runs)]
        if self.stacked and self.log:
            writers[0].write(f"training {seeds} seeds at once ({', '.join(str(r.seed) for r in self.seed_runs)}); "
                             f"the lines below are seed {self.seed_runs[0].seed}'s (its loss and tokens/s; step "
                             "time, TFLOP/s and MFU count every seed's work), every seed's are in its workdir's "
                             "TensorBoard")
        if resumed is not None and self.log:
            writers[0].write(f"resumed from checkpoint step {resumed} in {self.workdir}/checkpoints"
                             + (" and the other seeds'" if self.stacked else ""))
        final_metrics, eval_metrics = [{} for _ in range(seeds)], [{} for _ in range(seeds)]
        pending: list[tuple[int, dict]] = []  # (step, device metrics) not read yet
        windows: list[list[dict]] = [[] for _ in range(seeds)]  # each seed's metrics since the last logged step
        tokens_per_step = tcfg.batch_size * self.task.tokens_per_example  # each seed's own; the FLOPs count all
        step_flops = seeds * self.task.step_flops(tcfg.batch_size) if hasattr(self.task, "step_flops") else None
        compute_dtype = getattr(getattr(self.task.model, "cfg", None), "dtype", "float32")
        evaluations = None if eval_batches is None else (
            (lambda: eval_batches[0]()) if not self.stacked else (lambda: zip(*(fn() for fn in eval_batches))))
        tick = time.perf_counter()

        def read_pending() -> None:
            """Host copies of the unread steps' metrics, in one transfer (the steps ran ahead meanwhile); stops
            the run at the first step whose loss, gradient norm or updated state is not finite. Called before
            every log line, evaluation and checkpoint: a state not read finite is never saved (hooks, which run
            every step, may see one not yet read)."""
            if not pending:
                return
            stacked = jax.device_get(_stacked([m for _, m in pending]))  # a transfer a metric, not one a step
            for i, (step, _) in enumerate(pending):
                for k, window in enumerate(windows):
                    host = {name: float(np.reshape(values[i], -1)[k]) for name, values in stacked.items()}
                    state_finite = host.pop("state_finite") == 1.0
                    if not (math.isfinite(host["loss"]) and math.isfinite(host["grad_norm"]) and state_finite):
                        raise self._diverged(host, state_finite, step, k)
                    window.append(host)
            pending.clear()

        def save(done: int, state: TrainState, data_state) -> None:
            read_pending()  # never checkpoint a state not known to be finite
            positions = data_state if data_state is not None else data.get_state()
            for checkpointer, seed_state, position in zip(self.checkpointers, self.seed_states(state), positions):
                if done not in checkpointer.steps():  # a seed that saved it before the batch was stopped keeps it
                    checkpointer.save(done, seed_state, position, self.model_config)

        if tcfg.checkpoint_initial and resumed is None and start == 0:  # the initialisation, as step 0
            save(0, state, None)
        batches, in_flight = None, collections.deque(maxlen=IN_FLIGHT_STEPS)
        with deferred_stop() as stop:
            try:
                # With batches made ahead each carries its data position; made in turn, the iterator's is current.
                batches = Prefetcher(data, self.global_batch, tcfg.prefetch_batches)
                data_state = None
                if start >= tcfg.num_steps and not stop:  # resumed at the end: the last step's evaluation again
                    eval_metrics = self._evaluate_step(start, state, evaluations, hooks, writers, eval_metrics)
                for step in range(start, tcfg.num_steps):
                    batch, data_state = next(batches)
                    state, metrics = self.train_step(state, batch)
                    pending.append((step + 1, metrics))
                    if len(in_flight) == in_flight.maxlen:  # the host stays a few steps ahead, never the whole window
                        jax.block_until_ready(in_flight[0])
                    in_flight.append(metrics)
                    for writer in writers:
                        writer.advance()
                    done = step + 1
                    if done % tcfg.log_every == 0 or done == tcfg.num_steps:
                        read_pending()
                        elapsed = time.perf_counter() - tick
                        tick = time.perf_counter()
                        step_time = elapsed / len(windows[0])  # a step of every seed at once
                        speed = dict(step_time=step_time, tokens_per_s=tokens_per_step / step_time,
                                     **throughput(step_flops, step_time, self.mesh.size,
                                                  self.mesh.devices.flat[0].device_kind, compute_dtype))
                        for k, (writer, window) in enumerate(zip(writers, windows)):
                            final = {name: float(np.mean([m[name] for m in window])) for name in window[-1]}
                            final.update(speed)
                            writer.postfix(loss=final["loss"])
                            if done == tcfg.num_steps:
                                writer.finish_bar()
                            writer.scalars(done, final)
                            final_metrics[k] = final
                            window.clear()
                    if not stop:  # a stopping run saves its step and leaves its evaluation to the resumed one
                        evaluating = evaluations is not None and (done % tcfg.eval_every == 0
                                                                  or done == tcfg.num_steps)
                        if evaluating:
                            read_pending()
                        eval_metrics = self._evaluate_step(done, state, evaluations if evaluating else None, hooks,
                                                           writers, eval_metrics)
                    if done % tcfg.checkpoint_every == 0 or done == tcfg.num_steps or stop:
                        save(done, state, data_state)
                    if stop:
                        break
            finally:
                if batches is not None:
                    batches.close()
                for checkpointer in self.checkpointers:
                    checkpointer.wait()
                for writer in writers:
                    writer.close()
        if stop:  # the step in progress was checkpointed (or the run had just ended): say so instead of going on
            saved = self.checkpointer.steps()
            where = f"{self.workdir}/checkpoints" + (f" and the other {seeds - 1} seeds'" if self.stacked else "")
            raise RunStopped(stop.signum, saved[-1] if saved else None, where)
        return [TrainResult(seed_state, final, evaluated, resumed)
                for seed_state, final, evaluated in zip(self.seed_states(state), final_metrics, eval_metrics)]

    def _evaluate_step(self, step: int, state: TrainState, evaluations, hooks, writers, metrics: list[dict]) \
            -> list[dict]:
        """Step `step`'s held-out evaluation (when `evaluations` gives its batches) and hooks, written to each
        seed's writer: each seed's `metrics` (the latest evaluation's) replaced by the evaluation, updated by what
        the hooks return."""
        if evaluations is not None:
            metrics = self.evaluate(state.params, evaluations())
            for writer, evaluated in zip(writers, metrics):
                writer.scalars(step, evaluated, prefix="eval")
        for hook in hooks:  # one seed only
            extra = hook(step, state)
            if extra:
                writers[0].scalars(step, extra, prefix="eval")
                metrics[0].update(extra)
        return metrics

    def _diverged(self, host: dict, state_finite: bool, step: int, seed_index: int = 0) -> TrainingDiverged:
        """The error that stops a run whose step `step` read `host` (its metrics) and `state_finite`."""
        if not math.isfinite(host["loss"]):
            what = f"loss is {host['loss']}"
        elif not math.isfinite(host["grad_norm"]):
            what = f"gradient norm is {host['grad_norm']}"
        else:
            what = "the updated parameters or optimizer state are not finite"
        run = self.seed_runs[seed_index]
        if self.stacked:
            what += f" for seed {run.seed} (every seed trained with it stops)"
        saved = self.checkpointers[seed_index].steps()  # only states read finite are ever saved
        last = f"The last good checkpoint is step {saved[-1]}" if saved else "There is no checkpoint"
        return TrainingDiverged(f"{what} at step {step}; stopping. {last} in {run.workdir}")

    def close(self):
        for checkpointer in self.checkpointers:
            checkpointer.close()


def check_seed_runs(seed_runs: Sequence[SeedRun]) -> None:
    """Raises ValueError for no seed, a seed twice, or two seeds sharing a workdir."""
    if not seed_runs:
        raise ValueError("no seed to train")
    seeds, folders = [r.seed for r in seed_runs], [r.workdir for r in seed_runs]
    if len(set(seeds)) < len(seeds) or len(set(folders)) < len(folders):
        raise ValueError(f"each seed trains once, in its own workdir: seeds {seeds}, workdirs {folders}")
