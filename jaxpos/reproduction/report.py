"""OUT/REPRODUCTION.md, its figures (OUT/figures/*.png) and OUT/numbers.json from the runs' result.json files."""

from __future__ import annotations

import json
import os
import time

import numpy as np

from jaxpos.analysis.plots import line_style, plt, save_figure  # plots chooses matplotlib's file-only backend
from jaxpos.analysis.report import jsonable  # numpy -> JSON, NaN -> null
from jaxpos.config.files import write_json_atomically
from jaxpos.reproduction import claims as C, judging as J, readings as R
from jaxpos.reproduction.stats import INCONCLUSIVE
from jaxpos.reproduction import stats as S
from jaxpos.reproduction import verdicts as V
from jaxpos.reproduction.matrix import (BAG_OF_WORDS, RUN_MECHANISMS, profile_of, require_plan, read_result,
                                        resumed_line)

REPORT_FILE, NUMBERS_FILE, FIGURES = "REPRODUCTION.md", "numbers.json", "figures"
# Per-mechanism numbers of the mechanisms table: (key, column title, getter).
COLUMNS = (
    ("positional_parameters", "positional params", R.field("params.positional")),
    ("step_time_ms", "step time (ms)", lambda r: None if r["pretrain"]["step_time_s"] is None
     else 1000 * r["pretrain"]["step_time_s"]),
    ("mlm_eval_loss", "held-out MLM loss", lambda r: r["curve"][-1]["loss"] if r.get("curve") else None),
    ("order_accuracy", "word-order task dev acc. (max over evals and rates)", R.accuracy),
    ("order_zero_shot_accuracy", "word-order dev couples, zero-shot MLM preference",
     R.field("order.zero_shot.accuracy")),
    ("paraphrase_accuracy", "paraphrase dev acc. (max over evals)", R.paraphrase_accuracy),
    ("locality", "locality", R.field("last.headline.locality")),
    ("symmetry", "symmetry", R.field("last.headline.symmetry")),
    ("logit_rank_max", "largest logit rank", R.field("last.rank.logit_rank_max")),
)


def results_table(out: str, plan: dict) -> dict:
    """{mechanism: [result of each finished seed, by seed]} for the plan's runs, each with its mechanism's step
    time alone (pretrain.step_time_alone_s: the timing pass's window of its seed) where OUT has the pass."""
    alone = {}
    if os.path.isfile(os.path.join(out, C.STEP_TIMES_FILE)):
        with open(os.path.join(out, C.STEP_TIMES_FILE)) as f:
            alone = json.load(f)["step_s"]
    table: dict[str, list] = {}
    for name, spec in plan["runs"].items():
        result = read_result(out, name)
        if result is not None:
            windows = alone.get(spec["mechanism"], [])
            if spec["seed"] < len(windows):
                result["pretrain"]["step_time_alone_s"] = windows[spec["seed"]]
            table.setdefault(spec["mechanism"], []).append(result)
    return {m: sorted(runs, key=lambda r: r["seed"]) for m, runs in table.items()}


def mechanism_numbers(table: dict) -> dict:
    """{mechanism: {column key: mean, sd over seeds}}."""
    return {m: {key: R.describe([get(r) for r in table[m]]) for key, _, get in COLUMNS} for m in table}


def curves(table: dict) -> dict:
    """{mechanism: {"steps": [K], "loss": [[seeds] per step]}} of the learning curves."""
    out = {}
    for m, results in table.items():
        steps = sorted({p["step"] for r in results for p in r.get("curve", [])})
        losses = [[next((p["loss"] for p in r.get("curve", []) if p["step"] == s), None) for r in results]
                  for s in steps]
        out[m] = dict(steps=steps, loss=losses)
    return out


def _cell(s: dict, digits: int = 3) -> str:
    if s["n"] == 0:
        return "–"
    if s["sd"] is None or s["sd"] == 0:
        return f"{s['mean']:.{digits}g}"
    return f"{s['mean']:.{digits}g} ± {s['sd']:.2g}"


def _mark(value: str) -> str:
    return {"holds": "**holds**", "contradicted": "**contradicted**", "inconclusive": "inconclusive"}[value]


