"""The `jaxpos` command: train, tokenizer, finetune, evaluate, finetune-sweep, probe-word-order, analyze, curves,
export, translate, eval-bleu, reproduce, compare, mechanisms."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

import jaxpos
from jaxpos.cli.analyze import add_analyze_parser
from jaxpos.cli.common import DEBUG_HELP, Parser, add_command, add_import_option
from jaxpos.cli.export import add_export_parser
from jaxpos.cli.finetune import add_finetune_parser
from jaxpos.cli.compare import add_compare_parser
from jaxpos.cli.reproduce import add_reproduce_parser
from jaxpos.cli.train import add_tokenizer_parser, add_train_parser
from jaxpos.cli.translate import add_translate_parsers
from jaxpos.compilation_cache import enable_compilation_cache


def _mechanisms(args, overrides):
    from jaxpos.workflows.mechanisms import mechanisms_table  # lazy: loads jax (~2 s), which --help does not need

    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()] if args.kinds else None
    print(mechanisms_table(seq_len=args.seq_len, kinds=kinds))


# At initialisation attention barely reaches the logits, so the loss and gradient norm cannot tell mechanisms apart.
ORDER_NOTE = ("The order column shows whether a mechanism acts: how far the logits of each row with its tokens "
              "shuffled by a fixed permutation are from the row's logits shuffled the same way, relative to their "
              "size (matmuls at full float32 precision, on a GPU too). The bag of words `none` gives 0 up to float "
              "error (about 1e-7); a mechanism that is wired in gives at least ten times that (from about 1e-5 at "
              "initialisation). The loss and gradient norm are nearly the same for every mechanism at "
              "initialisation and cannot show it.")


def add_mechanisms_parser(subparsers) -> None:
    """Registers `mechanisms`: a forward and backward pass of every positional mechanism, as a table."""
    parser = add_command(subparsers, "mechanisms", "a forward and backward pass of every positional mechanism on a "
                         "small random BERT: parameters, loss, gradient norm, order sensitivity, compile and step "
                         "time (seconds on a CPU; checks an installation and that each mechanism acts)",
                         notes=ORDER_NOTE)
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per row (default 64; batch of 4)")
    parser.add_argument("--kinds", help="comma-separated kinds to run (default: every registered one, a mechanism "
                                        "of your own included: --import MODULE)")
    parser.set_defaults(run=_mechanisms)


def _curves(args, overrides):
    from jaxpos.workflows.curves import compare_runs, curves_table  # lazy: reads event files, draws with matplotlib

    rows = compare_runs(args.workdirs, args.out, args.metric)
    print(curves_table(rows, args.metric) + f"\nwrote {args.out}")
    return rows


def add_curves_parser(subparsers) -> None:
    """Registers `curves`: the logged curves of several runs in one figure and one table."""
    parser = add_command(subparsers, "curves", "the training and held-out loss (or --metric) of one or more runs "
                         "in one PNG, and a table of the last and best values")
    parser.add_argument("workdirs", nargs="+", metavar="WORKDIR", help="workdirs of `jaxpos train` or `jaxpos "
                        "finetune` runs (their tensorboard/ event files)")
    parser.add_argument("--out", default="curves.png", help="the PNG to write (default: ./curves.png)")
    parser.add_argument("--metric", default="loss", help="a logged metric: loss (default), accuracy, perplexity, "
                        "bleu (translation), a GLUE score (fine-tuning), ...")
    parser.set_defaults(run=_curves)


# Errors that jaxpos's own checks raise about what the user gave (config, paths, data); shown as one line.
USER_ERRORS = (ValueError, KeyError, FileNotFoundError, NotADirectoryError, IsADirectoryError, ModuleNotFoundError)
_PACKAGE_DIR = os.path.dirname(os.path.abspath(jaxpos.__file__)) + os.sep


def user_error_status(error: BaseException) -> int | None:
    """The exit status for an error that jaxpos explains in one line, or None for a fault (keeps its traceback).

    2 for USER_ERRORS raised by jaxpos's own code (the innermost frame of the traceback is in the package: the
    same types raised inside jax, orbax or numpy are faults); 1 for a diverged or unrestorable run.
    """
    from jaxpos.training.checkpoint import CheckpointError  # lazy: loads jax (~2 s); only a failed command gets here
    from jaxpos.training.loop import TrainingDiverged  # lazy: loads jax (~2 s); only a failed command gets here

    if isinstance(error, (TrainingDiverged, CheckpointError)):  # a run's outcome, already explained by its message
        return 1
    tb = error.__traceback__
    if not isinstance(error, USER_ERRORS) or tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    return 2 if os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_PACKAGE_DIR) else None


def _message(error: BaseException) -> str:
    text = error.args[0] if isinstance(error, KeyError) and error.args else str(error)  # KeyError quotes its text
    return " ".join(str(text).split()) or type(error).__name__


ERRORS_EPILOG = (
    "Errors: a mistake in what was given (a config field or value, a path, data) prints one line, `jaxpos: error: "
    "...`, and exits with status 2; a training run that diverged, or a workdir where no checkpoint restores, exits "
    "with 1; any other error keeps its traceback. Where a one-line error looks like a bug in jaxpos rather than a "
    "mistake, --debug (before or after the subcommand) or the environment variable JAXPOS_DEBUG=1 shows the "
    "traceback of every error.")


def debug_requested(args: argparse.Namespace) -> bool:
    """Whether to show every traceback: `--debug` on the command line, or JAXPOS_DEBUG set to anything but 0."""
    return args.debug or os.environ.get("JAXPOS_DEBUG", "").strip() not in ("", "0")


def build_parser() -> argparse.ArgumentParser:
    """The `jaxpos` argument parser with every subcommand; `--config.a.b=value` overrides pass through unparsed."""
    parser = Parser(prog="jaxpos", description=__doc__, epilog=ERRORS_EPILOG)
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    add_import_option(parser)
    parser.add_argument("--version", action="version", version=f"jaxpos {jaxpos.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for register in (add_train_parser, add_tokenizer_parser, add_finetune_parser, add_analyze_parser,
                     add_curves_parser, add_export_parser, add_translate_parsers, add_reproduce_parser,
                     add_compare_parser, add_mechanisms_parser):  # the order of the module docstring (tests/cli checks it)
        register(sub)
    return parser


def parse_command(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """A command line's parsed arguments and its `--config.a.b=value` overrides, without running anything; any
    other unknown argument is a usage error (argparse exits with status 2)."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    overrides = [r for r in rest if r.startswith("--config.")]
    unknown = [r for r in rest if not r.startswith("--config.")]
    if unknown:
        parser.error(f"unrecognised arguments: {' '.join(unknown)}")
    return args, overrides


