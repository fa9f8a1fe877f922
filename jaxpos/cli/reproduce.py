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


def _command_line() -> str:
    """This command as typed (quoted in the report), or `jaxpos reproduce` when run some other way."""
    if sys.argv and sys.argv[0].endswith("jaxpos"):
        return "jaxpos " + " ".join(shlex.quote(a) for a in sys.argv[1:] if a != "--debug")
    return "jaxpos reproduce"


def _reproduce(args, overrides):
    from jaxpos.reproduction import reproduce as repro
    from jaxpos.reproduction import runs

    if overrides:
        raise ValueError(f"`jaxpos reproduce` takes no --config overrides (got {' '.join(overrides)})")
    out = args.out
    if args.run_name:
        return repro.run_worker(out, [n.strip() for n in args.run_name.split(",") if n.strip()])
    from jaxpos.reproduction.report import REPORT_FILE, summary_table

    if args.report_only:
        numbers = repro.report_only(out, _command_line())
        print(summary_table(numbers["claims"]) + f"wrote {os.path.join(out, REPORT_FILE)}")
        return numbers
    mechanisms = [m.strip() for m in args.mechanisms.split(",") if m.strip()] if args.mechanisms else None
    settings = dict(profile=args.profile, seeds=args.seeds, budget_minutes=args.budget_minutes, workers=args.workers,
                    mechanisms=mechanisms, steps=args.steps)
    if args.dry_run:
        plan, _ = repro.new_plan(**settings)
        workers = plan["workers"]
        print(f"# {len(plan['runs'])} runs ({len(plan['mechanisms'])} mechanisms x {plan['seeds']} seed(s)), "
              f"{workers} at a time; steps per run: "
              f"{plan['steps'] or 'set by a timing of ' + str(workers) + ' calibration run(s)'}")
        print(f"# {workers} worker(s), each running the unclaimed runs of the list in turn:")
        line = " ".join(shlex.quote(c) for c in runs.worker_command(out, list(plan["runs"])))
        for _ in range(workers):
            print(line)
        return plan
    done = repro.reproduce(out, **settings, command=_command_line(), plan_only=args.plan_only)
    if args.plan_only:
        print(f"wrote {os.path.join(out, repro.RUNS_LIST_FILE)}: run each with `jaxpos reproduce --out {out} "
              f"--run NAME`, then `jaxpos reproduce --out {out} --report-only`")
        return done.plan
    print(summary_table(done.numbers["claims"]))
    print(f"wrote {os.path.join(out, REPORT_FILE)} ({done.wall_s / 60:.1f} min)")
    return done.numbers
