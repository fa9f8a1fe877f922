"""`jaxpos probe-word-order`: the word-order probes (jaxpos.evaluation.probes) of a fine-tuned classification run;
Chen et al.'s probe of a run fine-tuned on the paraphrase task (`paraphrase_probe`)."""

from __future__ import annotations

import json
import os
from typing import Sequence

import numpy as np

from jaxpos.data.classification import load_examples
from jaxpos.data.paraphrase import PARAPHRASE, probe_sets
from jaxpos.evaluation.probes import WINDOWS, markdown, swapped_paraphrase_share, word_order_drops
from jaxpos.workflows.finetune import load_finetuned

PROBE_FILE = "word_order_probe"  # WORKDIR/word_order_probe.json and .md
ORDER_LABELLED_TASKS = ("word_order", "bible_order")  # tasks whose labels a perturbation of word order changes


def probe_word_order(workdir: str, split: str | None = None, windows: Sequence[int] = WINDOWS, seed: int = 0,
                     overrides: Sequence[str] = ()) -> dict:
    """The probe on a fine-tuned classification run's split (default: its first dev split); writes
    WORKDIR/word_order_probe.json and .md. Returns what the .json holds: original, variants, task, split,
    examples, step, seed, position."""
    run = load_finetuned(workdir, overrides)
    if run.spec.num_labels == 1 or "accuracy" not in run.spec.metrics:
        raise ValueError(f"the word-order probe measures accuracy; task {run.spec.name!r} has "
                         f"{', '.join(run.spec.metrics)}")
    if run.spec.name in ORDER_LABELLED_TASKS:
        raise ValueError(f"the {run.spec.name} task's labels are about word order, so perturbing its sentences "
                         "changes their labels; probe a task such as mrpc, rte, snli or bible_paraphrase")
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


def paraphrase_probe(run, examples: Sequence, windows: Sequence[int] = WINDOWS, min_distance: int = 5,
                     seed: int = 0) -> dict:
    """Chen et al.'s probe as their paper runs it, on a run fine-tuned for bible_paraphrase (`run`, a
    `load_finetuned` result) and a split's `examples`: accuracy on the pairs and on each local_x set (sentence A
    shuffled inside windows of x words, labels kept), and the share of globally swapped paraphrases the run still
    calls paraphrases (`jaxpos.data.paraphrase.probe_sets`), beside the share of the unswapped ones it calls so.
    Returns {"original", "variants": {local_x: {"accuracy", "drop", "examples"}}, "local_drop" (mean drop),
    "swapped_paraphrase_share", "paraphrase_share", "global_examples"}."""
    if run.spec.name != "bible_paraphrase":
        raise ValueError(f"the paraphrase probe needs a run fine-tuned on bible_paraphrase, not {run.spec.name!r}")
    sets = probe_sets(examples, windows, min_distance, seed)
    if not sets["global"]:
        raise ValueError(f"none of the {len(examples)} pairs has two content words {min_distance} apart to swap")
    original = run.evaluate(list(examples))["accuracy"]
    variants = {}
    for name in (f"local_{x}" for x in windows):
        accuracy = run.evaluate(sets[name])["accuracy"] if sets[name] else float("nan")
        variants[name] = dict(accuracy=accuracy, drop=original - accuracy, examples=len(sets[name]))
    swapped = swapped_paraphrase_share(run.predict(sets["global"])[0])
    paraphrases = [example for example in examples if example.label == PARAPHRASE]
    drops = [v["drop"] for v in variants.values() if v["examples"]]
    return dict(original=original, variants=variants, local_drop=float(np.mean(drops)) if drops else float("nan"),
                swapped_paraphrase_share=swapped, global_examples=len(sets["global"]),
                paraphrase_share=swapped_paraphrase_share(run.predict(paraphrases)[0]), examples=len(examples),
                seed=seed)
