"""This host as the reproduction sees it: its CPU cores and GPUs (without importing jax, which would hold a
device), what ran a plan, and the barrier at which the pool's workers meet for a timing."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import threading
from importlib.metadata import version

RUNS_PER_GPU = 8  # worker processes sharing one GPU: a tiny model's step leaves most of it idle


def machine() -> dict:
    """What ran it: CPU model, cores, GPUs (nvidia-smi), Python and jax versions."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    info = dict(cpu=cpu, cores=len(cores()), gpus=gpus(), python=platform.python_version(), host=platform.node())
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


def cores() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def default_workers() -> int:
    """RUNS_PER_GPU per GPU (no more than the cores, which feed them), else one per CPU core."""
    count = len(gpus())
    return min(count * RUNS_PER_GPU, len(cores())) if count else len(cores())


EVERY_WORKER = None  # in a pool worker: the pool's barrier (a multiprocessing.Barrier of all its workers)


def wait_for_every_worker(timeout_s: float = 900.0) -> None:
    """In a pool worker, inside a call of `Pool.call_on_every_worker`: returns once every worker has reached this
    point (or after `timeout_s`, if one never does); elsewhere at once."""
    if EVERY_WORKER is None:
        return
    try:
        EVERY_WORKER.wait(timeout_s)
    except threading.BrokenBarrierError:  # a worker failed or was late: the timing goes on without it
        pass
