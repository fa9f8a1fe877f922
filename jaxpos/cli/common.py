"""What every `jaxpos` subcommand shares: how it is registered, and whether it takes `--config.*` overrides."""

from __future__ import annotations

import argparse


def add_command(subparsers, name: str, help: str, *, overrides: str | None = None,
                **options) -> argparse.ArgumentParser:
    """Registers subcommand NAME. `overrides`: what its `--config.a.b=value` overrides change, said in its help;
    None: it takes none, and `jaxpos` refuses them in one line. `options` go to `add_parser` (description, ...)."""
    epilog = f"Takes --config.a.b=value overrides: {overrides}" if overrides else None
    parser = subparsers.add_parser(name, help=help, epilog=epilog, **options)
    parser.set_defaults(takes_overrides=overrides is not None)
    return parser
