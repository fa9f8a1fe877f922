"""`jaxpos translate` and `jaxpos eval-bleu`: beam search with a trained translation run."""

from __future__ import annotations

import sys

from jaxpos.cli.common import add_command


def add_translate_parsers(subparsers) -> None:
    """Registers the `translate` and `eval-bleu` subcommands on an argparse subparsers object."""
    decoding = "fields of the run's config as read, e.g. --config.decode.beam_size=10 --config.decode.alpha=0.6"
    translate = add_command(subparsers, "translate", "translate lines with a trained translation run (beam search)",
                            overrides=decoding)
    translate.add_argument("--workdir", required=True, help="the workdir of a `jaxpos train` translation run")
    translate.add_argument("--input", help="file with one sentence per line (default: stdin)")
    translate.add_argument("--output", help="file for the translations, one per line (default: stdout)")
    translate.set_defaults(run=_translate)
    bleu = add_command(subparsers, "eval-bleu", "decode a held-out split of a translation run; print SacreBLEU",
                       overrides=decoding)
    bleu.add_argument("--workdir", required=True, help="the workdir of a `jaxpos train` translation run")
    bleu.add_argument("--split", default="test", choices=("dev", "test"),
                      help="the held-out split of the run's data to decode (default: test)")
    bleu.add_argument("--max-sentences", type=int, default=0, help="decode only the first N sentences (0 = all)")
    bleu.set_defaults(run=_eval_bleu)


def _input_lines(path: str | None):
    """The lines of `path` (stdin if None), opened when first read: after the checkpoint has loaded."""
    if path is None:
        yield from sys.stdin
        return
    with open(path, encoding="utf-8") as f:
        yield from f


def _translate(args, overrides):
    """Translates the lines of --input (stdin) into --output (stdout), line by line; notes go to stderr."""
    from jaxpos.workflows.translation import translate  # lazy: loads jax (~2 s), which `jaxpos --help` does not need

    done = translate(args.workdir, _input_lines(args.input), overrides, progress=args.output is not None)
    if done.cut:
        print(f"warning: {done.cut} line(s) are longer than {done.max_source_tokens} tokens and were cut",
              file=sys.stderr)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as out:
            out.writelines(line + "\n" for line in done.lines)
    else:
        sys.stdout.writelines(line + "\n" for line in done.lines)
    print(f"translated {len(done.lines)} line(s) with the step-{done.step} checkpoint of {args.workdir}",
          file=sys.stderr)
    return done


def _eval_bleu(args, overrides):
    from jaxpos.workflows.translation import eval_bleu  # lazy: loads jax (~2 s), which `jaxpos --help` does not need

    score = eval_bleu(args.workdir, args.split, args.max_sentences, overrides)
    print(f"{score.split} ({score.sentences} sentences, step {score.step}, beam {score.beam_size}, alpha "
          f"{score.alpha}): SacreBLEU {score.bleu.score:.2f}\n{score.bleu.details}\nsignature: {score.bleu.signature}"
          f"\ncopying the source: {score.copy_source:.2f}")
    return score
