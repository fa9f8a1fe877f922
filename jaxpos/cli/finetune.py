"""`jaxpos finetune`, `evaluate`, `finetune-sweep` and `probe-word-order`: classification and regression on a
pretrained encoder, the papers' seeds x learning-rates protocol, and word-order probes of a fine-tuned run."""

from __future__ import annotations

import os

from jaxpos.cli.common import RUN_NOTES, add_command


def add_finetune_parser(subparsers) -> None:
    """Registers the fine-tuning subcommands on an argparse subparsers object."""
    overrides = "any field of the config, e.g. --config.data.task=mrpc --config.data.source=glue_dir " \
                "--config.data.glue_dir=/data/glue"
    data_only = "--config.data.* fields only, to point at other data, e.g. another glue_dir"
    evaluate_overrides = (f"{data_only}; with --lengths, a RoPE run's length rule only (no parameter changes), "
                          "e.g. --config.model.position.rope.scaling=yarn --config.model.position.rope.factor=4 "
                          "(docs/mechanisms.md)")
    parser = add_command(
        subparsers, "finetune", "fine-tune a jaxpos run or a Hugging Face BERT-family folder on a classification or "
        "regression task; resumes from the workdir's latest checkpoint", overrides=overrides,
        notes=RUN_NOTES)
    parser.add_argument("--config", required=True, help="config file, e.g. configs/finetune/glue.py")
    parser.add_argument("--init", required=True, help="a `jaxpos train` masked-LM workdir or a local Hugging Face "
                                                      "BERT, ALBERT, DeBERTa or ModernBERT folder")
    parser.add_argument("--workdir", required=True, help="checkpoints, TensorBoard events, evals.json, report.json")
    parser.set_defaults(run=_finetune)

    parser = add_command(subparsers, "evaluate", "scores of a fine-tuned run's latest checkpoint on a split; with "
                         "--lengths, masked-LM runs' held-out loss and accuracy at several lengths; with "
                         "--word-order, masked-LM runs' preference for word-order pairs as they are",
                         overrides=evaluate_overrides)
    parser.add_argument("--workdir", action="append", default=[],
                        help="the workdir of a `jaxpos finetune` run; with --lengths or --word-order, of a `jaxpos "
                             "train` masked-LM run (repeat for several in one table)")
    parser.add_argument("--hf", action="append", default=[], metavar="FOLDER",
                        help="with --lengths: a local Hugging Face masked-LM folder (BERT, ALBERT, DeBERTa, "
                             "ModernBERT; its tokenizer.json, vocab.txt or spiece.model), scored on the embedded "
                             "corpus's held-out text (repeat for several)")
    parser.add_argument("--train-length", type=int, metavar="N",
                        help="with --hf: the length the folders' models trained at, the 1x of the loss by position "
                             "(default: each one's max_position_embeddings)")
    parser.add_argument("--split", help="a labelled split (default: the task's first dev split)")
    parser.add_argument("--lengths", help="comma-separated lengths, e.g. 128,256,512,1024: each run's held-out "
                                          "loss at each (rows of contiguous held-out text; docs/analysis.md)")
    parser.add_argument("--figure", help="with --lengths: the PNG of loss against length (default: "
                                         "FIRST_WORKDIR/lengths.png)")
    parser.add_argument("--max-tokens", type=int, default=0,
                        help="with --lengths: score the first N tokens of the held-out text at every length "
                             "(default: all)")
    parser.add_argument("--batch-size", type=int,
                        help="rows a batch: with --lengths (default 8) or --word-order (default 256)")
    parser.add_argument("--word-order", type=int, metavar="N",
                        help="masked-LM runs without fine-tuning: the share of N word-order pairs (a dev verse as it "
                             "is and with two distant words swapped) each prefers as it is (docs/analysis.md)")
    parser.set_defaults(run=_evaluate)

    parser = add_command(
        subparsers, "finetune-sweep", "the papers' protocol: seeds x learning rates per model and task; the median "
        "over seeds of each run's maximum dev score over checkpoints", overrides=overrides)
    parser.add_argument("--config", required=True, help="config file, e.g. configs/finetune/glue.py")
    parser.add_argument("--init", required=True, action="append",
                        help="NAME=PATH (or PATH, named by its folder) of a pretrained model; repeat for several")
    parser.add_argument("--tasks", required=True, help="comma-separated tasks, e.g. mrpc,rte,stsb")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds (default 0,1,2,3,4)")
    parser.add_argument("--learning-rates", default="2e-5,3e-5,5e-5", help="comma-separated (default 2e-5,3e-5,5e-5)")
    parser.add_argument("--out", required=True, help="one workdir per run under OUT/MODEL/TASK/, tables beside them")
    parser.set_defaults(run=_sweep)

    parser = add_command(
        subparsers, "probe-word-order", "accuracy of a fine-tuned run on local-swap (x=2..5) and global-swap "
        "variants of the first sentence, and the drop from the original (Chen et al. Table 3); for tasks whose "
        "labels do not depend on word order (MRPC, RTE, SNLI, ...)", overrides=data_only)
    parser.add_argument("--workdir", required=True, help="the workdir of a `jaxpos finetune` classification run")
    parser.add_argument("--split", help="a labelled split (default: the task's first dev split)")
    parser.add_argument("--windows", default="2,3,4,5", help="local-swap windows (default 2,3,4,5)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random swaps")
    parser.set_defaults(run=_probe)