def _verdict_text(part: dict) -> str:
    """The verdict, and for an inconclusive part why (not trained, a side that did not learn the task, not measured,
    one seed)."""
    if part["verdict"] == INCONCLUSIVE and part.get("why") in (J.NOT_TRAINED, J.NOT_LEARNED, "not measured",
                                                                  "one seed"):
        return f"inconclusive: {part['why']}"
    return _mark(part["verdict"])


def markdown_table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return "\n".join(lines) + "\n"


def summary_table(claims: list[dict]) -> str:
    """The verdict of every claim beside the paper's figure, one row each."""
    rows = [["paper", "claim", "the paper's figure", "verdict"]]
    rows += [[c["paper"], c["claim"], f"{c['figure']['source']}: {c['figure']['value']}", _mark(c["verdict"])]
             for c in claims]
    return markdown_table(rows)


def mechanisms_table(numbers: dict) -> str:
    rows = [["mechanism", "seeds"] + [title for _, title, _ in COLUMNS]]
    for m in (m for m in RUN_MECHANISMS if m in numbers):
        n = max(s["n"] for s in numbers[m].values())
        rows.append([f"{RUN_MECHANISMS[m].label} (`{m}`)", str(n)]
                    + [_cell(numbers[m][key], 4 if key.endswith("_accuracy") else 3) for key, _, _ in COLUMNS])
    return markdown_table(rows)


def curve_table(curve: dict, entropy: float | None) -> str:
    """Held-out MLM loss (mean ± sd over seeds) at each step of the curve, a column per mechanism."""
    names = [m for m in RUN_MECHANISMS if m in curve and curve[m]["steps"]]
    steps = sorted({s for m in names for s in curve[m]["steps"]})
    rows = [["step"] + [f"`{m}`" for m in names]]
    for step in steps:
        row = [str(step)]
        for m in names:
            k = curve[m]["steps"].index(step) if step in curve[m]["steps"] else None
            row.append("–" if k is None else _cell(R.describe(curve[m]["loss"][k])))
        rows.append(row)
    note = f"Unigram entropy of the training corpus (a model that ignores context): {entropy:.3f} nats/token.\n" \
        if entropy else ""
    return markdown_table(rows) + "\n" + note


def training_table(training: dict) -> str:
    rows = [["mechanism", "bag of words − mechanism, last step (95% CI, seeds)", "uses positions",
             "curves part at step"]]
    for m in (m for m in RUN_MECHANISMS if m in training):
        info, diff = training[m], training[m]["difference"]
        said = "–" if diff is None else f"{diff['mean']:+.3g} ({diff['ci_low']:+.3g} to {diff['ci_high']:+.3g}, " \
                                        f"{diff['n']})"
        uses = {True: "yes", False: "**no**", None: "cannot tell"}[info["trained"]]
        parted = str(info["parted_at"]) if info["parted_at"] else f"not by {info['last_step']}"
        rows.append([f"{RUN_MECHANISMS[m].label} (`{m}`)", said, uses, parted if info["trained"] is not None else "–"])
    return markdown_table(rows)


def comparisons_table(claims: list[dict]) -> str:
    """Every comparison of the report: mean difference, 95% CI, p, Holm-adjusted p, verdict, and for an
    undecided one the difference these seeds could detect."""
    rows = [["claim", "comparison", "mean difference (95% CI)", "p", "Holm p", "verdict",
             "detectable difference (80% power)"]]
    for c in claims:
        for p in c["parts"]:
            if p["kind"] != "comparison":
                continue
            test = p.get("test")
            if test:
                interval = (f"{test['mean']:+.3g} ({test['ci_low']:+.3g} to {test['ci_high']:+.3g}"
                            f"{S.clipped_note(test.get('clipped_to'))})")
                rows.append([c["id"], p["what"], interval, f"{test['p']:.2g}", f"{test['p_holm']:.2g}",
                             _verdict_text(p), f"{test['mdd']:.3g}" if p["verdict"] == INCONCLUSIVE else ""])
            else:
                mean = "–" if p.get("measured_mean") is None else f"{p['measured_mean']:+.3g} (not tested)"
                rows.append([c["id"], p["what"], mean, "", "", _verdict_text(p), ""])
    return markdown_table(rows)


# --- figures -----------------------------------------------------------------------------------------------------

