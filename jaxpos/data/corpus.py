"""Text sources for pretraining: the embedded default corpus, local text files, TFDS datasets, Bible editions.

Each source yields documents (strings) in a fixed order. Bad data is counted in a `DataStats`, never fatal:
whitespace-only documents are skipped, bytes that are not UTF-8 become spaces. The held-out split is a pure
function of the document's position in its source (see `is_eval_document`), so it never depends on timing; for
the Bible, of its chapter (`is_held_out_chapter`), so that no edition of a held-out chapter is trained on.
Paths and globs may be local or URLs that etils.epath reads (gs://, s3://, ...).
"""

from __future__ import annotations

import codecs
import dataclasses
import fractions
import glob
import os
import pydoc_data.topics
import re
from typing import Iterator, Sequence

from etils import epath

from jaxpos.config.run import MLM_SOURCES, check_source
from jaxpos.data.bible import chapter_documents, is_held_out_chapter
from jaxpos.data.tfds_records import record_value, tfds_records

_BLANK_LINES = re.compile(r"\n[ \t\r\f\v]*\n")
_HEADING_UNDERLINE = re.compile(r"^\s*([*=\-~^])\1{2,}\s*$")
_PROSE_WORD = re.compile(r"^[\"'(“‘*]*[A-Za-z][A-Za-z'’\-]*[.,;:!?\"')”’]*$")
_LIST_MARK = re.compile(r"^\s*(?:[*\-]|\d+\.|\(\d+\)|\[\d+\])\s+")  # "* ", "- ", "1. ", "(1) ", "[1] "
_REPLACE_WITH_SPACE = "jaxpos.space"
codecs.register_error(_REPLACE_WITH_SPACE, lambda error: (" ", error.end))  # an invalid UTF-8 sequence -> " "


@dataclasses.dataclass
class DataStats:
    """Counters of one split, printed at start-up. Source-level counters (files, undecodable*) are kept in the
    train split's stats, since one file can hold documents of both splits."""

    files: int = 0  # text files read
    documents: int = 0  # non-empty documents kept
    skipped_empty: int = 0  # whitespace-only documents, and sentences that tokenize to nothing
    undecodable: int = 0  # invalid UTF-8 sequences, each replaced by a space
    undecodable_files: int = 0  # files with at least one of them
    sentences: int = 0  # non-empty sentences
    tokens: int = 0  # sentence tokens, special tokens not counted
    split_long: int = 0  # sentences longer than a row, split into row-sized pieces
    packed_examples: int = 0  # rows of seq_len tokens

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        return ", ".join(f"{name}={value}" for name, value in self.as_dict().items())

    __str__ = summary


def split_blocks(text: str) -> list[str]:
    """Blank-line-separated blocks of `text`, stripped; empty blocks are kept (callers count them)."""
    return [block.strip() for block in _BLANK_LINES.split(text)]


def _is_prose(block: str) -> bool:
    """Whether a documentation block (unstripped) reads as English, not a grammar rule, code or a `>>>` session:
    mostly plain words, and an indented block (a literal block in reST) must end like a sentence."""
    words = block.split()
    if len(words) < 3 or "::=" in block or ">>>" in block:
        return False
    first_line = block.lstrip("\n").split("\n")[0]
    if len(first_line) - len(first_line.lstrip(" ")) >= 3 and not re.search(r"[.!?:][\"')”’]*$", block.rstrip()):
        return False
    return sum(bool(_PROSE_WORD.match(w)) for w in words) >= 0.75 * len(words)


