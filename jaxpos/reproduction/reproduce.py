"""`jaxpos reproduce` from start to report: the plan (resumed from OUT/plan.json where there is one), the shared
tokenizer, a timing that sets the steps of every run within the budget, the runs on worker processes, and
REPRODUCTION.md. A worker process executes runs through `run_worker`."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Sequence

from jaxpos.progress import status
from jaxpos.reproduction import runs

WALL_FILE = "wall_time.json"
RUNS_LIST_FILE = "runs.txt"
CALIBRATION_ORDER = ("attenuated_learned", "tupe", "shaw", "diet_abs_unshared", "tisa", "absolute")


def _calibration_runs(plan: dict, profile, workers: int, warm: bool = False) -> dict:
    """One calibration run per worker (the full pipeline, a few steps), of the costlier mechanisms first; `warm`:
    the same runs again with other seeds, which find their programs compiled (as a mechanism's later seeds do)."""
    order = [m for m in CALIBRATION_ORDER if m in plan["mechanisms"]] + \
        [m for m in plan["mechanisms"] if m not in CALIBRATION_ORDER]
    steps = profile.calibration_steps // profile.checkpoints * profile.checkpoints or profile.checkpoints
    return {f"calibration_{i}_{order[i % len(order)]}{'_warm' if warm else ''}": dict(
        mechanism=order[i % len(order)], seed=(200 if warm else 100) + i, steps=steps,
        finetune_steps=profile.calibration_finetune_steps) for i in range(workers)}


def _calibrate(out: str, plan: dict, profile, workers: int) -> tuple[float, float, float, float | None, float]:
    """(cold fixed s, step s, fine-tuning step s, warm fixed s or None, a worker's start-up s) measured by
    calibration runs."""
    passes = [False, True] if plan["seeds"] > 1 else [False]
    plan["calibration"] = {}
    estimates = []
    for warm in passes:
        names = _calibration_runs(plan, profile, workers, warm)
        plan["calibration"].update(names)
        runs.save_plan(out, plan)
        status(f"timing: {len(names)} calibration run(s) of the whole pipeline in parallel"
               + (", again with their programs compiled" if warm else ""))
        runs.execute(out, list(names), workers)
        estimates.append(runs.calibration_estimate([runs.read_result(out, name) for name in names]))
    fixed, step, finetune_step, startup = estimates[0]
    return fixed, step, finetune_step, estimates[1][0] if len(estimates) > 1 else None, startup


def _same_plan(old: dict, new: dict) -> None:
    def comparable(plan, key):  # as saved (tuples are lists); the compile mode follows the budget, not the runs
        value = json.loads(json.dumps(plan[key]))
        return {k: v for k, v in value.items() if k != "xla_flags"} if key == "profile" else value

    for key in ("profile", "mechanisms", "seeds"):
        if comparable(old, key) != comparable(new, key):
            raise ValueError(f"{key} differs from the plan already in this --out folder ({old[key]!r} there): "
                             "use a new --out, or the same settings to resume")


def _shared_tokenizer(out: str, plan: dict) -> tuple[str, dict]:
    """The SentencePiece model every run uses (the same data for all), trained once as `jaxpos train` would, and
    the size of the training corpus."""
    from jaxpos.data.pipeline import build_mlm_data
    from jaxpos.reproduction.pipeline import pretrain_config

    mechanism = plan["mechanisms"][0]
    config = pretrain_config(dict(plan, tokenizer=""), mechanism, 0, plan["profile"]["checkpoints"])
    folder = os.path.join(out, "tokenizer")
    data = build_mlm_data(config.data, config.train.batch_size, folder)
    corpus = dict(documents=data.stats.documents, tokens=data.stats.tokens, rows=data.stats.packed_examples)
    return os.path.abspath(data.tokenizer.path), corpus


def new_plan(profile: str, seeds: int, budget_minutes: float, workers: int | None = None,
             mechanisms: Sequence[str] | None = None, steps: int | None = None) -> tuple[dict, runs.Profile]:
    """(the run matrix of these settings, the profile it runs) without writing anything. `workers`: runs at a time
    (default: one per GPU, else one per CPU core); `steps`: pretraining steps per run instead of the budget's."""
    chosen = runs.PROFILES[profile]
    if steps is not None:
        if steps < 1:
            raise ValueError(f"--steps {steps}: must be positive")
        chosen = dataclasses.replace(chosen, fixed_steps=steps)
    workers = workers or runs.default_workers()
    return runs.make_plan(chosen, seeds, budget_minutes, workers, mechanisms), chosen


@dataclasses.dataclass
class Reproduction:
    plan: dict  # OUT/plan.json
    numbers: dict | None = None  # OUT/numbers.json (None when only planned)
    wall_s: float | None = None  # the whole command's seconds (None when only planned)


def reproduce(out: str, profile: str, seeds: int, budget_minutes: float, workers: int | None = None,
              mechanisms: Sequence[str] | None = None, steps: int | None = None, *, command: str = "jaxpos reproduce",
              plan_only: bool = False) -> Reproduction:
    """Plans (or resumes the plan in OUT), trains the shared tokenizer, times the pipeline to set the steps per run,
    executes every run on `workers` processes and writes the report (`command` is quoted in it). `plan_only`: stops
    after the timing, with the run names in OUT/runs.txt for workers started elsewhere."""
    from jaxpos.reproduction.report import write_report

    start = time.perf_counter()
    plan, chosen = new_plan(profile, seeds, budget_minutes, workers, mechanisms, steps)
    workers = plan["workers"]
    old = runs.load_plan(out)
    if old is not None:
        _same_plan(old, plan)
        plan = old
        status(f"jaxpos reproduce: resuming the plan in {out} ({plan['steps'] or 'no'} steps per run)")
    else:
        status(f"jaxpos reproduce: {len(plan['mechanisms'])} mechanisms x {plan['seeds']} seed(s) = "
               f"{len(plan['runs'])} runs, profile {chosen.name}, budget {budget_minutes:g} min, {workers} at a "
               f"time -> {out}")
        if plan["profile"]["xla_flags"] and not chosen.xla_flags:
            status(f"under {chosen.fast_compile_below_s:.0f} s of budget per run: compiling unoptimised programs "
                   "(faster to compile, slower to run)")
    if "tokenizer" not in plan:
        plan["tokenizer"], plan["corpus"] = _shared_tokenizer(out, plan)
        runs.save_plan(out, plan)

    if not plan["steps"]:
        fixed, step, finetune_step, warm, startup = _calibrate(out, plan, chosen, workers)
        reserve = 20 + 0.02 * budget_minutes * 60  # the report and figures, and a margin
        left = budget_minutes * 60 - (time.perf_counter() - start) - reserve
        plan["steps"], plan["finetune_steps"], plan["budget_note"] = runs.steps_for_budget(
            left, len(plan["runs"]), workers, fixed, step, finetune_step, chosen,
            cold_runs=len(plan["mechanisms"]), warm_fixed_s=warm, startup_s=startup)
        plan["calibration_estimate"] = dict(fixed_s=fixed, warm_fixed_s=warm, startup_s=startup, step_s=step,
                                            finetune_step_s=finetune_step, seconds_left=left)
        runs.save_plan(out, plan)
        status(f"steps per run: {plan['steps']} pretraining, {plan['finetune_steps']} fine-tuning "
               f"({plan['budget_note']})")

    names = list(plan["runs"])
    if plan_only:
        with open(os.path.join(out, RUNS_LIST_FILE), "w") as f:
            f.write("".join(name + "\n" for name in names))
        return Reproduction(plan)
    runs.execute(out, names, workers)
    wall = time.perf_counter() - start
    numbers = write_report(out, wall_s=wall, command=command)
    with open(os.path.join(out, WALL_FILE), "w") as f:
        json.dump(dict(wall_s=wall, budget_minutes=budget_minutes), f)
    return Reproduction(plan, numbers, wall)


def report_only(out: str, command: str = "jaxpos reproduce") -> dict:
    """Writes the report from the finished runs in OUT, with the wall time of the command that ran them; returns
    the numbers (OUT/numbers.json)."""
    from jaxpos.reproduction.report import write_report

    wall = None
    if os.path.isfile(os.path.join(out, WALL_FILE)):  # the wall time of the command that ran the runs
        with open(os.path.join(out, WALL_FILE)) as f:
            wall = json.load(f)["wall_s"]
    return write_report(out, wall_s=wall, command=command)


def run_worker(out: str, names: Sequence[str]) -> None:
    """A worker process: executes the runs `names` of OUT/plan.json that no other process has claimed; raises
    RuntimeError when any of them failed."""
    from jaxpos.reproduction.pipeline import execute_runs

    failures = execute_runs(out, list(names))
    if failures:
        raise RuntimeError(f"{failures} of the runs failed: see {out}/runs/NAME/{runs.FAILED_FILE}")