def _bars(ax, names, values, title, ylabel, line=None, line_label=""):
    if all(v["n"] == 0 for v in values):  # a stage no run had: say so rather than draw empty axes
        ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes, fontsize=9)
        ax.set_axis_off()
        ax.set_title(title, fontsize=9)
        return
    means = [np.nan if v["n"] == 0 else v["mean"] for v in values]
    errors = [0 if not v["sd"] else v["sd"] for v in values]
    ax.bar(np.arange(len(names)), means, yerr=errors, capsize=2, color="#4c72b0")
    if line is not None:
        ax.axhline(line, color="red", ls="--", lw=1, label=line_label)
        ax.legend(fontsize=7)
    ax.set_xticks(np.arange(len(names)))
    ax.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=8)


def mechanism_style(mechanism: str) -> dict:
    """Its line's style in every figure, one of its own per mechanism: bag of words thick and black, the others a
    colour of ten and a dash pattern of four by their place in the registry (no two alike up to 40)."""
    if mechanism == BAG_OF_WORDS:
        return dict(color="black", lw=2.2, ls="-", label="none (bag of words)")
    index = [m for m in RUN_MECHANISMS if m != BAG_OF_WORDS].index(mechanism)
    return dict(line_style(index), lw=1.2, label=mechanism)


def _learning_curves_figure(path: str, curve: dict, entropy: float | None) -> str:
    fig, ax = plt.subplots(figsize=(10.5, 4.5))
    for m in (m for m in RUN_MECHANISMS if m in curve and curve[m]["steps"]):
        loss = [S.counted(seeds) for seeds in curve[m]["loss"]]
        mean = np.array([np.mean(v) if v else np.nan for v in loss])
        sd = np.array([np.std(v, ddof=1) if len(v) > 1 else 0.0 for v in loss])
        line, = ax.plot(curve[m]["steps"], mean, marker=".", **mechanism_style(m))
        ax.fill_between(curve[m]["steps"], mean - sd, mean + sd, alpha=0.12, color=line.get_color())
    if entropy:
        ax.axhline(entropy, color="grey", ls="--", lw=1, label="unigram entropy")
    ax.set_xlabel("pretraining step")
    ax.set_ylabel("held-out MLM loss (nats/token)")
    ax.set_title("learning curves (mean ± sd over seeds)", fontsize=9)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: the curves stay clear
    return save_figure(fig, path)