def main(argv: list[str] | None = None) -> int:
    """Runs one `jaxpos` command. User errors print `jaxpos: error: ...` and return 2 (1 for a diverged or
    unrestorable run); `--debug` or JAXPOS_DEBUG=1 shows their traceback instead. Real faults raise as usual."""
    args, overrides = parse_command(argv)
    if overrides and not args.takes_overrides:
        print(f"jaxpos: error: `jaxpos {args.command}` takes no --config overrides (got {' '.join(overrides)})",
              file=sys.stderr, flush=True)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    enable_compilation_cache()  # before anything compiles: a program built once on this machine loads from disk
    from jaxpos.training.interrupt import RunStopped, stop_on_signals  # lazy: no jax; the signals' one path

    try:
        with stop_on_signals():
            if args.imports:  # a researcher's mechanisms register before any config is read
                from jaxpos.positions import import_mechanisms  # lazy: loads jax, which --help does not need

                import_mechanisms(args.imports)
            args.run(args, overrides)
    except RunStopped as stopped:
        print(f"jaxpos: {stopped}", file=sys.stderr, flush=True)
        return stopped.exit_status
    except KeyboardInterrupt:  # a second Ctrl-C while a run was saving its stop
        print("jaxpos: aborted by a second Ctrl-C; the checkpoints saved before are kept (a partial one is moved "
              "aside on resume)", file=sys.stderr, flush=True)
        return 128 + signal.SIGINT
    except Exception as error:
        status = None if debug_requested(args) else user_error_status(error)
        if status is None:
            raise
        print(f"jaxpos: error: {_message(error)}", file=sys.stderr, flush=True)
        return status
    return 0
