"""`jaxpos finetune-sweep`: the papers' fine-tuning protocol as one command. For each model and task, a run per
seed and learning rate, scored by jaxpos.evaluation.protocol; writes sweep.json and sweep.md per model and task, and
OUT/sweep.md for all of them."""

from __future__ import annotations

import json
import os
from typing import Mapping, Sequence

from jaxpos.config.files import apply_overrides, load_config
from jaxpos.data.classification import task_spec
from jaxpos.evaluation.protocol import markdown, run_score, summarize
from jaxpos.progress import status
from jaxpos.workflows.finetune import REPORT_FILE, finetune, read_evals


def run_dir(out: str, model: str, task: str, lr: float, seed: int) -> str:
    return os.path.join(out, model, task, f"lr{lr:g}_seed{seed}")


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
                        status(f"--- sweep: {name} {task} lr={lr:g} seed={seed} -> {workdir}")
                        finetune(config, init, workdir, log=log)
                    maxima.setdefault(lr, {})[seed] = run_score(read_evals(workdir), split, metric)
            row = dict(model=name, task=task, metric=f"{split} {metric}", **summarize(maxima))
            _write(os.path.join(out, name, task, "sweep"), row)
            rows.append(row)
    with open(os.path.join(out, "sweep.md"), "w") as f:
        f.write(markdown(rows))
    return rows