def figures(out: str, table: dict, numbers: dict, curve: dict, entropy: float | None) -> dict:
    """Writes OUT/figures/*.png; returns {name: relative path}."""
    folder = os.path.join(out, FIGURES)
    os.makedirs(folder, exist_ok=True)
    names = [m for m in RUN_MECHANISMS if m in table]
    paths = {"learning_curves": _learning_curves_figure(os.path.join(folder, "learning_curves.png"), curve,
                                                        entropy)}

    chance = {task: R.describe([r[task]["chance"] for runs in table.values() for r in runs if r.get(task)])["mean"]
              for task in ("order", "finetune")}
    fig, axes = plt.subplots(1, 5, figsize=(23, 3.8))
    _bars(axes[0], names, [numbers[m]["order_accuracy"] for m in names],
          "word-order pair task (max over evals and rates)", "dev accuracy", chance["order"],
          "chance (bag of words by construction)")
    _bars(axes[1], names, [numbers[m]["order_zero_shot_accuracy"] for m in names],
          "its dev couples without fine-tuning (the MLM prefers the original side)", "share of couples", 0.5,
          "chance (bag of words by construction)")
    _bars(axes[2], names, [numbers[m]["paraphrase_accuracy"] for m in names], "paraphrase task (max over evals)",
          "dev accuracy", chance["finetune"], "chance (majority class)")
    _bars(axes[3], names, [numbers[m]["mlm_eval_loss"] for m in names], "held-out MLM loss, last step", "loss",
          entropy, "unigram entropy")
    _bars(axes[4], names, [numbers[m]["step_time_ms"] for m in names], "pretraining step time", "ms / step")
    paths["mechanisms"] = save_figure(fig, os.path.join(folder, "mechanisms.png"))

    fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
    for ax, series, title in zip(axes, ("toeplitz_r2", "locality", "symmetry"),
                                 ("Toeplitz $R^2$ of $E_P E_P^T$", "identical-word locality (learned)",
                                  "identical-word symmetry (learned)")):
        for m in names:
            runs = [r for r in table[m] if r.get("over_training")]
            series_of = [r["over_training"]["series"][series] for r in runs]
            if not runs or any(v is None for c in series_of for v in c):
                continue
            steps = runs[0]["over_training"]["steps"]
            mean, sd = np.mean(series_of, axis=0), np.std(series_of, axis=0)
            ax.plot(steps, mean, marker=".", lw=1, label=m)
            ax.fill_between(steps, mean - sd, mean + sd, alpha=0.15)
        ax.set_xlabel("pretraining step")
        ax.set_title(title + " (mean ± sd over seeds)", fontsize=9)
        if ax.lines:
            ax.legend(fontsize=6, ncol=2)
    paths["over_training"] = save_figure(fig, os.path.join(folder, "over_training.png"))

    fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
    absolute = table.get("absolute", [])
    importance = [r["last"]["decomposition"]["importance"] for r in absolute
                  if (r.get("last") or {}).get("decomposition")]
    if importance:
        mean = np.mean(importance, axis=0)
        for k, term in enumerate(("i (input)", "h (attention)", "f (feed-forward)", "c (biases)")):
            axes[0].plot(np.arange(len(mean)), mean[:, k], marker="o", label=term)
        axes[0].set_xticks(np.arange(len(mean)))
        axes[0].set_xlabel("layer (0 = embeddings)")
        axes[0].legend(fontsize=7)
    axes[0].set_title("Muppet importance μ, absolute (mean over seeds)", fontsize=9)
    effective = [r["final"]["effective_attention"] for r in absolute
                 if (r.get("final") or {}).get("effective_attention")]
    if effective:
        lengths = effective[0]["lengths"]
        values = np.asarray([e["correlation"] for e in effective], float)
        axes[1].errorbar(lengths, values.mean(0), yerr=values.std(0), marker="o", capsize=2)
        axes[1].axvline(absolute[0]["head_dim"], color="red", ls="--", lw=1, label=f"D = {absolute[0]['head_dim']}")
        axes[1].set_xlabel("sequence length T")
        axes[1].legend(fontsize=7)
    axes[1].set_title("raw vs effective attention, Pearson r (absolute)", fontsize=9)
    rates = [r["final"]["identifiability"]["rates"]["linear"] for r in absolute
             if (r.get("final") or {}).get("identifiability")]
    if rates:
        rates = np.asarray(rates, float)
        axes[2].errorbar(np.arange(rates.shape[1]), rates.mean(0), yerr=rates.std(0), marker="o", capsize=2)
        axes[2].set_ylim(0, 1.02)
        axes[2].set_xticks(np.arange(rates.shape[1]))
        axes[2].set_xlabel("layer (0 = embeddings)")
    axes[2].set_title("token identifiability, linear probe (absolute)", fontsize=9)
    paths["muppet_identifiability"] = save_figure(fig, os.path.join(folder, "muppet_identifiability.png"))

    probed = [m for m in names if any(r.get("probe") for r in table[m])]
    fig, ax = plt.subplots(figsize=(10, 3.6))
    width = 0.27
    for offset, key, text in ((-width, "local_drop", "accuracy drop, local shuffles (mean over x = 2..5)"),
                              (0.0, "paraphrase_share", "share called paraphrase: unswapped paraphrases"),
                              (width, "swapped_paraphrase_share", "share called paraphrase: globally swapped")):
        values = [R.describe([R.value_at(r, f"probe.{key}") for r in table[m]]) for m in probed]
        ax.bar(np.arange(len(probed)) + offset, [v["mean"] if v["n"] else np.nan for v in values], width,
               yerr=[v["sd"] or 0 for v in values], capsize=2, label=text)
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xticks(np.arange(len(probed)))
    ax.set_xticklabels(probed, rotation=60, ha="right", fontsize=7)
    ax.set_title("Chen et al.'s word-order probe on the paraphrase task", fontsize=9)
    ax.legend(fontsize=7)
    paths["word_order_probe"] = save_figure(fig, os.path.join(folder, "word_order_probe.png"))

    factors = R.length_factors(table)
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for m in (m for m in names if any(r.get("lengths") for r in table[m])):
        values = [R.describe(R.by_seed(table, m, R.loss_at(f))) for f in factors]
        ran = [(f, v) for f, v in zip(factors, values) if v["n"]]
        if ran:
            ax.errorbar([f for f, _ in ran], [v["mean"] for _, v in ran], yerr=[v["sd"] or 0 for _, v in ran],
                        marker="o", capsize=2, **mechanism_style(m))
    if factors:
        ax.set_xscale("log", base=2)
        ax.set_xticks(factors, [f"{f}×" for f in factors])
    ax.set_xlabel("length, in multiples of the training length")
    ax.set_ylabel("held-out MLM loss (nats/token)")
    ax.set_title("length generalisation (mean ± sd over seeds; absent: cannot run there)", fontsize=9)
    if ax.lines:
        ax.legend(fontsize=6, ncol=3)
    paths["lengths"] = save_figure(fig, os.path.join(folder, "lengths.png"))
    return {k: os.path.relpath(v, out) for k, v in paths.items()}