def embedded_documents() -> list[str]:
    """The default corpus, needing no download: CPython's own English documentation (`pydoc_data.topics`).

    Topics are read in sorted order; every section (a heading with an underline) becomes one document of prose
    paragraphs joined by blank lines: headings, grammar rules, code and `>>>` sessions are dropped, list marks
    removed and whitespace collapsed. Deterministic for a given CPython version (3.11: ~200 documents).
    """
    documents, paragraphs = [], []
    topics = pydoc_data.topics.topics
    for name in sorted(topics):
        for block in _BLANK_LINES.split(topics[name]):
            if any(_HEADING_UNDERLINE.match(line) for line in block.split("\n")):
                if paragraphs:  # a heading closes the previous section's document
                    documents.append("\n\n".join(paragraphs))
                paragraphs = []
            elif _is_prose(block):
                paragraphs.append(" ".join(_LIST_MARK.sub("", block).split()))
        if paragraphs:
            documents.append("\n\n".join(paragraphs))
        paragraphs = []
    return documents


def is_url(path) -> bool:
    """Whether `path` names a remote location (gs://, s3://, ...) rather than a local file."""
    return "://" in str(path)


def read_text_file(path: str, stats: DataStats) -> str:
    """A file's text as UTF-8 (a BOM dropped); each invalid byte sequence becomes a space and is counted."""
    raw = epath.Path(path).read_bytes()
    text = raw.decode("utf-8-sig", errors="replace")
    bad = text.count("\ufffd") - raw.decode("utf-8-sig", errors="ignore").count("\ufffd")  # genuine U+FFFD kept
    stats.files += 1
    if bad:
        stats.undecodable += bad
        stats.undecodable_files += 1
        text = raw.decode("utf-8-sig", errors=_REPLACE_WITH_SPACE)
    return text


def _glob_files(pattern: str) -> list[str]:
    """Files matching one glob, sorted: local (with ** recursion) or a URL, listed through etils.epath."""
    if not is_url(pattern):
        return [p for p in sorted(glob.glob(os.path.expanduser(pattern), recursive=True)) if os.path.isfile(p)]
    parts = pattern.split("/")
    wild = next((i for i, part in enumerate(parts) if glob.has_magic(part)), None)
    if wild is None:
        return [pattern] if epath.Path(pattern).is_file() else []
    base = epath.Path("/".join(parts[:wild]))  # epath globs below the last wildcard-free folder
    return sorted(str(p) for p in base.glob("/".join(parts[wild:])) if not p.is_dir())


def expand_globs(patterns: Sequence[str] | str) -> list[str]:
    """Files matched by each glob, local or URL (sorted within a glob, globs in the given order, duplicates read
    once)."""
    if isinstance(patterns, str):
        patterns = [p for p in patterns.split(",") if p.strip()]
    if not patterns:
        raise ValueError("data.source='text' needs data.paths: a list of files or globs")
    files: dict[str, None] = {}
    for pattern in patterns:
        matched = _glob_files(pattern.strip())
        if not matched:
            raise FileNotFoundError(f"data.paths: the glob {pattern!r} matches no file")
        files.update(dict.fromkeys(matched))
    return list(files)


def text_file_documents(patterns: Sequence[str] | str, doc_separator: str, stats: DataStats) -> Iterator[str]:
    """Documents of local text files: one per blank-line-separated block (`blank_line`) or per file (`file`)."""
    check_doc_separator(doc_separator)
    for path in expand_globs(patterns):
        yield from file_documents(path, doc_separator, stats)


def check_doc_separator(doc_separator: str) -> None:
    if doc_separator not in ("blank_line", "file"):
        raise ValueError(f"data.doc_separator={doc_separator!r}; choose 'blank_line' or 'file'")


def file_documents(path: str, doc_separator: str, stats: DataStats) -> list[str]:
    """The documents of one text file, empty ones included: its blank-line-separated blocks, or the whole file."""
    text = read_text_file(path, stats)
    return split_blocks(text) if doc_separator == "blank_line" else [text.strip()]


def _record_text(record: dict, field: str, name: str) -> str:
    if field not in record:
        raise KeyError(f"TFDS dataset {name!r} has no field {field!r} (data.text_field); it has {sorted(record)}")
    return str(record_value(record[field]))


