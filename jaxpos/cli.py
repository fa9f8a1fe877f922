"""The `jaxpos` command: train, smoke, and (as they land) translate, eval-bleu, analyze."""

from __future__ import annotations

import argparse
import logging
import sys


def _train(args, overrides):
    from jaxpos.config_io import apply_overrides, load_config

    if args.distributed:  # multi-host: coordinator and process ids come from the TPU / SLURM environment
        import jax

        jax.distributed.initialize()

    config = apply_overrides(load_config(args.config), overrides)
    if config.task == "mlm":
        from jaxpos.training.mlm_main import train_mlm

        train_mlm(config, args.workdir)
    else:
        raise ValueError(f"unknown task {config.task!r} in {args.config}")


def _smoke(args, overrides):
    from jaxpos.smoke import smoke_table

    print(smoke_table(seq_len=args.seq_len))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jaxpos", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train from a config; resumes from the workdir's latest checkpoint",
                           epilog="Override any config field with --config.a.b=value, e.g. "
                                  "--config.model.position.kind=diet_rel")
    train.add_argument("--config", required=True, help="config file, e.g. configs/mlm/tiny.py (or file.py:arg)")
    train.add_argument("--workdir", required=True, help="checkpoints, TensorBoard events, tokenizer, figures")
    train.add_argument("--distributed", action="store_true",
                       help="call jax.distributed.initialize() first (multi-host TPU pods and SLURM jobs)")
    train.set_defaults(run=_train)
    smoke = sub.add_parser("smoke", help="forward/backward of every positional mechanism; prints a table")
    smoke.add_argument("--seq-len", type=int, default=64)
    smoke.set_defaults(run=_smoke)

    args, rest = parser.parse_known_args(argv)
    overrides = [r for r in rest if r.startswith("--config.")]
    unknown = [r for r in rest if not r.startswith("--config.")]
    if unknown:
        parser.error(f"unrecognised arguments: {' '.join(unknown)}")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args.run(args, overrides)
    return 0


if __name__ == "__main__":
    sys.exit(main())
