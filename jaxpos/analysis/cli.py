"""`jaxpos analyze`: the papers' diagnostics of a trained jaxpos run or a Hugging Face BERT/ALBERT folder."""

from __future__ import annotations

import os

QUICK = dict(num_probe_words=12, probe_length=32, max_sentences=60, lengths=(8, 16, 32), windows=2,
             probe_epochs=15, probe_patience=5, probe_learning_rate=3e-3, decomposition_sentences=8,
             attribution_windows=1, attribution_length=16)


def add_analyze_parser(subparsers) -> None:
    """Registers the `analyze` subcommand on an argparse subparsers object."""
    parser = subparsers.add_parser(
        "analyze", help="diagnostics of a trained model (Toeplitzness, F-hat_P, locality/symmetry, ranks, "
                        "Muppet decomposition, effective attention, identifiability, attribution)",
        description=__doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--workdir", help="a `jaxpos train` masked-LM workdir (config.json, checkpoints/, tokenizer)")
    source.add_argument("--hf", metavar="PATH", help="a local Hugging Face BERT/ALBERT folder (config.json, "
                                                     "model.safetensors or pytorch_model.bin, vocab.txt)")
    parser.add_argument("--out", help="output folder (default: WORKDIR/analysis, or ./analysis_<name> for --hf)")
    parser.add_argument("--text", help="a UTF-8 text file to take sentences from (default: the embedded corpus, "
                                       "held-out documents first)")
    parser.add_argument("--max-sentences", type=int, help="sentences to analyse (default 400; --quick 60)")
    parser.add_argument("--probe-words", type=int, help="identical-word probing: words (default 100; --quick 12)")
    parser.add_argument("--probe-length", type=int, help="identical-word probing: length (default 128; --quick 32)")
    parser.add_argument("--lengths", help="effective attention: comma-separated sequence lengths "
                                          "(default 16,32,64,128; --quick 8,16,32)")
    parser.add_argument("--only", help="comma-separated subset of the diagnostics")
    parser.add_argument("--checkpoints", metavar="all|STEPS",
                        help="with --workdir: analyse every saved checkpoint ('all') or these comma-separated "
                             "steps, each into OUT/step_<N>/, and draw the diagnostics against the step "
                             "(OUT/over_training.json and .png)")
    parser.add_argument("--quick", action="store_true",
                        help="small budgets everywhere (few words, short lengths, probes of a few epochs): "
                             "a minute on a CPU for a small model")
    parser.set_defaults(run=run_analyze)


def analysis_texts(path: str | None) -> list[str]:
    """Documents to draw sentences from: a text file's blank-line blocks, or the embedded corpus with the
    documents a run holds out (never trained on) first."""
    from jaxpos.data.corpus import embedded_documents, is_eval_document, split_blocks

    if path:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"--text {path!r} does not exist")
        with open(path, encoding="utf-8", errors="replace") as f:
            return [b for b in split_blocks(f.read()) if b]
    documents = embedded_documents()
    held_out = [d for i, d in enumerate(documents) if is_eval_document(i, 0.05)]
    return held_out + [d for i, d in enumerate(documents) if not is_eval_document(i, 0.05)]


def run_analyze(args, overrides=()) -> dict:
    from jaxpos.analysis.loading import load_hf, load_run
    from jaxpos.analysis.report import analyze, corpus_sentences

    if overrides:
        raise ValueError(f"`jaxpos analyze` takes no --config overrides (got {' '.join(overrides)}); the model's "
                         "own config is used")
    if args.checkpoints and not args.workdir:
        raise ValueError("--checkpoints needs --workdir (a Hugging Face folder has one set of weights)")
    model = load_run(args.workdir) if args.workdir else load_hf(args.hf)
    out = args.out or (os.path.join(args.workdir, "analysis") if args.workdir else f"analysis_{model.name}")
    settings = dict(QUICK) if args.quick else {}
    for key, value in (("num_probe_words", args.probe_words), ("probe_length", args.probe_length),
                       ("max_sentences", args.max_sentences)):
        if value is not None:
            settings[key] = value
    if args.lengths:
        settings["lengths"] = tuple(int(n) for n in args.lengths.split(",") if n.strip())
    max_sentences = settings.pop("max_sentences", 400)
    sentences = []
    if model.tokenize is not None:
        sentences = corpus_sentences(model, analysis_texts(args.text), max_sentences)
    else:
        print(f"{model.source} has no vocabulary file: the sentence-level diagnostics will be skipped")
    print(f"jaxpos analyze: {model.name} ({model.cfg.position.kind}, L={model.cfg.num_layers}, "
          f"H={model.cfg.num_heads}, d={model.cfg.d_model}), {len(sentences)} sentences -> {out}", flush=True)
    only = [n.strip() for n in args.only.split(",")] if args.only else None
    if args.checkpoints:
        from jaxpos.analysis.over_training import analyze_over_training, select_steps
        from jaxpos.run import Run

        steps = select_steps(args.checkpoints, Run.open(args.workdir, "mlm").steps())
        result = analyze_over_training(model, out, sentences=sentences, steps=steps, only=only, **settings)
        print(over_training_summary(result))
        print(f"wrote {os.path.join(out, 'over_training.json')} and step_<N>/ for steps "
              f"{', '.join(map(str, steps))}")
        return result
    report = analyze(model, out, sentences=sentences, only=only, **settings)
    print(summary(report))
    print(f"wrote {os.path.join(out, 'report.json')}")
    return report


