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
from typing import Callable, Iterable, Protocol

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxpos.config.run import MeshConfig, TrainConfig
from jaxpos.sharding import (activation_sharding, batch_sharding, check_batch_divisible, logical_sharding, make_mesh,
                             replicated)
from jaxpos.training.checkpoint import Checkpointer, abstract_like
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


@dataclasses.dataclass
class TrainResult:
    state: TrainState
    final_metrics: dict
    eval_metrics: dict
    resumed_from: int | None


class Trainer:
    """Builds the mesh, shardings and jitted steps for a task, then runs and resumes training."""

    def __init__(self, train: TrainConfig, workdir: str, task: Task, *, mesh: MeshConfig | Mesh | None = None,
                 log: bool = True):
        """`train`: the run's checked train block; `mesh`: a Mesh, or the sizes of one over every device of every
        process (None: MeshConfig's defaults). Refuses, before anything is written or compiled, a batch the mesh
        cannot split and a workdir whose newest checkpoint holds another model: the checkpoints are only read until
        `run` has restored them and the data position (`on_start`)."""
        self.train, self.workdir, self.task = train, workdir, task
        tcfg = train
        self.mesh = mesh if isinstance(mesh, Mesh) else make_mesh(**dataclasses.asdict(mesh or MeshConfig()))
        check_batch_divisible(tcfg.batch_size, self.mesh, jax.process_count(), tcfg.grad_accum_steps)
        if tcfg.prefetch_batches and jax.process_count() > 1:
            raise ValueError("train.prefetch_batches makes batches on a thread of one process; a run of "
                             f"{jax.process_count()} processes makes each in turn: set it to 0")
        self.checkpointer = Checkpointer(f"{workdir}/checkpoints", keep=tcfg.keep_checkpoints,
                                         async_save=tcfg.async_checkpoints, read_only=True)
        try:  # a model that does not build, or a checkpoint of another model, is refused before anything is written
            self.model_config = model_config_dict(task.model)
            self.tx = make_optimizer(tcfg)
            self.schedule = learning_rate_schedule(tcfg)
            args, kwargs = task.init_inputs()
            init = functools.partial(init_state, task.model, self.tx, init_args=args, init_kwargs=kwargs)
            boxed = jax.eval_shape(init, jax.random.PRNGKey(0))
            self.state_shardings = logical_sharding(boxed, self.mesh)
            self.abstract_state = nn.unbox(boxed)
            if self.model_config is not None:
                self.checkpointer.check_model_config(self.model_config)
            self.checkpointer.check_state(self.abstract_state)
        except BaseException:
            self.checkpointer.close()
            raise
        on_mesh = functools.partial(with_activation_sharding, mesh=self.mesh)
        self._init = jax.jit(lambda rng: nn.unbox(init(rng)), out_shardings=self.state_shardings)
        self.batch_sharding = batch_sharding(self.mesh)
        self.train_step = jax.jit(
            functools.partial(on_mesh(train_step), task=task, tx=self.tx, schedule=self.schedule,
                              accum_steps=tcfg.grad_accum_steps),
            in_shardings=(self.state_shardings, self.batch_sharding),
            out_shardings=(self.state_shardings, replicated(self.mesh)), donate_argnums=(0,))
        self.eval_step = jax.jit(functools.partial(on_mesh(eval_sums), task=task),
                                 in_shardings=(self.state_shardings.params, self.batch_sharding),
                                 out_shardings=replicated(self.mesh))
        self.log = log

    def global_batch(self, local: dict) -> dict:
        """This process's rows of a global batch (jaxpos.data.order.host_slice) -> global arrays sharded over
        the mesh; see `make_global_batch`."""
        return make_global_batch(local, self.batch_sharding)

    def initial_state(self, data) -> tuple[TrainState, int | None]:
        restored = self.checkpointer.restore_latest(abstract_like(self.abstract_state, self.state_shardings))
        if restored is None:
            return self._init(jax.random.PRNGKey(self.train.seed)), None
        step, state, data_state = restored
        data.set_state(data_state)
        return state, step

    def evaluate(self, params, batches: Iterable[dict]) -> dict:
        total = None
        for batch in batches:
            sums = self.eval_step(params, self.global_batch(batch))
            total = sums if total is None else jax.tree.map(jnp.add, total, sums)
        if total is None:
            raise ValueError("the evaluation data yielded no batch")
        return {k: float(v) for k, v in self.task.summarize(jax.device_get(total)).items()}

    def run(self, data, eval_batches: Callable[[], Iterable[dict]] | None = None,
            hooks: Iterable[Callable[[int, TrainState], dict | None]] = (),
            on_start: Callable[[], None] | None = None) -> TrainResult:
        """Trains to train.num_steps from wherever the workdir's checkpoints left off. `on_start` runs once the state
        and the data position are restored (or initialised) and before anything is written: the last point at
        which a run can be refused with its workdir untouched. SIGTERM or SIGINT during the loop checkpoints the
        step in progress and raises `RunStopped` (jaxpos.training.interrupt). A run resumed at its last step
        trains nothing and evaluates that step again."""
        tcfg = self.train
        state, resumed = self.initial_state(data)
        start = int(jax.device_get(state.step))
        if on_start is not None:
            on_start()
        self.checkpointer.writable()
        writer = MetricWriter(self.workdir, tcfg.num_steps, start, enabled=self.log and jax.process_index() == 0)
        if resumed is not None and self.log:
            writer.write(f"resumed from checkpoint step {resumed} in {self.workdir}/checkpoints")
        final_metrics, eval_metrics = {}, {}
        pending: list[tuple[int, dict]] = []  # (step, device metrics) not read yet
        window: list[dict] = []  # host metrics of the steps since the last logged one
        tokens_per_step = tcfg.batch_size * self.task.tokens_per_example
        step_flops = self.task.step_flops(tcfg.batch_size) if hasattr(self.task, "step_flops") else None
        compute_dtype = getattr(getattr(self.task.model, "cfg", None), "dtype", "float32")
        tick = time.perf_counter()

        def read_pending() -> None:
            """Host copies of the unread steps' metrics, in one transfer (the steps ran ahead meanwhile); stops
            the run at the first step whose loss, gradient norm or updated state is not finite. Called before
            every log line, evaluation and checkpoint: a state not read finite is never saved."""
            if not pending:
                return
            stacked = jax.device_get(_stacked([m for _, m in pending]))  # a transfer a metric, not one a step
            for k, (step, _) in enumerate(pending):
                host = {name: float(values[k]) for name, values in stacked.items()}
                state_finite = host.pop("state_finite") == 1.0
                if not (math.isfinite(host["loss"]) and math.isfinite(host["grad_norm"]) and state_finite):
                    raise self._diverged(host, state_finite, step)
                window.append(host)
            pending.clear()

        batches, in_flight = None, collections.deque(maxlen=IN_FLIGHT_STEPS)
        with deferred_stop() as stop:
            try:
                # With batches made ahead each carries its data position; made in turn, the iterator's is current.
                batches = Prefetcher(data, self.global_batch, tcfg.prefetch_batches)
                data_state = None
                if start >= tcfg.num_steps and not stop:  # resumed at the end: the last step's evaluation again
                    eval_metrics = self._evaluate_step(start, state, eval_batches is not None, eval_batches, hooks,
                                                       writer, {})
                for step in range(start, tcfg.num_steps):
                    batch, data_state = next(batches)
                    state, metrics = self.train_step(state, batch)
                    pending.append((step + 1, metrics))
                    if len(in_flight) == in_flight.maxlen:  # the host stays a few steps ahead, never the whole window
                        jax.block_until_ready(in_flight[0])
                    in_flight.append(metrics)
                    writer.advance()
                    done = step + 1
                    if done % tcfg.log_every == 0 or done == tcfg.num_steps:
                        read_pending()
                        elapsed = time.perf_counter() - tick
                        tick = time.perf_counter()
                        final_metrics = {k: float(np.mean([m[k] for m in window])) for k in window[-1]}
                        final_metrics["step_time"] = elapsed / len(window)
                        final_metrics["tokens_per_s"] = tokens_per_step / final_metrics["step_time"]
                        final_metrics.update(throughput(step_flops, final_metrics["step_time"], self.mesh.size,
                                                        self.mesh.devices.flat[0].device_kind, compute_dtype))
                        writer.postfix(loss=final_metrics["loss"])
                        if done == tcfg.num_steps:
                            writer.finish_bar()
                        writer.scalars(done, final_metrics)
                        window.clear()
                    if not stop:  # a stopping run saves its step and leaves its evaluation to the resumed one
                        evaluating = eval_batches is not None and (done % tcfg.eval_every == 0
                                                                   or done == tcfg.num_steps)
                        if evaluating:
                            read_pending()
                        eval_metrics = self._evaluate_step(done, state, evaluating, eval_batches, hooks, writer,
                                                           eval_metrics)
                    if done % tcfg.checkpoint_every == 0 or done == tcfg.num_steps or stop:
                        read_pending()  # never checkpoint a state not known to be finite
                        position = data_state if data_state is not None else data.get_state()
                        self.checkpointer.save(done, state, position, self.model_config)
                    if stop:
                        break
            finally:
                if batches is not None:
                    batches.close()
                self.checkpointer.wait()
                writer.close()
        if stop:  # the step in progress was checkpointed (or the run had just ended): say so instead of going on
            saved = self.checkpointer.steps()
            raise RunStopped(stop.signum, saved[-1] if saved else None, f"{self.workdir}/checkpoints")
        return TrainResult(state, final_metrics, eval_metrics, resumed)

    def _evaluate_step(self, step: int, state: TrainState, evaluating: bool, eval_batches, hooks, writer,
                       metrics: dict) -> dict:
        """Step `step`'s held-out evaluation (when `evaluating`) and hooks, written to `writer`: `metrics` (the
        latest evaluation's) replaced by the evaluation, updated by what the hooks return."""
        if evaluating:
            metrics = self.evaluate(state.params, eval_batches())
            writer.scalars(step, metrics, prefix="eval")
        for hook in hooks:
            extra = hook(step, state)
            if extra:
                writer.scalars(step, extra, prefix="eval")
                metrics.update(extra)
        return metrics

    def _diverged(self, host: dict, state_finite: bool, step: int) -> TrainingDiverged:
        """The error that stops a run whose step `step` read `host` (its metrics) and `state_finite`."""
        if not math.isfinite(host["loss"]):
            what = f"loss is {host['loss']}"
        elif not math.isfinite(host["grad_norm"]):
            what = f"gradient norm is {host['grad_norm']}"
        else:
            what = "the updated parameters or optimizer state are not finite"
        saved = self.checkpointer.steps()  # only states read finite are ever saved
        last = f"The last good checkpoint is step {saved[-1]}" if saved else "There is no checkpoint"
        return TrainingDiverged(f"{what} at step {step}; stopping. {last} in {self.workdir}")

    def close(self):
        self.checkpointer.close()
