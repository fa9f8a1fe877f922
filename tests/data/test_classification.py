"""GLUE/SNLI loading (local TSV folders in the official layout, TFDS without TensorFlow), BERT-style encoding, the
resumable training iterator and the evaluation batches."""

import math
import os

import numpy as np
import pytest

from jaxpos.data.classification import (TASKS, ClassificationTrainIterator, Example, ExampleStats, TokenizerAdapter,
                                        encode_examples, eval_batches, hf_tokenizer, jaxpos_tokenizer, load_examples,
                                        truncate_longest_first)
from jaxpos.config.data import default_finetune_data_config

MNLI_HEADER = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
               "sentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label")


def mnli_row(i, premise, hypothesis, label):
    return f"{i}\t{i}\t{i}e\tfiction\t( x )\t( y )\t(ROOT x)\t(ROOT y)\t{premise}\t{hypothesis}\t{label}\t{label}"


def write(root, folder, name, lines, bom=False):
    os.makedirs(os.path.join(root, folder), exist_ok=True)
    with open(os.path.join(root, folder, name), "w", encoding="utf-8-sig" if bom else "utf-8") as f:
        f.write("\n".join(lines) + "\n")


@pytest.fixture
def glue_dir(tmp_path):
    root = str(tmp_path / "glue")
    write(root, "CoLA", "train.tsv", ["gj04\t1\t\tThe sailors rode the breeze clear of the rocks.",
                                      "gj04\t0\t*\tThe more books I ask to whom he will give, the more he reads.",
                                      'clc95\t1\t\tShe said "hello" to me.'])  # a quote: QUOTE_NONE keeps it
    write(root, "CoLA", "dev.tsv", ["gj04\t0\t*\tHim left.", ""])
    write(root, "CoLA", "test.tsv", ["index\tsentence", "0\tBill whistled past the house."])
    write(root, "MRPC", "train.tsv", ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
                                      "1\t702876\t702977\tAmrozi accused his brother.\tHe accused his brother.",
                                      "0\t2108705\t2108831\tYucaipa owned Dominick's.\tYucaipa bought it."],
          bom=True)  # the MRPC files start with a byte-order mark
    write(root, "MRPC", "dev.tsv", ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String", "1\t1\t2\tA b.\tB a."])
    write(root, "STS-B", "train.tsv", [
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore",
        "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane is taking off.\tAn air plane is taking "
        "off.\t5.000", "1\tmain-captions\tMSRvid\t2012test\t0004\tnone\tnone\tA man plays a flute.\tA man plays "
        "a bamboo flute.\t3.800"])
    write(root, "MNLI", "train.tsv", [MNLI_HEADER, mnli_row(0, "He runs.", "He moves.", "entailment"),
                                      mnli_row(1, "He runs.", "He sleeps.", "contradiction")])
    write(root, "MNLI", "dev_matched.tsv", [MNLI_HEADER, mnli_row(0, "A b.", "C d.", "neutral")])
    write(root, "MNLI", "dev_mismatched.tsv", [MNLI_HEADER, mnli_row(0, "E f.", "G h.", "contradiction"),
                                               mnli_row(1, "I j.", "K l.", "entailment")])
    write(root, "MNLI", "test_matched.tsv", [MNLI_HEADER.rsplit("\t", 2)[0], "0\t0\t0e\tfiction\t( x )\t( y )\t"
                                             "(ROOT x)\t(ROOT y)\tTest premise.\tTest hypothesis."])
    write(root, "SNLI", "dev.tsv", [MNLI_HEADER, mnli_row(0, "A dog runs.", "An animal moves.", "entailment"),
                                    mnli_row(1, "A dog runs.", "It is a cat.", "-")])  # no gold label: dropped
    return root


def config(task, root, **overrides):
    cfg = default_finetune_data_config()
    cfg.update(dict(dict(task=task, source="glue_dir", glue_dir=root), **overrides))
    return cfg


def test_glue_tsv_layouts(glue_dir):
    cola = load_examples(config("cola", glue_dir), "train")
    assert cola[1] == Example("The more books I ask to whom he will give, the more he reads.", None, 0.0)
    assert cola[2].text_a == 'She said "hello" to me.' and [e.label for e in cola] == [1.0, 0.0, 1.0]
    assert load_examples(config("cola", glue_dir), "dev") == [Example("Him left.", None, 0.0)]
    test = load_examples(config("cola", glue_dir), "test")
    assert test[0].text_a == "Bill whistled past the house." and math.isnan(test[0].label)  # unlabelled
    mrpc = load_examples(config("mrpc", glue_dir), "train")
    assert mrpc == [Example("Amrozi accused his brother.", "He accused his brother.", 1.0),
                    Example("Yucaipa owned Dominick's.", "Yucaipa bought it.", 0.0)]
    stsb = load_examples(config("stsb", glue_dir), "train")
    assert [e.label for e in stsb] == [5.0, 3.8] and stsb[1].text_b == "A man plays a bamboo flute."
    mnli = config("mnli", glue_dir)
    assert TASKS["mnli"].dev_splits == ("dev_matched", "dev_mismatched")
    assert load_examples(mnli, "train") == [Example("He runs.", "He moves.", 0.0),
                                            Example("He runs.", "He sleeps.", 2.0)]
    assert load_examples(mnli, "dev_matched") == [Example("A b.", "C d.", 1.0)]
    assert [e.label for e in load_examples(mnli, "dev_mismatched")] == [2.0, 0.0]
    assert math.isnan(load_examples(mnli, "test")[0].label)
    stats = ExampleStats()
    assert load_examples(config("snli", glue_dir), "dev", stats) == [Example("A dog runs.", "An animal moves.", 0.0)]
    assert stats == ExampleStats(examples=1, dropped_no_gold=1)


def test_corrupt_rows_are_dropped_as_tfds_does(glue_dir):
    write(glue_dir, "QQP", "train.tsv", ["id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
                                         "0\t1\t2\tHow do I learn?\tHow can I learn?\t1",
                                         "1\t3\t4\tWhat is it?",  # a row cut short
                                         "2\t5\t6\tWhy?\tWhy not?\t",  # no label
                                         "3\t7\t8\tWho?\tWhen?\t0"])
    stats = ExampleStats()
    with pytest.warns(UserWarning, match=r"QQP/train.tsv: dropped 2 rows with missing fields or an empty label"):
        qqp = load_examples(config("qqp", glue_dir), "train", stats)
    assert [e.label for e in qqp] == [1.0, 0.0] and stats == ExampleStats(examples=2, dropped_corrupt=2)


def test_glue_errors(glue_dir):
    with pytest.raises(FileNotFoundError, match=r"RTE/train.tsv is missing"):
        load_examples(config("rte", glue_dir), "train")
    with pytest.raises(FileNotFoundError, match=r"MNLI/test_mismatched.tsv is missing"):
        load_examples(config("mnli", glue_dir), "test_mismatched")
    write(glue_dir, "SST-2", "train.tsv", ["sentence\tlabel", "a fine film\t1", "a dull film\tpositive"])
    with pytest.raises(ValueError, match=r"SST-2/train.tsv:3: label 'positive' is not one of \('0', '1'\)"):
        load_examples(config("sst2", glue_dir), "train")
    write(glue_dir, "SST-2", "dev.tsv", ["sentence\tlabel"])
    with pytest.raises(ValueError, match=r"the 'dev' split of sst2 in .* has no examples"):
        load_examples(config("sst2", glue_dir), "dev")
    write(glue_dir, "STS-B", "dev.tsv", ["index\tsentence1\tsentence2\tscore", "0\ta\tb\tfive"])
    with pytest.raises(ValueError, match=r"STS-B/dev.tsv:2: the score 'five' is not a finite number"):
        load_examples(config("stsb", glue_dir), "dev")
    write(glue_dir, "WNLI", "train.tsv", ["index\tpremise\thypothesis\tlabel"])
    with pytest.raises(ValueError, match=r"WNLI/train.tsv: no column 'sentence1' in its header"):
        load_examples(config("wnli", glue_dir), "train")
    with pytest.raises(ValueError, match=r"unknown fine-tuning task 'squad'"):
        load_examples(config("squad", glue_dir), "train")
    with pytest.raises(ValueError, match=r"task 'cola' has no split 'dev_matched'"):
        load_examples(config("cola", glue_dir), "dev_matched")
    with pytest.raises(ValueError, match=r"the word_order task is built offline"):
        load_examples(config("cola", glue_dir, source="offline"), "train")
    with pytest.raises(ValueError, match=r"needs data.glue_dir"):
        load_examples(config("cola", ""), "train")


def test_max_train_examples_is_a_seeded_subset(glue_dir):
    cola = load_examples(config("cola", glue_dir), "train")
    subset = load_examples(config("cola", glue_dir, max_train_examples=2, seed=1), "train")
    assert len(subset) == 2 and all(e in cola for e in subset)
    assert subset == load_examples(config("cola", glue_dir, max_train_examples=2, seed=1), "train")


WORDS = {w: i for i, w in enumerate("[PAD] [UNK] [CLS] [SEP] a b c d e f g h".split())}
TOY = TokenizerAdapter(lambda text: [WORDS.get(w, 1) for w in text.split()], cls_id=2, sep_id=3, pad_id=0,
                       vocab_size=len(WORDS), source="test")


def test_encoding_layout_and_longest_first_truncation():
    examples = [Example("a b", "c d e", 1.0), Example("f", None, 0.0),
                Example("a b c d e f", "g h", 2.0),  # 8 tokens for a budget of 10 - 3 = 7: a loses its last
                Example("a b c d", "e f g h", 0.5)]  # a tie: b loses first (BERT's _truncate_seq_pair)
    encoded = encode_examples(examples, TOY, 10)
    ids = [[2, 4, 5, 3, 6, 7, 8, 3, 0, 0],
           [2, 9, 3, 0, 0, 0, 0, 0, 0, 0],
           [2, 4, 5, 6, 7, 8, 3, 10, 11, 3],
           [2, 4, 5, 6, 7, 3, 8, 9, 10, 3]]
    types = [[0, 0, 0, 0, 1, 1, 1, 1, 0, 0], [0] * 10, [0] * 7 + [1] * 3, [0] * 6 + [1] * 4]
    piece_ids = [[1] * 8 + [0] * 2, [1] * 3 + [0] * 7, [1] * 10, [1] * 10]
    np.testing.assert_array_equal(encoded.input_ids, ids)
    np.testing.assert_array_equal(encoded.token_types, types)
    np.testing.assert_array_equal(encoded.piece_ids, piece_ids)
    np.testing.assert_array_equal(encoded.labels, [1.0, 0.0, 2.0, 0.5])
    assert encoded.truncated == 2 and encoded.input_ids.dtype == np.int32 and encoded.labels.dtype == np.float32
    assert encode_examples(examples[3:], TOY, 9).input_ids.tolist() == [[2, 4, 5, 6, 3, 8, 9, 10, 3]]
    assert truncate_longest_first(10, 2, 6) == (4, 2) and truncate_longest_first(3, 3, 4) == (2, 2)
    single = encode_examples([Example("a b c d e f g h", None, 1.0)], TOY, 5)
    assert single.input_ids.tolist() == [[2, 4, 5, 6, 3]] and single.truncated == 1
    with pytest.raises(ValueError, match="max_length=3 leaves no room"):
        encode_examples(examples, TOY, 3)


def test_tokenizer_adapters(tmp_path):
    from jaxpos.data.tokenizer import train_sentencepiece

    texts = [f"the cat number {i} sat on the mat while the dog slept" for i in range(50)]
    spm = jaxpos_tokenizer(train_sentencepiece(texts, str(tmp_path / "spm"), 40))
    assert (spm.cls_id, spm.sep_id, spm.pad_id) == (2, 3, 0)
    encoded = encode_examples([Example("the cat sat", "the dog", 1.0)], spm, 16)
    row = encoded.input_ids[0]
    assert row[0] == 2 and list(row).count(3) == 2 and row[encoded.piece_ids[0].sum():].tolist() == [0] * (
        16 - encoded.piece_ids[0].sum())
    assert jaxpos_tokenizer(str(tmp_path / "spm.model")).encode("the cat") == spm.encode("the cat")

    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat",
                                                 "sat", "##s", "."]) + "\n")
    wordpiece = hf_tokenizer(str(folder))
    assert (wordpiece.cls_id, wordpiece.sep_id, wordpiece.pad_id, wordpiece.vocab_size) == (2, 3, 0, 10)
    encoded = encode_examples([Example("The cats sat.", None, 0.0)], wordpiece, 8)
    assert encoded.input_ids.tolist() == [[2, 5, 6, 8, 7, 9, 3, 0]]
    (folder / "vocab.txt").write_text("the\ncat\n[UNK]\n")
    with pytest.raises(ValueError, match=r"vocab.txt has no \[CLS\], \[SEP\], \[PAD\]"):
        hf_tokenizer(str(folder))
    with pytest.raises(FileNotFoundError, match="has no tokenizer"):
        hf_tokenizer(str(tmp_path))


