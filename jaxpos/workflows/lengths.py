"""`jaxpos evaluate --lengths`: masked-LM runs scored at several lengths (jaxpos.evaluation.lengths), each run's
numbers in WORKDIR/lengths.json and every run's loss against length in one figure. A RoPE run may be scored under
another length rule (`rope_rule_run`), which changes no parameter; its numbers then go to a file named by the rule."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from typing import Sequence

import ml_collections
from etils import epath

from jaxpos.config import ModelConfig
from jaxpos.config.files import apply_overrides, write_run_file
from jaxpos.config.model import ROPE_RULE_FIELDS, RopeConfig
from jaxpos.evaluation.lengths import evaluate_lengths
from jaxpos.run import Run

LENGTHS_FILE = "lengths.json"
ROPE_RULE_OVERRIDES = tuple(f"config.model.position.rope.{field}" for field in ROPE_RULE_FIELDS)


def rope_rule_run(run: Run, overrides: Sequence[str]) -> Run:
    """RUN with RoPE's length rule changed by `overrides` (`--config.model.position.rope.FIELD=value`, FIELD one of
    ROPE_RULE_FIELDS: none changes a parameter). Raises ValueError for any other field or a run without RoPE."""
    if not overrides:
        return run
    bad = [o for o in overrides if o.lstrip("-").partition("=")[0] not in ROPE_RULE_OVERRIDES]
    if bad:
        raise ValueError(f"a trained run is scored as it trained, except for RoPE's length rule (no parameter "
                         f"changes): --config.model.position.rope.{{{','.join(ROPE_RULE_FIELDS)}}}=VALUE only, "
                         f"got {' '.join(bad)}")
    model = run.config.model
    if model.position.kind != "rope":
        raise ValueError(f"{run.workdir} is a {model.position.kind!r} run: --config.model.position.rope.* sets "
                         "RoPE's length rule, for rope runs only")
    # Typed from the run's own values (a config.json older than these fields lacks them); a float field written
    # as an integer still takes a fraction.
    values = {f.name: getattr(model.position.rope, f.name) for f in dataclasses.fields(RopeConfig)}
    values.update({f.name: float(values[f.name]) for f in dataclasses.fields(RopeConfig) if f.type == "float"})
    block = ml_collections.ConfigDict({"model": {"position": {"rope": values}}})
    rope = RopeConfig(**apply_overrides(block, list(overrides)).model.position.rope.to_dict())
    return dataclasses.replace(run, config=run.config.replace_model(
        position=dataclasses.replace(model.position, rope=rope)))


def positions_text(cfg: ModelConfig) -> str:
    """The mechanism, and RoPE's length rule where it has one: "tisa", "rope", "rope, yarn ×4, L₀ 512"."""
    position = cfg.position
    rule = position.rope.rule(position.rope.original_max_length or cfg.max_length)
    return position.kind if position.kind != "rope" or rule == "none" else f"rope, {rule}"


def lengths_file(cfg: ModelConfig, overrides: Sequence[str]) -> str:
    """lengths.json for a run as it trained; under a RoPE rule given at evaluation, lengths_<rule>_x<factor>.json."""
    rope = cfg.position.rope
    return f"lengths_{rope.scaling}_x{rope.factor:g}.json" if overrides else LENGTHS_FILE


def length_generalisation(workdirs: Sequence[str], lengths: Sequence[int], figure: str | None = None,
                          batch_size: int = 8, max_tokens: int = 0, overrides: Sequence[str] = ()
                          ) -> dict[str, dict]:
    """{run name: evaluate_lengths's dict} of each masked-LM run in WORKDIRS (its numbers written beside its
    checkpoints, `lengths_file`), and the figure of every run's loss against length at `figure` (default: the first
    run's WORKDIR/lengths.png). `overrides`: RoPE's length rule for every run (`rope_rule_run`); each result names
    the positions it was scored with ("positions"; RoPE runs' whole block under "rope")."""
    from jaxpos.analysis.plots import plot_lengths  # lazy: matplotlib, for the figure only

    runs = [rope_rule_run(Run.open(workdir, "mlm"), overrides) for workdir in workdirs]  # refused before any work
    results = {}
    for workdir, run in zip(workdirs, runs):
        cfg = run.model_config
        result = evaluate_lengths(run, lengths, batch_size, max_tokens)
        result["positions"] = positions_text(cfg)
        if cfg.position.kind == "rope":
            result["rope"] = dict(dataclasses.asdict(cfg.position.rope),
                                  original_max_length=cfg.position.rope.original_max_length or cfg.max_length)
        name = lengths_file(cfg, overrides)
        write_run_file(workdir, name, json.dumps(result, indent=1))
        key = run.name if run.name not in results else run.location
        results[key] = dict(result, workdir=workdir, mechanism=cfg.position.kind, file=name)
    target = epath.Path(figure or epath.Path(workdirs[0]) / "lengths.png")
    with tempfile.TemporaryDirectory() as scratch:  # matplotlib writes local files; epath copies them anywhere
        local = plot_lengths(results, os.path.join(scratch, "lengths.png"))
        target.write_bytes(epath.Path(local).read_bytes())
    for result in results.values():
        result["figure"] = os.fspath(target)
    return results


def lengths_table(results: dict[str, dict]) -> str:
    """A markdown table: a row per run with the positions it was scored with (RoPE's length rule), a column per
    length, `loss / accuracy` or the reason it did not run."""
    lengths = sorted({e["length"] for r in results.values() for e in r["lengths"]})
    lines = ["| run | positions | trained at | " + " | ".join(f"{n} tokens" for n in lengths) + " |",
             "|---|---|---|" + "---|" * len(lengths)]
    notes = []
    for name, result in results.items():
        by_length = {e["length"]: e for e in result["lengths"]}
        cells = []
        for n in lengths:
            entry = by_length.get(n)
            if entry is None:
                cells.append("")
            elif "skipped" in entry:
                cells.append("cannot run")
                if f"{name}: {entry['skipped']}" not in notes:
                    notes.append(f"{name}: {entry['skipped']}")
            else:
                cells.append(f"{entry['loss']:.3f} / {entry['accuracy']:.3f}")
        lines.append(f"| {name} | {result['positions']} | {result['train_length']} | " + " | ".join(cells) + " |")
    return "\n".join(lines + ["", "loss / accuracy of the held-out masked tokens", *notes]) + "\n"
