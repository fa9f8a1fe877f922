"""`jaxpos compare`: one masked-LM recipe (any config file and overrides), a set of positional mechanisms and
variants x seeds, trained and evaluated by the reproduction's engine (the plan, seeds of a mechanism at once, the
pool or SLURM array tasks, resuming), and one report of paired statistics.

A variant is a label and `--config.*` overrides of the recipe: a mechanism of the registry's runs
(`jaxpos.reproduction.matrix.RUN_MECHANISMS`: `rope`, `alibi`, `diet_rel_layer`, a researcher's own kind, ...)
with options joined by `+`, each a shorthand of `SHORTHANDS`, e.g. `rope+partial0.5`, `absolute+random`,
`alibi+local128`:
  linear | ntk | dynamic | yarn | llama3, each with an optional factor (`yarn8`; default: the largest --lengths
              factor): RoPE's length rule (position.rope.scaling, with L0 the training length);
  partialF    RoPE rotating a fraction F of each head's channel pairs (position.rope.fraction);
  random[N]   randomized positions drawn from [0, N) (position.randomized_max_length; default: the longest
              evaluated length, and more than model.max_length);
  localW      a local attention window of W keys (model.local_window);
  clipN       DIET-Rel's offsets clipped at N (position.diet_rel.max_distance: inductive);
  nopeK       no positional term in every K-th layer (model.nope_every);
  headsH      RoPE or ALiBi on the first H heads only, the rest NoPE (position.rope.heads, position.alibi.heads);
  gate | sink | qknorm | ssmax
              the output gate, a learned sink logit per head, QK-norm, Scalable-Softmax's length-scaled logits
              (model.output_gate, model.attention_sinks, model.qk_norm, model.length_scaled_logits);
  extendK     context extension: after pretraining, 1/4 of the recipe's steps more at K times the training length
              (train.init_from), the options after it the extension's own (`rope+extend4+ntk4`); scored and
              fine-tuned from the extended weights.
Every variant is made into its run config and checked when the plan is made (`matrix.check_variants`): an option
the variant's mechanism does not read, a model that cannot be built, an attention path that cannot run it is
refused then, in one line, by `--dry-run` and `--plan-only` too.
A trailing `@eval` applies the RoPE rules of a variant at evaluation only: `rope+yarn@eval` is the `rope` runs'
weights scored with YaRN in the lengths stage (no training of its own); the other options always train.

The report (OUT/COMPARISON.md, OUT/comparison.json, OUT/figures/): per variant the held-out masked-LM loss and
accuracy at the last checkpoint with a 95% t interval over seeds, the learning curves with their seeds' range,
the loss at each evaluated length (a variant that cannot run there says so), the fine-tuning accuracy where asked,
and paired comparisons against `--baseline` (and between every pair with `--all-pairs`): the mean difference with
its interval, a paired t test, Holm's correction over every comparison of the report, and beside each difference
the seeds did not resolve, the smallest difference they could have detected.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from typing import Sequence

import numpy as np
from scipy.stats import distributions

from jaxpos.config.checks import typed
from jaxpos.config.files import apply_overrides, load_config, write_json_atomically
from jaxpos.config.run import FinetuneDataConfig, TrainConfig
from jaxpos.reproduction import host, matrix, stats, verdicts
from jaxpos.reproduction.matrix import RUN_MECHANISMS, Profile, registry_runs
from jaxpos.reproduction.readings import describe

REPORT_FILE = "COMPARISON.md"
NUMBERS_FILE = "comparison.json"
RULES = ("linear", "ntk", "dynamic", "yarn", "llama3")
RULE_LABELS = dict(linear="PI", ntk="NTK", dynamic="dynamic NTK", yarn="YaRN", llama3="Llama 3")
FINETUNE_STAGES = {"paraphrase": "finetune", "order": "order"}  # --finetune TASK: the reproduction's stage
ALPHA = 0.05
SHARE, SHARE_DIFFERENCE = (0.0, 1.0), (-1.0, 1.0)  # the ranges of an accuracy and of a difference of two
_OPTION = re.compile(r"^([a-z]+?)([0-9.]*)$")
# where attention sinks (jaxpos.analysis.sinks), the report's columns: the mean over layers and heads of each run
SINK_COLUMNS = {"first": "first token", "sep": "[SEP]", "top": "most-attended key", "learned": "learned sink",
                "uniform": "uniform (1/n)"}


def _rope_rule(scaling: str):
    def rule(number: str, lengths: dict) -> tuple[list[str], str]:
        factor = float(number) if number else float(max(lengths["factors"]))
        return ([f"--config.model.position.rope.scaling={scaling}", f"--config.model.position.rope.factor={factor}",
                 f"--config.model.position.rope.original_max_length={lengths['seq_len']}"],
                f"{RULE_LABELS[scaling]} ×{factor:g}")
    return rule


def _needs(what: str, example: str):
    def check(number: str) -> str:
        if not number:
            raise ValueError(f"give {what}, e.g. {example}")
        return number
    return check


# The shorthands a variant's options take, each `+NAME[NUMBER]` -> (its --config overrides, its label): one table.
# `lengths` holds the comparison's factors, seq_len and max_length, and the variant's mechanism kind. RoPE's rules may also act at evaluation only
# (`@eval`); every other shorthand trains.
SHORTHANDS = {
    **{scaling: _rope_rule(scaling) for scaling in RULES},
    "partial": lambda n, lengths: ([f"--config.model.position.rope.fraction={float(n or 0.5)}"],
                                   f"partial {float(n or 0.5):g}"),
    "random": lambda n, lengths: (lambda width: ([f"--config.model.position.randomized_max_length={width}"],
                                                 f"randomized over [0, {width})"))(
        int(n) if n else max(lengths["seq_len"] * max(lengths["factors"]), lengths["max_length"] + 1)),
    "local": lambda n, lengths: ([f"--config.model.local_window={int(_needs('the window', 'local128')(n))}"],
                                 f"local {int(n)}"),
    "clip": lambda n, lengths: ([f"--config.model.position.diet_rel.max_distance="
                                 f"{int(_needs('the clip', 'diet_rel+clip16')(n))}"], f"clipped at ±{int(n)}"),
    "nope": lambda n, lengths: ([f"--config.model.nope_every={int(_needs('the period', 'rope+nope4')(n))}"],
                                f"NoPE every {int(n)}"),
    "heads": lambda n, lengths: ([f"--config.model.position.{lengths['kind']}.heads="
                                  f"{int(_needs('the heads', 'rope+heads2')(n))}"],
                                 f"on the first {int(n)} head" + ("s" if int(n) != 1 else "")),
    **{name: (lambda field, label: lambda n, lengths: ([f"--config.model.{field}=true"], label))(field, label)
       for name, field, label in (("gate", "output_gate", "output gate"), ("sink", "attention_sinks", "sink logit"),
                                  ("qknorm", "qk_norm", "QK-norm"),
                                  ("ssmax", "length_scaled_logits", "Scalable-Softmax"))},
}


def parse_variant(text: str, factors: Sequence[int], seq_len: int, max_length: int) -> tuple[str, dict, str | None]:
    """(the training variant's name, its {"label", "overrides", "eval"}, the evaluation rule's label or None) of a
    variant `text` (module docstring): its mechanism's overrides, then each option's from `SHORTHANDS`; a trailing
    `@eval` keeps RoPE's rules for the lengths stage (their overrides under "eval"). Whether the overrides make a
    model is checked with the plan (`matrix.check_variants`)."""
    base, _, at = text.partition("@")
    if at not in ("", "eval"):
        raise ValueError(f"variant {text!r}: only '@eval' may follow a variant")
    name, *options = base.split("+")
    runs = RUN_MECHANISMS if name in RUN_MECHANISMS else registry_runs()  # a mechanism registered since import
    if name not in runs:
        raise ValueError(f"variant {text!r}: unknown mechanism {name!r}; choose from {', '.join(runs)} (a mechanism "
                         "of your own: --import MODULE)")
    run = runs[name]
    lengths = dict(factors=factors, seq_len=seq_len, max_length=max_length, kind=run.kind)
    overrides, labels, trained, evaluated = list(run.overrides), [run.label], [name], []
    extend = None  # after `extendK`, options are the extension's own
    for option in options:
        if option.startswith("extend"):
            factor = option[len("extend"):]
            if extend is not None or at or not factor.isdigit() or int(factor) < 2:
                raise ValueError(f"variant {text!r}: {option}: give one extension by a whole factor of 2 or more "
                                 "(extend4), without @eval")
            extend = dict(factor=int(factor), overrides=[])
            labels.append(f"extended to {factor}× for 1/{matrix.EXTENSION_SHARE} of the steps")
            trained.append(option)
            continue
        match = _OPTION.match(option)
        if not match or match.group(1) not in SHORTHANDS:
            raise ValueError(f"variant {text!r}: unknown option {option!r}; choose {', '.join(SHORTHANDS)} (a number "
                             "may follow: yarn8, partial0.5, random512, local128, clip16, nope4, heads2)")
        key, number = match.groups()
        try:
            more, label = SHORTHANDS[key](number, lengths)
        except ValueError as error:
            raise ValueError(f"variant {text!r}: {option}: {error}") from None
        if at and key in RULES:  # applied to the trained weights in the lengths stage
            evaluated += more
            labels.append(f"{label} at evaluation")
            continue
        (extend["overrides"] if extend is not None else overrides).extend(more)
        labels.append(label if extend is None else f"{label} in the extension")
        trained.append(option)
    if at and not evaluated:
        raise ValueError(f"variant {text!r}: '@eval' applies RoPE's length rules at evaluation; give one, e.g. "
                         "rope+yarn@eval")
    train_labels = [label for label in labels if not label.endswith("at evaluation")]
    variant = dict(label=", ".join(train_labels), overrides=overrides, eval={}, **({"extend": extend} if extend else {}))
    if evaluated:
        variant["eval"][text] = evaluated
        return "+".join(trained), variant, ", ".join(labels)
    return "+".join(trained), variant, None


def new_plan(config_file: str, overrides: Sequence[str], mechanisms: Sequence[str], seeds: int,
             workers: int | None = None, lengths: Sequence[int] = (), finetune: Sequence[str] = (),
             baseline: str = "none", all_pairs: bool = False, length_tokens: int = 32768) -> dict:
    """The plan of a comparison without writing anything: a run per (variant, seed) of the recipe in `config_file`
    with `overrides`, each with the stages asked for (`lengths`: factors of the training length; `finetune`:
    paraphrase and/or order), the baseline included."""
    if seeds < 2:
        raise ValueError(f"--seeds {seeds}: a comparison needs 2 seeds or more (paired tests over seeds)")
    path = os.path.abspath(config_file)
    config = load_config(path)
    if config.get("task", "mlm") != "mlm":
        raise ValueError(f"{config_file} is a {config.task} config: jaxpos compare runs masked-LM recipes")
    config = apply_overrides(config, list(overrides))
    factors = tuple(sorted(set(lengths))) or ()
    if any(f < 1 for f in factors):
        raise ValueError(f"--lengths {','.join(map(str, factors))}: give multiples of the training length (1, 2, ...)")
    unknown = [t for t in finetune if t not in FINETUNE_STAGES]
    if unknown:
        raise ValueError(f"--finetune {','.join(unknown)}: choose {' or '.join(FINETUNE_STAGES)}")
    seq_len, max_length = int(config.data.seq_len), int(config.model.max_length)
    variants, rows = {}, {}  # training variants; report rows {row name: (training variant, rule label or None)}
    for text in dict.fromkeys([baseline, *mechanisms]):
        name, variant, rule_label = parse_variant(text, factors or (1,), seq_len, max_length)
        if name in variants:
            variants[name]["eval"].update(variant["eval"])
        else:
            variants[name] = variant
        rows[name] = (name, None)
        if rule_label:
            rows[text] = (name, rule_label)
    if baseline not in rows:
        raise ValueError(f"--baseline {baseline!r} is not among the variants")
    if any(variant["eval"] for variant in variants.values()) and not factors:
        raise ValueError("a rule at evaluation (@eval) acts in the lengths stage: give --lengths")
    profile = comparison_profile(path, overrides, config, variants, seeds, factors, length_tokens)
    stages = tuple(s for s in matrix.STAGES if s == "lengths" and factors or s in {FINETUNE_STAGES[t] for t in finetune})
    plan = matrix.make_plan(profile, seeds, {name: stages for name in variants}, workers or host.default_workers())
    plan["comparison"] = dict(rows={k: list(v) for k, v in rows.items()}, baseline=baseline, all_pairs=all_pairs,
                              command_overrides=list(overrides))
    return plan


def comparison_profile(path: str, overrides: Sequence[str], config, variants: dict, seeds: int,
                       factors: Sequence[int], length_tokens: int) -> Profile:
    """The comparison's recipe as a profile: the user's config and overrides as they stand, the curve at up to 8
    evenly spaced checkpoints, fine-tuning as configs/finetune/*.py give it (rows of the training length)."""
    steps = int(config.train.num_steps)
    points = max(c for c in range(1, 9) if steps % c == 0)
    finetune = load_config(matrix.repo_config("configs/finetune/paraphrase.py"))
    finetune_data = typed(FinetuneDataConfig, finetune.data, "data")
    finetune_train = typed(TrainConfig, finetune.train, "train")
    return Profile(
        "compare", "a comparison of positional mechanisms on one recipe", tuple(variants), seeds, model={},
        data=dict(seq_len=int(config.data.seq_len)),
        train=dict(num_steps=steps, batch_size=int(config.train.batch_size)),
        finetune_data=dict(max_length=int(config.data.seq_len), offline_train_examples=finetune_data.offline_train_examples,
                           offline_dev_examples=finetune_data.offline_dev_examples),
        finetune_train=dict(num_steps=finetune_train.num_steps or 1000, batch_size=finetune_train.batch_size,
                            learning_rate=finetune_train.learning_rate),
        analysis={}, max_sentences=16, probe_examples=16, curve_points=points, analysis_points=1,
        eval_batches=int(config.train.eval_batches) or 8, length_factors=tuple(factors) or (1,),
        length_tokens=length_tokens,
        config=path, overrides=tuple(overrides), variants=variants)


# --- the report --------------------------------------------------------------------------------------------------

def mean_interval(values: Sequence[float | None], bounds: tuple[float, float] | None = None) -> dict:
    """{"mean", "low", "high", "n"}: the mean of the finite values with its 95% t interval (None bounds for one),
    clipped to `bounds` where the quantity has a range (an accuracy), with "clipped": True then."""
    d = describe(values)
    if not d["n"]:
        return dict(mean=None, low=None, high=None, n=0)
    if d["n"] < 2:
        return dict(mean=d["mean"], low=None, high=None, n=1)
    half = float(distributions.t.ppf(0.975, d["n"] - 1)) * d["sd"] / math.sqrt(d["n"])
    low, high = d["mean"] - half, d["mean"] + half
    out = dict(mean=d["mean"], low=low, high=high, n=d["n"])
    if bounds is not None and (low < bounds[0] or high > bounds[1]):
        out.update(low=max(low, bounds[0]), high=min(high, bounds[1]), clipped=True)
    return out


def interval_text(s: dict, digits: int = 3) -> str:
    if s["mean"] is None:
        return "–"
    if s["low"] is None:
        return f"{s['mean']:.{digits}f}"
    clipped = "*" if s.get("clipped") else ""
    return f"{s['mean']:.{digits}f} [{s['low']:.{digits}f}, {s['high']:.{digits}f}]{clipped}"


def measurements(out: str, plan: dict) -> dict:
    """{row: {"label", "seeds": [...], "loss", "accuracy", "curve", "lengths", "finetune", "order"}} of the finished
    runs: per seed, read from each run's result.json."""
    comparison = plan["comparison"]
    profile = matrix.profile_of(plan)
    rows = {}
    for row, (variant, rule) in comparison["rows"].items():
        label = matrix.mechanism_of(profile, variant).label if rule is None else rule
        seeds = {}
        for seed in range(plan["seeds"]):
            result = matrix.read_result(out, matrix.run_name(variant, seed))
            if result is not None:
                seeds[seed] = result
        lengths = {}
        for seed, result in seeds.items():
            entries = result.get("lengths") if rule is None else result.get("lengths_by_rule", {}).get(row)
            for entry in entries or []:
                lengths.setdefault(entry["length"], {})[seed] = entry
        own = seeds if rule is None else {}  # a rule at evaluation has only its lengths: the rest is its runs'
        rows[row] = dict(
            label=label, variant=variant, rule=rule, seeds=sorted(seeds), results=list(own.values()),
            loss={s: r["curve"][-1]["loss"] for s, r in own.items()},
            accuracy={s: r["curve"][-1]["accuracy"] for s, r in own.items()},
            curve={s: [(p["step"], p["loss"]) for p in r["curve"]] for s, r in own.items()},
            lengths=lengths, train_length=profile.data["seq_len"],
            sinks={s: r["sinks"]["mean"] for s, r in own.items() if "sinks" in r},
            finetune={s: r["finetune"]["best"] for s, r in own.items() if "finetune" in r},
            order={s: r["order"]["best"] for s, r in own.items() if "order" in r})
    return rows


def comparisons(rows: dict, baseline: str, all_pairs: bool) -> list[dict]:
    """Every paired comparison of the report, Holm-corrected together: each variant against the baseline (every
    pair with all_pairs) on the held-out loss and accuracy, the loss at each evaluated length and the fine-tuning
    scores; and each variant's loss at every longer length against its own at the training length (the same masked
    tokens: what extending the rows costs it). Each {"a", "b", "quantity", "test" (stats.PairedDifference), "adjusted_p",
    "decided"}; a comparison of a variant with itself has b == a."""
    pairs = [(a, baseline) for a in rows if a != baseline]
    if all_pairs:
        names = list(rows)
        pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    found = []
    for name, row in rows.items():
        lengths = sorted(row["lengths"])
        train = row["train_length"]
        if train not in lengths:
            continue
        base = {s: e.get("loss") for s, e in row["lengths"][train].items()}
        for length in (n for n in lengths if n > train):
            longer = {s: e.get("loss") for s, e in row["lengths"][length].items()}
            seeds = sorted(s for s in set(base) & set(longer) if base[s] is not None and longer[s] is not None)
            if len(seeds) >= 2:
                test = stats.paired_difference([longer[s] for s in seeds], [base[s] for s in seeds], alpha=ALPHA)
                found.append(dict(a=name, b=name, quantity=f"loss at {length} − at {train} tokens", test=test))
    for a, b in pairs:
        quantities = [("held-out loss", rows[a]["loss"], rows[b]["loss"], None),
                      ("held-out accuracy", rows[a]["accuracy"], rows[b]["accuracy"], SHARE_DIFFERENCE)]
        for length in sorted(set(rows[a]["lengths"]) & set(rows[b]["lengths"])):
            sides = [{s: e.get("loss") for s, e in rows[x]["lengths"][length].items()} for x in (a, b)]
            quantities.append((f"loss at {length} tokens", *sides, None))
        for task in ("finetune", "order"):
            quantities.append((f"{task} accuracy", rows[a][task], rows[b][task], SHARE_DIFFERENCE))
        for quantity, x, y, bounds in quantities:
            seeds = sorted(set(x) & set(y))
            if len(seeds) < 2 or any(x[s] is None or y[s] is None for s in seeds):
                continue
            test = stats.paired_difference([x[s] for s in seeds], [y[s] for s in seeds], alpha=ALPHA, bounds=bounds)
            found.append(dict(a=a, b=b, quantity=quantity, test=test))
    if found:
        adjusted, rejected = stats.holm([c["test"].p for c in found], ALPHA)
        for c, p, decided in zip(found, adjusted, rejected):
            c.update(adjusted_p=float(p), decided=bool(decided))
    return found


def degradation(row: dict) -> dict[str, dict]:
    """{str(length): where the loss by position first exceeds the variant's loss at the training length} for each
    evaluated length past it: {"start", "end", "mean", "low", "high", "n"} of the first bucket at or past the
    training length whose loss, paired by seed with the loss at the training length, has a 95% t interval above 0
    (not corrected for the buckets tried); {"none": buckets tried, "n"} when none has; {"skipped"} where the variant
    cannot run or fewer than 2 seeds have both."""
    train = row["train_length"]
    base = {s: e.get("loss") for s, e in row["lengths"].get(train, {}).items()}
    found = {}
    for length in sorted(n for n in row["lengths"] if n > train):
        entries = row["lengths"][length]
        if any("skipped" in e for e in entries.values()) or not base:
            found[str(length)] = dict(skipped="cannot run" if entries else "no seeds")
            continue
        seeds = sorted(s for s in set(base) & set(entries) if base[s] is not None and entries[s].get("by_position"))
        if len(seeds) < 2:
            found[str(length)] = dict(skipped="fewer than 2 seeds")
            continue
        buckets = [k for k, b in enumerate(entries[seeds[0]]["by_position"]) if b["start"] >= train]
        for k in buckets:
            bucket = entries[seeds[0]]["by_position"][k]
            losses = [entries[s]["by_position"][k]["loss"] for s in seeds]
            if any(v is None for v in losses):
                continue
            test = stats.paired_difference(losses, [base[s] for s in seeds], alpha=ALPHA)
            if test.ci_low > 0:
                found[str(length)] = dict(start=bucket["start"], end=bucket["end"], mean=test.mean,
                                          low=test.ci_low, high=test.ci_high, n=test.n)
                break
        else:
            found[str(length)] = dict(none=len(buckets), n=len(seeds))
    return found


def passkey_cells(row: dict) -> dict[str, dict]:
    """{str(length): {depth: the share of keys retrieved whole, mean over seeds with its interval}, with "floor"
    (a uniform guess's) and "digit_floor"}, or {"skipped": why} where no seed's rows hold a key."""
    cells = {}
    for length, entries in sorted(row["lengths"].items()):
        probes = [e["passkey"] for e in entries.values() if "depths" in e.get("passkey", {})]
        if not probes:
            why = next((e.get("skipped") or e.get("passkey", {}).get("skipped") for e in entries.values()), None)
            if why:
                cells[str(length)] = dict(skipped=why)
            continue
        depths = list(probes[0]["depths"])
        first = probes[0]["depths"][depths[0]]
        cells[str(length)] = dict(
            depths={d: mean_interval([p["depths"][d]["accuracy"] for p in probes], SHARE) for d in depths},
            floor=first["floor"], digit_floor=first["digit_floor"], examples=first["examples"])
    return cells


def degradation_text(cell: dict | None) -> str:
    if cell is None:
        return "–"
    if "skipped" in cell:
        return cell["skipped"]
    if "none" in cell:
        return f"not worse in any of {cell['none']} buckets ({cell['n']} seeds)"
    return (f"from column {cell['start']} (columns {cell['start']}–{cell['end'] - 1}: "
            f"{cell['mean']:+.3f} [{cell['low']:+.3f}, {cell['high']:+.3f}])")


def comparison_text(c: dict) -> str:
    t = c["test"]
    interval = f"{t.mean:+.3g} [{t.ci_low:+.3g}, {t.ci_high:+.3g}]"
    said = "higher" if t.mean > 0 else "lower"
    tested = f"{interval}, p = {t.p:.2g}, Holm {c['adjusted_p']:.2g}"
    if c["decided"]:
        return f"{tested}: {said}"
    if t.p < ALPHA:  # the detectable difference below is the uncorrected one: it would mislead here
        return f"{tested}: not resolved after Holm's correction (alone it would read {said})"
    if t.sd == 0:
        return f"{tested}: the seeds agree exactly (every paired difference {t.mean:+.3g}): nothing to test against"
    needed = seeds_to_resolve(t)
    more = f"; about {needed} seeds would resolve a difference of this size" if needed else ""
    return (f"{tested}: no difference resolved (these {t.n} seeds could detect {t.mdd:.3g} at α = {ALPHA} before "
            f"the correction{more})")


def seeds_to_resolve(t) -> int | None:
    """The seeds a paired t test would need to resolve the observed mean difference at α and 80% power, from the
    observed sd (a normal approximation, (z_α/2 + z_0.8)² sd² / mean², plus one); None for a zero difference."""
    if t.mean == 0 or not math.isfinite(t.sd):
        return None
    z = float(distributions.norm.ppf(1 - ALPHA / 2) + distributions.norm.ppf(0.8))
    return max(t.n + 1, math.ceil((z * t.sd / abs(t.mean)) ** 2) + 1)


def cannot_say(parting: dict) -> str | None:
    """Why the comparison cannot say anything about positions, or None: every variant measured against bag of
    words (`verdicts.training_status`) and none of them parted from it (the recipe too short for word order to
    matter)."""
    judged = [p for p in parting.values() if p.get("trained") is not None]
    if judged and not any(p["trained"] for p in judged):
        return ("no variant's held-out loss left bag of words' (paired by seed, 95% interval): each predicts the "
                "masked tokens as a model that ignores word order does, so no difference below is about positions; "
                "train longer (--config.train.num_steps) or on more data")
    return None


def write_report(out: str, wall_s: float | None = None, command: str = "jaxpos compare") -> dict:
    """Writes OUT/COMPARISON.md, OUT/comparison.json and OUT/figures/ from the finished runs; returns the numbers."""
    plan = matrix.require_plan(out, f"start with `jaxpos compare --out {out} ...`")
    comparison = plan["comparison"]
    rows = measurements(out, plan)
    found = comparisons(rows, comparison["baseline"], comparison["all_pairs"])
    # When each variant's held-out loss leaves the bag-of-words model's for good (paired by seed): what the
    # steps suffice for
    parting = verdicts.training_status({name: r["results"] for name, r in rows.items() if r["results"]})
    figures = os.path.join(out, "figures")
    os.makedirs(figures, exist_ok=True)
    paths = dict(curves=curves_figure(rows, os.path.join(figures, "learning_curves.png")))
    if any(r["lengths"] for r in rows.values()):
        paths["lengths"] = lengths_figure(rows, os.path.join(figures, "lengths.png"))
        paths["by_position"] = by_position_figure(rows, os.path.join(figures, "loss_by_position.png"))
    numbers = dict(
        rows={name: dict(label=r["label"], seeds=r["seeds"], loss=mean_interval(list(r["loss"].values())),
                         accuracy=mean_interval(list(r["accuracy"].values()), SHARE),
                         lengths={str(n): length_cell(entries) for n, entries in sorted(r["lengths"].items())},
                         degradation=degradation(r), passkey=passkey_cells(r),
                         sinks={m: mean_interval([v.get(m) for v in r["sinks"].values()], SHARE)
                                for m in SINK_COLUMNS},
                         finetune=mean_interval(list(r["finetune"].values()), SHARE),
                         order=mean_interval(list(r["order"].values()), SHARE),
                         parting=parting.get(name, {}).get("reason")) for name, r in rows.items()},
        comparisons=[dict(a=c["a"], b=c["b"], quantity=c["quantity"], mean=c["test"].mean, ci_low=c["test"].ci_low,
                          ci_high=c["test"].ci_high, p=c["test"].p, adjusted_p=c["adjusted_p"], n=c["test"].n,
                          mdd=c["test"].mdd, decided=c["decided"]) for c in found],
        cannot_say=cannot_say(parting),
        seeds=plan["seeds"], baseline=comparison["baseline"], machine=plan.get("machine"), wall_s=wall_s,
        command=command, written=time.strftime("%Y-%m-%d %H:%M:%S"), figures=paths)
    write_json_atomically(os.path.join(out, NUMBERS_FILE), numbers, indent=1)
    with open(os.path.join(out, REPORT_FILE), "w") as f:
        f.write(report_text(plan, rows, numbers, found))
    return numbers


def length_cell(entries: dict) -> dict:
    """A length's cell over seeds: the loss's mean and interval, or why the variant cannot run there."""
    skipped = [e["skipped"] for e in entries.values() if "skipped" in e]
    if skipped:
        return dict(skipped=skipped[0])
    return mean_interval([e.get("loss") for e in entries.values()])


def shown_path(path: str) -> str:
    """A path as a reader can use it: relative to the working folder when inside it (the plan keeps it absolute)."""
    inside = path.startswith(os.path.join(os.getcwd(), ""))
    return os.path.relpath(path) if inside else path


def report_text(plan: dict, rows: dict, numbers: dict, found: list[dict]) -> str:
    """COMPARISON.md: the recipe, then a table per quantity, then the comparisons."""
    profile = matrix.profile_of(plan)
    machine = plan.get("machine") or {}
    device = ", ".join(machine.get("gpus") or [f"{machine.get('cpu', '?')}, {machine.get('cores', '?')} cores"])
    lines = [f"# Comparison: {len(rows)} variants × {plan['seeds']} seeds", "",
             f"`{numbers['command']}`", "",
             f"Recipe: `{shown_path(profile.config)}` with {' '.join(profile.overrides) or 'no overrides'}; "
             f"{profile.steps} steps of {profile.train['batch_size']} × {profile.data['seq_len']} tokens. "
             f"Machine: {device}, jax {machine.get('jax', '?')}; written {numbers['written']}"
             + (f", wall time {numbers['wall_s'] / 60:.1f} min." if numbers.get("wall_s") else "."),
             *matrix.resumed_line(plan), "",
             "Cells: the mean over seeds and its 95% t interval; comparisons: the mean paired difference (variant − "
             f"{numbers['baseline']}) with its 95% interval, the paired t test's p and Holm's adjusted p over all "
             f"{len(found)} comparisons of this report (α = {ALPHA}); * an interval clipped to the quantity's "
             "range.", "",
             *([f"**This comparison cannot say anything about positions:** {numbers['cannot_say']}.", ""]
               if numbers.get("cannot_say") else []),
             "## Held-out masked-LM at the training length (last checkpoint)", "",
             "| variant | loss | accuracy | against bag of words |", "| --- | --- | --- | --- |"]
    for name, r in numbers["rows"].items():
        if r["loss"]["n"]:  # rules at evaluation have lengths only
            lines.append(f"| {r['label']} | {interval_text(r['loss'])} | {interval_text(r['accuracy'])} | "
                         f"{r['parting'] or '–'} |")
    lengths = sorted({int(n) for r in numbers["rows"].values() for n in r["lengths"]})
    if lengths:
        train = profile.data["seq_len"]
        lines += ["", "## Held-out loss by length (the same masked tokens at every length)", "",
                  "| variant | " + " | ".join(f"{n} ({n / train:g}×)" for n in lengths) + " |",
                  "| --- |" + " --- |" * len(lengths)]
        for r in numbers["rows"].values():
            cells = [r["lengths"].get(str(n)) for n in lengths]
            lines.append(f"| {r['label']} | " + " | ".join(
                "–" if c is None else f"cannot run: {c['skipped']}" if "skipped" in c else interval_text(c)
                for c in cells) + " |")
        lines += degradation_section(numbers, [n for n in lengths if n > train], train)
    lines += passkey_section(numbers, lengths, profile.data["seq_len"])
    lines += sinks_section(numbers)
    for task, title in (("finetune", "Fine-tuning: paraphrase task, best dev accuracy"),
                        ("order", "Fine-tuning: word-order task, best dev accuracy")):
        if any(r[task]["n"] for r in numbers["rows"].values()):
            lines += ["", f"## {title}", "", "| variant | accuracy |", "| --- | --- |"]
            lines += [f"| {r['label']} | {interval_text(r[task])} |" for r in numbers["rows"].values()]
    if found:
        lines += ["", "## Paired comparisons", "", "Each variant's loss at a longer length against its own at the "
                  "training length (what extending the rows costs it), then each variant against "
                  f"{rows[numbers['baseline']]['label']}.", "", "| variant | against | quantity | difference, test |",
                  "| --- | --- | --- | --- |"]
        lines += [f"| {rows[c['a']]['label']} | {'itself' if c['a'] == c['b'] else rows[c['b']]['label']} | "
                  f"{c['quantity']} | {comparison_text(c)} |" for c in found]
    lines += ["", "![learning curves](figures/learning_curves.png)"]
    if "lengths" in numbers["figures"]:
        lines += ["", "![lengths](figures/lengths.png)", "", "![loss by position](figures/loss_by_position.png)"]
    return "\n".join(lines) + "\n"


def degradation_section(numbers: dict, longer: list[int], train: int) -> list[str]:
    """The report's lines on where each variant's loss by position degrades at the lengths past the training one."""
    if not longer:
        return []
    lines = ["", "## Where the loss by position degrades", "",
             "Past the training length, the first bucket of columns (a quarter of the training length each) whose "
             "loss is above the variant's own loss at the training length: the mean paired difference over seeds "
             "with its 95% t interval, which lies above 0 (each bucket tested alone, not corrected for the buckets "
             "tried). The loss of every bucket is in comparison.json (`by_position` of each run's lengths) and "
             "figures/loss_by_position.png.", "",
             "| variant | " + " | ".join(f"at {n} ({n / train:g}×)" for n in longer) + " |",
             "| --- |" + " --- |" * len(longer)]
    for r in numbers["rows"].values():
        lines.append(f"| {r['label']} | " + " | ".join(degradation_text(r["degradation"].get(str(n)))
                                                        for n in longer) + " |")
    return lines


def sinks_section(numbers: dict) -> list[str]:
    """The report's table of where attention sinks: each variant's attention weight on the first token, on [SEP],
    on the most-attended key of a row and on a learned sink, against the uniform floor."""
    shown = [r for r in numbers["rows"].values() if r.get("sinks", {}).get("first", {}).get("n")]
    if not shown:
        return []
    lines = ["", "## Where attention sinks (last checkpoint)", "",
             "The mean attention weight over the real queries of 64 held-out sentences, layers and heads "
             "(`jaxpos analyze --only sinks` per layer and head), then the mean over seeds with its 95% interval: on "
             "the row's first token, on its [SEP] tokens, on the one key that draws the most attention in the row, "
             "on a learned sink logit; the uniform floor is what spreading attention evenly gives a key.", "",
             "| variant | " + " | ".join(SINK_COLUMNS.values()) + " |", "| --- |" + " --- |" * len(SINK_COLUMNS)]
    for r in shown:
        lines.append(f"| {r['label']} | " + " | ".join(interval_text(r["sinks"][m]) for m in SINK_COLUMNS) + " |")
    return lines


def passkey_section(numbers: dict, lengths: list[int], train: int) -> list[str]:
    """The report's passkey table: a row per variant and depth, a column per length that holds a key."""
    probed = [n for n in lengths if any("depths" in r["passkey"].get(str(n), {}) for r in numbers["rows"].values())]
    if not probed:
        return []
    first = next(r["passkey"][str(n)] for n in probed for r in numbers["rows"].values()
                 if "depths" in r["passkey"].get(str(n), {}))
    lines = ["", "## Passkey retrieval (zero-shot)", "",
             f"A key of digits hidden at depth δ of held-out text and asked for again at the row's end with its digits "
             f"masked ({first['examples']} keys a length and depth, a run): the share of keys retrieved whole (every "
             "digit the most probable digit token), the mean over seeds with its 95% interval. A uniform guess among "
             f"the digits retrieves {first['floor']:.2g} of the keys (a digit: {first['digit_floor']:.2g}).", "",
             "| variant | depth | " + " | ".join(f"{n} ({n / train:g}×)" for n in probed) + " |",
             "| --- | --- |" + " --- |" * len(probed)]
    for r in numbers["rows"].values():
        for depth in first["depths"]:
            cells = [r["passkey"].get(str(n)) for n in probed]
            lines.append(f"| {r['label']} | {depth} | " + " | ".join(
                "–" if c is None else "cannot run" if "skipped" in c else interval_text(c["depths"][depth])
                for c in cells) + " |")
    return lines


def curves_figure(rows: dict, path: str) -> str:
    """Held-out loss against the step: each variant's mean over seeds, its seeds' range shaded, labelled by the
    variant (rows of evaluation rules share their training variant's curve and are left out)."""
    from jaxpos.analysis.plots import line_style, plt, save_figure  # matplotlib: only for a report

    fig, ax = plt.subplots(figsize=(10, 5))
    shown = [r for r in rows.values() if r["rule"] is None and r["curve"]]
    for index, r in enumerate(shown):
        steps = [s for s, _ in next(iter(r["curve"].values()))]
        losses = np.array([[loss for _, loss in curve] for curve in r["curve"].values()])
        style = line_style(index)
        ax.plot(steps, losses.mean(0), label=f"{r['label']} ({len(losses)} seeds)", **style)
        ax.fill_between(steps, losses.min(0), losses.max(0), color=style["color"], alpha=0.08, lw=0)
    ax.set_xlabel("step")
    ax.set_ylabel("held-out masked-LM loss")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(fig, path)


def lengths_figure(rows: dict, path: str) -> str:
    """Held-out loss against the evaluated length (× the training length): each variant's mean with its 95%
    interval over seeds; lengths a variant cannot run are left out."""
    from jaxpos.analysis.plots import line_style, plt, save_figure  # matplotlib: only for a report

    fig, ax = plt.subplots(figsize=(10, 5))
    for index, r in enumerate(rows.values()):
        points = [(n, mean_interval([e.get("loss") for e in entries.values()])) for n, entries in
                  sorted(r["lengths"].items()) if not any("skipped" in e for e in entries.values())]
        points = [(n / r["train_length"], s) for n, s in points if s["mean"] is not None]
        if not points:
            continue
        x = [p for p, _ in points]
        mean = [s["mean"] for _, s in points]
        low = [s["low"] if s["low"] is not None else s["mean"] for _, s in points]
        high = [s["high"] if s["high"] is not None else s["mean"] for _, s in points]
        style = line_style(index)
        ax.plot(x, mean, marker="o", label=r["label"], **style)
        ax.fill_between(x, low, high, color=style["color"], alpha=0.06, lw=0)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("evaluated length / training length")
    ax.set_ylabel("held-out masked-LM loss (mean over seeds; shaded: 95% interval)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(fig, path)


def by_position_figure(rows: dict, path: str) -> str:
    """The held-out loss by position within the row, a panel per evaluated length: each variant's mean over seeds
    at the middle column of each bucket, its 95% interval shaded, the training length dotted."""
    from jaxpos.analysis.plots import line_style, plt, save_figure  # matplotlib: only for a report

    lengths = sorted({n for r in rows.values() for n in r["lengths"]})
    fig, axes = plt.subplots(1, len(lengths), figsize=(4.2 * len(lengths), 3.8), squeeze=False)
    for ax, length in zip(axes[0], lengths):
        for index, r in enumerate(rows.values()):
            entries = [e for e in r["lengths"].get(length, {}).values() if e.get("by_position")]
            if not entries:
                continue
            cells = [mean_interval([e["by_position"][k]["loss"] for e in entries])
                     for k in range(len(entries[0]["by_position"]))]
            buckets = entries[0]["by_position"]
            shown = [(0.5 * (b["start"] + b["end"] - 1), c) for b, c in zip(buckets, cells) if c["mean"] is not None]
            style = line_style(index)
            ax.plot([x for x, _ in shown], [c["mean"] for _, c in shown], marker=".", label=r["label"], **style)
            ax.fill_between([x for x, _ in shown], [c["low"] if c["low"] is not None else c["mean"] for _, c in shown],
                            [c["high"] if c["high"] is not None else c["mean"] for _, c in shown],
                            color=style["color"], alpha=0.06, lw=0)
        ax.axvline(next(iter(rows.values()))["train_length"], color="0.5", linestyle=":", linewidth=1)
        ax.set(title=f"rows of {length} tokens", xlabel="column")
    axes[0][0].set_ylabel("held-out masked-LM loss")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(fig, path)
