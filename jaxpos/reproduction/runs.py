"""The run matrix of `jaxpos reproduce` and its scheduling.

Every mechanism is pretrained with the same data, recipe and token budget (steps x batch x seq_len), once per
seed; the seed sets the initialisation, the data order and the masking. The budget (`--budget-minutes`) covers the
whole command: a calibration (one run of the full pipeline with a few steps per worker, in parallel as the real
runs will be, and once more with their programs compiled when there are several seeds) measures the fixed cost of
a run and the time of a step, and the steps per run follow from what is left. Under a small budget per run the
programs are compiled unoptimised (`FAST_COMPILE`), and the calibration measures that mode. Runs go to worker
processes (`jaxpos reproduce --out DIR --run NAME,NAME,...`), one per core (pinned, XLA on one thread) or per GPU
(CUDA_VISIBLE_DEVICES), each claiming runs and executing them one after another; launch/reproduce.sh starts the
same workers on a host.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from typing import Sequence

from jaxpos.config import MECHANISMS, position_config
from jaxpos.progress import status

PLAN_FILE = "plan.json"
RESULT_FILE = "result.json"


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


FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


@dataclasses.dataclass(frozen=True)
class Profile:
    """Model size, recipes and analysis budgets of a reproduction. Steps are derived from the budget unless
    `fixed_steps` is set."""

    name: str
    mechanisms: tuple[str, ...]
    model: dict  # config.model overrides of configs/mlm/tiny.py
    data: dict  # config.data overrides
    train: dict  # config.train overrides
    finetune_train: dict  # config.train overrides of configs/finetune/tiny.py
    finetune_data: dict
    analysis: dict  # report.analyze options
    max_sentences: int  # sentences the analyses read
    probe_sentences: int  # sentences (word-order test split) of the masked-LM word-order probe
    checkpoints: int = 4  # evenly spaced checkpoints analysed over training
    min_steps: int = 8
    max_steps: int = 20_000
    finetune_ratio: float = 0.5  # fine-tuning steps per pretraining step (pretraining is where mechanisms part)
    min_finetune_steps: int = 8  # ... within this range
    max_finetune_steps: int = 1_000
    fixed_steps: int = 0  # > 0: skip the calibration and pretrain this many steps
    calibration_steps: int = 32  # pretraining steps of a calibration run
    calibration_finetune_steps: int = 16
    xla_flags: str = ""  # added to XLA_FLAGS in each run's process
    # Below this many seconds of budget per run, compiling dominates a run: its programs are compiled unoptimised
    # (FAST_COMPILE: about half the compile time, steps about 2.5x slower on a CPU); the timing measures that mode.
    fast_compile_below_s: float = 80.0


PROFILES = {
    # configs/mlm/tiny.py (d=128, L=2, H=4, D=32) on 64-token rows: the logit-rank and effective-attention
    # claims need T > D, and the sequences are as long as the word-order task's.
    "tiny": Profile(
        "tiny", tuple(RUN_MECHANISMS),
        model=dict(max_length=64),
        data=dict(seq_len=64, vocab_size=4000),
        train=dict(batch_size=16, max_predictions=16),
        finetune_train=dict(batch_size=16, learning_rate=1e-3),
        finetune_data=dict(max_length=64),
        analysis=dict(num_probe_words=16, probe_length=64, lengths=(16, 32, 64), windows=2, probe_epochs=10,
                      probe_patience=3, probe_learning_rate=3e-3, decomposition_sentences=8),
        max_sentences=64, probe_sentences=96),
    # For tests and smoke runs: a d=32 model (D=8) on 16-token rows, two mechanisms, a few steps.
    "micro": Profile(
        "micro", ("absolute", "diet_rel"),
        model=dict(d_model=32, num_layers=2, num_heads=4, mlp_dim=48, max_length=16, dropout=0.0,
                   attention_dropout=0.0),
        data=dict(seq_len=16, vocab_size=300, max_documents=40),
        train=dict(batch_size=8, max_predictions=4),
        finetune_train=dict(batch_size=8, learning_rate=1e-3),
        finetune_data=dict(max_length=16, offline_train_examples=64, offline_dev_examples=48),
        analysis=dict(num_probe_words=4, probe_length=16, lengths=(16,), windows=1, probe_epochs=2,
                      probe_patience=1, probe_learning_rate=3e-3, decomposition_sentences=4),
        max_sentences=24, probe_sentences=12, checkpoints=2, min_steps=4, min_finetune_steps=4, fixed_steps=4,
        # A few steps: compiling dominates, and unoptimised CPU code compiles in half the time.
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


# --- the budget --------------------------------------------------------------------------------------------------

def finetune_steps_for(steps: int, profile: Profile) -> int:
    """Fine-tuning steps that go with `steps` pretraining steps: profile.finetune_ratio of them, clipped to the
    profile's range (a bigger budget buys both)."""
    return int(min(profile.max_finetune_steps, max(profile.min_finetune_steps, round(profile.finetune_ratio * steps))))


