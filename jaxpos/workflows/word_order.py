"""`jaxpos evaluate --word-order N`: masked-LM runs asked about word order without fine-tuning. Each scores the
first N pairs (one per couple) of the offline word-order task's dev split: the side a couple swaps, as it is and
swapped (jaxpos.evaluation.pseudo_likelihood), less the couples whose two sides the run's tokenizer splits into
different pieces (a model without positions could tell those apart); each run's numbers go to
WORKDIR/word_order.json."""

from __future__ import annotations

import json
from typing import Sequence

from jaxpos.config.files import write_run_file
from jaxpos.data.classification import ExampleStats, jaxpos_tokenizer, keep_same_pieces
from jaxpos.data.paraphrase import bible_order_minimal_pairs
from jaxpos.evaluation.pseudo_likelihood import minimal_pair_preference
from jaxpos.run import Run

WORD_ORDER_FILE = "word_order.json"


def word_order_preference(workdirs: Sequence[str], pairs: int, batch_size: int = 256) -> dict[str, dict]:
    """{run name: minimal_pair_preference's dict, with "workdir", "mechanism" and "unequal_pieces" (couples left
    out)} of each masked-LM run in WORKDIRS on the first `pairs` minimal pairs of the bible_order dev split (the
    task's default editions and seed) whose two sides the run's tokenizer splits into the same pieces."""
    if pairs < 1:
        raise ValueError(f"--word-order {pairs}: give at least one pair")
    runs = [Run.open(workdir, "mlm") for workdir in workdirs]  # every workdir checked before the corpus is read
    results = {}
    for workdir, run in zip(workdirs, runs):
        left_out = ExampleStats()
        texts = bible_order_minimal_pairs("dev", num_examples=2 * pairs,
                                          keep=keep_same_pieces(jaxpos_tokenizer(run.tokenizer()), stats=left_out))
        result = dict(minimal_pair_preference(run, texts, batch_size=batch_size),
                      unequal_pieces=left_out.dropped_unequal_pieces)
        write_run_file(workdir, WORD_ORDER_FILE, json.dumps(result, indent=1))
        name = run.name if run.name not in results else run.location
        results[name] = dict(result, workdir=workdir, mechanism=run.model_config.position.kind)
    return results


def word_order_table(results: dict[str, dict]) -> str:
    """A markdown table: a row per run with the share of pairs it prefers as they are and its interval."""
    lines = ["| run | position | step | pairs | prefers the original | Wilson 95% | ties | mean difference (nats) |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['mechanism']} | {r['step']} | {r['pairs']} | {r['accuracy']:.3f} | "
                     f"{r['low']:.3f}-{r['high']:.3f} | {r['ties']} | {r['mean_difference']:+.2f} |")
    left_out = {name: r["too_long"] for name, r in results.items() if r["too_long"]}
    notes = [f"{name}: {n} pairs longer than the model's positions left out" for name, n in left_out.items()]
    notes += [f"{name}: {r['unequal_pieces']} couples left out, their two sides split into different pieces"
              for name, r in results.items() if r.get("unequal_pieces")]
    return "\n".join(lines + ["", "a model without positions ties every pair: 0.5", *notes]) + "\n"
