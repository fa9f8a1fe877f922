"""URLs wherever a path goes (data globs, tokenizer files, TensorBoard events, workdir files): a fake gs:// behind
etils.epath's own interface (`epath.testing.mock_epath`), kept in a local folder, so nothing leaves the machine."""

import os
import struct

import pytest
from etils import epath

from jaxpos.data import DataStats, embedded_documents, load_tokenizer, split_sentences
from jaxpos.config.data import default_data_config
from jaxpos.data.corpus import expand_globs, text_file_documents
from jaxpos.data.pipeline import build_mlm_data
from jaxpos.data.tokenizer import load_or_train_tokenizer, train_sentencepiece
from tests.helpers import fake_gcs


def event_scalars(data: bytes) -> list[tuple[str, int, float]]:
    """(tag, step, value) of each scalar in a TensorBoard event file (TFRecord framing: length, crc, payload,
    crc)."""
    from tensorboardX.proto import event_pb2

    scalars, offset = [], 0
    while offset < len(data):
        (length,) = struct.unpack("<Q", data[offset:offset + 8])
        event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
        offset += 16 + length
        scalars += [(value.tag, event.step, value.simple_value) for value in event.summary.value]
    return scalars


@pytest.fixture(scope="module")
def sentences():
    return [s for d in embedded_documents()[:30] for s in split_sentences(d)]


def test_globs_text_and_tokenizers_at_urls(tmp_path, sentences):
    corpus = tmp_path / "bucket" / "corpus"
    corpus.mkdir(parents=True)
    documents = embedded_documents()[:6]
    (corpus / "b.txt").write_text("\n\n".join(documents[3:]))
    (corpus / "a.txt").write_text("\n\n".join(documents[:3]))
    (corpus / "sub").mkdir()
    with fake_gcs(tmp_path):
        assert expand_globs("gs://bucket/corpus/*.txt") == ["gs://bucket/corpus/a.txt", "gs://bucket/corpus/b.txt"]
        assert expand_globs(["gs://bucket/corpus/b.txt"]) == ["gs://bucket/corpus/b.txt"]
        with pytest.raises(FileNotFoundError, match="the glob 'gs://bucket/corpus/.*.md' matches no file"):
            expand_globs("gs://bucket/corpus/*.md")
        stats = DataStats()
        read = list(text_file_documents("gs://bucket/corpus/*.txt", "file", stats))
        assert read == ["\n\n".join(documents[:3]), "\n\n".join(documents[3:])] and stats.files == 2

        remote = train_sentencepiece(sentences, "gs://bucket/tok/spm", 300)
        assert remote.path == "gs://bucket/tok/spm.model" and (tmp_path / "bucket" / "tok" / "spm.model").exists()
        local = train_sentencepiece(sentences, str(tmp_path / "spm"), 300)
        text = "The value of the attribute is bound."
        assert load_tokenizer("gs://bucket/tok/spm.model").encode(text) == local.encode(text)
        with pytest.raises(FileNotFoundError, match="'gs://bucket/tok/none.model' does not exist"):
            load_tokenizer("gs://bucket/tok/none.model")
        first, trained = load_or_train_tokenizer("gs://bucket/run", iter(sentences), 300, process_index=0,
                                                 process_count=1)
        again, retrained = load_or_train_tokenizer("gs://bucket/run", iter(sentences), 300, process_index=0,
                                                   process_count=1)
        assert trained and not retrained and again.path == "gs://bucket/run/spm_mlm.model"

        config = default_data_config()
        config.update(source="text", paths=["gs://bucket/corpus/*.txt"], seq_len=32, eval_fraction=0.2,
                      streaming=True, tokenizer_path="gs://bucket/tok/spm.model")
        data = build_mlm_data(config, 4, "gs://bucket/run", process_index=0, process_count=2, eval_rows=4)
        assert next(data.train)["input_ids"].shape == (2, 32) and len(data.eval_examples) == 4


def test_tensorboard_events_and_run_files_at_a_url(tmp_path):
    from jaxpos.config.files import write_run_file
    from jaxpos.training.metrics import MetricWriter

    with fake_gcs(tmp_path):
        writer = MetricWriter("gs://bucket/run", total_steps=2, sync_every_s=3600)
        writer.scalars(1, {"loss": 2.5}, echo=False)
        events = tmp_path / "bucket" / "run" / "tensorboard"
        synced = [p.name for p in events.iterdir()]
        assert len(synced) == 1 and synced[0].startswith("events.out.tfevents")  # the first write is copied
        first_copy = (events / synced[0]).read_bytes()
        writer.scalars(2, {"loss": 1.5}, echo=False)
        assert (events / synced[0]).read_bytes() == first_copy  # copied at most every sync_every_s
        writer.close()
        assert event_scalars((events / synced[0]).read_bytes()) == [("train/loss", 1, 2.5), ("train/loss", 2, 1.5)]
        assert not os.path.exists(writer.local_dir)
        assert write_run_file("gs://bucket/run", "config.json", "{}") == "gs://bucket/run/config.json"
        assert epath.Path("gs://bucket/run/config.json").read_text() == "{}"
    assert (tmp_path / "bucket" / "run" / "config.json").read_text() == "{}"


def test_a_run_config_is_read_from_a_url(tmp_path):
    from jaxpos.config.files import load_run_config

    workdir = tmp_path / "bucket" / "runs" / "tiny"
    workdir.mkdir(parents=True)
    (workdir / "config.json").write_text('{"task": "mlm", "model": {"d_model": 32}}')
    (tmp_path / "bucket" / "runs" / "broken").mkdir()
    (tmp_path / "bucket" / "runs" / "broken" / "config.json").write_text("{not json")
    with fake_gcs(tmp_path):
        assert load_run_config("gs://bucket/runs/tiny", "mlm").model.d_model == 32
        with pytest.raises(ValueError, match="a 'mlm' run; this command reads 'translation'"):
            load_run_config("gs://bucket/runs/tiny", "translation")
        with pytest.raises(ValueError, match="not a valid JSON config"):
            load_run_config("gs://bucket/runs/broken", "mlm")
        with pytest.raises(FileNotFoundError, match="does not exist"):
            load_run_config("gs://bucket/runs/missing", "mlm")
