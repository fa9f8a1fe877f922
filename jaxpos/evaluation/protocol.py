"""The papers' fine-tuning protocol as one command: for each model and task, runs over seeds x learning rates;
a run's score is the maximum dev score over its evaluations (checkpoints), a learning rate's score the median of
that over seeds (DIET Table 2: "median of the maximum over all checkpoints among five runs"), and the best
learning rate is reported. Writes sweep.json and sweep.md per model and task, and OUT/sweep.md for all of them.

NaN policy: a diverged evaluation (a NaN score, as the metrics give for NaN predictions) counts as the worst score,
so no result depends on the order of evaluations, seeds or learning rates. NaN never wins a maximum (a run whose
evaluations are all NaN scores NaN); a learning rate's median ranks NaN seeds below every number (it is NaN only
when a middle value is); the best learning rate is the highest median, the smallest rate among equals.
"""

from __future__ import annotations

import json
import math
import os
from typing import Callable, Iterable, Mapping, Sequence, TypeVar

import numpy as np

T = TypeVar("T")


def run_dir(out: str, model: str, task: str, lr: float, seed: int) -> str:
    return os.path.join(out, model, task, f"lr{lr:g}_seed{seed}")


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


def _write(path: str, row: dict) -> None:
    with open(path + ".json", "w") as f:
        json.dump(dict(row, per_lr={f"{lr:g}": v for lr, v in row["per_lr"].items()}), f, indent=2)
    with open(path + ".md", "w") as f:
        f.write(markdown([row]))


def sweep(config_spec: str, inits: Mapping[str, str], tasks: Sequence[str], seeds: Sequence[int],
          learning_rates: Sequence[float], out: str, overrides: Sequence[str] = (), log: bool = True) -> list[dict]:
    """Fine-tunes every model in `inits` ({name: --init path}) on every task with every (lr, seed), each in its own
    workdir under OUT (a finished run is not repeated; an unfinished one resumes). Returns one row per (model,
    task) with the protocol's score."""
    from jaxpos.config.files import apply_overrides, load_config
    from jaxpos.data.classification import task_spec
    from jaxpos.training.finetune_main import REPORT_FILE, finetune, read_evals

    if not seeds or not learning_rates:
        raise ValueError("the sweep needs at least one seed and one learning rate")
    rows = []
    for name, init in inits.items():
        for task in tasks:
            spec = task_spec(task)
            split, metric = spec.dev_splits[0], spec.metrics[0]
            maxima: dict[float, dict[int, float]] = {}
            for lr in learning_rates:
                for seed in seeds:
                    workdir = run_dir(out, name, task, lr, seed)
                    if not os.path.isfile(os.path.join(workdir, REPORT_FILE)):  # written when a run ends
                        config = apply_overrides(load_config(config_spec), list(overrides))
                        config.data.task = task
                        config.train.learning_rate = float(lr)
                        config.train.seed = config.data.seed = int(seed)
                        print(f"--- sweep: {name} {task} lr={lr:g} seed={seed} -> {workdir}", flush=True)
                        finetune(config, init, workdir, log=log)
                    maxima.setdefault(lr, {})[seed] = run_score(read_evals(workdir), split, metric)
            row = dict(model=name, task=task, metric=f"{split} {metric}", **summarize(maxima))
            _write(os.path.join(out, name, task, "sweep"), row)
            rows.append(row)
    with open(os.path.join(out, "sweep.md"), "w") as f:
        f.write(markdown(rows))
    return rows

