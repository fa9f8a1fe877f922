"""The fine-tuning tasks (GLUE, SNLI and the offline ones): labels, metrics and splits of each, and the counters of
one split's loading."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    name: str
    num_labels: int  # 1 = regression (STS-B)
    label_names: tuple[str, ...]
    metrics: tuple[str, ...]  # jaxpos.evaluation.metrics names; the first is the task's main score
    pair: bool  # sentence pairs?
    dev_splits: tuple[str, ...]
    test_splits: tuple[str, ...] = ("test",)  # MNLI: ("test", "test_mismatched"); "test" = test_matched
    offline: bool = False  # built by jaxpos (data.source='offline'), not read from GLUE files or TFDS

    @property
    def splits(self) -> tuple[str, ...]:
        return ("train", *self.dev_splits, *self.test_splits)


# Main scores as in BERT's GLUE table: F1 for MRPC and QQP, Spearman for STS-B, Matthews for CoLA, else accuracy.
TASKS: dict[str, TaskSpec] = {spec.name: spec for spec in (
    TaskSpec("cola", 2, ("unacceptable", "acceptable"), ("matthews", "accuracy"), False, ("dev",)),
    TaskSpec("sst2", 2, ("negative", "positive"), ("accuracy",), False, ("dev",)),
    TaskSpec("mrpc", 2, ("not_equivalent", "equivalent"), ("f1", "accuracy", "accuracy_f1_mean"), True, ("dev",)),
    TaskSpec("qqp", 2, ("not_duplicate", "duplicate"), ("f1", "accuracy", "accuracy_f1_mean"), True, ("dev",)),
    TaskSpec("stsb", 1, ("similarity",), ("spearman", "pearson", "pearson_spearman_mean"), True, ("dev",)),
    TaskSpec("mnli", 3, ("entailment", "neutral", "contradiction"), ("accuracy",), True,
             ("dev_matched", "dev_mismatched"), ("test", "test_mismatched")),
    TaskSpec("qnli", 2, ("entailment", "not_entailment"), ("accuracy",), True, ("dev",)),
    TaskSpec("rte", 2, ("entailment", "not_entailment"), ("accuracy",), True, ("dev",)),
    TaskSpec("wnli", 2, ("not_entailment", "entailment"), ("accuracy",), True, ("dev",)),
    TaskSpec("snli", 3, ("entailment", "neutral", "contradiction"), ("accuracy",), True, ("dev",)),
    TaskSpec("word_order", 3, ("original", "local_shuffle", "global_swap"), ("accuracy",), False, ("dev",),
             offline=True),
    TaskSpec("bible_paraphrase", 2, ("not_paraphrase", "paraphrase"), ("accuracy", "f1"), True, ("dev",),
             offline=True),
    TaskSpec("bible_order", 2, ("swapped", "same_meaning"), ("accuracy", "f1"), True, ("dev",), offline=True),
)}


def task_spec(name: str) -> TaskSpec:
    """The spec of task `name`; ValueError naming the tasks for an unknown one."""
    if name not in TASKS:
        raise ValueError(f"unknown fine-tuning task {name!r}; choose one of {', '.join(TASKS)}")
    return TASKS[name]


@dataclasses.dataclass
class ExampleStats:
    """Counters of one split's loading."""

    examples: int = 0  # examples kept
    dropped_no_gold: int = 0  # SNLI pairs the annotators did not agree on
    dropped_corrupt: int = 0  # TSV rows with missing fields or an empty label
    dropped_unequal_pieces: int = 0  # bible_order couples whose two members the tokenizer splits differently
