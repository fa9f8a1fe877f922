"""TFDS glue/<task> or snli prepared as array_record in data_dir, read without TensorFlow through
`tfds.data_source` (nothing is downloaded); splits validation* are jaxpos's dev*. Label -1 means none: a GLUE test
example (label = NaN) or an SNLI pair without a gold label (dropped)."""

from __future__ import annotations

from jaxpos.data.classification.tasks import TASKS, ExampleStats
from jaxpos.data.examples import Example
from jaxpos.data.tfds_records import record_value, tfds_records


# task -> (text_a feature, text_b feature); labels are the `label` feature (-1: none)
_TFDS_FIELDS = {
    "cola": ("sentence", None), "sst2": ("sentence", None), "mrpc": ("sentence1", "sentence2"),
    "qqp": ("question1", "question2"), "stsb": ("sentence1", "sentence2"), "mnli": ("premise", "hypothesis"),
    "qnli": ("question", "sentence"), "rte": ("sentence1", "sentence2"), "wnli": ("sentence1", "sentence2"),
    "snli": ("premise", "hypothesis"),
}
_TFDS_SPLITS = {"train": "train", "dev": "validation", "dev_matched": "validation_matched",
                "dev_mismatched": "validation_mismatched", "test": "test", "test_mismatched": "test_mismatched"}


def tfds_name_of(data_cfg) -> str:
    """data.tfds_name, or the task's TFDS dataset: glue/<task>, snli."""
    return data_cfg.tfds_name or ("snli" if data_cfg.task == "snli" else f"glue/{data_cfg.task}")


def _feature(record: dict, field: str, name: str):
    if field not in record:
        raise KeyError(f"TFDS dataset {name!r} has no feature {field!r}; its records have {sorted(record)}")
    return record_value(record[field])


def tfds_examples(name: str, task: str, split: str, data_dir: str | None, stats: ExampleStats | None = None,
                  read_threads: int = 8) -> list[Example]:
    """Examples of a TFDS GLUE/SNLI split prepared as array_record (nothing is downloaded), in index order."""
    stats = stats if stats is not None else ExampleStats()
    tfds_split = _TFDS_SPLITS[split]
    if task == "mnli" and split == "test":
        tfds_split = "test_matched"
    field_a, field_b = _TFDS_FIELDS[task]
    spec = TASKS[task]

    def convert(record):
        return (str(_feature(record, field_a, name)), None if field_b is None else str(_feature(record, field_b, name)),
                float(_feature(record, "label", name)))

    try:
        reader = tfds_records(name, tfds_split, data_dir, convert, read_threads=read_threads)
    except Exception as err:  # TFDS lists every registered dataset here: keep its first line
        first_line = str(err).strip().split("\n")[0]
        raise ValueError(f"TFDS {name} {tfds_split!r} cannot be read from data_dir={data_dir or '(TFDS default)'} "
                         f"(prepare it as array_record there first): {first_line}") from err
    examples = []
    for index, (text_a, text_b, label) in enumerate(reader):
        if label == -1 and task == "snli":
            stats.dropped_no_gold += 1
            continue
        if label == -1 and split.startswith("test"):
            label = float("nan")  # GLUE test sets are unlabelled
        elif not (spec.num_labels == 1 or (label == int(label) and 0 <= label < spec.num_labels)):
            raise ValueError(f"TFDS {name} {tfds_split}[{index}]: label {label:g} is not a class of {task} "
                             f"({spec.num_labels} classes)")
        examples.append(Example(text_a, text_b, label))
    stats.examples += len(examples)
    return examples
