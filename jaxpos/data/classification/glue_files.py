"""A local GLUE folder as download_glue_data.py writes it: CoLA/, SST-2/, MRPC/, QQP/, STS-B/, MNLI/, QNLI/, RTE/,
WNLI/ (and SNLI/ with its {train,dev,test}.tsv, or the snli_1.0_{split}.txt files), each with train.tsv, dev.tsv
(MNLI: dev_matched.tsv, dev_mismatched.tsv) and test.tsv. Tab-separated with quoting off (csv.QUOTE_NONE), as the
official readers; columns found by header name, except the header-less CoLA train/dev files (source, label,
original label, sentence).

Test files have no label column: label = NaN there. SNLI pairs without a gold label ("-") are dropped, as usual.
Rows with missing fields or an empty label are dropped as TFDS's GLUE reader drops them (a few QQP rows); both are
counted in `ExampleStats` and a warning names the file. Any other label outside the task's label set is an error
naming the file and line.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import warnings

import numpy as np

from jaxpos.data.classification.tasks import ExampleStats
from jaxpos.data.examples import Example


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Where a task's TSV files are and which columns hold what."""

    folder: str
    text_a: str
    text_b: str | None
    label: str
    label_values: tuple[str, ...] | None  # the file's label strings, index = class id; None: a float score
    files: dict = dataclasses.field(default_factory=lambda: {s: (f"{s}.tsv",) for s in ("train", "dev", "test")})
    no_header: tuple[str, ...] = ()  # column names of header-less train/dev files (CoLA)
    no_gold: str | None = None  # a label meaning "annotators disagreed": such rows are dropped (SNLI "-")


_NLI = ("entailment", "neutral", "contradiction")
_MNLI_FILES = {"train": ("train.tsv",), "dev_matched": ("dev_matched.tsv",),
               "dev_mismatched": ("dev_mismatched.tsv",), "test": ("test_matched.tsv",),
               "test_mismatched": ("test_mismatched.tsv",)}
_SNLI_FILES = {s: (f"{s}.tsv", f"snli_1.0_{s}.txt") for s in ("train", "dev", "test")}
_LAYOUTS = {
    "cola": _Layout("CoLA", "sentence", None, "label", ("0", "1"),
                    no_header=("source", "label", "original_label", "sentence")),
    "sst2": _Layout("SST-2", "sentence", None, "label", ("0", "1")),
    "mrpc": _Layout("MRPC", "#1 String", "#2 String", "Quality", ("0", "1")),
    "qqp": _Layout("QQP", "question1", "question2", "is_duplicate", ("0", "1")),
    "stsb": _Layout("STS-B", "sentence1", "sentence2", "score", None),
    "mnli": _Layout("MNLI", "sentence1", "sentence2", "gold_label", _NLI, _MNLI_FILES),
    "qnli": _Layout("QNLI", "question", "sentence", "label", ("entailment", "not_entailment")),
    "rte": _Layout("RTE", "sentence1", "sentence2", "label", ("entailment", "not_entailment")),
    "wnli": _Layout("WNLI", "sentence1", "sentence2", "label", ("0", "1")),
    "snli": _Layout("SNLI", "sentence1", "sentence2", "gold_label", _NLI, _SNLI_FILES, no_gold="-"),
}


def _parse_label(text: str, layout: _Layout, where: str, stats: ExampleStats) -> float | None:
    """The label of a row as a float; None for a row to drop (counted in `stats`)."""
    text = text.strip()
    if layout.no_gold is not None and text == layout.no_gold:
        stats.dropped_no_gold += 1
        return None
    if not text:
        stats.dropped_corrupt += 1
        return None
    if layout.label_values is None:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not np.isfinite(value):
            raise ValueError(f"{where}: the score {text!r} is not a finite number")
        return value
    if text not in layout.label_values:
        raise ValueError(f"{where}: label {text!r} is not one of {layout.label_values}")
    return float(layout.label_values.index(text))


def read_glue_tsv(path: str, layout: _Layout, headerless: bool = False,
                  stats: ExampleStats | None = None) -> list[Example]:
    """Examples of one GLUE TSV file. A file whose header lacks the label column (a test set) gives NaN labels.
    Raises ValueError naming the file for a missing column, and the line for a bad label."""
    stats = stats if stats is not None else ExampleStats()
    corrupt_before = stats.dropped_corrupt
    examples = []
    with open(path, encoding="utf-8-sig", newline="") as f:  # utf-8-sig: MRPC's header starts with a BOM
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = list(layout.no_header) if headerless else next(reader, None)
        if header is None:
            raise ValueError(f"{path} is empty")
        header = [name.strip() for name in header]
        needed = [c for c in (layout.text_a, layout.text_b) if c is not None]
        missing = [c for c in needed if c not in header]
        if missing:
            raise ValueError(f"{path}: no column {missing[0]!r} in its header {header}")
        columns = [header.index(c) for c in needed]
        label_column = header.index(layout.label) if layout.label in header else None
        width = max(columns + [label_column or 0]) + 1
        for row in reader:
            if not row or row == [""]:
                continue  # a blank line, e.g. at the end of the file
            if len(row) < width:
                stats.dropped_corrupt += 1
                continue
            label = float("nan") if label_column is None else _parse_label(
                row[label_column], layout, f"{path}:{reader.line_num}", stats)
            if label is None:
                continue
            examples.append(Example(row[columns[0]], row[columns[1]] if len(columns) > 1 else None, label))
    if stats.dropped_corrupt > corrupt_before:
        warnings.warn(f"{path}: dropped {stats.dropped_corrupt - corrupt_before} rows with missing fields or an "
                      "empty label (as TFDS's GLUE reader does)", stacklevel=2)
    stats.examples += len(examples)
    return examples


def glue_dir_examples(glue_dir: str, task: str, split: str, stats: ExampleStats | None = None) -> list[Example]:
    """Examples of `split` of `task` from a local GLUE folder (layout in the module docstring)."""
    layout = _LAYOUTS[task]
    folder = os.path.join(os.path.expanduser(glue_dir), layout.folder)
    names = layout.files[split] if split in layout.files else layout.files["test"]  # the spec checked `split`
    paths = [os.path.join(folder, name) for name in names]
    path = next((p for p in paths if os.path.isfile(p)), None)
    if path is None:
        raise FileNotFoundError(f"the {split!r} split of {task}: {' or '.join(paths)} is missing (data.glue_dir "
                                "should be the GLUE root holding CoLA/, SST-2/, MRPC/, ... as download_glue_data.py "
                                "writes them)")
    return read_glue_tsv(path, layout, headerless=bool(layout.no_header) and split != "test", stats=stats)
