"""The TFDS source without TensorFlow: a tiny dataset prepared as array_record here, read through the loader."""

import numpy as np
import pytest

pytest.importorskip("array_record", reason="TFDS data sources need the array_record package")
tfds = pytest.importorskip("tensorflow_datasets")

from jaxpos.data import DataStats, build_mlm_data, load_documents  # noqa: E402
from jaxpos.config.data import default_data_config
from jaxpos.data.corpus import tfds_documents  # noqa: E402

TEXTS = [f"Document number {i} talks about topic {i % 3}.\nIt has a second line about it." for i in range(40)]
TEXTS[5] = "   "  # a whitespace-only record


class JaxposDataTinyText(tfds.core.GeneratorBasedBuilder):
    """40 training and 8 validation documents, with a `body` field beside `text`."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
            {"text": tfds.features.Text(), "body": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(TEXTS),
                "validation": self._generate_examples([f"Held-out document {i}." for i in range(8)])}

    def _generate_examples(self, texts):
        for i, text in enumerate(texts):
            yield i, {"text": text, "body": text.upper()}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("tfds"))
    JaxposDataTinyText(data_dir=directory, file_format="array_record").download_and_prepare()
    return directory


def tfds_config(data_dir, **overrides):
    config = default_data_config()
    config.update(source="tfds", tfds_name="jaxpos_data_tiny_text", data_dir=data_dir, **overrides)
    return config


def test_documents_are_read_through_a_data_source(data_dir):
    documents = list(tfds_documents("jaxpos_data_tiny_text", "train", data_dir))
    assert sorted(documents) == sorted(TEXTS) and documents == list(tfds_documents(
        "jaxpos_data_tiny_text", "train", data_dir))  # a fixed order
    assert sorted(tfds_documents("jaxpos_data_tiny_text", "train", data_dir, "body")) == sorted(
        t.upper() for t in TEXTS)
    assert len(list(tfds_documents("jaxpos_data_tiny_text", "train[:50%]", data_dir))) == 20
    assert len(list(tfds_documents("jaxpos_data_tiny_text", "train", data_dir, max_documents=7))) == 7
    with pytest.raises(KeyError, match=r"no field 'title' \(data.text_field\); it has \['body', 'text'\]"):
        list(tfds_documents("jaxpos_data_tiny_text", "train", data_dir, "title"))


def test_splits_from_tfds_eval_split_or_eval_fraction(data_dir):
    stats, eval_stats = DataStats(), DataStats()
    train, held_out = load_documents(tfds_config(data_dir, tfds_eval_split="validation"), stats, eval_stats)
    assert sorted(train) == sorted(t for t in TEXTS if t.strip()) and stats.skipped_empty == 1
    assert sorted(held_out) == sorted(f"Held-out document {i}." for i in range(8))
    train, held_out = load_documents(tfds_config(data_dir, eval_fraction=0.25), DataStats(), DataStats())
    assert len(held_out) == 10 and len(train) == 29  # every 4th of the 40 documents; empty index 5 skipped


def test_mlm_batches_from_tfds(data_dir, tmp_path):
    config = tfds_config(data_dir, tfds_eval_split="validation", seq_len=32, vocab_size=120,
                         newline_ends_sentence=True)
    data = build_mlm_data(config, 4, str(tmp_path), process_index=0, process_count=1)
    assert data.stats.documents == 39 and data.stats.sentences == 78 and data.eval_stats.documents == 8
    batch = next(data.train)
    assert batch["input_ids"].shape == (4, 32) and batch["mask_weights"].sum() > 0
    assert np.all(batch["targets"][:, 0] == 2)


def test_streaming_reads_each_array_record_file_as_a_shard_of_one_process(tmp_path):
    from jaxpos.data.stream import ShardReader, list_shards, shard_documents

    directory = str(tmp_path / "tfds")
    JaxposDataTinyText(data_dir=directory, file_format="array_record").download_and_prepare(
        download_config=tfds.download.DownloadConfig(num_shards=3))
    config = tfds_config(directory, tfds_eval_split="validation", seq_len=32, vocab_size=120, streaming=True,
                         newline_ends_sentence=True)
    shards = list_shards(config)
    assert [(s.start, s.stop) for s in shards] == [(0, 13), (13, 27), (27, 40)]
    assert [(s.start, s.stop) for s in list_shards(tfds_config(directory, tfds_split="train[5:30]"))] == [
        (0, 8), (8, 22), (22, 25)]
    read = [d for s in shards for _, d in shard_documents(config, s, DataStats())]
    assert sorted(read) == sorted(TEXTS)  # the shards partition the split
    documents = []
    for p in range(3):
        data = build_mlm_data(config, 3, str(tmp_path / "run"), process_index=p, process_count=3)
        assert [str(s) for s in data.train.shards] == [str(shards[p])]
        assert next(data.train)["input_ids"].shape == (1, 32) and len(data.eval_examples) > 0
        documents += [i for s in data.train.shards for i, _ in ShardReader(config, data.tokenizer, DataStats()).read(s)]
        assert "of 3" in data.train.describe()
    assert len(documents) == 39  # every non-empty training record, each read by one process
