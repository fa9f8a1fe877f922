"""The run matrix of `jaxpos reproduce` and its scheduling.

Every mechanism is pretrained with the same data, recipe and token budget (steps x batch x seq_len), once per
seed; the seed sets the initialisation, the data order and the masking. The budget (`--budget-minutes`) covers the
whole command: a calibration (one run of the full pipeline with a few steps per worker, in parallel as the real
runs will be, and once more with their programs compiled when there are several seeds) measures the fixed cost of
a run and the time of a step, and the steps per run follow from what is left. Under a small budget per run the
programs are compiled unoptimised (`FAST_COMPILE`), and the calibration measures that mode. Runs are separate
processes (`jaxpos reproduce --out DIR --run NAME`), one per core (pinned, XLA on one thread) or per GPU
(CUDA_VISIBLE_DEVICES); launch/reproduce.sh spreads the same commands over a host.
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

PLAN_FILE = "plan.json"
RESULT_FILE = "result.json"


@dataclasses.dataclass(frozen=True)
class Mechanism:
    name: str
    label: str  # as the report names it
    position: dict  # the model.position block (kind and options)
    learned: bool  # has learned positional parameters (Chen's "learned encodings")


MECHANISMS = {m.name: m for m in (
    Mechanism("none", "none (bag of words)", dict(kind="none"), False),
    Mechanism("absolute", "absolute, learned (BERT)", dict(kind="absolute"), True),
    Mechanism("sinusoidal", "absolute, sinusoidal", dict(kind="sinusoidal"), False),
    Mechanism("tisa", "TISA", dict(kind="tisa"), True),
    Mechanism("tisa_input", "TISA + input positions", dict(kind="tisa", tisa=dict(input_positions=True)), True),
    Mechanism("diet_rel", "DIET-Rel", dict(kind="diet_rel", diet_rel=dict(sharing="none")), True),
    Mechanism("diet_rel_layer", "DIET-Rel, shared by layer", dict(kind="diet_rel", diet_rel=dict(sharing="layer")),
              True),
    Mechanism("diet_abs", "DIET-Abs, shared by layer", dict(kind="diet_abs", diet_abs=dict(sharing="layer")), True),
    Mechanism("diet_abs_unshared", "DIET-Abs, unshared", dict(kind="diet_abs", diet_abs=dict(sharing="none")), True),
    Mechanism("diet_abs_segments", "DIET-Abs, shared by layer, per-head segments",
              dict(kind="diet_abs", diet_abs=dict(sharing="layer"), segment="per_head"), True),
    Mechanism("t5", "T5 buckets", dict(kind="t5"), True),
    Mechanism("shaw", "Shaw et al.", dict(kind="shaw"), True),
    Mechanism("tupe", "TUPE", dict(kind="tupe"), True),
    Mechanism("rope", "RoPE", dict(kind="rope"), False),
    Mechanism("alibi", "ALiBi", dict(kind="alibi"), False),
    Mechanism("attenuated", "attenuated, fixed", dict(kind="attenuated"), False),
    Mechanism("attenuated_learned", "attenuated, learnable (n x n per head)",
              dict(kind="attenuated", attenuated=dict(form="matrix")), True),
)}


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
    finetune_ratio: float = 1.0  # fine-tuning steps per pretraining step ...
    min_finetune_steps: int = 8  # ... within this range
    max_finetune_steps: int = 1_000
    fixed_steps: int = 0  # > 0: skip the calibration and pretrain this many steps
    calibration_steps: int = 32  # pretraining steps of a calibration run
    calibration_finetune_steps: int = 16
    xla_flags: str = ""  # added to XLA_FLAGS in each run's process
    # Below this many seconds of budget per run, compiling dominates a run: its programs are compiled unoptimised
    # (FAST_COMPILE: about half the compile time, steps about 2.5x slower on a CPU); the timing measures that mode.
    fast_compile_below_s: float = 120.0


PROFILES = {
    # configs/mlm/tiny.py (d=128, L=2, H=4, D=32) on 64-token rows: the logit-rank and effective-attention
    # claims need T > D, and the sequences are as long as the word-order task's.
    "tiny": Profile(
        "tiny", tuple(MECHANISMS),
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
                     warm_fixed_s: float | None = None) -> tuple[int, int, str]:
    """(pretraining steps, fine-tuning steps, a note) such that `runs` runs spread over `workers` parallel
    processes fit in `seconds_left`. A run costs its fixed part (start-up, compiling, evaluations, analyses)
    plus steps * step_s + finetune_steps * finetune_step_s; the fixed part is fixed_s for the first `cold_runs`
    (default: all) and warm_fixed_s for the others (the seeds of a mechanism after the first reuse its compiled
    programs). Pretraining steps are a multiple of the checkpoint count within [min_steps, max_steps]; the note
    says when even the floor overruns the budget."""
    if runs < 1 or workers < 1:
        raise ValueError(f"need at least one run and one worker (runs={runs}, workers={workers})")
    if step_s <= 0 or finetune_step_s < 0 or fixed_s < 0:
        raise ValueError(f"timings must be positive (fixed {fixed_s} s, step {step_s} s, fine-tuning step "
                         f"{finetune_step_s} s)")
    cold = runs if cold_runs is None else min(cold_runs, runs)
    warm = fixed_s if warm_fixed_s is None else min(warm_fixed_s, fixed_s)
    fixed_per_worker = (cold * fixed_s + (runs - cold) * warm) / workers
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


def calibration_estimate(results: Sequence[dict]) -> tuple[float, float, float]:
    """(fixed seconds per run, seconds per pretraining step, seconds per fine-tuning step) from calibration runs'
    results (the slowest of them): a run's wall time less its own pretraining and fine-tuning steps."""
    fixed, step, finetune_step = [], [], []
    for r in results:
        t = r["timing"]
        step.append(t["pretrain_step_s"])
        finetune_step.append(t["finetune_step_s"])
        fixed.append(t["wall_s"] - t["pretrain_steps"] * t["pretrain_step_s"]
                     - t["finetune_steps"] * t["finetune_step_s"])
    return max(fixed), max(step), max(finetune_step)


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
    unknown = [m for m in names if m not in MECHANISMS]
    if unknown or not names:
        raise ValueError(f"unknown mechanisms {unknown}; choose from {', '.join(MECHANISMS)}")
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

