"""OUT/REPRODUCTION.md, its figures (OUT/figures/*.png) and OUT/numbers.json from the runs' result.json files."""

from __future__ import annotations

import json
import os
import time

import numpy as np

from jaxpos.analysis.report import _jsonable  # numpy -> JSON, NaN -> null
from jaxpos.reproduction import claims as C
from jaxpos.reproduction.runs import RUN_MECHANISMS, load_plan, profile_of, read_result

REPORT_FILE, NUMBERS_FILE, FIGURES = "REPRODUCTION.md", "numbers.json", "figures"
# Per-mechanism numbers of the mechanisms table: (key, column title, getter).
COLUMNS = (
    ("positional_parameters", "positional params", C.field("params.positional")),
    ("step_time_ms", "step time (ms)", lambda r: None if r["pretrain"]["step_time_s"] is None
     else 1000 * r["pretrain"]["step_time_s"]),
    ("mlm_eval_loss", "MLM eval loss", C.field("pretrain.eval_loss")),
    ("word_order_accuracy", "word-order dev acc. (max over evals)", C.accuracy),
    ("locality", "locality", C.field("over_training.series.locality.-1")),
    ("symmetry", "symmetry", C.field("over_training.series.symmetry.-1")),
    ("logit_rank_max", "largest logit rank", C.field("final.rank.logit_rank_max")),
)


def results_table(out: str, plan: dict) -> dict:
    """{mechanism: [result of each finished seed, by seed]} for the plan's runs."""
    table: dict[str, list] = {}
    for name, spec in plan["runs"].items():
        result = read_result(out, name)
        if result is not None:
            table.setdefault(spec["mechanism"], []).append(result)
    return {m: sorted(runs, key=lambda r: r["seed"]) for m, runs in table.items()}


def mechanism_numbers(table: dict) -> dict:
    """{mechanism: {column key: stats over seeds}}."""
    return {m: {key: C.stats(C.per_seed(table, m, get)) for key, _, get in COLUMNS} for m in table}


def _cell(s: dict, digits: int = 3) -> str:
    if s["n"] == 0:
        return "–"
    if s["std"] is None or s["std"] == 0:
        return f"{s['mean']:.{digits}g}"
    return f"{s['mean']:.{digits}g} ± {s['std']:.2g}"


def _mark(value: str) -> str:
    return {"holds": "**holds**", "contradicted": "**contradicted**", "inconclusive": "inconclusive"}[value]


def markdown_table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return "\n".join(lines) + "\n"


def summary_table(claims: list[dict]) -> str:
    """The verdict of every claim, one row each (what the README quotes)."""
    rows = [["paper", "claim", "source", "verdict"]]
    rows += [[c["paper"], c["claim"], c["reference"], _mark(c["verdict"])] for c in claims]
    return markdown_table(rows)


def mechanisms_table(numbers: dict) -> str:
    rows = [["mechanism", "seeds"] + [title for _, title, _ in COLUMNS]]
    for m in (m for m in RUN_MECHANISMS if m in numbers):
        n = max(s["n"] for s in numbers[m].values())
        rows.append([f"{RUN_MECHANISMS[m].label} (`{m}`)", str(n)]
                    + [_cell(numbers[m][key], 4 if key == "word_order_accuracy" else 3) for key, _, _ in COLUMNS])
    return markdown_table(rows)


# --- figures -----------------------------------------------------------------------------------------------------

def _bars(ax, names, values, title, ylabel, line=None, line_label=""):
    means = [np.nan if v["n"] == 0 else v["mean"] for v in values]
    errors = [0 if not v["std"] else v["std"] for v in values]
    ax.bar(np.arange(len(names)), means, yerr=errors, capsize=2, color="#4c72b0")
    if line is not None:
        ax.axhline(line, color="red", ls="--", lw=1, label=line_label)
        ax.legend(fontsize=7)
    ax.set_xticks(np.arange(len(names)))
    ax.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=8)


