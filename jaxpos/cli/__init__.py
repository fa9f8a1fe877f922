"""The `jaxpos` command: train, translate, eval-bleu, analyze, finetune, evaluate, finetune-sweep, probe-word-order,
reproduce, smoke, tokenizer, export."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

import jaxpos
from jaxpos.cli.analyze import add_analyze_parser
from jaxpos.cli.export import add_export_parser
from jaxpos.cli.finetune import add_finetune_parser
from jaxpos.cli.reproduce import add_reproduce_parser
from jaxpos.cli.train import add_tokenizer_parser, add_train_parser
from jaxpos.cli.translate import add_translate_parsers


def _smoke(args, overrides):
    from jaxpos.workflows.smoke import smoke_table  # lazy: loads jax (~2 s), which `jaxpos --help` does not need

    print(smoke_table(seq_len=args.seq_len))


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


def build_parser() -> argparse.ArgumentParser:
    """The `jaxpos` argument parser with every subcommand; `--config.a.b=value` overrides pass through unparsed."""
    parser = argparse.ArgumentParser(prog="jaxpos", description=__doc__)
    parser.add_argument("--debug", action="store_true", help="show the traceback of every error (any position)")
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_parser(sub)
    add_translate_parsers(sub)
    smoke = sub.add_parser("smoke", help="forward/backward of every positional mechanism; prints a table")
    smoke.add_argument("--seq-len", type=int, default=64)
    smoke.set_defaults(run=_smoke)
    add_tokenizer_parser(sub)
    add_analyze_parser(sub)
    add_finetune_parser(sub)
    add_export_parser(sub)
    add_reproduce_parser(sub)
    return parser


def parse_command(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """A command line's parsed arguments and its `--config.a.b=value` overrides, without running anything; any
    other unknown argument is a usage error (argparse exits with status 2)."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    args.debug = args.debug or "--debug" in rest  # accepted after the subcommand too
    overrides = [r for r in rest if r.startswith("--config.")]
    unknown = [r for r in rest if not r.startswith("--config.") and r != "--debug"]
    if unknown:
        parser.error(f"unrecognised arguments: {' '.join(unknown)}")
    return args, overrides


def main(argv: list[str] | None = None) -> int:
    """Runs one `jaxpos` command. User errors print `jaxpos: error: ...` and return 2 (1 for a diverged or
    unrestorable run); `--debug` shows their traceback instead. Real faults raise as usual."""
    args, overrides = parse_command(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from jaxpos.training.interrupt import RunStopped, stop_on_signals  # lazy: no jax; the signals' one path

    try:
        with stop_on_signals():
            args.run(args, overrides)
    except RunStopped as stopped:
        print(f"jaxpos: {stopped}", file=sys.stderr, flush=True)
        return stopped.exit_status
    except KeyboardInterrupt:  # a second Ctrl-C while a run was saving its stop
        print("jaxpos: aborted by a second Ctrl-C; the checkpoints saved before are kept (a partial one is moved "
              "aside on resume)", file=sys.stderr, flush=True)
        return 128 + signal.SIGINT
    except Exception as error:
        status = None if args.debug else user_error_status(error)
        if status is None:
            raise
        print(f"jaxpos: error: {_message(error)}", file=sys.stderr, flush=True)
        return status
    return 0
