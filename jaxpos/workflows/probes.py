"""`jaxpos probe-word-order`: the word-order probes (jaxpos.evaluation.probes) of a fine-tuned classification run."""

from __future__ import annotations

import json
import os
from typing import Sequence

from jaxpos.data.classification import load_examples
from jaxpos.evaluation.probes import WINDOWS, markdown, word_order_drops
from jaxpos.workflows.finetune import load_finetuned

PROBE_FILE = "word_order_probe"  # WORKDIR/word_order_probe.json and .md


def probe_word_order(workdir: str, split: str | None = None, windows: Sequence[int] = WINDOWS, seed: int = 0,
                     overrides: Sequence[str] = ()) -> dict:
    """The probe on a fine-tuned classification run's split (default: its first dev split); writes
    WORKDIR/word_order_probe.json and .md. Returns what the .json holds: original, variants, task, split,
    examples, step, seed, position."""
    run = load_finetuned(workdir, overrides)
    if run.spec.num_labels == 1 or "accuracy" not in run.spec.metrics:
        raise ValueError(f"the word-order probe measures accuracy; task {run.spec.name!r} has "
                         f"{', '.join(run.spec.metrics)}")
    if run.spec.name == "word_order":
        raise ValueError("the word_order task's labels are about word order, so perturbing its sentences changes "
                         "their labels; probe a task such as mrpc, rte or snli")
    split = split or run.spec.dev_splits[0]
    examples = load_examples(run.config.data, split)
    result = word_order_drops(lambda ex: run.evaluate(ex)["accuracy"], examples, windows, seed)
    result.update(task=run.spec.name, split=split, examples=len(examples), step=run.step, seed=seed,
                  position=run.config.model.position.kind)
    path = os.path.join(workdir, PROBE_FILE)
    with open(path + ".json", "w") as f:
        json.dump(result, f, indent=2)
    with open(path + ".md", "w") as f:
        f.write(markdown(result))
    return result
