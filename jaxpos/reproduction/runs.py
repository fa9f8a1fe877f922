"""The run matrix of `jaxpos reproduce`, its fixed recipes (profiles) and a process pool that executes it.

Every mechanism is pretrained with its profile's recipe (steps x batch x seq_len, learning rate), once per seed;
the seed sets the initialisation, the data order and the masking, so runs with the same seed are paired. A run
executes only the stages the chosen claims need of its mechanism (`STAGES`). Runs go to a pool of worker
processes on this host, one per CPU core (pinned, XLA on one thread) or several per GPU (tiny models are
latency-bound); a finished run's result.json is reused and an unfinished one resumes from its checkpoints, so
running the command again resumes. launch/reproduce.sbatch spreads the same runs over a SLURM job array instead.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import platform
import shutil
import signal
import subprocess
import threading
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from importlib.metadata import version
from typing import Callable, Mapping, Sequence

from jaxpos.config import MECHANISMS, position_config
from jaxpos.config.files import load_config, write_json_atomically
from jaxpos.progress import status

PLAN_FILE = "plan.json"
RESULT_FILE = "result.json"
FAILED_FILE = "failed.txt"
LOG_FILE = "run.log"
# What a run does beyond pretraining and its learning curve, each only where a chosen claim needs it:
#   finetune      fine-tuning on the paraphrase task (dev accuracy)
#   probe         Chen et al.'s word-order probe of the fine-tuned model (needs finetune)
#   last          the analyses (Toeplitz R², locality, symmetry, rank, decomposition) at the last checkpoint
#   over_training the same at every analysed checkpoint (the last included)
#   final         effective attention and token identifiability at the last checkpoint
STAGES = ("finetune", "probe", "last", "over_training", "final")
RUNS_PER_GPU = 8  # worker processes sharing one GPU: a tiny model's step leaves most of it idle


@dataclasses.dataclass(frozen=True)
class RunMechanism:
    """A mechanism as the reproduction runs it: a registry kind under some options."""

    name: str
    label: str  # as the report names it
    position: dict  # the model.position block (kind and options)
    learned: bool  # has learned positional parameters (Chen's "learned encodings")


def run_mechanism(name: str, position: dict, label: str | None = None) -> RunMechanism:
    """The run `name` of the position block `position`; `learned` from the registry, and its label unless given."""
    mechanism = MECHANISMS[position["kind"]]
    return RunMechanism(name, label or mechanism.label, position, mechanism.is_learned(position_config(position)))


# The runs of a kind beside its own (named after the kind, with the registry's label and default options):
# (name, label, options).
RUN_VARIANTS = {
    "tisa": [("tisa_input", "TISA + input positions", dict(tisa=dict(input_positions=True)))],
    "diet_rel": [("diet_rel_layer", "DIET-Rel, shared by layer", dict(diet_rel=dict(sharing="layer")))],
    "diet_abs": [("diet_abs_unshared", "DIET-Abs, unshared", dict(diet_abs=dict(sharing="none"))),
                 ("diet_abs_segments", "DIET-Abs, shared by layer, per-head segments",
                  dict(diet_abs=dict(sharing="layer"), segment="per_head"))],
    "attenuated": [("attenuated_learned", "attenuated, learnable (n x n per head)",
                    dict(attenuated=dict(form="matrix")))],
}

# Every registered mechanism, each followed by its variants.
RUN_MECHANISMS = {run.name: run for kind in MECHANISMS for run in (
    run_mechanism(kind, dict(kind=kind)),
    *(run_mechanism(name, dict(kind=kind, **options), label) for name, label, options in RUN_VARIANTS.get(kind, ())))}
BAG_OF_WORDS = "none"  # the baseline every learning curve is judged against
TIMING_MECHANISM = "tisa"  # timed for the estimate: a logit-bias mechanism, its step costs what most runs' do

FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


@dataclasses.dataclass(frozen=True)
class Profile:
    """A fixed recipe: model, pretraining and fine-tuning data and steps, evaluation points and analysis sizes.
    Nothing in it depends on the machine."""

    name: str
    purpose: str  # one line: what the profile is for
    mechanisms: tuple[str, ...]  # the matrix when no --mechanisms is given
    seeds: int  # seeds when no --seeds is given
    model: dict  # config.model overrides of configs/mlm/tiny.py
    data: dict  # config.data overrides (the pretraining corpus)
    train: dict  # config.train overrides: num_steps, batch_size, learning_rate, ...
    finetune_data: dict  # config.data overrides of configs/finetune/paraphrase.py
    finetune_train: dict  # config.train overrides: num_steps, batch_size, learning_rate
    analysis: dict  # report.analyze options
    max_sentences: int  # held-out sentences the analyses read
    probe_examples: int  # paraphrase test pairs of the word-order probe
    curve_points: int = 8  # held-out MLM loss at this many evenly spaced steps: the learning curve
    analysis_points: int = 4  # of those checkpoints, this many evenly spaced ones (the last included) analysed
    eval_batches: int = 8  # held-out batches behind each point of the curve
    timing_steps: int = 6  # training steps of the timing that estimates the wall time
    xla_flags: str = ""  # added to XLA_FLAGS in each worker

    @property
    def steps(self) -> int:
        return int(self.train["num_steps"])

    def curve_steps(self) -> list[int]:
        """The steps of the learning curve (checkpoints kept at each): [curve_points]."""
        every = self.steps // self.curve_points
        return [every * (k + 1) for k in range(self.curve_points)]

    def analysis_steps(self) -> list[int]:
        """The checkpoints analysed over training: every (curve_points / analysis_points)-th step of the curve."""
        stride = self.curve_points // self.analysis_points
        return self.curve_steps()[stride - 1::stride]

    def check(self) -> None:
        """Raises ValueError for a recipe whose curve or analysis points do not divide its steps."""
        if self.steps % self.curve_points or self.curve_points % self.analysis_points:
            raise ValueError(f"profile {self.name}: {self.steps} steps, {self.curve_points} curve points and "
                             f"{self.analysis_points} analysis points must divide each other")
        unknown = [m for m in self.mechanisms if m not in RUN_MECHANISMS]
        if unknown:
            raise ValueError(f"profile {self.name}: unknown mechanisms {unknown}")


_TINY_ANALYSIS = dict(num_probe_words=16, probe_length=128, lengths=(16, 32, 64, 128), windows=2, probe_epochs=10,
                      probe_patience=3, probe_learning_rate=3e-3, decomposition_sentences=8)
PROFILES = {
    # The recipe the verdicts are for: configs/mlm/tiny.py (d = 128, L = 2, H = 4, D = 32) on 128-token rows of
    # three English Bibles (2.8M tokens), 64 rows a step. At 16 rows a step DIET-Rel's held-out loss parts from
    # the bag-of-words model's between steps 1,000 and 2,000 and learned absolute positions had not parted by
    # step 4,000; 64 rows a step cost a GPU no more time per step (a tiny model is latency-bound) and bring the
    # parting forward, so 4,000 steps leave the slow mechanisms a margin (on an H200, learned absolute positions
    # part by step 1,600). Fine-tuning: 600 steps of 32 pairs.
    "full": Profile(
        "full", "the verdicts: every mechanism, 5 seeds; about half an hour on one GPU host, days on 2 CPU cores",
        tuple(RUN_MECHANISMS), 5,
        model=dict(max_length=128),
        data=dict(source="bible", bible_editions=("web", "kjv", "bbe"), seq_len=128, vocab_size=4000),
        train=dict(num_steps=4000, batch_size=64, learning_rate=2e-3, warmup_fraction=0.05, max_predictions=32),
        finetune_data=dict(max_length=128, offline_train_examples=4000, offline_dev_examples=1000,
                           offline_test_examples=1000),
        finetune_train=dict(num_steps=600, batch_size=32, learning_rate=1e-3),
        analysis=_TINY_ANALYSIS, max_sentences=64, probe_examples=1000, curve_points=10, analysis_points=5,
        timing_steps=40),
    # A first look in minutes on 2 CPU cores: a d = 64 model on 64-token rows of one Bible, 2 seeds, four
    # mechanisms. Its models are judged as untrained where they are: the verdicts are the full profile's to give.
    "smoke": Profile(
        "smoke", "a first look: a small model, 4 mechanisms, 2 seeds, a few minutes on 2 CPU cores",
        ("none", "absolute", "tisa", "diet_rel"), 2,
        model=dict(d_model=64, num_layers=2, num_heads=4, mlp_dim=128, max_length=64, dropout=0.0,
                   attention_dropout=0.0),
        data=dict(source="bible", bible_editions=("web",), max_documents=400, seq_len=64, vocab_size=2000),
        train=dict(num_steps=240, batch_size=16, learning_rate=3e-3, warmup_fraction=0.05, max_predictions=16),
        finetune_data=dict(max_length=64, offline_train_examples=512, offline_dev_examples=256,
                           offline_test_examples=256, bible_books=tuple(range(1, 11)), bible_dev_fraction=0.1,
                           bible_test_fraction=0.1),
        finetune_train=dict(num_steps=60, batch_size=16, learning_rate=1e-3),
        analysis=dict(_TINY_ANALYSIS, probe_length=64, lengths=(16, 32, 64), probe_epochs=4),
        max_sentences=32, probe_examples=128, curve_points=4, analysis_points=2, eval_batches=4,
        xla_flags=FAST_COMPILE),
    # For tests: a d = 32 model (D = 8) on 32-token rows, a few steps.
    "micro": Profile(
        "micro", "tests: a d = 32 model, a few steps", ("none", "tisa"), 2,
        model=dict(d_model=32, num_layers=2, num_heads=4, mlp_dim=48, max_length=32, dropout=0.0,
                   attention_dropout=0.0),
        data=dict(source="bible", bible_editions=("web",), max_documents=60, eval_fraction=0.2, seq_len=32,
                  vocab_size=400),
        train=dict(num_steps=12, batch_size=8, learning_rate=3e-3, warmup_fraction=0.1, max_predictions=8),
        finetune_data=dict(max_length=32, offline_train_examples=64, offline_dev_examples=32,
                           offline_test_examples=32, bible_books=(1, 2), bible_dev_fraction=0.1,
                           bible_test_fraction=0.1),
        finetune_train=dict(num_steps=4, batch_size=8, learning_rate=1e-3),
        analysis=dict(num_probe_words=4, probe_length=32, lengths=(8, 16), windows=1, probe_epochs=2,
                      probe_patience=1, probe_learning_rate=3e-3, decomposition_sentences=4),
        max_sentences=16, probe_examples=24, curve_points=2, analysis_points=2, eval_batches=2, timing_steps=3,
        xla_flags=FAST_COMPILE),
}


def run_name(mechanism: str, seed: int) -> str:
    return f"{mechanism}_s{seed}"


def repo_config(relative: str) -> str:
    """A config file of the repository (configs/...), next to the installed package in a checkout."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), relative)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is missing: `jaxpos reproduce` runs from a checkout of the repository "
                                "(pip install -e .)")
    return path


