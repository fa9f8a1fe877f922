"""Checkpoint import (Hugging Face BERT/ALBERT: `huggingface`) and export (`export`: parameters only, as an orbax
checkpoint that `load_export` restores onto any mesh, or as a Hugging Face folder).

The names below come from `jaxpos.checkpoints.export` on first use, so the `jaxpos` command starts without
loading jax.
"""

from __future__ import annotations

_LAZY = ("export_run", "load_export", "read_export_config", "save_export", "save_huggingface")


def __getattr__(name: str):
    if name in _LAZY:
        from jaxpos.checkpoints import export as module

        return getattr(module, name)
    raise AttributeError(f"module 'jaxpos.checkpoints' has no attribute {name!r}")


def add_export_parser(subparsers) -> None:
    """Registers the `export` subcommand on an argparse subparsers object."""
    parser = subparsers.add_parser(
        "export", help="a run's parameters without optimiser state: an orbax checkpoint that "
                       "jaxpos.checkpoints.load_export restores onto any mesh, or a Hugging Face folder")
    parser.add_argument("--workdir", required=True, help="the workdir of a `jaxpos train` or `jaxpos finetune` run")
    parser.add_argument("--out", required=True, help="a new folder (local or gs://...)")
    parser.add_argument("--format", default="orbax", choices=("orbax", "huggingface"),
                        help="orbax (any run; default) or huggingface (masked-LM runs with learned absolute "
                             "positions: config.json + model.safetensors for transformers)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                        help="cast floating parameters (default: as trained)")
    parser.add_argument("--step", type=int, help="the checkpoint step (default: the newest that restores)")
    parser.set_defaults(run=_run_export)


def _run_export(args, overrides) -> None:
    if overrides:
        raise ValueError(f"`jaxpos export` takes no --config overrides (got {' '.join(overrides)})")
    from jaxpos.checkpoints.export import export_main

    export_main(args)