def encoded_rows(n):
    rng = np.random.default_rng(0)
    examples = [Example(" ".join(rng.choice(list("abcdefgh"), rng.integers(1, 6))), None, float(i % 3))
                for i in range(n)]
    return encode_examples(examples, TOY, 8)


def test_training_batches_resume_and_split_over_hosts():
    encoded = encoded_rows(23)
    iterator = ClassificationTrainIterator(encoded, 4, seed=7)
    batches = [next(iterator) for _ in range(9)]  # 5 batches an epoch: crosses into epoch 1
    assert set(batches[0]) == {"input_ids", "token_types", "piece_ids", "labels"}
    assert batches[0]["input_ids"].shape == (4, 8) and batches[0]["labels"].dtype == np.float32
    state = iterator.get_state()
    resumed = ClassificationTrainIterator(encoded, 4, seed=7)
    resumed.set_state(dict(state, step=3))
    for expected in batches[3:]:
        got = next(resumed)
        for key in expected:
            np.testing.assert_array_equal(got[key], expected[key])
    epoch = np.concatenate([iterator.global_indices(s) for s in range(5)])
    assert len(set(epoch.tolist())) == 20  # an epoch: distinct rows, the 23 mod 4 = 3 last ones left out
    halves = [ClassificationTrainIterator(encoded, 4, seed=7, process_index=h, process_count=2) for h in (0, 1)]
    joined = np.concatenate([next(h)["input_ids"] for h in halves])
    np.testing.assert_array_equal(joined, batches[0]["input_ids"])
    with pytest.raises(ValueError, match="saved for other data"):
        ClassificationTrainIterator(encoded_rows(24), 4, seed=7).set_state(state)
    with pytest.raises(ValueError, match="fewer than one global batch of 32"):
        ClassificationTrainIterator(encoded, 32)


