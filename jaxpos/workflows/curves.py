"""`jaxpos curves`: the training and held-out loss (or another logged metric) of several runs, in one figure and
one table, read from the TensorBoard event files every training run writes to WORKDIR/tensorboard."""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

from jaxpos.training.metrics import read_scalars


@dataclasses.dataclass
class RunCurve:
    """One run's row of the table: its last logged step and, for `metric`, the last training value, the last and
    best held-out values (None where the run logged none)."""

    name: str
    step: int
    train_last: float | None
    eval_last: float | None
    eval_best: float | None
    eval_best_step: int | None


def run_names(workdirs: Sequence[str]) -> list[str]:
    """Each workdir's last path component, or the whole path where two would share it."""
    names = [os.path.basename(os.path.normpath(w)) for w in workdirs]
    return [w if names.count(n) > 1 else n for w, n in zip(workdirs, names)]


def summarize(name: str, scalars: dict, metric: str = "loss", higher_is_better: bool = False) -> RunCurve:
    """The table row of one run's scalars ({tag: {step: value}})."""
    train, held_out = scalars.get(f"train/{metric}", {}), scalars.get(f"eval/{metric}", {})
    steps = [s for values in scalars.values() for s in values]
    best = max if higher_is_better else min  # over the sorted steps: the earliest of equal values
    best_step = best(sorted(held_out), key=held_out.get) if held_out else None
    return RunCurve(name, max(steps) if steps else 0, train[max(train)] if train else None,
                    held_out[max(held_out)] if held_out else None, held_out[best_step] if held_out else None,
                    best_step)


def compare_runs(workdirs: Sequence[str], out: str, metric: str = "loss") -> list[RunCurve]:
    """Draws `metric` of every run in WORKDIRS (training and held-out panels) to OUT (a PNG); returns the rows of
    the table. Accuracy-like metrics (accuracy, bleu and GLUE scores) rank higher values best."""
    from jaxpos.analysis.plots import plot_curves  # lazy: matplotlib costs ~1 s at import

    if not workdirs:
        raise ValueError("give at least one workdir")
    runs = dict(zip(run_names(workdirs), (read_scalars(w) for w in workdirs)))
    if not any(f"{split}/{metric}" in s for s in runs.values() for split in ("train", "eval")):
        logged = sorted({tag.split("/", 1)[1] for s in runs.values() for tag in s if "/" in tag})
        raise ValueError(f"no run logged {metric!r}; logged: {', '.join(logged)}")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    plot_curves(runs, out, metric)
    higher = metric not in ("loss", "perplexity", "grad_norm", "step_time")
    return [summarize(name, scalars, metric, higher) for name, scalars in runs.items()]


def curves_table(rows: Sequence[RunCurve], metric: str = "loss") -> str:
    """The rows as a plain-text table."""
    def show(value, digits=4):
        return "-" if value is None else f"{value:.{digits}f}"

    width = max(12, *(len(r.name) for r in rows))
    lines = [f"{'run':<{width}} {'step':>7} {'train ' + metric:>14} {'held-out ' + metric:>17} "
             f"{'best held-out':>14} {'at step':>8}"]
    for r in rows:
        lines.append(f"{r.name:<{width}} {r.step:>7} {show(r.train_last):>14} {show(r.eval_last):>17} "
                     f"{show(r.eval_best):>14} {'-' if r.eval_best_step is None else r.eval_best_step:>8}")
    return "\n".join(lines)
