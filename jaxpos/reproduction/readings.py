"""What a claim reads: accessors of the runs' numbers (`table` everywhere is {mechanism: [result.json of each
seed]}, jaxpos.reproduction.pipeline), per-seed series and their summaries."""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from jaxpos.reproduction.matrix import RUN_MECHANISMS
from jaxpos.reproduction.stats import counted, counts


def value_at(result: dict, path: str):
    """result['a']['b'][i]... for a dotted path with integer indices; None where anything is missing."""
    node = result
    for key in path.split("."):
        if node is None:
            return None
        if isinstance(node, list):
            index = int(key)
            node = node[index] if -len(node) <= index < len(node) else None
        else:
            node = node.get(key)
    return node


def field(path: str) -> Callable[[dict], float | None]:
    return lambda r: value_at(r, path)


def accuracy(r):  # the downstream score: the word-order pair task's best dev accuracy over evaluations and rates
    return value_at(r, "order.best")


def paraphrase_accuracy(r):  # the lexical paraphrase task's best dev accuracy over evaluations, beside it
    return value_at(r, "finetune.best")


def by_seed(table: dict, mechanism: str, value: Callable[[dict], float | None]) -> dict[int, float | None]:
    """{seed: value of that seed's run of `mechanism`} (None where the run does not give it)."""
    return {r["seed"]: value(r) for r in table.get(mechanism, [])}


def pooled(table: dict, mechanisms: Sequence[str], value: Callable[[dict], float | None]) -> dict[int, float]:
    """Per seed, the mean of `value` over the runs of `mechanisms` with that seed."""
    return mean_by_seed([by_seed(table, m, value) for m in mechanisms])


def mean_by_seed(values: Sequence[Mapping[int, float | None]]) -> dict[int, float]:
    """Per seed, the mean of the given values ({seed: value} each; None, NaN and inf left out: `stats.counts`)."""
    by_seed_values: dict[int, list[float]] = {}
    for one in values:
        for seed, v in one.items():
            if counts(v):
                by_seed_values.setdefault(seed, []).append(v)
    return {seed: float(np.mean(v)) for seed, v in sorted(by_seed_values.items())}


def describe(values) -> dict:
    """{"mean", "sd" (ddof=1; None for one value), "n", "values"} of the finite values of a list or {seed: value}."""
    values = values.values() if isinstance(values, Mapping) else values
    xs = counted(values)
    if not xs:
        return dict(mean=None, sd=None, n=0, values=[])
    return dict(mean=float(np.mean(xs)), sd=float(np.std(xs, ddof=1)) if len(xs) > 1 else None, n=len(xs),
                values=xs)


def fmt(s: dict, digits: int = 3) -> str:
    """'mean ± sd (n=k)' of a `describe` dict."""
    if not s or s["n"] == 0:
        return "not measured"
    if s["sd"] is None:
        return f"{s['mean']:.{digits}g} (n=1)"
    return f"{s['mean']:.{digits}g} ± {s['sd']:.{digits}g} (n={s['n']})"


def parted_at(trained: Mapping[str, int], mechanism: str) -> int | None:
    """The step from which `mechanism` uses positions (its curve stays below bag of words), where `trained` (the
    judges' second argument: {mechanism: that step} of the mechanisms that use positions) says; else None."""
    return trained.get(mechanism)


def first_trained(r: dict, start: int | None) -> int | None:
    """The index of a run's first analysed checkpoint at or after step `start` (None: the first one), or None. The
    initialisation (step 0) is a reference, never the start: a change from it measures training, used or not."""
    steps = value_at(r, "over_training.steps") or []
    return next((k for k, step in enumerate(steps) if step > 0 and (start is None or step >= start)), None)


def first_last(series: str, start: int | None = None) -> Callable[[dict], float | None]:
    """The change of an over-training series from the first analysed checkpoint at or after step `start` (the
    step from which the mechanism uses positions; None: the first one after the initialisation) to the last; None
    where fewer than two checkpoints remain."""
    def change(r):
        values = value_at(r, f"over_training.series.{series}")
        first = first_trained(r, start)
        if not values or first is None or first >= len(values) - 1 or values[first] is None or values[-1] is None:
            return None
        return values[-1] - values[first]
    return change


def series_at_step(series: str, step: int) -> Callable[[dict], float | None]:
    """The value of an over-training series at analysed step `step` (0: the initialisation), or None."""
    def value(r):
        steps = value_at(r, "over_training.steps") or []
        return value_at(r, f"over_training.series.{series}.{steps.index(step)}") if step in steps else None
    return value


def series_at_first(series: str, start: int | None = None) -> Callable[[dict], float | None]:
    """The value of an over-training series at the first analysed checkpoint at or after step `start`."""
    def value(r):
        first = first_trained(r, start)
        return None if first is None else value_at(r, f"over_training.series.{series}.{first}")
    return value


def label(m: str) -> str:
    return RUN_MECHANISMS[m].label if m in RUN_MECHANISMS else m


def loss_at(factor: int) -> Callable[[dict], float | None]:
    """A run's held-out loss at `factor` times its training length (None where it did not or could not run)."""
    def loss(r):
        entry = next((e for e in r.get("lengths") or [] if e["length"] == factor * r["seq_len"]), None)
        return None if entry is None or "skipped" in entry else entry["loss"]
    return loss


def length_factors(table: dict) -> list[int]:
    """The multiples of the training length the runs were evaluated at."""
    return sorted({e["length"] // r["seq_len"] for runs in table.values() for r in runs
                   for e in r.get("lengths") or []})


def rank_correlation(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None for fewer than 3 pairs or a constant side."""
    if len(x) < 3:
        return None

    def ranks(v):
        v = np.asarray(v, float)
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(len(v), dtype=float)
        for value in np.unique(v):  # ties share their mean rank
            r[v == value] = r[v == value].mean()
        return r

    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])