@pytest.mark.parametrize("hosts", [1, 2])
def test_eval_batches_cover_every_example_once(hosts):
    encoded = encoded_rows(11)
    seen, weights = [], []
    for host in range(hosts):
        for batch in eval_batches(encoded, 4, process_index=host, process_count=hosts):
            assert batch["input_ids"].shape == (4 // hosts, 8) and batch["weights"].dtype == np.float32
            real = batch["weights"] > 0
            seen.extend(map(tuple, batch["input_ids"][real]))
            weights.append(batch["weights"])
    assert sorted(seen) == sorted(map(tuple, encoded.input_ids)) and np.concatenate(weights).sum() == 11
    assert len(weights) == 3 * hosts  # ceil(11 / 4) batches, the last with one padded row


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
    """glue/mrpc's features and splits in a tiny array_record dataset prepared here (test labels are -1)."""
    pytest.importorskip("array_record", reason="TFDS data sources need the array_record package")
    tfds = pytest.importorskip("tensorflow_datasets")

    class JaxposGlueTiny(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
                "sentence1": tfds.features.Text(), "sentence2": tfds.features.Text(),
                "label": tfds.features.ClassLabel(names=["not_equivalent", "equivalent"]),
                "idx": tfds.features.Scalar(dtype=np.int32)}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(12, labelled=True),
                    "validation": self._generate_examples(5, labelled=True),
                    "test": self._generate_examples(3, labelled=False)}

        def _generate_examples(self, n, labelled):
            for i in range(n):
                yield i, {"sentence1": f"Sentence {i} says a thing.", "sentence2": f"Sentence {i} repeats it.",
                          "label": i % 2 if labelled else -1, "idx": i}

    directory = str(tmp_path_factory.mktemp("tfds_glue"))
    JaxposGlueTiny(data_dir=directory, file_format="array_record").download_and_prepare()
    return directory


