"""The `jaxpos` command: train, translate, eval-bleu, analyze, finetune, evaluate, finetune-sweep, probe-word-order,
reproduce, smoke, tokenizer, export."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from jaxpos.analysis.cli import add_analyze_parser
from jaxpos.checkpoints import add_export_parser
from jaxpos.reproduction.cli import add_reproduce_parser
from jaxpos.training.finetune_cli import add_finetune_parser


def _train(args, overrides):
    from jaxpos.config import model_config
    from jaxpos.config.files import apply_overrides, load_config
    from jaxpos.config.defaults import check_train_block
    from jaxpos.config.model import check_training

    if args.distributed:  # multi-host: coordinator and process ids come from the TPU / SLURM environment
        import jax

        jax.distributed.initialize()

    config = apply_overrides(load_config(args.config), overrides)
    check_training(model_config(config.model))  # refuse a bad model or train block before any data is read
    check_train_block(config.train)
    if "decode" in config:  # translation: the beam search's settings too
        from jaxpos.config.decode import decode_config

        decode_config(config.decode)
    if config.task == "mlm":
        from jaxpos.training.mlm_main import train_mlm

        train_mlm(config, args.workdir)
    elif config.task == "translation":
        from jaxpos.training.translation_main import train_translation

        train_translation(config, args.workdir)
    elif config.task == "finetune":
        raise ValueError(f"{args.config} is a fine-tuning config: run it with `jaxpos finetune --config "
                         f"{args.config} --init PRETRAINED --workdir DIR`")
    else:
        raise ValueError(f"unknown task {config.task!r} in {args.config}")


def _translate(args, overrides):
    from jaxpos.training.translation_main import translate_main

    translate_main(args.workdir, args.input, args.output, overrides)


def _eval_bleu(args, overrides):
    from jaxpos.training.translation_main import eval_bleu_main

    eval_bleu_main(args.workdir, args.split, args.max_sentences, overrides)


def _smoke(args, overrides):
    from jaxpos.smoke import smoke_table

    print(smoke_table(seq_len=args.seq_len))


def _tokenizer(args, overrides):
    from jaxpos.data.pipeline import tokenizer_main

    tokenizer_main(args.config, args.out, overrides)


# Errors that jaxpos's own checks raise about what the user gave (config, paths, data); shown as one line.
USER_ERRORS = (ValueError, KeyError, FileNotFoundError, NotADirectoryError, IsADirectoryError, ModuleNotFoundError)
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_error_status(error: BaseException) -> int | None:
    """The exit status for an error that jaxpos explains in one line, or None for a fault (keeps its traceback).

    2 for USER_ERRORS raised by jaxpos's own code (the innermost frame of the traceback is in the package: the
    same types raised inside jax, orbax or numpy are faults); 1 for a diverged or unrestorable run.
    """
    from jaxpos.training.checkpoint import CheckpointError
    from jaxpos.training.loop import TrainingDiverged

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


def main(argv: list[str] | None = None) -> int:
    """Runs one `jaxpos` command. User errors print `jaxpos: error: ...` and return 2 (1 for a diverged or
    unrestorable run); `--debug` shows their traceback instead. Real faults raise as usual."""
    parser = argparse.ArgumentParser(prog="jaxpos", description=__doc__)
    parser.add_argument("--debug", action="store_true", help="show the traceback of every error (any position)")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train from a config; resumes from the workdir's latest checkpoint",
                           epilog="Override any config field with --config.a.b=value, e.g. "
                                  "--config.model.position.kind=diet_rel")
    train.add_argument("--config", required=True, help="config file, e.g. configs/mlm/tiny.py (or file.py:arg)")
    train.add_argument("--workdir", required=True, help="checkpoints, TensorBoard events, tokenizer, figures")
    train.add_argument("--distributed", action="store_true",
                       help="call jax.distributed.initialize() first (multi-host TPU pods and SLURM jobs)")
    train.set_defaults(run=_train)
    translate = sub.add_parser("translate", help="translate lines with a trained translation run (beam search)",
                               epilog="Decoding settings come from the run's config; override them with e.g. "
                                      "--config.decode.beam_size=10 --config.decode.alpha=0.6")
    translate.add_argument("--workdir", required=True, help="the workdir of a `jaxpos train` translation run")
    translate.add_argument("--input", help="file with one sentence per line (default: stdin)")
    translate.add_argument("--output", help="file for the translations, one per line (default: stdout)")
    translate.set_defaults(run=_translate)
    bleu = sub.add_parser("eval-bleu", help="decode a held-out split of a translation run; print SacreBLEU")
    bleu.add_argument("--workdir", required=True, help="the workdir of a `jaxpos train` translation run")
    bleu.add_argument("--split", default="test", choices=("dev", "test"))
    bleu.add_argument("--max-sentences", type=int, default=0, help="decode only the first N sentences (0 = all)")
    bleu.set_defaults(run=_eval_bleu)
    smoke = sub.add_parser("smoke", help="forward/backward of every positional mechanism; prints a table")
    smoke.add_argument("--seq-len", type=int, default=64)
    smoke.set_defaults(run=_smoke)
    tokenizer = sub.add_parser("tokenizer", help="train a config's SentencePiece model once (before a multi-process "
                                                 "run); then pass --config.data.tokenizer_path=OUT.model")
    tokenizer.add_argument("--config", required=True, help="the training config, e.g. configs/mlm/diet.py")
    tokenizer.add_argument("--out", required=True, help="writes OUT.model, OUT.vocab, OUT.json (local or gs://...)")
    tokenizer.set_defaults(run=_tokenizer)
    add_analyze_parser(sub)
    add_finetune_parser(sub)
    add_export_parser(sub)
    add_reproduce_parser(sub)

    args, rest = parser.parse_known_args(argv)
    debug = args.debug or "--debug" in rest  # accepted after the subcommand too
    overrides = [r for r in rest if r.startswith("--config.")]
    unknown = [r for r in rest if not r.startswith("--config.") and r != "--debug"]
    if unknown:
        parser.error(f"unrecognised arguments: {' '.join(unknown)}")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        args.run(args, overrides)
    except Exception as error:
        status = None if debug else user_error_status(error)
        if status is None:
            raise
        print(f"jaxpos: error: {_message(error)}", file=sys.stderr, flush=True)
        return status
    return 0


if __name__ == "__main__":
    sys.exit(main())
