"""The scores of the papers' fine-tuning protocol, as `jaxpos finetune-sweep` applies them: a run's score is the
maximum dev score over its evaluations (checkpoints), a learning rate's score the median of that over seeds (DIET
Table 2: "median of the maximum over all checkpoints among five runs"), and the best learning rate is reported.

NaN policy: a diverged evaluation (a NaN score, as the metrics give for NaN predictions) counts as the worst score,
so no result depends on the order of evaluations, seeds or learning rates. NaN never wins a maximum (a run whose
evaluations are all NaN scores NaN); a learning rate's median ranks NaN seeds below every number (it is NaN only
when a middle value is); the best learning rate is the highest median, the smallest rate among equals.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Mapping, Sequence, TypeVar

import numpy as np

T = TypeVar("T")


def score_rank(score: float) -> tuple[int, float]:
    """Sort key of a score under the NaN policy: NaN (a diverged evaluation) ranks below every number."""
    score = float(score)
    return (0, 0.0) if math.isnan(score) else (1, score)


def best_of(items: Iterable[T], score: Callable[[T], float] = float) -> T:
    """The item with the highest `score` under the NaN policy (the first of equals); NaN only if every score is."""
    return max(items, key=lambda item: score_rank(score(item)))


def median_score(values: Sequence[float]) -> float:
    """The median under the NaN policy: NaN values rank lowest, and the median is NaN only if a middle value is."""
    if not len(values):
        raise ValueError("no score to take the median of")
    ordered = sorted((float(v) for v in values), key=score_rank)
    middle = ordered[(len(ordered) - 1) // 2:len(ordered) // 2 + 1]  # one value, or the two of an even count
    return math.nan if any(math.isnan(v) for v in middle) else float(np.mean(middle))


def run_score(evals: Sequence[dict], split: str, metric: str) -> float:
    """The maximum of `metric` on `split` over a run's evaluations; NaN ones lose (NaN only if all are NaN)."""
    values = [e[split][metric] for e in evals if split in e and metric in e[split]]
    if not values:
        raise ValueError(f"no evaluation of {metric!r} on {split!r} to take the maximum of")
    return float(best_of(values))


def summarize(maxima: Mapping[float, Mapping[int, float]]) -> dict:
    """{lr: {seed: max dev score}} -> per learning rate the median over seeds (NaN seeds rank lowest), and the best
    learning rate: the highest median, the smallest rate among equals, whatever the order of `maxima`."""
    per_lr = {}
    for lr in sorted(maxima):
        by_seed = maxima[lr]
        per_lr[lr] = dict(max_per_seed={int(s): float(by_seed[s]) for s in sorted(by_seed)},
                          median=median_score([by_seed[s] for s in sorted(by_seed)]), seeds=len(by_seed))
    best = best_of(per_lr, lambda lr: per_lr[lr]["median"])
    return dict(per_lr=per_lr, best_lr=best, score=per_lr[best]["median"])


def markdown(rows: Sequence[dict]) -> str:
    """A table with one row per (model, task): the best learning rate's median score and every lr's median."""
    lines = ["| model | task | metric | score (median over seeds of max over checkpoints) | best lr | "
             "median per lr |", "|---|---|---|---|---|---|"]
    for r in rows:
        per_lr = ", ".join(f"{lr:g}: {v['median']:.4f}" for lr, v in sorted(r["per_lr"].items()))
        lines.append(f"| {r['model']} | {r['task']} | {r['metric']} | {r['score']:.4f} | {r['best_lr']:g} | "
                     f"{per_lr} |")
    return "\n".join(lines) + "\n"