FIGURE_OF = dict(tisa_toeplitz="over_training", tisa_inductive="lengths", tisa_parameters="mechanisms",
                 diet_per_head="mechanisms",
                 diet_sharing="mechanisms", diet_segments="mechanisms", diet_step_time="mechanisms",
                 chen_rise="over_training", chen_swaps="word_order_probe", muppet_depth="muppet_identifiability",
                 identifiability_effective="muppet_identifiability", identifiability_tokens="muppet_identifiability")


# --- the report --------------------------------------------------------------------------------------------------

def recipe_lines(plan: dict, table: dict) -> list[str]:
    """The profile's recipe, as the report states it."""
    profile = profile_of(plan)
    run = next(iter(table.values()))[0]
    corpus = plan.get("corpus", {})
    editions = ", ".join(corpus.get("editions", [])) or "?"
    train, ft = profile.train, profile.finetune_train
    order, rates = profile.order_recipe(), profile.order_rates()
    stages = {stage for spec in plan["runs"].values() for stage in spec["stages"]}  # only what some run did
    lines = [
        f"- profile `{profile.name}` ({profile.purpose}); a fixed recipe, the same for every mechanism and seed:",
        f"  - model: BERT with d = {run['d_model']}, L = {run['num_layers']}, head dim D = {run['head_dim']}",
        f"  - pretraining: masked LM on the Bible ({editions}: {corpus.get('documents', '?')} chapters, "
        f"{corpus.get('tokens', 0):,} tokens, held-out chapters by the chapter hash), {profile.steps} steps of "
        f"{train['batch_size']} rows × {profile.data['seq_len']} tokens ({run['tokens']:,} tokens), peak learning "
        f"rate {train['learning_rate']:g}, warmup {train['warmup_fraction']:.0%}, linear decay",
        f"  - learning curve: held-out MLM loss at steps {', '.join(map(str, profile.curve_steps()))} "
        f"({profile.eval_batches} batches each); analyses at steps "
        f"{', '.join(map(str, profile.analysis_steps()))}",
    ]
    if "finetune" in stages:
        lines.append(
            f"  - fine-tuning: the offline Bible paraphrase task (verse pairs of two editions), {ft['num_steps']} "
            f"steps of {ft['batch_size']} pairs at learning rate {ft['learning_rate']:g}, "
            f"{profile.finetune_data['offline_train_examples']} training pairs, dev accuracy at half-way and the end "
            f"(the better one); the word-order probe on {profile.probe_examples} test pairs")
    if "order" in stages:
        said = {"cls": "the pooler on [CLS]", "mean": "the pooler on the mean over the tokens",
                "max": "the pooler on the max over the tokens"}
        # runs from before results named their pooling read [CLS]
        pooled = " or ".join(sorted({said[r["order"].get("pooling", "cls")] for runs in table.values() for r in runs
                                     if r.get("order")}))
        count = profile.order_inputs()["offline_train_examples"]
        pairs = f"of {count:,} training pairs" if count else "of all the training pairs"
        at = (f"at each learning rate of {', '.join(f'{r:g}' for r in rates)}" if len(rates) > 1 else
              f"at learning rate {rates[0]:g}")
        left = sorted({r["order"]["couples_left_out"]["dev"] for runs in table.values() for r in runs
                       if (r.get("order") or {}).get("couples_left_out")})  # runs from before results count them
        left_out = "" if not left else (
            f", the couples whose two members the run's tokenizer splits into different pieces left out (dev: "
            f"{left[0]}{'' if len(left) == 1 else f'–{left[-1]}'} per run)")
        lines.append(
            f"  - the downstream claims' task: the word-order pair task (a verse in two editions, as it is or with "
            f"two distant content words swapped in one side; bag of words at chance by construction{left_out}), "
            f"{order['num_steps']:,} steps of {order['batch_size']} pairs ({pairs}) {at}, {pooled}, the best dev "
            f"accuracy over evaluations{' and rates' if len(rates) > 1 else ''} (the papers' protocol); bag of words "
            f"fine-tuned on every task as the floor; without fine-tuning, the masked LM's preference for the dev "
            f"couples' swapped side as it is (pseudo-log-likelihood)")
    if "lengths" in stages:
        factors = ", ".join(f"{f}×" for f in profile.length_factors)
        lines.append(
            f"  - length evaluation: held-out MLM loss at {factors} the training length on the first "
            f"{profile.length_tokens:,} held-out tokens, the same masked tokens at every length")
    return lines