def figures(out: str, table: dict, numbers: dict) -> dict:
    """Writes OUT/figures/*.png; returns {name: relative path}."""
    import matplotlib.pyplot as plt

    from jaxpos.analysis.plots import _save

    folder = os.path.join(out, FIGURES)
    os.makedirs(folder, exist_ok=True)
    names = [m for m in RUN_MECHANISMS if m in table]
    paths = {}

    chance = C.stats([r["finetune"]["chance"] for runs in table.values() for r in runs])["mean"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    _bars(axes[0], names, [numbers[m]["word_order_accuracy"] for m in names], "word-order task (max over evals)",
          "dev accuracy", chance, "chance (majority class)")
    _bars(axes[1], names, [numbers[m]["mlm_eval_loss"] for m in names], "masked-LM held-out loss", "loss")
    _bars(axes[2], names, [numbers[m]["step_time_ms"] for m in names], "pretraining step time", "ms / step")
    paths["mechanisms"] = _save(fig, os.path.join(folder, "mechanisms.png"))

    fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
    for ax, series, title in zip(axes, ("toeplitz_r2", "locality", "symmetry"),
                                 ("Toeplitz $R^2$ of $E_P E_P^T$", "identical-word locality (learned)",
                                  "identical-word symmetry (learned)")):
        for m in (names if series == "toeplitz_r2" else [m for m in names if RUN_MECHANISMS[m].learned]):
            curves = [r["over_training"]["series"][series] for r in table[m]]
            if not curves or any(v is None for c in curves for v in c):
                continue
            steps = table[m][0]["over_training"]["steps"]
            mean, std = np.mean(curves, axis=0), np.std(curves, axis=0)
            ax.plot(steps, mean, marker=".", lw=1, label=m)
            ax.fill_between(steps, mean - std, mean + std, alpha=0.15)
        ax.set_xlabel("pretraining step")
        ax.set_title(title + " (mean ± std over seeds)", fontsize=9)
        if ax.lines:
            ax.legend(fontsize=6, ncol=2)
    paths["over_training"] = _save(fig, os.path.join(folder, "over_training.png"))

    fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
    absolute = table.get("absolute", [])
    importance = [r["final"]["decomposition"]["importance"] for r in absolute if r["final"]["decomposition"]]
    if importance:
        mean = np.mean(importance, axis=0)
        for k, term in enumerate(("i (input)", "h (attention)", "f (feed-forward)", "c (biases)")):
            axes[0].plot(np.arange(len(mean)), mean[:, k], marker="o", label=term)
        axes[0].set_xticks(np.arange(len(mean)))
        axes[0].set_xlabel("layer (0 = embeddings)")
        axes[0].legend(fontsize=7)
    axes[0].set_title("Muppet importance μ, absolute (mean over seeds)", fontsize=9)
    effective = [r["final"]["effective_attention"] for r in absolute if r["final"]["effective_attention"]]
    if effective:
        lengths = effective[0]["lengths"]
        curves = np.asarray([e["correlation"] for e in effective], float)
        axes[1].errorbar(lengths, curves.mean(0), yerr=curves.std(0), marker="o", capsize=2)
        axes[1].axvline(absolute[0]["head_dim"], color="red", ls="--", lw=1, label=f"D = {absolute[0]['head_dim']}")
        axes[1].set_xlabel("sequence length T")
        axes[1].legend(fontsize=7)
    axes[1].set_title("raw vs effective attention, Pearson r (absolute)", fontsize=9)
    rates = [r["final"]["identifiability"]["rates"]["linear"] for r in absolute if r["final"]["identifiability"]]
    if rates:
        rates = np.asarray(rates, float)
        axes[2].errorbar(np.arange(rates.shape[1]), rates.mean(0), yerr=rates.std(0), marker="o", capsize=2)
        axes[2].set_ylim(0, 1.02)
        axes[2].set_xticks(np.arange(rates.shape[1]))
        axes[2].set_xlabel("layer (0 = embeddings)")
    axes[2].set_title("token identifiability, linear probe (absolute)", fontsize=9)
    paths["muppet_identifiability"] = _save(fig, os.path.join(folder, "muppet_identifiability.png"))

    fig, ax = plt.subplots(figsize=(10, 3.6))
    width = 0.4
    for offset, key, label in ((-width / 2, "local_drop", "local swaps (mean over x = 2..5)"),
                               (width / 2, "global_drop", "global swap")):
        values = [C.stats(C.per_seed(table, m, C.field(f"probe.{key}"))) for m in names]
        ax.bar(np.arange(len(names)) + offset, [v["mean"] if v["n"] else np.nan for v in values], width,
               yerr=[v["std"] or 0 for v in values], capsize=2, label=label)
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xticks(np.arange(len(names)))
    ax.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("drop in masked-token accuracy")
    ax.set_title("word-order probe (masked-LM stand-in for Chen et al. Table 3)", fontsize=9)
    ax.legend(fontsize=7)
    paths["word_order_probe"] = _save(fig, os.path.join(folder, "word_order_probe.png"))
    return {k: os.path.relpath(v, out) for k, v in paths.items()}


FIGURE_OF = dict(tisa_toeplitz="over_training", tisa_parameters="mechanisms", diet_per_head="mechanisms",
                 diet_sharing="mechanisms", diet_segments="mechanisms", diet_step_time="mechanisms",
                 chen_rise="over_training", chen_swaps="word_order_probe", muppet_depth="muppet_identifiability",
                 identifiability_effective="muppet_identifiability", identifiability_tokens="muppet_identifiability")


# --- the report --------------------------------------------------------------------------------------------------

def write_report(out: str, wall_s: float | None = None, command: str = "") -> dict:
    """Writes OUT/REPRODUCTION.md, OUT/figures/ and OUT/numbers.json from the finished runs of OUT/plan.json;
    returns the numbers. Runs that have not finished are listed as missing."""
    plan = load_plan(out)
    if plan is None:
        raise FileNotFoundError(f"{out}/plan.json is missing: nothing to report")
    profile = profile_of(plan)
    table = results_table(out, plan)
    if not table:
        raise ValueError(f"no run in {out}/runs has finished: nothing to report")
    missing = [n for n in plan["runs"] if read_result(out, n) is None]
    numbers = mechanism_numbers(table)
    claims = C.evaluate_claims(table)
    paths = figures(out, table, numbers)
    any_run = next(iter(table.values()))[0]
    machine = plan["machine"]
    hardware = (", ".join(machine["gpus"]) if machine.get("gpus") else f"{machine['cores']} CPU cores") + \
        f" ({machine['cpu']}), jax {machine.get('jax', '?')}"
    run_wall = [r["timing"]["wall_s"] for runs in table.values() for r in runs]
    if wall_s is None:  # written apart from the runs (launch/reproduce.sh): the time since the plan was made
        wall_s = time.time() - plan["started_unix"]
    lines = [
        "# Reproducing the papers' claims at small scale", "",
        f"Written by `{command or 'jaxpos reproduce'}` on {time.strftime('%Y-%m-%d %H:%M %Z')}.", "",
        f"- profile `{profile.name}`: BERT with d = {any_run['d_model']}, L = {any_run['num_layers']}, head dim "
        f"D = {any_run['head_dim']}, rows of {any_run['seq_len']} tokens from the embedded corpus (CPython's "
        f"documentation: {plan.get('corpus', {}).get('documents', '?')} documents, "
        f"{plan.get('corpus', {}).get('tokens', 0):,} tokens, a small corpus)",
        f"- {len(table)} mechanisms × {plan['seeds']} seed(s); every run pretrains {any_run['steps']} steps of "
        f"{any_run['tokens'] // any_run['steps'] // any_run['seq_len']} rows × {any_run['seq_len']} tokens (the "
        "same data, recipe and token budget for every mechanism), fine-tunes "
        f"{plan['finetune_steps']} steps on the offline word-order task and is analysed at "
        f"{len(any_run['over_training']['steps'])} checkpoints",
        f"- budget {plan['budget_minutes']:g} min" + (f", {plan['budget_note']}" if plan.get("budget_note") else "")
        + (f"; wall time {wall_s / 60:.1f} min" if wall_s else "")
        + f"; a run took {np.mean(run_wall):.0f} s on average",
        f"- machine: {hardware}, {plan['workers']} runs at a time"
        + (f"; XLA_FLAGS={profile.xla_flags} (compiling dominates runs this short)" if profile.xla_flags else ""),
        ""]
    if missing:
        lines += [f"**Missing runs** (not finished, left out below): {', '.join(missing)}", ""]
    lines += [
        "> **Scale.** These are tiny models trained for minutes on a small corpus. A verdict here is evidence about "
        "the mechanism at this scale, not a replacement for the papers' runs.", "",
        "**Verdicts.** A comparison needs two or more seeds and is decided only when the groups' mean ± standard "
        "deviation over seeds do not overlap (or a per-seed difference's mean ± std excludes 0); otherwise it is "
        "*inconclusive*, whatever the sign of the difference. A bound every run must satisfy (exactness, a rank "
        "bound) is checked run by run. A claim of several parts holds when all parts hold and is contradicted when "
        "any part is.", "",
        "## Summary", "", summary_table(claims),
        "## Mechanisms", "",
        "Mean ± standard deviation over seeds. Positional parameters: the positional module's own (input position "
        "tables, biases, kernels). Locality, symmetry: identical-word attention at the last checkpoint. Largest "
        "logit rank: over layers, heads and held-out windows of T = "
        f"{C._get(any_run, 'final.rank.length')} tokens (D = {any_run['head_dim']}).", "",
        mechanisms_table(numbers), f"![mechanisms]({paths['mechanisms']})", ""]
    for paper in C.PAPERS:
        lines += [f"## {paper}", ""]
        for c in (c for c in claims if c["paper"] == paper):
            lines += [f"### {c['claim']}", "", f"*{c['paper']}, {c['reference']}.* Verdict: {_mark(c['verdict'])}.",
                      ""]
            lines += [f"- {p['what']}: {_mark(p['verdict'])}. {p['reason']}." for p in c["parts"]]
            lines.append("")
            if c.get("caveat"):
                lines += [f"Caveat: {c['caveat']}", ""]
            if c["id"] in FIGURE_OF:
                lines += [f"![{c['id']}]({paths[FIGURE_OF[c['id']]]})", ""]
    lines += ["## Files", "",
              f"`{NUMBERS_FILE}` holds every number (each run's result, the per-mechanism statistics, every claim's "
              "measurements and verdict); `runs/NAME/` each run's workdirs, logs and per-checkpoint analyses.", ""]
    with open(os.path.join(out, REPORT_FILE), "w") as f:
        f.write("\n".join(lines))
    result = dict(
        plan=plan, wall_s=wall_s, missing=missing, figures=paths,
        mechanisms=numbers, claims=claims, runs={r["name"]: r for runs in table.values() for r in runs})
    with open(os.path.join(out, NUMBERS_FILE), "w") as f:
        json.dump(_jsonable(result), f, indent=1, allow_nan=False)
    return result

