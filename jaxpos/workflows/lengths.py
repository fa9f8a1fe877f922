"""`jaxpos evaluate --lengths`: masked-LM runs scored at several lengths (jaxpos.evaluation.lengths), each run's
numbers in WORKDIR/lengths.json and every run's loss against length in one figure."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Sequence

from etils import epath

from jaxpos.config.files import write_run_file
from jaxpos.evaluation.lengths import evaluate_lengths
from jaxpos.run import Run

LENGTHS_FILE = "lengths.json"


def length_generalisation(workdirs: Sequence[str], lengths: Sequence[int], figure: str | None = None,
                          batch_size: int = 8, max_tokens: int = 0) -> dict[str, dict]:
    """{run name: evaluate_lengths's dict} of each masked-LM run in WORKDIRS (its lengths.json written beside its
    checkpoints), and the figure of every run's loss against length at `figure` (default: the first run's
    WORKDIR/lengths.png)."""
    from jaxpos.analysis.plots import plot_lengths  # lazy: matplotlib, for the figure only

    results = {}
    for workdir in workdirs:
        run = Run.open(workdir, "mlm")
        result = evaluate_lengths(run, lengths, batch_size, max_tokens)
        write_run_file(workdir, LENGTHS_FILE, json.dumps(result, indent=1))
        name = run.name if run.name not in results else run.location
        results[name] = dict(result, workdir=workdir, mechanism=run.model_config.position.kind)
    target = epath.Path(figure or epath.Path(workdirs[0]) / "lengths.png")
    with tempfile.TemporaryDirectory() as scratch:  # matplotlib writes local files; epath copies them anywhere
        local = plot_lengths(results, os.path.join(scratch, "lengths.png"))
        target.write_bytes(epath.Path(local).read_bytes())
    for result in results.values():
        result["figure"] = os.fspath(target)
    return results


def lengths_table(results: dict[str, dict]) -> str:
    """A markdown table: a row per run, a column per length, `loss / accuracy` or the reason it did not run."""
    lengths = sorted({e["length"] for r in results.values() for e in r["lengths"]})
    lines = ["| run | trained at | " + " | ".join(f"{n} tokens" for n in lengths) + " |",
             "|---|---|" + "---|" * len(lengths)]
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
        lines.append(f"| {name} | {result['train_length']} | " + " | ".join(cells) + " |")
    return "\n".join(lines + ["", "loss / accuracy of the held-out masked tokens", *notes]) + "\n"
