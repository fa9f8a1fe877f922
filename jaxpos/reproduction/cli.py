"""`jaxpos reproduce`: pretrain every positional mechanism with the same data and token budget over several seeds,
fine-tune each on the offline word-order task, analyse them over training, and write OUT/REPRODUCTION.md (one
section per paper, a verdict per claim), its figures and OUT/numbers.json. The whole command keeps to
--budget-minutes: a quick timing sets the pretraining steps of every run.

    jaxpos reproduce --out runs/reproduce --budget-minutes 10 --seeds 1
    jaxpos reproduce --out runs/repro3 --budget-minutes 40 --seeds 3
    launch/reproduce.sh runs/repro3 40 3          # the same runs spread over a host's cores or GPUs

Re-running a command with the same --out resumes: finished runs are kept, an unfinished one resumes from its
checkpoints.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

PROFILE_CHOICES = ("tiny", "micro")


def add_reproduce_parser(subparsers) -> None:
    """Registers the `reproduce` subcommand on an argparse subparsers object."""
    parser = subparsers.add_parser(
        "reproduce", help="small-scale reproduction of the papers' claims: every mechanism x seeds, pretrained, "
                          "fine-tuned and analysed; REPRODUCTION.md with a verdict per claim", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output folder (plan.json, runs/, figures/, REPRODUCTION.md, "
                                                     "numbers.json)")
    parser.add_argument("--budget-minutes", type=float, default=30.0,
                        help="wall-clock budget of the whole command (default 30); sets the pretraining steps")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per mechanism (default 3; one seed leaves every "
                                                             "comparison inconclusive)")
    parser.add_argument("--profile", default="tiny", choices=PROFILE_CHOICES,
                        help="tiny: configs/mlm/tiny.py at 64 tokens, every mechanism; micro: a d=32 model, two "
                             "mechanisms, a few steps (tests)")
    parser.add_argument("--mechanisms", help="comma-separated subset of the profile's mechanisms")
    parser.add_argument("--workers", type=int, help="runs at a time (default: one per GPU, else one per CPU core)")
    parser.add_argument("--steps", type=int, help="pretraining steps per run instead of the budget's (no timing)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the runs and their commands; run and write nothing")
    mode.add_argument("--plan-only", action="store_true",
                      help="plan (tokenizer, timing, steps), write the run names to OUT/runs.txt and stop "
                           "(launch/reproduce.sh runs them)")
    mode.add_argument("--run", dest="run_name", metavar="NAME[,NAME...]",
                      help="a worker: execute these runs of OUT/plan.json that no other process has claimed, one "
                           "after another (what each worker process runs)")
    mode.add_argument("--report-only", action="store_true", help="write the report from the finished runs")
    parser.set_defaults(run=_reproduce)


WALL_FILE = "wall_time.json"
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
    from jaxpos.reproduction import runs

    passes = [False, True] if plan["seeds"] > 1 else [False]
    plan["calibration"] = {}
    estimates = []
    for warm in passes:
        names = _calibration_runs(plan, profile, workers, warm)
        plan["calibration"].update(names)
        runs.save_plan(out, plan)
        print(f"timing: {len(names)} calibration run(s) of the whole pipeline in parallel"
              + (", again with their programs compiled" if warm else ""), flush=True)
        runs.execute(out, list(names), workers)
        estimates.append(runs.calibration_estimate([runs.read_result(out, name) for name in names]))
    fixed, step, finetune_step, startup = estimates[0]
    return fixed, step, finetune_step, estimates[1][0] if len(estimates) > 1 else None, startup


def _same_plan(old: dict, new: dict) -> None:
    import json

    def comparable(plan, key):  # as saved (tuples are lists); the compile mode follows the budget, not the runs
        value = json.loads(json.dumps(plan[key]))
        return {k: v for k, v in value.items() if k != "xla_flags"} if key == "profile" else value

    for key in ("profile", "mechanisms", "seeds"):
        if comparable(old, key) != comparable(new, key):
            raise ValueError(f"{key} differs from the plan already in this --out folder ({old[key]!r} there): "
                             "use a new --out, or the same settings to resume")


def _reproduce(args, overrides):
    import dataclasses
    import json

    from jaxpos.reproduction import runs

    if overrides:
        raise ValueError(f"`jaxpos reproduce` takes no --config overrides (got {' '.join(overrides)})")
    out = args.out
    if args.run_name:
        from jaxpos.reproduction.pipeline import execute_runs

        names = [n.strip() for n in args.run_name.split(",") if n.strip()]
        failures = execute_runs(out, names)
        if failures:
            raise RuntimeError(f"{failures} of the runs failed: see {out}/runs/NAME/{runs.FAILED_FILE}")
        return None
    from jaxpos.reproduction.report import REPORT_FILE, summary_table, write_report

    command = "jaxpos " + " ".join(shlex.quote(a) for a in sys.argv[1:] if a != "--debug") \
        if sys.argv and sys.argv[0].endswith("jaxpos") else "jaxpos reproduce"
    if args.report_only:
        wall = None
        if os.path.isfile(os.path.join(out, WALL_FILE)):  # the wall time of the command that ran the runs
            with open(os.path.join(out, WALL_FILE)) as f:
                wall = json.load(f)["wall_s"]
        numbers = write_report(out, wall_s=wall, command=command)
        print(summary_table(numbers["claims"]) + f"wrote {os.path.join(out, REPORT_FILE)}")
        return numbers

    start = time.perf_counter()
    profile = runs.PROFILES[args.profile]
    if args.steps is not None:
        if args.steps < 1:
            raise ValueError(f"--steps {args.steps}: must be positive")
        profile = dataclasses.replace(profile, fixed_steps=args.steps)
    workers = args.workers or runs.default_workers()
    mechanisms = [m.strip() for m in args.mechanisms.split(",") if m.strip()] if args.mechanisms else None
    plan = runs.make_plan(profile, args.seeds, args.budget_minutes, workers, mechanisms)
    if args.dry_run:
        print(f"# {len(plan['runs'])} runs ({len(plan['mechanisms'])} mechanisms x {plan['seeds']} seed(s)), "
              f"{workers} at a time; steps per run: "
              f"{plan['steps'] or 'set by a timing of ' + str(workers) + ' calibration run(s)'}")
        print(f"# {workers} worker(s), each running the unclaimed runs of the list in turn:")
        command = " ".join(shlex.quote(c) for c in runs.worker_command(out, list(plan["runs"])))
        for _ in range(workers):
            print(command)
        return plan
    old = runs.load_plan(out)
    if old is not None:
        _same_plan(old, plan)
        plan = old
        print(f"jaxpos reproduce: resuming the plan in {out} ({plan['steps'] or 'no'} steps per run)", flush=True)
    else:
        print(f"jaxpos reproduce: {len(plan['mechanisms'])} mechanisms x {plan['seeds']} seed(s) = "
              f"{len(plan['runs'])} runs, profile {profile.name}, budget {args.budget_minutes:g} min, {workers} at a "
              f"time -> {out}", flush=True)
        if plan["profile"]["xla_flags"] and not profile.xla_flags:
            print(f"under {profile.fast_compile_below_s:.0f} s of budget per run: compiling unoptimised programs "
                  "(faster to compile, slower to run)", flush=True)
    if "tokenizer" not in plan:
        plan["tokenizer"], plan["corpus"] = _shared_tokenizer(out, plan)
        runs.save_plan(out, plan)

    if not plan["steps"]:
        fixed, step, finetune_step, warm, startup = _calibrate(out, plan, profile, workers)
        reserve = 20 + 0.02 * args.budget_minutes * 60  # the report and figures, and a margin
        left = args.budget_minutes * 60 - (time.perf_counter() - start) - reserve
        plan["steps"], plan["finetune_steps"], plan["budget_note"] = runs.steps_for_budget(
            left, len(plan["runs"]), workers, fixed, step, finetune_step, profile,
            cold_runs=len(plan["mechanisms"]), warm_fixed_s=warm, startup_s=startup)
        plan["calibration_estimate"] = dict(fixed_s=fixed, warm_fixed_s=warm, startup_s=startup, step_s=step,
                                            finetune_step_s=finetune_step, seconds_left=left)
        runs.save_plan(out, plan)
        print(f"steps per run: {plan['steps']} pretraining, {plan['finetune_steps']} fine-tuning "
              f"({plan['budget_note']})", flush=True)

    names = list(plan["runs"])
    if args.plan_only:
        with open(os.path.join(out, "runs.txt"), "w") as f:
            f.write("".join(name + "\n" for name in names))
        print(f"wrote {os.path.join(out, 'runs.txt')}: run each with `jaxpos reproduce --out {out} --run NAME`, "
              f"then `jaxpos reproduce --out {out} --report-only`")
        return plan
    runs.execute(out, names, workers)
    wall = time.perf_counter() - start
    numbers = write_report(out, wall_s=wall, command=command)
    print(summary_table(numbers["claims"]))
    print(f"wrote {os.path.join(out, REPORT_FILE)} ({wall / 60:.1f} min)")
    with open(os.path.join(out, WALL_FILE), "w") as f:
        json.dump(dict(wall_s=wall, budget_minutes=args.budget_minutes), f)
    return numbers


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
