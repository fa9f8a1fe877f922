"""`jaxpos analyze`: the papers' diagnostics of a trained jaxpos run or a Hugging Face BERT/ALBERT folder."""

from __future__ import annotations

import os

from jaxpos.cli.common import add_command


def add_analyze_parser(subparsers) -> None:
    """Registers the `analyze` subcommand on an argparse subparsers object."""
    parser = add_command(
        subparsers, "analyze", "diagnostics of a trained model (Toeplitzness, F-hat_P, locality/symmetry, ranks, "
                        "Muppet decomposition, effective attention, identifiability, attribution)", description=__doc__)
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
    parser.set_defaults(run=_analyze)


def _analyze(args, overrides):
    from jaxpos.workflows.analyze import analyze_model  # lazy: loads jax (~3 s), which `jaxpos --help` does not need

    lengths = tuple(int(n) for n in args.lengths.split(",") if n.strip()) if args.lengths else None
    only = [n.strip() for n in args.only.split(",")] if args.only else None
    done = analyze_model(args.workdir, args.hf, args.out, text=args.text, quick=args.quick,
                         max_sentences=args.max_sentences, probe_words=args.probe_words,
                         probe_length=args.probe_length, lengths=lengths, only=only, checkpoints=args.checkpoints)
    if done.steps is not None:
        print(over_training_summary(done.report))
        print(f"wrote {os.path.join(done.out, 'over_training.json')} and step_<N>/ for steps "
              f"{', '.join(map(str, done.steps))}")
    else:
        print(summary(done.report))
        print(f"wrote {os.path.join(done.out, 'report.json')}")
    return done


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