def _finetune(args, overrides):
    # lazy: ml_collections, etils (0.2 s): `jaxpos --help` does not need them
    from jaxpos.config.files import apply_overrides, load_config
    from jaxpos.workflows.finetune import finetune  # lazy: loads jax (~2 s), which `jaxpos --help` does not need

    config = apply_overrides(load_config(args.config), overrides)
    if config.get("task") != "finetune":
        raise ValueError(f"{args.config} is a {config.get('task')!r} config; `jaxpos finetune` takes a fine-tuning "
                         "config such as configs/finetune/glue.py")
    return finetune(config, args.init, args.workdir)


def _data_overrides(overrides, command: str) -> list[str]:
    """Only data fields may change after training (where the data lives, batch size of evaluation)."""
    bad = [o for o in overrides if not o.startswith("--config.data.")]
    if bad:
        raise ValueError(f"`jaxpos {command}` takes --config.data.* overrides only (got {' '.join(bad)})")
    return list(overrides)


def _evaluate(args, overrides):
    if args.lengths and args.word_order is not None:
        raise ValueError("--lengths or --word-order, not both")
    if args.lengths:
        return _evaluate_lengths(args, overrides)
    if args.hf or args.train_length is not None:
        raise ValueError("--hf and --train-length go with --lengths")
    if not args.workdir:
        raise ValueError("give --workdir (with --lengths, --workdir or --hf)")
    if args.word_order is not None:
        return _evaluate_word_order(args, overrides)
    if len(args.workdir) > 1 or args.figure:
        raise ValueError("one --workdir of a fine-tuned run (several, and --figure, go with --lengths)")
    # lazy: loads jax (~2 s), which `jaxpos --help` does not need
    from jaxpos.workflows.finetune import chance_note, evaluate, format_scores

    done = evaluate(args.workdir[0], args.split, _data_overrides(overrides, "evaluate"))
    print(f"{done.task} {done.split} ({done.examples} examples, step {done.step}): {format_scores(done.scores)}"
          f"{chance_note(done.chance, done.main_metric)}")
    return done.as_dict()


def _evaluate_lengths(args, overrides):
    if args.split or any(o.lstrip("-").startswith("config.data.") for o in overrides):
        raise ValueError("--lengths reads each run's own held-out text: no --split or --config.data overrides")
    batch_size = 8 if args.batch_size is None else args.batch_size
    if batch_size < 1 or args.max_tokens < 0:
        raise ValueError("--batch-size must be at least 1 and --max-tokens at least 0")
    from jaxpos.workflows.lengths import length_generalisation, lengths_table  # lazy: loads jax

    results = length_generalisation(args.workdir, _numbers(args.lengths, int, "--lengths"), args.figure,
                                    batch_size, args.max_tokens, overrides, args.hf, args.train_length)
    first = next(iter(results.values()))
    print(lengths_table(results) + f"wrote {first['figure']} and each model's {first['file']}")
    return results


def _evaluate_word_order(args, overrides):
    if overrides or args.split or args.figure or args.max_tokens:
        raise ValueError("--word-order scores the word-order task's dev pairs: no --split, --figure, --max-tokens "
                         "or --config overrides")
    batch_size = 256 if args.batch_size is None else args.batch_size
    if batch_size < 1:
        raise ValueError("--batch-size must be at least 1")
    from jaxpos.workflows.word_order import WORD_ORDER_FILE, word_order_preference, word_order_table  # lazy: jax

    results = word_order_preference(args.workdir, args.word_order, batch_size)
    print(word_order_table(results) + f"wrote each run's {WORD_ORDER_FILE}")
    return results


def _numbers(text: str, kind, flag: str) -> list:
    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise ValueError(f"{flag} {text!r}: not a comma-separated list of numbers") from err


def _sweep(args, overrides):
    from jaxpos.evaluation.protocol import markdown  # lazy: numpy, scipy (0.2 s), which `jaxpos --help` does not need
    from jaxpos.workflows.sweep import sweep  # lazy: loads jax (~2 s), which `jaxpos --help` does not need

    inits = {}
    for item in args.init:
        name, sep, path = item.partition("=")
        if not sep:
            name, path = os.path.basename(os.path.normpath(item)), item
        inits[name] = path
    rows = sweep(args.config, inits, [t.strip() for t in args.tasks.split(",") if t.strip()],
                 _numbers(args.seeds, int, "--seeds"), _numbers(args.learning_rates, float, "--learning-rates"),
                 args.out, overrides)
    print(markdown(rows) + f"wrote {os.path.join(args.out, 'sweep.md')} and sweep.json/.md per model and task")
    return rows


def _probe(args, overrides):
    from jaxpos.evaluation.probes import markdown  # lazy: loads jax (~1.3 s), which `jaxpos --help` does not need
    # lazy: loads jax (~3 s), which `jaxpos --help` does not need
    from jaxpos.workflows.probes import PROBE_FILE, probe_word_order

    result = probe_word_order(args.workdir, args.split, _numbers(args.windows, int, "--windows"), args.seed,
                              _data_overrides(overrides, "probe-word-order"))
    print(f"word-order probe: {result['task']} {result['split']}, {result['examples']} examples, step "
          f"{result['step']}, position {result['position']}\n{markdown(result)}wrote "
          f"{os.path.join(args.workdir, PROBE_FILE)}.json")
    return result
