"""`jaxpos compare`: train every (mechanism or variant, seed) of one masked-LM recipe, the seeds of each at once,
score them at the training length and past it, fine-tune them where asked, and write OUT/COMPARISON.md: each
quantity with its 95% interval over seeds, the learning curves with their seeds' range, and paired comparisons
against the baseline (Holm-corrected over the report).

    jaxpos compare --config configs/mlm/tiny.py --mechanisms none,sinusoidal,rope,alibi,t5 --seeds 3 \\
        --lengths 1,2,4,8 --out runs/lengths
    jaxpos compare --config configs/mlm/tiny.py --mechanisms rope,rope+yarn@eval,rope+partial0.5,alibi+local128 \\
        --seeds 3 --lengths 1,4 --out runs/rope --config.train.num_steps=2000
    jaxpos compare ... --plan-only   then   jaxpos compare --out DIR --run NAME   (SLURM array tasks; see
        launch/reproduce.sbatch), and   jaxpos compare --out DIR --report-only

Variants: a mechanism of `jaxpos reproduce`'s runs (a registry kind, or e.g. diet_rel_layer) with options joined by
`+`: a RoPE length rule (linear, ntk, dynamic, yarn, llama3, each with an optional factor: yarn8), partialF (RoPE
on a fraction F of each head's channel pairs), random[N] (randomized positions from [0, N)), localW (a local
window of W keys), clipN (DIET-Rel's offsets clipped at N), nopeK (no positional term in every K-th layer),
headsH (RoPE or ALiBi on the first H heads), gate, sink, qknorm, ssmax (the output gate, a sink logit, QK-norm,
Scalable-Softmax); a trailing @eval applies the RoPE rules at evaluation only, to the weights of the variant
without them. Re-running with the same --out resumes: finished runs are kept, an unfinished one resumes.
"""

from __future__ import annotations

import argparse
import os

from jaxpos.cli.common import add_command
from jaxpos.cli.reproduce import _command_line, _names, print_dry_run, run_named


def length_factors(text: str | None) -> list[int]:
    """--lengths as whole multiples of the training length ("1,2,4" -> [1, 2, 4]); anything else is a one-line
    error that says what the flag takes."""
    factors = []
    for item in _names(text) or ():
        if not item.isdigit() or int(item) < 1:
            raise ValueError(f"--lengths {text}: give whole multiples of the training length, such as 1,2,4,8 (got "
                             f"{item!r}; a row is scored at 1x, 2x, ... its training length)")
        factors.append(int(item))
    return factors


def add_compare_parser(subparsers) -> None:
    """Registers the `compare` subcommand on an argparse subparsers object."""
    parser = add_command(
        subparsers, "compare", "any masked-LM recipe, mechanisms and variants x seeds, paired statistics, one "
        "report (COMPARISON.md)", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        overrides="the recipe in --config (every run's)")
    parser.add_argument("--out", required=True, help="output folder (plan.json, runs/, figures/, COMPARISON.md)")
    parser.add_argument("--config", help="the masked-LM recipe (a config file); needed to plan, not to resume")
    parser.add_argument("--mechanisms", action="append",
                        help="comma-separated mechanisms and variants (see above); may be repeated, the lists join")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per variant (default 3, at least 2)")
    parser.add_argument("--baseline", default="none", help="the variant every other is compared with (default "
                                                            "none: bag of words; always run)")
    parser.add_argument("--all-pairs", action="store_true", help="also compare every pair of variants")
    parser.add_argument("--lengths", help="comma-separated multiples of the training length to score the held-out "
                                          "loss at, e.g. 1,2,4,8 (the same masked tokens at each)")
    parser.add_argument("--length-tokens", type=int, default=32768,
                        help="held-out tokens scored at every length (default 32768; the same masked ones at each)")
    parser.add_argument("--finetune", help="comma-separated fine-tuning tasks: paraphrase, order")
    parser.add_argument("--workers", type=int, help="runs at a time (default: 8 per GPU, else one per CPU core)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true",
                      help="print the variants, one a line, with their seeds and stages; run and write nothing")
    mode.add_argument("--plan-only", action="store_true", help="plan, train the shared tokenizer, write OUT/runs.txt "
                                                                "and stop (array tasks run the variants)")
    mode.add_argument("--run", dest="run_name", metavar="NAME", help="execute a variant of OUT/plan.json (its seeds "
                                                                     "at once) or one run in this process")
    mode.add_argument("--report-only", action="store_true", help="write the report from the finished runs")
    parser.set_defaults(run=_compare)


def _compare(args, overrides):
    from jaxpos.reproduction import compare as comp, reproduce as repro  # lazy: loads jax

    out = args.out
    if args.run_name:
        return run_named(out, args.run_name)
    if args.report_only:
        numbers = repro.report_only(out, _command_line("jaxpos compare"), comp.write_report)
        print(f"wrote {os.path.join(out, comp.REPORT_FILE)}")
        return numbers
    if not args.config or not args.mechanisms:
        raise ValueError("jaxpos compare plans from --config FILE and --mechanisms a,b,...")
    plan = comp.new_plan(args.config, overrides, _names(",".join(args.mechanisms)), args.seeds, args.workers,
                         length_factors(args.lengths), _names(args.finetune) or (), args.baseline,
                         args.all_pairs, args.length_tokens)
    if args.dry_run:
        print_dry_run(plan, f"of {args.config}")
        return plan
    about = (f"jaxpos compare: {len(plan['mechanisms'])} variants x {plan['seeds']} seeds of {args.config} "
             f"({len(plan['runs'])} runs)")
    done = repro.run_plan(out, plan, "jaxpos compare", about, comp.write_report,
                          command=_command_line("jaxpos compare"), plan_only=args.plan_only)
    if args.plan_only:
        print(f"wrote {os.path.join(out, repro.RUNS_LIST_FILE)}: run each variant with `jaxpos compare --out {out} "
              f"--run NAME`, then `jaxpos compare --out {out} --report-only`")
        return done.plan
    print(f"wrote {os.path.join(out, comp.REPORT_FILE)} ({done.wall_s / 60:.1f} min)")
    return done.numbers
