"""`jaxpos train` (masked-LM and translation configs) and `jaxpos tokenizer` (a config's tokenizer, trained once)."""

from __future__ import annotations

from jaxpos.cli.common import RUN_NOTES, add_command


def add_train_parser(subparsers) -> None:
    """Registers the `train` subcommand on an argparse subparsers object."""
    train = add_command(subparsers, "train", "train from a config; resumes from the workdir's latest checkpoint; "
                        "SIGTERM or Ctrl-C checkpoints and exits (143 / 130)",
                        overrides="any field of the config, e.g. --config.model.position.kind=diet_rel",
                        notes=RUN_NOTES)
    train.add_argument("--config", required=True, help="config file, e.g. configs/mlm/tiny.py (or file.py:arg)")
    train.add_argument("--workdir", required=True, help="checkpoints, TensorBoard events, tokenizer, figures")
    train.add_argument("--seeds", type=int, default=1,
                       help="masked-LM: train this many seeds at once (train.seed and data.seed + 0, 1, ...), each in "
                       "WORKDIR/seed_S; small models train several seeds for little more than the time of one")
    train.add_argument("--init", metavar="RUN",
                       help="masked-LM: start from RUN's newest parameters (train.init_from: continued pretraining, "
                            "e.g. --config.data.seq_len=1024 --config.model.position.rope.base=160000 to extend the "
                            "context); a fresh optimiser, RUN's tokenizer and mechanism")
    train.add_argument("--distributed", action="store_true",
                       help="call jax.distributed.initialize() first (multi-host TPU pods and SLURM jobs)")
    train.set_defaults(run=_train)


def add_tokenizer_parser(subparsers) -> None:
    """Registers the `tokenizer` subcommand on an argparse subparsers object."""
    tokenizer = add_command(
        subparsers, "tokenizer", "train a config's tokenizer once (before a multi-process run); then pass "
        "--config.data.tokenizer_path= the file it names", overrides="any field of the config, e.g. "
        "--config.data.vocab_size=16000")
    tokenizer.add_argument("--config", required=True, help="the training config, e.g. configs/mlm/diet.py")
    tokenizer.add_argument("--out", required=True, help="writes OUT.model and OUT.vocab (data.tokenizer=tokenizers: "
                           "OUT.tokenizer.json), then OUT.json (local or gs://...)")
    tokenizer.set_defaults(run=_tokenizer)


def _train(args, overrides):
    # lazy: ml_collections, etils (0.2 s): `jaxpos --help` does not need them
    from jaxpos.config.files import apply_overrides, load_config
    from jaxpos.workflows.train import train  # lazy: loads jax (~2 s), which `jaxpos --help` does not need

    if args.distributed:  # multi-host: coordinator and process ids come from the TPU / SLURM environment
        import jax  # lazy: 1.3 s, which `jaxpos --help` does not need

        jax.distributed.initialize()
    if args.init:
        overrides = [f"--config.train.init_from={args.init}", *overrides]
    return train(apply_overrides(load_config(args.config), overrides), args.workdir, args.config, args.seeds)


def _tokenizer(args, overrides):
    # lazy: ml_collections, etils (0.2 s): `jaxpos --help` does not need them
    from jaxpos.config.files import apply_overrides, load_config
    # lazy: loads jax (~1.3 s), which `jaxpos --help` does not need
    from jaxpos.workflows.tokenizer import train_config_tokenizer

    tokenizer = train_config_tokenizer(apply_overrides(load_config(args.config), overrides), args.out, args.config)
    print(f"wrote {tokenizer.path} ({tokenizer.vocab_size} pieces); train with "
          f"--config.data.tokenizer_path={tokenizer.path}")
    return tokenizer