def steps_for_budget(seconds_left: float, runs: int, workers: int, fixed_s: float, step_s: float,
                     finetune_step_s: float, profile: Profile, *, cold_runs: int | None = None,
                     warm_fixed_s: float | None = None, startup_s: float = 0.0) -> tuple[int, int, str]:
    """(pretraining steps, fine-tuning steps, a note) such that `runs` runs spread over `workers` parallel
    processes fit in `seconds_left`. A run costs its fixed part (start-up, compiling, evaluations, analyses)
    plus steps * step_s + finetune_steps * finetune_step_s; the fixed part is fixed_s for the first `cold_runs`
    (default: all) and warm_fixed_s for the others (the seeds of a mechanism after the first reuse its compiled
    programs); each worker pays `startup_s` once. Pretraining steps are a multiple of the checkpoint count within
    [min_steps, max_steps]; the note says when even the floor overruns the budget."""
    if runs < 1 or workers < 1:
        raise ValueError(f"need at least one run and one worker (runs={runs}, workers={workers})")
    if step_s <= 0 or finetune_step_s < 0 or fixed_s < 0:
        raise ValueError(f"timings must be positive (fixed {fixed_s} s, step {step_s} s, fine-tuning step "
                         f"{finetune_step_s} s)")
    cold = runs if cold_runs is None else min(cold_runs, runs)
    warm = fixed_s if warm_fixed_s is None else min(warm_fixed_s, fixed_s)
    fixed_per_worker = startup_s + (cold * fixed_s + (runs - cold) * warm) / workers
    rounds = math.ceil(runs / workers)
    k = profile.checkpoints

    def total(steps):  # the busiest worker's seconds
        return fixed_per_worker + rounds * (steps * step_s + finetune_steps_for(steps, profile) * finetune_step_s)

    per_step = rounds * (step_s + profile.finetune_ratio * finetune_step_s)
    steps = max(0, int((seconds_left - fixed_per_worker) / per_step) // k * k)
    while steps > 0 and total(steps) > seconds_left:  # the fine-tuning floor can make the estimate optimistic
        steps -= k
    fixed_text = f"{fixed_s:.0f} s fixed" + (f" ({warm:.0f} s once compiled)" if cold < runs else "")
    if steps < profile.min_steps:
        steps = profile.min_steps
        note = (f"OVER BUDGET: {runs} runs need {fixed_per_worker / 60:.1f} min of fixed cost per worker on this "
                f"machine now ({fixed_text}), more than the {seconds_left / 60:.1f} min left; running the minimum "
                f"{steps} steps, about {total(steps) / 60:.1f} min")
    elif steps > profile.max_steps:
        steps = profile.max_steps
        note = f"capped at the profile's {steps} steps"
    else:
        note = (f"{rounds} rounds of {workers} parallel runs in {seconds_left / 60:.1f} min: {fixed_text} + {steps} "
                f"pretraining steps x {step_s * 1000:.0f} ms + {finetune_steps_for(steps, profile)} fine-tuning "
                f"steps x {finetune_step_s * 1000:.0f} ms per run")
    return steps, finetune_steps_for(steps, profile), note


def calibration_estimate(results: Sequence[dict]) -> tuple[float, float, float, float]:
    """(fixed seconds per run, seconds per pretraining step, seconds per fine-tuning step, a worker's start-up
    seconds) from calibration runs' results (the slowest of them): a run's fixed part is its wall time less its own
    pretraining and fine-tuning steps; start-up (imports, the backend) is paid once per worker."""
    fixed, step, finetune_step, startup = [], [], [], [0.0]
    for r in results:
        t = r["timing"]
        step.append(t["pretrain_step_s"])
        finetune_step.append(t["finetune_step_s"])
        fixed.append(t["wall_s"] - t["pretrain_steps"] * t["pretrain_step_s"]
                     - t["finetune_steps"] * t["finetune_step_s"])
        startup.append(t.get("worker_startup_s") or 0.0)
    return max(fixed), max(step), max(finetune_step), max(startup)


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
        from importlib.metadata import version

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


def default_workers() -> int:
    return len(gpus()) or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def make_plan(profile: Profile, seeds: int, budget_minutes: float, workers: int,
              mechanisms: Sequence[str] | None = None) -> dict:
    """The run matrix (steps to be filled in by the calibration unless the profile fixes them)."""
    if seeds < 1:
        raise ValueError(f"--seeds {seeds}: need at least one seed")
    if budget_minutes <= 0:
        raise ValueError(f"--budget-minutes {budget_minutes}: must be positive")
    if workers < 1:
        raise ValueError(f"--workers {workers}: need at least one")
    names = list(mechanisms or profile.mechanisms)
    unknown = [m for m in names if m not in RUN_MECHANISMS]
    if unknown or not names:
        raise ValueError(f"unknown mechanisms {unknown}; choose from {', '.join(RUN_MECHANISMS)}")
    runs = {run_name(m, s): dict(mechanism=m, seed=s) for s in range(seeds) for m in names}  # seed-major order
    if not profile.xla_flags and budget_minutes * 60 * workers / len(runs) < profile.fast_compile_below_s:
        profile = dataclasses.replace(profile, xla_flags=FAST_COMPILE)
    steps = profile.fixed_steps or None
    return dict(profile=dataclasses.asdict(profile), mechanisms=names, seeds=seeds, budget_minutes=budget_minutes,
                workers=workers, runs=runs, steps=steps,
                finetune_steps=finetune_steps_for(steps, profile) if steps else None, machine=machine(),
                created=time.strftime("%Y-%m-%d %H:%M:%S %Z"), started_unix=time.time())


def load_plan(out: str) -> dict | None:
    path = os.path.join(out, PLAN_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def save_plan(out: str, plan: dict) -> None:
    os.makedirs(out, exist_ok=True)
    tmp = os.path.join(out, PLAN_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(plan, f, indent=1)
    os.replace(tmp, os.path.join(out, PLAN_FILE))


def profile_of(plan: dict) -> Profile:
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


# --- scheduling --------------------------------------------------------------------------------------------------
# Runs go to worker processes (one per core or GPU), each executing runs one after another (imports and compiled
# programs shared) as it claims them: a claim is runs/NAME/claim, created exclusively, naming the host and process;
# a claim whose process has died on this host is stale and taken over, so a crashed or killed run resumes when the
# command runs again. launch/reproduce.sh starts the same worker commands.

CLAIM_FILE = "claim"
FAILED_FILE = "failed.txt"
LOG_FILE = "run.log"
STARTED_ENV = "JAXPOS_WORKER_STARTED"  # when the scheduler started the worker (unix time): its start-up cost


def worker_command(out: str, names: Sequence[str]) -> list[str]:
    """The command of a worker process: executes the unclaimed, unfinished runs of `names` in turn."""
    return [sys.executable, "-m", "jaxpos.cli", "reproduce", "--out", out, "--run", ",".join(names)]


def _claim_owner() -> str:
    return f"{platform.node()} {os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def claim(out: str, name: str) -> bool:
    """Claims run NAME for this process (True), unless a live process holds it. A claim left by a process that
    died on this host is taken over; the run's failure mark of an earlier attempt is cleared."""
    folder = run_dir(out, name)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, CLAIM_FILE)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                with open(path) as f:
                    host, pid = f.read().split()
            except (OSError, ValueError):  # being written this instant, or garbage: leave it to its owner
                return False
            if host != platform.node() or (int(pid) != os.getpid() and _alive(int(pid))):
                return False
            os.remove(path)  # stale (or our own from an earlier call)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(_claim_owner())
        if os.path.exists(os.path.join(folder, FAILED_FILE)):
            os.remove(os.path.join(folder, FAILED_FILE))
        return True
    return False


def mark_failed(out: str, name: str, message: str) -> None:
    with open(os.path.join(run_dir(out, name), FAILED_FILE), "w") as f:
        f.write(message.strip() + "\n")


def failure(out: str, name: str) -> str | None:
    path = os.path.join(run_dir(out, name), FAILED_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return f.read().strip()


def worker_env(out: str, slot: int, gpu_count: int) -> dict:
    """Environment of the worker in `slot`: its GPU, or XLA on one thread of the CPU (each worker has its own
    core); a compilation cache shared by the runs (the seeds of a mechanism compile the same programs)."""
    env = dict(os.environ)
    if gpu_count:
        env["CUDA_VISIBLE_DEVICES"] = str(slot % gpu_count)
    else:
        env["JAX_PLATFORMS"] = "cpu"
        flags = env.get("XLA_FLAGS", "")
        flags = " ".join(f for f in flags.split() if not f.startswith("--xla_force_host_platform_device_count"))
        env["XLA_FLAGS"] = (flags + " --xla_cpu_multi_thread_eigen=false").strip()
    env["JAX_COMPILATION_CACHE_DIR"] = os.path.join(os.path.abspath(out), "jax_cache")
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.3"
    env[STARTED_ENV] = repr(time.time())
    return env


def execute(out: str, names: Sequence[str], workers: int, *, log=status) -> dict[str, float]:
    """Runs `names` on `workers` worker processes, each pinned to its own core (CPU) or GPU; a run's output goes
    to runs/NAME/run.log, a worker's own to workers/K.log. Finished runs (result.json) are skipped. Returns the
    wall seconds of each run executed (its own, without the worker's start-up); raises RuntimeError naming the
    runs that failed."""
    gpu_count = len(gpus())
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    pending = [n for n in names if read_result(out, n) is None]
    if not pending:
        return {}
    workers = min(workers, len(pending))
    os.makedirs(os.path.join(out, "workers"), exist_ok=True)
    processes, logs = [], []

    def interrupted(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupted)  # so that the workers stop with this process
    try:
        for slot in range(workers):
            core = cores[slot % len(cores)] if cores and not gpu_count and workers <= len(cores) else None
            pin = ["taskset", "-c", str(core)] if core is not None and shutil.which("taskset") else []
            logs.append(open(os.path.join(out, "workers", f"{slot}.log"), "w"))
            processes.append(subprocess.Popen(pin + worker_command(out, pending), stdout=logs[-1],
                                              stderr=subprocess.STDOUT, env=worker_env(out, slot, gpu_count)))
            log(f"  worker {slot} on {'GPU ' + str(slot % gpu_count) if gpu_count else f'core {core}'}")
        seconds = _follow(out, pending, processes, log)
    finally:
        signal.signal(signal.SIGTERM, previous)
        for process in processes:  # still running only when interrupted
            if process.poll() is None:
                process.terminate()  # a run checkpoints on SIGTERM; running the command again resumes it
        for process in processes:
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()
        for f in logs:
            f.close()
    failed = [n for n in pending if read_result(out, n) is None]
    if failed:
        reasons = "; ".join(f"{n}: {failure(out, n) or 'did not finish'}" for n in failed)
        raise RuntimeError(f"{len(failed)} run(s) failed ({reasons}); their logs are "
                           f"{os.path.join(out, 'runs', 'NAME', LOG_FILE)} and {os.path.join(out, 'workers')}. "
                           "Re-running the command resumes.")
    return seconds


def _follow(out, pending, processes, log) -> dict[str, float]:
    """Reports runs as the workers claim, finish or fail them, until every worker has exited."""
    seen_claim, done, seconds = set(), set(), {}
    while True:
        exited = all(p.poll() is not None for p in processes)
        for name in pending:
            if name in done:
                continue
            folder = run_dir(out, name)
            if name not in seen_claim and os.path.exists(os.path.join(folder, CLAIM_FILE)):
                seen_claim.add(name)
                log(f"  started {name}")
            result = read_result(out, name)
            if result is not None:
                done.add(name)
                seconds[name] = result["timing"]["wall_s"]
                log(f"  finished {name} in {seconds[name]:.0f} s")
            elif reason := failure(out, name):
                done.add(name)
                log(f"  FAILED {name}: {reason}; see {folder}/{LOG_FILE}")
        if exited:
            return seconds
        time.sleep(0.5)
