"""`jaxpos analyze`: the papers' diagnostics of a trained jaxpos run or a Hugging Face BERT/ALBERT folder."""

from __future__ import annotations

import os

from jaxpos.cli.common import add_command


def add_analyze_parser(subparsers) -> None:
    """Registers the `analyze` subcommand on an argparse subparsers object."""
    parser = add_command(
        subparsers, "analyze", "diagnostics of a trained model (Toeplitzness, F-hat_P, locality/symmetry, ranks, "
                        "Muppet decomposition, effective attention, identifiability, attribution, attention sinks)", description=__doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--workdir", help="a `jaxpos train` masked-LM workdir (config.json, checkpoints/, tokenizer)")
    source.add_argument("--hf", metavar="PATH", help="a local Hugging Face BERT, ALBERT, DeBERTa or "
                                                     "ModernBERT folder (config.json, "
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
    """A few lines with the headline numbers of a report; the per-layer ones in one table over the hidden states,
    numbered as the figures number them (the embedding output, then layer 1 = the first)."""
    from jaxpos.analysis.plots import hidden_state_label, layer_number  # lazy: matplotlib, not needed by --help

    lines = []

    def get(name, key):
        section = report.get(name, {})
        return None if "skipped" in section else section.get(key)

    def fmt(values, digits=2):
        return " ".join(f"{v:.{digits}f}" if v is not None else "nan" for v in values)

    if get("position_gram", "toeplitz_r2") is not None:
        lines.append(f"  Toeplitz R^2 of E_P E_P^T: {get('position_gram', 'toeplitz_r2'):.3f}")
    if get("positional_profile", "fit_r2") is not None:
        layer = layer_number(get("positional_profile", "layer") or 0)
        lines.append(f"  F-hat_P (layer {layer}): TISA fit r^2 per head {fmt(get('positional_profile', 'fit_r2'))}")
    if get("identical_word", "locality") is not None:
        lines.append(f"  identical words (all layers): locality {get('identical_word', 'locality'):.3f}, symmetry "
                     f"{get('identical_word', 'symmetry'):.3f}")
    if get("rank", "logit_rank_mean") is not None:
        lines.append(f"  attention logit rank (T={get('rank', 'length')}, D={get('rank', 'head_dim')}): mean "
                     f"{get('rank', 'logit_rank_mean'):.1f}, max {get('rank', 'logit_rank_max')} "
                     f"(tolerance {get('rank', 'rtol'):.3g} x the largest singular value)")
    if get("decomposition", "importance") is not None:
        importance = get("decomposition", "importance")  # [L+1, 4]: the embedding output first
        lines.append(f"  Muppet importance at layer {hidden_state_label(len(importance) - 1)} (the last; i h f c): "
                     f"{fmt(importance[-1])}")
    if get("effective_attention", "correlation") is not None:
        pairs = zip(get("effective_attention", "lengths"), get("effective_attention", "correlation"))
        lines.append("  raw vs effective attention r: " + ", ".join(f"T={n}: {r:.3f}" for n, r in pairs))
    if get("effective_attention", "rank_summary"):
        lines.append("  effective attention: " + get("effective_attention", "rank_summary"))
    rows = {f"identifiability ({kind})": dict(enumerate(values))
            for kind, values in (get("identifiability", "rates") or {}).items()}
    if get("attribution", "self_share") is not None:
        own = get("attribution", "self_share")
        states = get("attribution", "layers") or range(1, len(own) + 1)  # hidden-state indices: layer 1 is 1
        rows["own-token contribution"] = dict(zip(states, own))
    if get("sinks", "mean") is not None:
        mean = get("sinks", "mean")
        shares = ", ".join(f"{label} {mean[key]:.3f}" for key, label in
                           (("first", "first token"), ("sep", "[SEP]"), ("top", "most-attended key"),
                            ("learned", "learned sink")) if mean.get(key) is not None)
        lines.append(f"  attention drawn (mean over layers and heads): {shares}; uniform {mean['uniform']:.3f}")
    lines.extend(per_layer_table(rows))
    for name, why in report.get("skipped", {}).items():
        lines.append(f"  skipped {name}: {why}")
    return "\n".join(lines)


def per_layer_table(rows: dict[str, dict[int, float]]) -> list[str]:
    """Lines of a table of `rows` {label: {hidden-state index: value}}, a column per hidden state that has a value:
    0 is the embedding output ("embeddings"), i the output of layer i; "-" where a row has no value, "nan" where
    it is None (a NaN in report.json)."""
    from jaxpos.analysis.plots import LAYER_AXIS_LABEL, hidden_state_label  # lazy: matplotlib, for a summary only

    states = sorted({state for values in rows.values() for state in values})
    if not states:
        return []
    width = max(len(LAYER_AXIS_LABEL), *(len(label) for label in rows))
    heads = [hidden_state_label(state) for state in states]
    widths = [max(len(head), 4) for head in heads]
    lines = [f"  {LAYER_AXIS_LABEL:<{width}}" + "".join(f"  {head:>{w}}" for head, w in zip(heads, widths))]
    for label, values in rows.items():
        cells = ["-" if state not in values else "nan" if values[state] is None else f"{values[state]:.2f}"
                 for state in states]
        lines.append(f"  {label:<{width}}" + "".join(f"  {cell:>{w}}" for cell, w in zip(cells, widths)))
    return lines
