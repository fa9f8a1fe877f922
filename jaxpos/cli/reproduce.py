"""`jaxpos reproduce`: pretrain the positional mechanisms with a fixed recipe (a profile) over several seeds on the
Bible, follow their held-out masked-LM loss, fine-tune them on the offline Bible paraphrase task, probe and
analyse them, and write OUT/REPRODUCTION.md: one section per paper, the paper's figure beside the measured one,
and a verdict per claim from paired tests over seeds with Holm's correction (needs `pip install 'jaxpos[bible]'`).

    jaxpos reproduce --out runs/smoke --profile smoke             # a first look: minutes on 2 CPU cores
    jaxpos reproduce --out runs/full --profile full               # the verdicts: every mechanism, 5 seeds
    jaxpos reproduce --out runs/tisa --profile full --claims tisa_local,tisa_toeplitz --seeds 3
    launch/reproduce.sbatch runs/full --profile full               # the same runs as a SLURM job array

Only the runs the chosen claims need are run (and the bag-of-words runs every learning curve is judged against).
Re-running a command with the same --out resumes: finished runs are kept, an unfinished one resumes from its
checkpoints.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from jaxpos.cli.common import add_command

# configs/reproduce/*.py (matrix.PROFILE_NAMES), named here to keep start-up light
PROFILE_CHOICES = ("smoke", "full", "micro")


def add_reproduce_parser(subparsers) -> None:
    """Registers the `reproduce` subcommand on an argparse subparsers object."""
    parser = add_command(
        subparsers, "reproduce", "small-scale reproduction of the papers' claims: mechanisms x seeds with a fixed "
        "recipe, pretrained, fine-tuned and analysed; REPRODUCTION.md with a verdict per claim",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output folder (plan.json, runs/, figures/, REPRODUCTION.md, "
                                                     "numbers.json)")
    parser.add_argument("--profile", default="smoke",
                        help="a profile file (configs/reproduce/*.py: get_config() -> the recipe's fields), or one of "
                             "the repository's by name: smoke: a first look, minutes on 2 CPU cores (default); full: "
                             "the verdicts, every "
                             "mechanism, 5 seeds, about 1.5 hours of one H200 (docs/reproduction.md); micro: tests. "
                             "Before the runs start, the command prints its estimate for this machine")
    parser.add_argument("--seeds", type=int, help="seeds per mechanism (default: the profile's)")
    parser.add_argument("--mechanisms", help="comma-separated mechanisms to run (default: the profile's; the "
                                             "bag-of-words model `none` is always run)")
    parser.add_argument("--claims", help="comma-separated claims to decide (default: all), by the ids of "
                                         "jaxpos/reproduction/claims.py: tisa_local, diet_sharing, chen_swaps, ...")
    parser.add_argument("--workers", type=int, help="runs at a time (default: 8 per GPU, else one per CPU core)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true",
                      help="print the mechanisms, one a line, with their seeds and stages; run and write nothing")
    mode.add_argument("--plan-only", action="store_true",
                      help="plan and train the shared tokenizer, write the mechanisms to OUT/runs.txt and stop "
                           "(launch/reproduce.sbatch runs them as array tasks)")
    mode.add_argument("--run", dest="run_name", metavar="NAME",
                      help="execute a mechanism of OUT/plan.json (its seeds pretrained at once, then each run's "
                           "stages) or one run (MECHANISM_sSEED) in this process (an array task)")
    mode.add_argument("--report-only", action="store_true", help="write the report from the finished runs")
    parser.set_defaults(run=_reproduce)


def _command_line(otherwise: str = "jaxpos reproduce") -> str:
    """This command as typed (quoted in the report), or `otherwise` when run some other way."""
    if sys.argv and sys.argv[0].endswith("jaxpos"):
        return "jaxpos " + " ".join(shlex.quote(a) for a in sys.argv[1:] if a != "--debug")
    return otherwise


def print_dry_run(plan: dict, about: str) -> None:
    """A plan's mechanisms, one a line (an array task each), with their seeds and stages; `about`: the header's end."""
    from jaxpos.reproduction.matrix import pretraining_groups  # lazy: with the plan, for a dry run only

    print(f"# {len(plan['runs'])} runs ({len(plan['mechanisms'])} mechanisms x {plan['seeds']} seed(s)) {about}, "
          f"{plan['workers']} at a time")
    for mechanism, names in pretraining_groups(plan).items():  # an array task a mechanism
        seeds = ", ".join(str(plan["runs"][n]["seed"]) for n in names)
        stages = plan["runs"][names[0]]["stages"]
        print(f"{mechanism}  # seeds {seeds} pretrained at once; each then: {', '.join(['learning curve', *stages])}")


def run_named(out: str, name: str) -> None:
    """`--run NAME`: a mechanism or one run of OUT/plan.json in this process (an array task); prints its outcome."""
    from jaxpos.reproduction.reproduce import run_one  # lazy: loads jax

    print(f"{name}: {run_one(out, name)}")


def _names(text: str | None) -> list[str] | None:
    return [n.strip() for n in text.split(",") if n.strip()] if text else None


def _reproduce(args, overrides):
    from jaxpos.reproduction import reproduce as repro  # lazy: loads jax, which `jaxpos --help` does not need

    out = args.out
    if args.run_name:
        return run_named(out, args.run_name)
    from jaxpos.reproduction.report import REPORT_FILE, summary_table  # lazy: matplotlib, for a report only

    if args.report_only:
        numbers = repro.report_only(out, _command_line())
        print(summary_table(numbers["claims"]) + f"wrote {os.path.join(out, REPORT_FILE)}")
        return numbers
    settings = dict(profile=args.profile, seeds=args.seeds, workers=args.workers,
                    mechanisms=_names(args.mechanisms), claims=_names(args.claims))
    if args.dry_run:
        plan = repro.new_plan(**settings)
        print_dry_run(plan, f"for {len(plan['claims'])} claim(s), profile {args.profile}")
        return plan
    done = repro.reproduce(out, **settings, command=_command_line(), plan_only=args.plan_only)
    if args.plan_only:
        print(f"wrote {os.path.join(out, repro.RUNS_LIST_FILE)}: run each mechanism with `jaxpos reproduce --out "
              f"{out} --run NAME`, then `jaxpos reproduce --out {out} --report-only`")
        return done.plan
    print(summary_table(done.numbers["claims"]) + f"wrote {os.path.join(out, REPORT_FILE)} "
          f"({done.wall_s / 60:.1f} min)")
    return done.numbers