def test_tfds_glue_through_a_data_source(tfds_dir):
    cfg = default_finetune_data_config()
    cfg.update(task="mrpc", source="tfds", tfds_name="jaxpos_glue_tiny", data_dir=tfds_dir)
    train = load_examples(cfg, "train")
    # TFDS stores records in an order of its own (hashed keys): compare as sets
    assert {(e.text_a, e.text_b, e.label) for e in train} == {
        (f"Sentence {i} says a thing.", f"Sentence {i} repeats it.", float(i % 2)) for i in range(12)}
    assert len(load_examples(cfg, "dev")) == 5  # TFDS "validation"
    test = load_examples(cfg, "test")
    assert len(test) == 3 and all(math.isnan(e.label) for e in test)  # -1: unlabelled
    encoded = encode_examples(train, TOY, 16)
    assert encoded.input_ids.shape == (12, 16) and encoded.token_types.max() == 1
    cfg.update(task="mnli")  # the tiny dataset has no validation_matched split
    with pytest.raises(ValueError, match=r"TFDS jaxpos_glue_tiny 'validation_matched' cannot be read from"):
        load_examples(cfg, "dev_matched")
    cfg.tfds_name = ""
    from jaxpos.data.classification import tfds_name_of

    assert tfds_name_of(cfg) == "glue/mnli"
    cfg.task = "snli"
    assert tfds_name_of(cfg) == "snli"


