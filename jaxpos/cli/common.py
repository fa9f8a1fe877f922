"""What every `jaxpos` subcommand shares: its parser class (errors in jaxpos's words), the `--debug` flag, how it
is registered, and whether it takes `--config.*` overrides."""

from __future__ import annotations

import argparse
import sys

DEBUG_HELP = "show the traceback of every error, before or after the subcommand (or set JAXPOS_DEBUG=1)"
IMPORT_HELP = ("import MODULE first (a dotted name on sys.path, the working folder first; repeatable): a positional "
               "mechanism of your own registers as it loads (docs/extending.md); installed packages' mechanisms "
               "register through the entry point group jaxpos.mechanisms without it")

# What a training loop does when stopped and how its command ends: the epilog of `train` and `finetune`, stated by
# jaxpos.training.interrupt, jaxpos.training.checkpoint and jaxpos.cli.main.
RUN_NOTES = (
    "Resuming: the same command again resumes from the newest checkpoint in WORKDIR that restores (a corrupt or "
    "partial one is moved aside); a checkpoint of another model is refused.\n\n"
    "Signals: during training, SIGTERM or SIGINT (Ctrl-C) finishes the step in progress, checkpoints it and stops; "
    "elsewhere (reading data, compiling, evaluating) it stops at once. The exit status is 128 + the signal's "
    "number (143 for SIGTERM, 130 for SIGINT); a second Ctrl-C aborts at once (130), keeping the checkpoints "
    "saved before.\n\n"
    "Exit status: 0 done; 2 a mistake in what was given (one line, `jaxpos: error: ...`); 1 a run that diverged "
    "(NaN or infinite values) or a workdir where no checkpoint restores; any other error keeps its traceback "
    "(--debug or JAXPOS_DEBUG=1 shows every one).")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors read `jaxpos: error: ...`, as jaxpos's own errors do; each blank-line
    separated paragraph of a description or epilog wraps on its own. Subparsers take the same class."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", ParagraphFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        """Prints this parser's usage line and `jaxpos: error: MESSAGE` to stderr; exits with status 2."""
        self.print_usage(sys.stderr)
        self.exit(2, f"jaxpos: error: {message}\n")


class ParagraphFormatter(argparse.HelpFormatter):
    """The default help layout, keeping the blank lines between paragraphs of a description or epilog."""

    def _fill_text(self, text, width, indent):
        # super() with its arguments: the generator expression is a scope of its own
        return "\n\n".join(super(ParagraphFormatter, self)._fill_text(paragraph, width, indent)
                           for paragraph in text.split("\n\n"))


def _debug_parent() -> argparse.ArgumentParser:
    """A parent parser holding `--debug` and `--import` for every subcommand, so that each one's help lists them.
    Their defaults are suppressed: a subcommand without the flag keeps `jaxpos --debug`'s (`--import`'s) value
    rather than resetting it."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    add_import_option(parent, default=argparse.SUPPRESS)
    return parent


def add_import_option(parser: argparse.ArgumentParser, default=None) -> None:
    """`--import MODULE` (repeatable) on `parser`, into args.imports."""
    parser.add_argument("--import", dest="imports", action="append", metavar="MODULE", default=default,
                        help=IMPORT_HELP)


_DEBUG = _debug_parent()


def add_command(subparsers, name: str, help: str, *, overrides: str | None = None, notes: str | None = None,
                **options) -> argparse.ArgumentParser:
    """Registers subcommand NAME, with `--debug`. `overrides`: what its `--config.a.b=value` overrides change, said
    in its help; None: it takes none, and `jaxpos` refuses them in one line. `notes`: more of its help's epilog
    (paragraphs apart by blank lines). `options` go to `add_parser` (description, ...)."""
    epilog = "\n\n".join(filter(None, [f"Takes --config.a.b=value overrides: {overrides}" if overrides else None,
                                       notes])) or None
    parser = subparsers.add_parser(name, help=help, epilog=epilog, parents=[_DEBUG], **options)
    parser.set_defaults(takes_overrides=overrides is not None)
    return parser