def tfds_documents(name: str, split: str, data_dir: str | None, text_field: str = "text",
                   max_documents: int = 0, read_threads: int = 8, start: int = 0,
                   stop: int | None = None) -> Iterator[str]:
    """Documents of a TFDS dataset prepared as array_record (`tfds_records`; nothing is downloaded): records
    [start, stop) of the split (at most `max_documents` of them, 0 = all), in index order."""
    yield from tfds_records(name, split, data_dir, lambda record: _record_text(record, text_field, name),
                            start=start, stop=stop, limit=max_documents, read_threads=read_threads)


def is_eval_document(index: int, eval_fraction: float) -> bool:
    """Whether document `index` of a source is held out: exactly every (1/eval_fraction)-th document, evenly
    spread (index i is held out when floor((i+1)·f) > floor(i·f)), so the split depends on nothing else."""
    f = fractions.Fraction(eval_fraction).limit_denominator(1_000_000)
    return (index + 1) * f.numerator // f.denominator > index * f.numerator // f.denominator


def source_documents(config, stats: DataStats) -> Iterator[str]:
    """The configured source's documents in their fixed order, empty ones included (see `load_documents`)."""
    if config.source == "embedded":
        yield from embedded_documents()
    elif config.source == "text":
        yield from text_file_documents(config.paths, config.doc_separator, stats)
    elif config.source == "tfds":
        yield from tfds_documents(config.tfds_name, config.tfds_split, config.data_dir, config.text_field,
                                  config.max_documents)
    elif config.source == "bible":
        yield from (text for _, _, text in bible_documents(config))
    else:
        check_source(config.source, MLM_SOURCES)


def bible_documents(config) -> Iterator[tuple[int, int, str]]:
    """(book, chapter, text) of source=bible: a document per chapter per edition of data.bible_editions."""
    return chapter_documents(tuple(config.bible_editions))


def documents_and_held_out(config, stats: DataStats) -> Iterator[tuple[str, bool]]:
    """(document, whether it is held out) of `source_documents`, in its order (see `load_documents`)."""
    if config.source == "bible":
        for book, chapter, text in bible_documents(config):
            yield text, is_held_out_chapter(book, chapter, config.eval_fraction)
        return
    held_by_split = config.source == "tfds" and config.tfds_eval_split  # a split of its own
    for index, document in enumerate(source_documents(config, stats)):
        yield document, not held_by_split and is_eval_document(index, config.eval_fraction)


def load_documents(config, train_stats: DataStats, eval_stats: DataStats) -> tuple[list[str], list[str]]:
    """(train documents, held-out documents) of `config` (a `default_data_config()` block).

    The held-out documents are `data.tfds_eval_split` for TFDS when it is set; for the Bible, every edition of
    the chapters `is_held_out_chapter` picks with `data.eval_fraction`; else the documents that `is_eval_document`
    picks with it. Reads at most `data.max_documents` (0 = all) documents of the source (per split).
    Whitespace-only documents are skipped and counted in their split's stats.
    """
    train, held_out = [], []
    for index, (document, held) in enumerate(documents_and_held_out(config, train_stats)):
        if config.max_documents and index >= config.max_documents:
            break
        if not document.strip():
            (eval_stats if held else train_stats).skipped_empty += 1
        else:
            (held_out if held else train).append(document)
    if config.source == "tfds" and config.tfds_eval_split:
        for document in tfds_documents(config.tfds_name, config.tfds_eval_split, config.data_dir,
                                       config.text_field, config.max_documents):
            if document.strip():
                held_out.append(document)
            else:
                eval_stats.skipped_empty += 1
    train_stats.documents += len(train)
    eval_stats.documents += len(held_out)
    if not train:
        where = f" (data.paths={list(config.paths)})" if config.source == "text" else ""
        raise ValueError(f"the {config.source!r} corpus{where} has no non-empty training document")
    return train, held_out
