"""Text sources: the embedded corpus, local files with bad data, globs, the deterministic held-out split."""

import pytest

from jaxpos.data import DataStats, embedded_documents, load_documents
from jaxpos.config.data import default_data_config
from jaxpos.data.corpus import is_eval_document, text_file_documents


def data_config(**overrides):
    config = default_data_config()
    config.update(overrides)
    return config


def test_embedded_corpus_is_clean_deterministic_prose():
    documents = embedded_documents()
    assert documents == embedded_documents()
    assert len(documents) > 100 and sum(map(len, documents)) > 200_000
    text = "\n".join(documents)
    assert "::=" not in text and ">>>" not in text and "*****" not in text and "=====" not in text
    assert "Assert statements are a convenient way to insert debugging assertions" in documents[0]


def test_held_out_documents_are_evenly_spread_and_exact():
    held = [i for i in range(1000) if is_eval_document(i, 0.05)]
    assert held == list(range(19, 1000, 20))
    assert sum(is_eval_document(i, 1 / 3) for i in range(300)) == 100
    assert not any(is_eval_document(i, 0.0) for i in range(100))
    train, held_out = load_documents(data_config(), DataStats(), DataStats())
    documents = embedded_documents()
    assert held_out == [d for i, d in enumerate(documents) if i % 20 == 19]
    assert len(train) + len(held_out) == len(documents)


def test_bad_text_is_counted_not_fatal(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"First document. It has two sentences.\n\n\n   \n\nSecond \xff\xfe document.\n")
    (tmp_path / "b.txt").write_bytes(b"\xef\xbb\xbfThird document.\r\n\r\n  \t\r\n")  # BOM, CRLF, blank tail
    (tmp_path / "c.txt").write_text("   \n\n")
    config = data_config(source="text", paths=[str(tmp_path / "*.txt")], eval_fraction=0.0)
    stats = DataStats()
    train, held_out = load_documents(config, stats, DataStats())
    assert train == ["First document. It has two sentences.", "Second    document.", "Third document."]
    assert held_out == []
    assert stats.files == 3 and stats.undecodable == 2 and stats.undecodable_files == 1
    assert stats.skipped_empty == 4  # the "   " block, b.txt's blank tail, c.txt's two blocks
    assert stats.documents == 3 and "undecodable=2" in stats.summary() and str(stats) == stats.summary()
    stats = DataStats()
    per_file = list(text_file_documents([str(tmp_path / "*.txt")], "file", stats))
    assert per_file[2] == "" and per_file[1] == "Third document." and stats.undecodable == 2


def test_globs_that_match_nothing_and_empty_corpora_raise_clearly(tmp_path):
    missing = str(tmp_path / "nothing*.txt")
    with pytest.raises(FileNotFoundError, match=r"the glob '.*nothing\*\.txt' matches no file"):
        load_documents(data_config(source="text", paths=[missing]), DataStats(), DataStats())
    (tmp_path / "empty.txt").write_text("\n\n   \n")
    with pytest.raises(ValueError, match=r"'text' corpus \(data.paths=\[.*empty.txt'\]\) has no non-empty"):
        load_documents(data_config(source="text", paths=[str(tmp_path / "empty.txt")]), DataStats(), DataStats())
    with pytest.raises(ValueError, match="needs data.paths"):
        load_documents(data_config(source="text"), DataStats(), DataStats())
    with pytest.raises(ValueError, match="choose 'blank_line' or 'file'"):
        load_documents(data_config(source="text", paths=[str(tmp_path / "*.txt")], doc_separator="line"),
                       DataStats(), DataStats())
    with pytest.raises(ValueError, match="data.source='web'"):
        load_documents(data_config(source="web"), DataStats(), DataStats())


def test_paths_as_comma_separated_string_and_max_documents(tmp_path):
    for name in "ab":
        (tmp_path / f"{name}.txt").write_text("\n\n".join(f"Doc {name}{i}." for i in range(5)))
    config = data_config(source="text", eval_fraction=0.0, max_documents=7)
    config.paths = [f"{tmp_path}/b.txt", f"{tmp_path}/*.txt"]  # b first, then a; b is read once
    train, _ = load_documents(config, DataStats(), DataStats())
    assert train == [f"Doc b{i}." for i in range(5)] + ["Doc a0.", "Doc a1."]
    config = data_config(source="text", eval_fraction=0.0)
    with config.ignore_type():  # what `--config.data.paths=a.txt,b.txt` on the command line sets
        config.paths = f"{tmp_path}/a.txt,{tmp_path}/b.txt"
    assert load_documents(config, DataStats(), DataStats())[0][5] == "Doc b0."
