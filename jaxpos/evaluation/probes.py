"""Word-order probes (Chen et al. 2021, section 5, Table 3): a fine-tuned model's accuracy on variants of a dev set
whose first sentences have local swaps (window x = 2..5) or global swaps, and the drop from the original; on a
paraphrase task, the share of globally swapped paraphrases still called paraphrases (`swapped_paraphrase_share`).

A model that ignores word order loses nothing; the larger the drop, the more the task accuracy rests on order.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from jaxpos.data.word_order import perturb_examples

WINDOWS = (2, 3, 4, 5)


def variant_names(windows: Sequence[int] = WINDOWS) -> list[tuple[str, str, int]]:
    """(name, kind, window) of each perturbation: local_2 ... local_5, then global."""
    return [(f"local_{x}", "local", x) for x in windows] + [("global", "global", 0)]


def word_order_drops(accuracy: Callable[[list], float], examples: list, windows: Sequence[int] = WINDOWS,
                     seed: int = 0) -> dict:
    """{"original": acc, "variants": {name: {"accuracy": acc, "drop": original - acc}}} for `accuracy`, a
    function from a list of Examples to an accuracy."""
    original = float(accuracy(examples))
    variants = {}
    for name, kind, window in variant_names(windows):
        value = float(accuracy(perturb_examples(examples, kind, window, seed)))
        variants[name] = dict(accuracy=value, drop=original - value)
    return dict(original=original, variants=variants)


def swapped_paraphrase_share(predictions) -> float:
    """Chen et al.'s global-swap probe on a paraphrase task: the share of globally swapped paraphrase pairs (the
    "global" set of `jaxpos.data.paraphrase.probe_sets`) that the model still calls paraphrases (class 1).
    `predictions`: [N] class ids, or [N, 2] logits or probabilities. 1 for a model blind to the swap."""
    predictions = np.asarray(predictions)
    if predictions.ndim == 2:
        predictions = predictions.argmax(-1)
    if predictions.ndim != 1 or not len(predictions):
        raise ValueError(f"predictions of shape {predictions.shape}: give [N] class ids or [N, 2] logits, N > 0")
    return float(np.mean(predictions == 1))


def markdown(result: dict) -> str:
    """A table of the accuracy on the original and on every variant, and each variant's drop."""
    names = list(result["variants"])
    lines = ["| | original | " + " | ".join(names) + " |", "|---" * (len(names) + 2) + "|",
             f"| accuracy | {result['original']:.4f} | "
             + " | ".join(f"{result['variants'][n]['accuracy']:.4f}" for n in names) + " |",
             "| drop | | " + " | ".join(f"{result['variants'][n]['drop']:+.4f}" for n in names) + " |"]
    return "\n".join(lines) + "\n"