# --- the configs of a run ---------------------------------------------------------------------------------------

def clean_log_every(steps: int, every: int) -> int:
    """A logging interval whose last window, (steps - every + 1, steps], holds no checkpoint or evaluation (they
    happen at multiples of `every`), so its mean step time is the step's own cost (the step-time claim reads it)."""
    return steps - (every - 1) if every > 1 else steps


def pretrain_config(plan: dict, mechanism: str, seed: int):
    """configs/mlm/tiny.py with the profile's recipe, the mechanism's position block, the shared tokenizer, and a
    checkpoint (all kept) at each step of the learning curve."""
    profile = profile_of(plan)
    config = load_config(repo_config("configs/mlm/tiny.py"))
    config.model.update(profile.model)
    for key, value in RUN_MECHANISMS[mechanism].position.items():
        if isinstance(value, dict):
            config.model.position[key].update(value)
        else:
            config.model.position[key] = value
    config.data.update(profile.data)
    config.data.update(tokenizer_path=plan.get("tokenizer", ""), seed=seed)
    steps = profile.steps
    every = steps // profile.curve_points
    config.train.update(profile.train)
    config.train.update(seed=seed, log_every=clean_log_every(steps, every), eval_every=steps,
                        eval_batches=profile.eval_batches, checkpoint_every=every,
                        keep_checkpoints=profile.curve_points + 1)
    return config


