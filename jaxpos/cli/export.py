"""`jaxpos export`: a run's parameters without optimiser state, as an orbax checkpoint or a Hugging Face folder."""

from __future__ import annotations

from jaxpos.cli.common import add_command


def add_export_parser(subparsers) -> None:
    """Registers the `export` subcommand on an argparse subparsers object."""
    parser = add_command(
        subparsers, "export", "a run's parameters without optimiser state: an orbax checkpoint that "
                       "jaxpos.checkpoints.load_export restores onto any mesh, or a Hugging Face folder")
    parser.add_argument("--workdir", required=True, help="the workdir of a `jaxpos train` or `jaxpos finetune` run")
    parser.add_argument("--out", required=True, help="a new folder (local or gs://...)")
    parser.add_argument("--format", default="orbax", choices=("orbax", "huggingface"),
                        help="orbax (any run; default) or huggingface (masked-LM runs with learned absolute "
                             "positions: config.json + model.safetensors for transformers)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                        help="cast floating parameters (default: as trained)")
    parser.add_argument("--step", type=int, help="the checkpoint step (default: the newest that restores)")
    parser.set_defaults(run=_export)


def _export(args, overrides) -> dict:
    """Exports, then prints one line saying what was written."""
    from jaxpos.checkpoints.export import export_run  # lazy: loads jax (~2 s), which `jaxpos --help` does not need

    done = export_run(args.workdir, args.out, format=args.format, dtype=args.dtype, step=args.step)
    print(f"exported step {done['step']} of {args.workdir} ({done['task']}, {done['dtype']}) as {done['format']} "
          f"to {done['out']}")
    return done
