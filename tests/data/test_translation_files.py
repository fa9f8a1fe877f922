"""Local parallel files: alignment check, empty and overlong pairs counted, held-out pairs kept whole."""

import re

import pytest

from jaxpos.data.parallel import TranslationStats, parallel_file_pairs, read_lines
from jaxpos.data.translation import EOS_ID, build_translation_data
from jaxpos.config.data import default_translation_data_config


def write(path, text, encoding="utf-8"):
    path.write_bytes(text.encode(encoding))
    return str(path)


def test_mismatched_line_counts_name_both_files(tmp_path):
    de = write(tmp_path / "train.de", "eins\nzwei\ndrei\n")
    en = write(tmp_path / "train.en", "one\ntwo\n")
    with pytest.raises(ValueError, match=re.escape(f"{de} has 3 lines but {en} has 2")):
        parallel_file_pairs(de, en, TranslationStats())


def test_empty_lines_are_skipped_and_counted(tmp_path):
    de = write(tmp_path / "a.de", "\ufeffHallo Welt\r\n\r\nGuten Morgen\r\n  \r\nx\u2028y\r\n")  # BOM, CRLF, U+2028
    en = write(tmp_path / "a.en", "Hello world\nHi\n\nblank\nx y")  # no final newline
    assert read_lines(de) == ["Hallo Welt", "", "Guten Morgen", "  ", "x\u2028y"]  # U+2028 does not split
    stats = TranslationStats()
    text = parallel_file_pairs(de, en, stats)
    assert text.sources == ["Hallo Welt", "x\u2028y"] and text.targets == ["Hello world", "x y"]
    assert text.ids == [f"{de}:1", f"{de}:5"] and stats.skipped_empty == 3
    assert len(parallel_file_pairs(de, en, TranslationStats(), max_pairs=2)) == 1  # the first 2 lines only


def test_overlong_pairs_dropped_in_training_and_cut_when_held_out(tmp_path):
    words = ["house", "garden", "tree", "river", "mountain", "city", "road", "window"]
    german = ["Haus", "Garten", "Baum", "Fluss", "Berg", "Stadt", "Straße", "Fenster"]
    train_en = [f"the {a} and the {b}" for a in words for b in words]
    train_de = [f"das {a} und das {b}" for a in german for b in german]
    long_de, long_en = " ".join(german * 6), " ".join(words * 6)
    train_de[10], train_en[10] = long_de, long_en
    train_de[20] = ""
    config = default_translation_data_config()
    config.update(source="files", train_source=write(tmp_path / "train.de", "\n".join(train_de) + "\n"),
                  train_target=write(tmp_path / "train.en", "\n".join(train_en) + "\n"),
                  test_source=write(tmp_path / "test.de", f"das Haus und das Baum\n{long_de}\n"),
                  test_target=write(tmp_path / "test.en", f"the house and the tree\n{long_en}\n"),
                  vocab_size=100, max_length=24, eval_max_length=20)
    data = build_translation_data(config, 4, str(tmp_path / "work"), process_index=0, process_count=1)
    train = data.stats["train"]
    long_tokens = len(data.tokenizer.encode(long_de)) + len(data.tokenizer.encode(long_en)) + 2  # + 2 EOS
    assert (train.pairs, train.skipped_empty, train.dropped_long, train.dropped_long_tokens) == (62, 1, 1,
                                                                                                 long_tokens)
    assert len(data.dev) == 0 and data.stats["test"].truncated == 1 and len(data.test) == 2
    assert data.test.inputs.shape == (2, 20) and data.test.inputs[1, -1] == EOS_ID  # cut, EOS kept last
    assert data.test.references[1] == long_en  # the BLEU reference stays whole
    config.test_target = ""
    with pytest.raises(ValueError, match="give both files of the split"):
        build_translation_data(config, 4, str(tmp_path / "work"))


def test_held_out_split_reads_no_training_data(tmp_path):
    from jaxpos.data.tokenizer import TRANSLATION_SPECIAL_TOKENS, train_sentencepiece
    from jaxpos.data.translation import load_eval_set

    words = ["house", "garden", "tree", "river", "mountain", "city"]
    tokenizer = train_sentencepiece([f"the {a} and the {b}" for a in words for b in words], str(tmp_path / "spm"),
                                    60, special_tokens=TRANSLATION_SPECIAL_TOKENS)
    config = default_translation_data_config()
    config.update(source="files", train_source=str(tmp_path / "gone.de"), train_target=str(tmp_path / "gone.en"),
                  test_source=write(tmp_path / "t.de", "das Haus\n\nder Baum\n"),
                  test_target=write(tmp_path / "t.en", "the house\nthe garden\nthe tree\n"), eval_max_length=8)
    eval_set, stats = load_eval_set(config, "test", tokenizer)  # the training files do not even exist
    assert eval_set.references == ["the house", "the tree"] and stats.skipped_empty == 1
    assert eval_set.inputs.shape == (2, 8) and all(EOS_ID in row for row in eval_set.inputs)