STAGE_LABELS = dict(pretrain_s="pretraining", curve_s="learning curve", finetune_s="fine-tuning",
                    probe_s="word-order probe", analysis_s="analyses", final_s="final analyses",
                    lengths_s="length evaluation", order_s="word-order task")


def stages_line(table: dict) -> str:
    """Where a run's time went: the mean seconds of each stage (`timing` of result.json) over the runs that have
    it."""
    timings = [r["timing"] for runs in table.values() for r in runs]
    parts = [f"{label} {np.mean([t[key] for t in timings if key in t]):.0f} s"
             for key, label in STAGE_LABELS.items() if any(key in t for t in timings)]
    together = sorted({t.get("seeds_at_once", 1) for t in timings} - {1})
    if together and parts and parts[0].startswith(STAGE_LABELS["pretrain_s"]):  # a group's wall time, not a run's
        parts[0] += f" (a mechanism's {' or '.join(map(str, together))} seeds at once)"
    return "- a run's time by stage (mean over the runs that have the stage): " + ", ".join(parts)


def write_report(out: str, wall_s: float | None = None, command: str = "") -> dict:
    """Writes OUT/REPRODUCTION.md, OUT/figures/ and OUT/numbers.json from the finished runs of OUT/plan.json;
    returns the numbers. Runs that have not finished are listed as missing."""
    plan = require_plan(out, "nothing to report")
    table = results_table(out, plan)
    if not table:
        raise ValueError(f"no run in {out}/runs has finished: nothing to report")
    finished = {r["name"] for runs in table.values() for r in runs}
    missing = [n for n in plan["runs"] if n not in finished]
    numbers = mechanism_numbers(table)
    evaluated = V.evaluate_claims(table, C.select_claims(plan["claims"]))
    claims = evaluated["claims"]
    curve = curves(table)
    entropy = plan.get("corpus", {}).get("unigram_entropy")
    paths = figures(out, table, numbers, curve, entropy)
    machine = plan["machine"]
    hardware = (", ".join(machine["gpus"]) if machine.get("gpus") else f"{machine['cores']} CPU cores") + \
        f" ({machine['cpu']}), jax {machine.get('jax', '?')}"
    run_wall = [r["timing"]["wall_s"] for runs in table.values() for r in runs]
    if wall_s is None:  # written apart from the runs (a job array): the time since the plan was made
        wall_s = time.time() - plan["started_unix"]
    estimated = (plan.get("estimates") or [None])[0]
    lines = [
        "# Reproducing the papers' claims at small scale", "",
        f"Written by `{command or 'jaxpos reproduce'}` on {time.strftime('%Y-%m-%d %H:%M %Z')}.", "",
        *recipe_lines(plan, table),
        f"- {len(table)} mechanisms × {plan['seeds']} seed(s), the runs that {len(claims)} claim(s) need; runs with "
        "the same seed share data order and masking",
        f"- wall time {wall_s / 60:.1f} min" + (f" (estimated beforehand: {estimated['total_s'] / 60:.1f} min)"
                                                if estimated else "")
        + f"; a run took {np.mean(run_wall):.0f} s on average; machine: {hardware}, {plan['workers']} worker(s)",
        stages_line(table),
        *resumed_line(plan),
        ""]
    if missing:
        lines += [f"**Missing runs** (not finished, left out below): {', '.join(missing)}", ""]
    lines += [
        "> **Scale.** These are tiny models trained for minutes. A verdict here is evidence about the mechanism at "
        "this scale, not a replacement for the papers' runs.", "",
        f"**Verdicts.** A downstream claim about a mechanism is judged only once that mechanism uses positions: its "
        f"held-out MLM loss at the last step lies below the bag-of-words model's, paired by seed, with the 95% "
        f"interval of the difference above 0 (otherwise: *inconclusive: {J.NOT_TRAINED}*, with the step at which "
        f"the curves part); a comparison of scores on the word-order task, only once both sides learned it in "
        f"every seed: the Wilson interval of the best dev accuracy above chance, at the level at which the best of "
        f"a run's dev evaluations at chance passes 2.5% of the time (Šidák; otherwise: *inconclusive: "
        f"{J.NOT_LEARNED}*). Each comparison pairs the two sides by seed (a change or a value against a constant "
        f"is paired with 0) and gets a two-sided paired t test; the {evaluated['family']} tested comparisons of "
        f"this report are Holm-corrected together, and a comparison *holds* or is *contradicted* only when its "
        f"Holm-adjusted p <= {evaluated['alpha']:g} (its 95% interval then excludes 0); otherwise it is "
        "*inconclusive*, with the difference these seeds could have detected (80% power, before the correction). "
        "A bound every run must satisfy (exactness, a rank bound) is checked run by run. A claim holds when every "
        "part holds and is contradicted when any part is.", "",
        "## Summary", "", summary_table(claims),
        "## Learning curves", "",
        "Held-out masked-LM loss (mean ± sd over seeds) at fixed steps, beside the bag-of-words model (`none`).", "",
        curve_table(curve, entropy), f"![learning curves]({paths['learning_curves']})", "",
        training_table(evaluated["training"]),
        "## Comparisons", "", comparisons_table(claims),
        "## Mechanisms", "",
        "Mean ± sd over seeds. Positional parameters: the positional module's own. Locality, symmetry: "
        "identical-word attention at the last checkpoint. Largest logit rank: over layers, heads and held-out "
        "windows (D = " + str(next(iter(table.values()))[0]['head_dim']) + "). Zero-shot MLM preference: the "
        "share of the word-order task's dev couples whose swapped side the pretrained masked LM, not fine-tuned, "
        "scores higher (pseudo-log-likelihood) as it is than swapped; ties count half, so bag of words is at 0.5.",
        "",
        mechanisms_table(numbers), f"![mechanisms]({paths['mechanisms']})", ""]
    for paper in C.PAPERS:
        section = [c for c in claims if c["paper"] == paper]
        if not section:
            continue
        lines += [f"## {paper}", ""]
        for c in section:
            lines += [f"### {c['claim']}", "", f"*{c['paper']}, {c['reference']}.* Verdict: {_mark(c['verdict'])}.",
                      "", f"- the paper ({c['figure']['source']}): {c['figure']['value']}"]
            for p in c["parts"]:
                direction = ""
                if p["kind"] == "comparison" and p.get("direction"):
                    direction = f" Direction {p['direction']} with the paper's."
                lines.append(f"- measured, {p['what']}: {_verdict_text(p)}. {p['reason']}.{direction}")
            lines.append("")
            if c.get("caveat"):
                lines += [f"Caveat: {c['caveat']}", ""]
            if c["id"] in FIGURE_OF:
                lines += [f"![{c['id']}]({paths[FIGURE_OF[c['id']]]})", ""]
    lines += ["## Files", "",
              f"`{NUMBERS_FILE}` holds every number (each run's result, the learning curves, the training status, "
              "every comparison's test and every claim's measurements and verdict); `runs/NAME/` each run's "
              "workdirs, log and analyses.", ""]
    with open(os.path.join(out, REPORT_FILE), "w") as f:
        f.write("\n".join(lines))
    result = dict(plan=plan, wall_s=wall_s, missing=missing, figures=paths, mechanisms=numbers, curves=curve,
                  training=evaluated["training"], comparisons=evaluated["comparisons"], family=evaluated["family"],
                  alpha=evaluated["alpha"], claims=claims, runs={r["name"]: r for runs in table.values() for r in runs})
    write_json_atomically(os.path.join(out, NUMBERS_FILE), jsonable(result), indent=1, allow_nan=False)
    return result
