"""The plan executed on this host: a pool of worker processes, one per CPU core (pinned, XLA on one thread) or
several per GPU (tiny models are latency-bound). Each worker takes the next task, a mechanism's pretraining (its
seeds at once) or the rest of one run, executes it (jaxpos.reproduction.pipeline) with its output in a log file, and
takes the next; a run's stages follow its mechanism's pretraining."""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

from jaxpos.progress import status
from jaxpos.reproduction import host
from jaxpos.training.interrupt import RunStopped
from jaxpos.reproduction.matrix import LOG_FILE, group_log, run_dir, unfinished_groups


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


def _start_worker(out: str, slots, barrier, gpu_count: int, pin: bool, xla_flags: str) -> None:
    """A pool worker's initializer: takes a slot, keeps the pool's barrier, sets its environment and pins it to its
    core."""
    host.EVERY_WORKER = barrier
    slot = slots.get()
    os.environ.update(worker_env(out, slot, gpu_count, xla_flags))
    if pin and hasattr(os, "sched_setaffinity"):
        cores = host.cores()
        os.sched_setaffinity(0, {cores[slot % len(cores)]})
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent stops the workers


def _call_in_worker(function: str, out: str, name: str):
    """pipeline.`function`(out, name) in a worker. A stage stopped by SIGTERM (checkpointed) ends the worker: the
    pool is being stopped."""
    from jaxpos.reproduction import pipeline  # imported in the worker, after its environment: jax reads it there

    try:
        return getattr(pipeline, function)(out, name)
    except RunStopped:
        os._exit(3)  # this worker takes no further task


class Pool:
    """`workers` worker processes on this host: one per CPU core (pinned), or shares of the GPUs. A context
    manager; leaving it early (an exception, SIGTERM, Ctrl-C) stops the workers with SIGTERM, on which a
    training run checkpoints, and waits for them."""

    def __init__(self, out: str, workers: int, xla_flags: str = ""):
        gpu_count = len(host.gpus())
        context = multiprocessing.get_context("spawn")
        slots = context.Queue()
        for slot in range(workers):
            slots.put(slot)
        pin = not gpu_count and workers <= len(host.cores())
        self.out, self.workers = out, workers
        self.device = f"{gpu_count} GPU(s), {workers} worker(s)" if gpu_count else f"{workers} CPU worker(s)"
        self.executor = ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker,
                                            initargs=(out, slots, context.Barrier(workers), gpu_count, pin,
                                                      xla_flags))

    def __enter__(self):
        def interrupted(signum, frame):
            raise RunStopped(signum)  # the workers checkpoint on SIGTERM as the pool stops them (`__exit__`)

        self.previous = signal.signal(signal.SIGTERM, interrupted)
        return self

    def call(self, function: str, name: str):
        """pipeline.`function`(out, name) on one worker; its return value."""
        return self.submit(function, name).result()

    def call_on_every_worker(self, function: str, name: str) -> list:
        """pipeline.`function`(out, name) as many times as there are workers, submitted at once so that each
        worker takes one (each call outlasts the workers' start); the return values."""
        futures = [self.submit(function, name) for _ in range(self.workers)]
        return [future.result() for future in futures]

    def submit(self, function: str, name: str) -> Future:
        """pipeline.`function`(out, name) queued for the first free worker."""
        return self.executor.submit(_call_in_worker, function, self.out, name)

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


PROGRESS_EVERY_S = 30.0  # a progress line per active task this often while none ends
_STEP_LINE = re.compile(r"\[train step (\d+)/(\d+) eta ([0-9:]+)\].*?\bloss=([0-9.e+-]+)")


def progress_text(log_path: str) -> str | None:
    """'step S/N (P%), loss L, about ETA left' from the last training step line of a task's log (its last 8 KB), or
    None before the first."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, os.path.getsize(log_path) - 8192))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    found = _STEP_LINE.findall(tail)
    if not found:
        return None
    step, steps, eta, loss = found[-1]
    return f"step {step}/{steps} ({100 * int(step) / int(steps):.0f}%), loss {float(loss):.3f}, about {eta} left"


def outcome_of(future: Future) -> str:
    """A task's "done" or "failed: why", also where its worker died."""
    try:
        return future.result()
    except BrokenProcessPool:  # a worker was killed (out of memory?): the pool cannot go on
        return "failed: its worker process died"


def execute(out: str, plan: dict, pool: Pool, *, log=status) -> dict:
    """Executes the unfinished runs of `plan` on `pool`; finished ones (result.json) are reused. A mechanism with
    more than one run left to pretrain pretrains them at once first (`pipeline.pretrain_group_logged`), then each
    run's other stages follow on the first free worker (`pipeline.execute_logged`); a run whose group failed, or
    left alone, pretrains there, resuming from its checkpoints. Returns {name: outcome}; raises RuntimeError
    naming the runs that did not finish."""
    groups = unfinished_groups(out, plan)
    pending = [n for names, _ in groups.values() for n in names]
    if not pending:
        return {}
    log(f"{len(pending)} run(s) on {pool.device}"
        + (f"; {len(plan['runs']) - len(pending)} finished before" if len(pending) < len(plan["runs"]) else ""))
    start, outcomes = time.perf_counter(), {}
    tasks: dict[Future, tuple[str, str]] = {}

    def submit_runs(names: list[str]) -> None:
        for name in names:
            try:
                tasks[pool.submit("execute_logged", name)] = ("run", name)
            except BrokenProcessPool:  # a worker died (out of memory?): the pool takes nothing more
                outcomes[name] = "failed: its worker process died"

    for mechanism, (names, to_pretrain) in groups.items():
        if len(to_pretrain) > 1:
            tasks[pool.submit("pretrain_group_logged", mechanism)] = ("group", mechanism)
        else:
            submit_runs(names)
    def log_of(kind: str, name: str) -> str:
        return group_log(out, name) if kind == "group" else os.path.join(run_dir(out, name), LOG_FILE)

    log(f"  each task's progress: {group_log(out, 'MECHANISM')} (seeds pretrained at once), then "
        f"{os.path.join(run_dir(out, 'NAME'), LOG_FILE)}")
    while tasks:
        finished, _ = wait(tasks, timeout=PROGRESS_EVERY_S, return_when=FIRST_COMPLETED)
        if not finished:  # a line per task in progress: where it is, from its log
            for future, (kind, name) in tasks.items():
                shown = progress_text(log_of(kind, name)) if future.running() else None
                if shown:
                    log(f"  {name}{' (seeds at once)' if kind == 'group' else ''}: {shown}")
        for future in finished:
            kind, name = tasks.pop(future)
            outcome = outcome_of(future)
            if kind == "group":
                names, to_pretrain = groups[name]
                where = "" if outcome == "done" else f"; its runs pretrain alone; see {group_log(out, name)}"
                log(f"  {name}: pretraining of {len(to_pretrain)} seeds at once {outcome}{where}")
                submit_runs(names)
                continue
            outcomes[name] = outcome
            where = "" if outcome == "done" else f"; see {os.path.join(run_dir(out, name), LOG_FILE)}"
            log(f"  {name}: {outcome}{where} ({pace(len(outcomes), len(pending), time.perf_counter() - start)})")
    failed = [n for n in pending if outcomes.get(n) != "done"]
    if failed:
        reasons = "; ".join(f"{n}: {outcomes.get(n, 'did not finish')}" for n in failed)
        raise RuntimeError(f"{len(failed)} run(s) did not finish ({reasons}); their logs are "
                           f"{os.path.join(out, 'runs', 'NAME', LOG_FILE)}. Running the command again resumes.")
    return outcomes