def run_command(out: str, name: str) -> list[str]:
    """The command that executes one run of the plan in OUT (what launch/reproduce.sh runs too)."""
    return [sys.executable, "-m", "jaxpos.cli", "reproduce", "--out", out, "--run", name]


def worker_env(out: str, slot: int, gpu_count: int) -> dict:
    """Environment of the process in `slot`: its GPU, or XLA on one thread of the CPU (each process has its own
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
    return env


def execute(out: str, names: Sequence[str], workers: int, *, log=print) -> dict[str, float]:
    """Runs `names` (each `jaxpos reproduce --out OUT --run NAME`, output in runs/NAME/run.log), at most `workers`
    at a time, each pinned to its own core (CPU) or GPU. Runs whose result.json exists are skipped. Returns the
    wall seconds of each run; raises RuntimeError naming the runs that failed."""
    gpu_count = len(gpus())
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    pending = [n for n in names if read_result(out, n) is None]
    running: dict[int, tuple[str, subprocess.Popen, float, object]] = {}
    seconds, failed = {}, []

    def interrupted(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupted)  # so that the runs stop with this process
    try:
        _schedule(out, pending, running, seconds, failed, workers, gpu_count, cores, log)
    finally:
        signal.signal(signal.SIGTERM, previous)
        for name, process, _, logfile in running.values():  # left running only when interrupted
            process.terminate()  # a run checkpoints on SIGTERM; running the command again resumes it
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()
            logfile.close()
    if failed:
        raise RuntimeError(f"{len(failed)} run(s) failed: {', '.join(failed)}; their logs are "
                           f"{os.path.join(out, 'runs', 'NAME', 'run.log')}. Re-running the command resumes.")
    return seconds


def _schedule(out, pending, running, seconds, failed, workers, gpu_count, cores, log) -> None:
    """The loop of `execute`: keeps `workers` runs going until `pending` is empty and all have ended."""
    while pending or running:
        free = [s for s in range(workers) if s not in running]
        while pending and free:
            slot, name = free.pop(0), pending.pop(0)
            os.makedirs(run_dir(out, name), exist_ok=True)
            logfile = open(os.path.join(run_dir(out, name), "run.log"), "w")
            core = cores[slot % len(cores)] if cores and not gpu_count and workers <= len(cores) else None
            pin = ["taskset", "-c", str(core)] if core is not None and shutil.which("taskset") else []
            process = subprocess.Popen(pin + run_command(out, name), stdout=logfile, stderr=subprocess.STDOUT,
                                       env=worker_env(out, slot, gpu_count))
            running[slot] = (name, process, time.perf_counter(), logfile)
            log(f"  started {name} ({'GPU ' + str(slot % gpu_count) if gpu_count else f'core {core}'})")
        time.sleep(0.2)
        for slot, (name, process, start, logfile) in list(running.items()):
            if process.poll() is None:
                continue
            logfile.close()
            del running[slot]
            seconds[name] = time.perf_counter() - start
            if process.returncode != 0 or read_result(out, name) is None:
                failed.append(name)
                log(f"  FAILED {name} (exit {process.returncode}); see {run_dir(out, name)}/run.log")
            else:
                log(f"  finished {name} in {seconds[name]:.0f} s")