def finetune_config(plan: dict, seed: int):
    """configs/finetune/paraphrase.py (the offline Bible paraphrase task) with the profile's recipe and two dev
    evaluations (half-way and at the end; a run's score is the better one, as in DIET's protocol)."""
    profile = profile_of(plan)
    config = load_config(repo_config("configs/finetune/paraphrase.py"))
    config.data.update(profile.finetune_data)
    config.data.seed = seed
    config.train.update(profile.finetune_train)
    steps = config.train.num_steps
    every = max(1, steps // 2)
    config.train.update(seed=seed, eval_every=every, log_every=clean_log_every(steps, every), checkpoint_every=steps)
    return config


# --- the plan ----------------------------------------------------------------------------------------------------

def machine() -> dict:
    """What ran it: CPU model, cores, GPUs (nvidia-smi), Python and jax versions."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    info = dict(cpu=cpu, cores=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                gpus=gpus(), python=platform.python_version(), host=platform.node())
    try:
        info["jax"] = version("jax")
    except Exception:  # noqa: BLE001 - informational only
        pass
    return info


def gpus() -> list[str]:
    """NVIDIA GPUs of this host (nvidia-smi -L), without importing jax (which would hold a device)."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.splitlines() if line.startswith("GPU ")]


def _cores() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def default_workers() -> int:
    """RUNS_PER_GPU per GPU (no more than the cores, which feed them), else one per CPU core."""
    count = len(gpus())
    return min(count * RUNS_PER_GPU, len(_cores())) if count else len(_cores())


def make_plan(profile: Profile, seeds: int, needs: Mapping[str, Sequence[str]], workers: int,
              claims: Sequence[str] = ()) -> dict:
    """The run matrix: a run per mechanism of `needs` ({mechanism: stages}) and seed, doing those stages."""
    profile.check()
    if seeds < 1:
        raise ValueError(f"--seeds {seeds}: need at least one seed")
    if workers < 1:
        raise ValueError(f"--workers {workers}: need at least one")
    if not needs:
        raise ValueError("the chosen claims need no run of the chosen mechanisms")
    bad = sorted({s for stages in needs.values() for s in stages} - set(STAGES))
    if bad:
        raise ValueError(f"unknown stages {bad}; stages are {', '.join(STAGES)}")
    order = [m for m in RUN_MECHANISMS if m in needs]
    runs = {run_name(m, s): dict(mechanism=m, seed=s, stages=[x for x in STAGES if x in needs[m]])
            for s in range(seeds) for m in order}  # seed-major: every mechanism's first seed comes first
    return dict(profile=dataclasses.asdict(profile), mechanisms=order, claims=list(claims), seeds=seeds,
                workers=workers, runs=runs, machine=machine(), created=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                started_unix=time.time())


def load_plan(out: str) -> dict | None:
    """OUT/plan.json, its tokenizer's path made absolute; None where there is none."""
    path = os.path.join(out, PLAN_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        plan = json.load(f)
    if plan.get("tokenizer"):
        plan["tokenizer"] = os.path.join(os.path.abspath(out), plan["tokenizer"])
    return plan


def save_plan(out: str, plan: dict) -> None:
    """Writes OUT/plan.json, the tokenizer's path relative to OUT: the folder may move to another host and resume
    there (finished runs are reused)."""
    os.makedirs(out, exist_ok=True)
    saved = dict(plan)
    if saved.get("tokenizer"):
        saved["tokenizer"] = os.path.relpath(saved["tokenizer"], os.path.abspath(out))
    write_json_atomically(os.path.join(out, PLAN_FILE), saved, indent=1)


def profile_of(plan: dict) -> Profile:
    """The plan's profile (as saved: tuples came back as lists)."""
    values = dict(plan["profile"])
    values["mechanisms"] = tuple(values["mechanisms"])
    values["analysis"] = dict(values["analysis"], lengths=tuple(values["analysis"]["lengths"]))
    return Profile(**values)


def run_dir(out: str, name: str) -> str:
    return os.path.join(out, "runs", name)


def read_result(out: str, name: str) -> dict | None:
    path = os.path.join(run_dir(out, name), RESULT_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def mark_failed(out: str, name: str, message: str) -> None:
    with open(os.path.join(run_dir(out, name), FAILED_FILE), "w") as f:
        f.write(message.strip() + "\n")


def failure(out: str, name: str) -> str | None:
    path = os.path.join(run_dir(out, name), FAILED_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return f.read().strip()


# --- the process pool --------------------------------------------------------------------------------------------
# concurrent.futures' ProcessPoolExecutor over spawned workers: each starts a fresh interpreter, so the environment
# its initializer sets is in place before it imports jax. A worker takes the next run, executes it with its output
# in runs/NAME/run.log, and takes the next; imports and the backend start once per worker.

def worker_env(out: str, slot: int, gpu_count: int, xla_flags: str = "") -> dict:
    """The environment of the worker in `slot`: its GPU share (no preallocation, so several fit on one GPU), or
    the CPU alone (each worker has its own core); XLA's CPU programs (a GPU worker's analyses) on one thread; a
    compilation cache shared by the runs (the seeds of a mechanism compile the same programs); the profile's XLA
    flags."""
    env = {}
    flags = os.environ.get("XLA_FLAGS", "")
    flags = " ".join(f for f in flags.split() if not f.startswith("--xla_force_host_platform_device_count"))
    if gpu_count:
        env["CUDA_VISIBLE_DEVICES"] = str(slot % gpu_count)
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    else:
        env["JAX_PLATFORMS"] = "cpu"
    flags += " --xla_cpu_multi_thread_eigen=false"  # the pool fills the cores: one thread for its CPU programs
    env["XLA_FLAGS"] = " ".join((flags + " " + xla_flags).split())
    env["JAX_COMPILATION_CACHE_DIR"] = os.path.join(os.path.abspath(out), "jax_cache")
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.3"
    return env


_EVERY_WORKER = None  # in a pool worker: the pool's barrier (a multiprocessing.Barrier of all its workers)


def wait_for_every_worker(timeout_s: float = 900.0) -> None:
    """In a pool worker, inside a call of `Pool.call_on_every_worker`: returns once every worker has reached this
    point (or after `timeout_s`, if one never does); elsewhere at once."""
    if _EVERY_WORKER is None:
        return
    try:
        _EVERY_WORKER.wait(timeout_s)
    except threading.BrokenBarrierError:  # a worker failed or was late: the timing goes on without it
        pass


def _start_worker(out: str, slots, barrier, gpu_count: int, pin: bool, xla_flags: str) -> None:
    """A pool worker's initializer: takes a slot, keeps the pool's barrier, sets its environment and pins it to its
    core."""
    global _EVERY_WORKER
    _EVERY_WORKER = barrier
    slot = slots.get()
    os.environ.update(worker_env(out, slot, gpu_count, xla_flags))
    if pin and hasattr(os, "sched_setaffinity"):
        cores = _cores()
        os.sched_setaffinity(0, {cores[slot % len(cores)]})
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent stops the workers


def _call_in_worker(function: str, out: str, name: str):
    """pipeline.`function`(out, name) in a worker."""
    from jaxpos.reproduction import pipeline  # imported in the worker, after its environment: jax reads it there

    return getattr(pipeline, function)(out, name)


class Pool:
    """`workers` worker processes on this host: one per CPU core (pinned), or shares of the GPUs. A context
    manager; leaving it early (an exception, SIGTERM, Ctrl-C) stops the workers with SIGTERM, on which a
    training run checkpoints, and waits for them."""

    def __init__(self, out: str, workers: int, xla_flags: str = ""):
        gpu_count = len(gpus())
        context = multiprocessing.get_context("spawn")
        slots = context.Queue()
        for slot in range(workers):
            slots.put(slot)
        pin = not gpu_count and workers <= len(_cores())
        self.out, self.workers = out, workers
        self.device = f"{gpu_count} GPU(s), {workers} worker(s)" if gpu_count else f"{workers} CPU worker(s)"
        self.executor = ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker,
                                            initargs=(out, slots, context.Barrier(workers), gpu_count, pin,
                                                      xla_flags))

    def __enter__(self):
        def interrupted(signum, frame):
            raise KeyboardInterrupt(f"signal {signum}")

        self.previous = signal.signal(signal.SIGTERM, interrupted)
        return self

    def call(self, function: str, name: str):
        """pipeline.`function`(out, name) on one worker; its return value."""
        return self.executor.submit(_call_in_worker, function, self.out, name).result()

    def call_on_every_worker(self, function: str, name: str) -> list:
        """pipeline.`function`(out, name) as many times as there are workers, submitted at once so that each
        worker takes one (each call outlasts the workers' start); the return values."""
        futures = [self.executor.submit(_call_in_worker, function, self.out, name) for _ in range(self.workers)]
        return [future.result() for future in futures]

    def map(self, function: str, names: Sequence[str], on_result: Callable[[str, object], None]) -> dict:
        """pipeline.`function`(out, name) for each name, the first free worker taking the next; `on_result`
        sees each as it ends. Returns {name: return value, or "failed: why" where the worker died}."""
        futures = {self.executor.submit(_call_in_worker, function, self.out, n): n for n in names}
        results = {}
        for future in as_completed(futures):
            name = futures[future]
            try:
                results[name] = future.result()
            except BrokenProcessPool:  # a worker was killed (out of memory?): the pool cannot go on
                results[name] = "failed: its worker process died"
            on_result(name, results[name])
        return results

    def __exit__(self, kind, error, trace):
        signal.signal(signal.SIGTERM, self.previous)
        if kind is None:
            self.executor.shutdown(wait=True)
            return
        self.executor.shutdown(wait=False, cancel_futures=True)
        workers = multiprocessing.active_children()
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.join(timeout=120)
            if worker.is_alive():
                worker.kill()


def pace(ended: int, total: int, elapsed_s: float) -> str:
    """'ENDED of TOTAL', and while runs remain, their wall time at the pool's pace so far (runs ended per second
    since the pool started: the measured counterpart of the estimate printed before)."""
    left = total - ended
    if not left:
        return f"{ended} of {total}"
    return f"{ended} of {total}; the rest about {left * elapsed_s / ended / 60:.1f} min at the pace so far"


def execute(out: str, names: Sequence[str], pool: Pool, *, log=status) -> dict:
    """Executes the unfinished runs of `names` on `pool`; finished ones (result.json) are reused. Returns
    {name: outcome}; raises RuntimeError naming the runs that did not finish."""
    pending = [n for n in names if read_result(out, n) is None]
    if not pending:
        return {}
    log(f"{len(pending)} run(s) on {pool.device}"
        + (f"; {len(names) - len(pending)} finished before" if len(pending) < len(names) else ""))

    start, ended = time.perf_counter(), []

    def report(name, outcome):
        ended.append(name)
        where = "" if outcome == "done" else f"; see {os.path.join(run_dir(out, name), LOG_FILE)}"
        log(f"  {name}: {outcome}{where} ({pace(len(ended), len(pending), time.perf_counter() - start)})")

    outcomes = pool.map("execute_logged", pending, report)
    failed = [n for n in pending if outcomes.get(n) != "done"]
    if failed:
        reasons = "; ".join(f"{n}: {outcomes.get(n, 'did not finish')}" for n in failed)
        raise RuntimeError(f"{len(failed)} run(s) did not finish ({reasons}); their logs are "
                           f"{os.path.join(out, 'runs', 'NAME', LOG_FILE)}. Running the command again resumes.")
    return outcomes