def test_tfds_snli_drops_pairs_without_gold_label(tmp_path):
    pytest.importorskip("array_record", reason="TFDS data sources need the array_record package")
    tfds = pytest.importorskip("tensorflow_datasets")

    class JaxposSnliTiny(tfds.core.GeneratorBasedBuilder):  # snli's features; label -1 = no gold label
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
                "premise": tfds.features.Text(), "hypothesis": tfds.features.Text(),
                "label": tfds.features.ClassLabel(names=["entailment", "neutral", "contradiction"])}))

        def _split_generators(self, dl_manager):
            return {"validation": self._generate_examples()}

        def _generate_examples(self):
            for i, label in enumerate([0, 1, -1, 2]):
                yield i, {"premise": f"Premise {i}.", "hypothesis": f"Hypothesis {i}.", "label": label}

    JaxposSnliTiny(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
    cfg = default_finetune_data_config()
    cfg.update(task="snli", source="tfds", tfds_name="jaxpos_snli_tiny", data_dir=str(tmp_path))
    stats = ExampleStats()
    dev = load_examples(cfg, "dev", stats)
    assert {(e.text_a, e.text_b, e.label) for e in dev} == {
        ("Premise 0.", "Hypothesis 0.", 0.0), ("Premise 1.", "Hypothesis 1.", 1.0),
        ("Premise 3.", "Hypothesis 3.", 2.0)}
    assert stats == ExampleStats(examples=3, dropped_no_gold=1)