def over_training_summary(result: dict) -> str:
    """One line per step with the headline numbers drawn against it."""
    def fmt(value, digits=3):
        return "-" if value is None else f"{value:.{digits}f}"

    lines = ["  step  Toeplitz R^2(P)  locality  symmetry  logit rank  Muppet i h f c (last layer)"]
    for index, step in enumerate(result["steps"]):
        values = {name: series[index] for name, series in result["series"].items()}
        muppet = values["importance_last"]
        lines.append(f"  {step:>4}  {fmt(values['toeplitz_r2']):>15}  {fmt(values['locality']):>8}  "
                     f"{fmt(values['symmetry']):>8}  {fmt(values['logit_rank_mean'], 1):>10}  "
                     + (" ".join(f"{v:.2f}" for v in muppet) if muppet else "-"))
    return "\n".join(lines)


def summary(report: dict) -> str:
    """A few lines with the headline numbers of a report."""
    lines = []

    def get(name, key):
        section = report.get(name, {})
        return None if "skipped" in section else section.get(key)

    def fmt(values, digits=2):
        return " ".join(f"{v:.{digits}f}" if v is not None else "nan" for v in values)

    if get("position_gram", "toeplitz_r2") is not None:
        lines.append(f"  Toeplitz R^2 of E_P E_P^T: {get('position_gram', 'toeplitz_r2'):.3f}")
    if get("positional_profile", "fit_r2") is not None:
        lines.append(f"  F-hat_P: TISA fit r^2 per head {fmt(get('positional_profile', 'fit_r2'))}")
    if get("identical_word", "locality") is not None:
        lines.append(f"  identical words: locality {get('identical_word', 'locality'):.3f}, symmetry "
                     f"{get('identical_word', 'symmetry'):.3f}")
    if get("rank", "logit_rank_mean") is not None:
        lines.append(f"  attention logit rank (T={get('rank', 'length')}, D={get('rank', 'head_dim')}): mean "
                     f"{get('rank', 'logit_rank_mean'):.1f}, max {get('rank', 'logit_rank_max')} "
                     f"(tolerance {get('rank', 'rtol'):.3g} x the largest singular value)")
    if get("decomposition", "importance") is not None:
        last = get("decomposition", "importance")[-1]
        lines.append(f"  Muppet importance at the last layer (i h f c): {fmt(last)}")
    if get("effective_attention", "correlation") is not None:
        pairs = zip(get("effective_attention", "lengths"), get("effective_attention", "correlation"))
        lines.append("  raw vs effective attention r: " + ", ".join(f"T={n}: {r:.3f}" for n, r in pairs))
    if get("effective_attention", "rank_summary"):
        lines.append("  effective attention: " + get("effective_attention", "rank_summary"))
    for kind, values in (get("identifiability", "rates") or {}).items():
        lines.append(f"  identifiability ({kind}) per layer: {fmt(values)}")
    if get("attribution", "self_share") is not None:
        lines.append(f"  own-token contribution per layer: {fmt(get('attribution', 'self_share'))}")
    for name, why in report.get("skipped", {}).items():
        lines.append(f"  skipped {name}: {why}")
    return "\n".join(lines)
