"""Analysis over training: the one-checkpoint diagnostics of `report.analyze` at every saved checkpoint of a
masked-LM run, and their headline numbers against the training step (`jaxpos analyze --checkpoints all`).

OUT/step_<N>/ holds each checkpoint's report.json, arrays.npz and figures exactly as `jaxpos analyze` writes
them for that checkpoint; OUT/over_training.json gathers the headline numbers per step (`series`) and
OUT/over_training.png draws them: Toeplitz R^2 of P = E_P E_P^T, identical-word locality and symmetry, attention
logit rank (with its bounds, the head dim D and the analysis length T), and Muppet term importance at the last layer.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Sequence

import jax
import numpy as np

from jaxpos.analysis.loading import AnalyzedModel
from jaxpos.analysis.plots import plot_over_training
from jaxpos.analysis.report import analyze
from jaxpos.run import Run

OVER_TRAINING_FILE = "over_training.json"
# The diagnostics whose headline numbers are drawn against the step (the others are still computed if asked).
PLOTTED = ("position_gram", "identical_word", "rank", "decomposition")


def select_steps(spec: str, available: Sequence[int]) -> list[int]:
    """'all' -> every available step; '100,200' -> those steps, each of which must be available."""
    if spec.strip() == "all":
        return list(available)
    try:
        steps = sorted({int(s) for s in spec.split(",") if s.strip()})
    except ValueError as err:
        raise ValueError(f"--checkpoints {spec!r}: give 'all' or a comma-separated list of steps") from err
    missing = [s for s in steps if s not in available]
    if not steps or missing:
        raise ValueError(f"--checkpoints {spec!r}: no checkpoint at step(s) {missing or spec!r}; the run has "
                         f"{', '.join(map(str, available))}")
    return steps


def load_run_at(model: AnalyzedModel, step: int) -> AnalyzedModel:
    """`model` (from `load_run`) with the encoder parameters of its checkpoint `step` (parameters only, onto the
    CPU, the workdir only read): the same restore as `load_run`'s newest checkpoint, limited to that step."""
    if model.info.get("step") == step:
        return model
    step, params = Run.open(model.source, "mlm").params(step)
    params = jax.tree.map(np.asarray, params["bert"])
    return dataclasses.replace(model, params=params, info=dict(model.info, step=step))


def _section(report: dict, name: str) -> dict | None:
    section = report.get(name)
    return None if not isinstance(section, dict) or "skipped" in section else section


def headline(report: dict) -> dict:
    """The numbers of one checkpoint's report drawn against the step (None where a diagnostic did not run or
    does not apply): toeplitz_r2 of P, locality, symmetry, logit_rank_mean / _max, positional_rank_mean,
    importance_last [4] (Muppet i, h, f, c at the last layer), raw_effective_r [lengths],
    identifiability_linear [L+1]."""
    out = dict.fromkeys(("toeplitz_r2", "locality", "symmetry", "logit_rank_mean", "logit_rank_max",
                         "positional_rank_mean", "importance_last", "raw_effective_r", "identifiability_linear"))
    if gram := _section(report, "position_gram"):
        out["toeplitz_r2"] = gram["toeplitz_r2"]
    if probe := _section(report, "identical_word"):
        out["locality"], out["symmetry"] = probe["locality"], probe["symmetry"]
    if rank := _section(report, "rank"):
        out["logit_rank_mean"], out["logit_rank_max"] = rank["logit_rank_mean"], rank["logit_rank_max"]
        positional = rank.get("positional_bias") or rank.get("positional_input")
        if positional:
            out["positional_rank_mean"] = float(np.mean(positional["rank"]))
    if parts := _section(report, "decomposition"):
        out["importance_last"] = list(parts["importance"][-1])
    if effective := _section(report, "effective_attention"):
        out["raw_effective_r"] = effective["correlation"]
    if probes := _section(report, "identifiability"):
        out["identifiability_linear"] = probes["rates"].get("linear")
    return out


def analyze_over_training(newest: AnalyzedModel, out_dir: str, *, sentences: Sequence[Sequence[int]],
                          steps: Sequence[int] | None = None, only: Sequence[str] | None = None,
                          num_probe_words: int = 100, probe_length: int = 128, **options) -> dict:
    """`report.analyze` at each checkpoint `steps` (default: all) of the run that `newest = load_run(WORKDIR)`
    came from, into OUT/step_<N>/; then OUT/over_training.json ({"steps": [S], "series": {name: [S values]},
    "reports": {step: path}}) and the figure OUT/over_training.png. `sentences`, `only` and the options are
    those of `analyze`."""
    if newest.info.get("kind") != "jaxpos run":
        raise ValueError(f"{newest.source} is not a jaxpos run: analysis over training reads its checkpoints")

    workdir = newest.source
    run = Run.open(workdir, "mlm")
    available = run.steps()
    steps = list(available if steps is None else steps)
    missing = [s for s in steps if s not in available]
    if not steps or missing:
        raise ValueError(f"no checkpoint at step(s) {missing or steps} in {workdir}/checkpoints; it has "
                         f"{', '.join(map(str, available))}")
    os.makedirs(out_dir, exist_ok=True)
    reports, paths = {}, {}
    for step in sorted(steps):
        folder = os.path.join(out_dir, f"step_{step}")
        reports[step] = analyze(load_run_at(newest, step), folder, sentences=sentences, only=only,
                                num_probe_words=num_probe_words, probe_length=probe_length, **options)
        paths[step] = os.path.relpath(os.path.join(folder, "report.json"), out_dir)
    per_step = [headline(reports[s]) for s in sorted(reports)]
    series = {name: [h[name] for h in per_step] for name in per_step[0]}
    cfg = newest.cfg
    result = dict(model=dict(name=newest.name, source=run.location, position=cfg.position.kind,
                             head_dim=cfg.head_dim, num_layers=cfg.num_layers),
                  steps=sorted(reports), series=series, reports={str(s): p for s, p in paths.items()},
                  figure="over_training.png" if options.get("figures", True) else None)
    if result["figure"]:
        # The rank panel marks both bounds, D and the window length T the ranks were taken at (the same every step).
        rank_lengths = {rank["length"] for rank in (_section(r, "rank") for r in reports.values()) if rank}
        plot_over_training(result["steps"], series, os.path.join(out_dir, result["figure"]),
                           head_dim=cfg.head_dim, title=f"{newest.name} ({cfg.position.kind}) over training",
                           length=max(rank_lengths) if rank_lengths else None)
    with open(os.path.join(out_dir, OVER_TRAINING_FILE), "w") as f:
        json.dump(result, f, indent=1, allow_nan=False)
    return result
