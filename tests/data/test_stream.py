"""The streaming masked-LM path: the same batches as in memory where both apply, exact resumption from the
saved state, disjoint shards per process, clear errors; the tokenizer trained once (`jaxpos tokenizer`, or
process 0 while the others wait)."""

import argparse
import itertools
import json
import os
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest

from jaxpos.cli import main
from jaxpos.data import DataStats, embedded_documents, load_tokenizer, split_sentences
from jaxpos.config.data import default_data_config
from jaxpos.data.corpus import file_documents, is_eval_document
from jaxpos.data.mlm import encode_documents, pack_documents
from jaxpos.data.pipeline import build_mlm_data, eval_batches
from jaxpos.data.stream import Shard, ShardReader, StreamingMLMIterator, process_shards, stream_rows
from jaxpos.data.tokenizer import load_or_train_tokenizer, train_sentencepiece

KEYS = ("input_ids", "targets", "mask_weights", "piece_ids", "positions", "token_types")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Five text shards of 4 embedded documents each (blank-line-separated paragraphs), and a tokenizer."""
    root = tmp_path_factory.mktemp("stream")
    documents = embedded_documents()
    for i in range(5):
        (root / f"shard{i}.txt").write_text("\n\n".join(documents[4 * i:4 * (i + 1)]))
    sentences = [s for d in documents[:60] for s in split_sentences(d)]
    tokenizer = train_sentencepiece(sentences, str(root / "spm"), 400)
    return root, tokenizer


def data_config(root, tokenizer, pattern="shard*.txt", **overrides):
    config = default_data_config()
    config.update(dict(dict(source="text", paths=[str(root / pattern)], seq_len=32, eval_fraction=0.1,
                            tokenizer_path=tokenizer.path), **overrides))
    return config


def assert_same(first, second):
    for key in KEYS:
        np.testing.assert_array_equal(first[key], second[key], err_msg=key)


@pytest.mark.parametrize("shuffle", [True, False])
def test_one_shard_on_one_process_streams_the_in_memory_batches(corpus, tmp_path, shuffle):
    root, tokenizer = corpus
    kwargs = dict(process_index=0, process_count=1, eval_rows=32)
    memory = build_mlm_data(data_config(root, tokenizer, "shard0.txt", shuffle=shuffle), 32, str(tmp_path), **kwargs)
    stream = build_mlm_data(data_config(root, tokenizer, "shard0.txt", shuffle=shuffle, streaming=True), 32,
                            str(tmp_path), **kwargs)
    assert len(memory.train.examples) % 32 and memory.train.batches_per_epoch < 6  # 12 batches: several epochs
    for step in range(12):
        assert_same(next(stream.train), next(memory.train))
    assert stream.train.epoch == 11 // memory.train.batches_per_epoch
    np.testing.assert_array_equal(stream.eval_examples.tokens, memory.eval_examples.tokens[:32])
    for got, expected in zip(eval_batches(stream.eval_examples, tokenizer, 16, process_index=0, process_count=1),
                             eval_batches(memory.eval_examples, tokenizer, 16, 2, process_index=0, process_count=1)):
        assert_same(got, expected)


def test_every_row_position_restarts_the_stream_at_that_row(corpus):
    root, tokenizer = corpus
    config = data_config(root, tokenizer)
    shards = [Shard(str(root / f"shard{i}.txt")) for i in (3, 1)]
    reader = ShardReader(config, tokenizer, DataStats())
    rows = list(stream_rows(shards, reader.read, 32, DataStats()))
    assert any(p["taken"] > 0 for p, _ in rows) and rows[-1][0]["shard"] == 2  # mid-document and final rows
    for k, (position, _) in enumerate(rows):
        restarted = stream_rows(shards, reader.read, 32, DataStats(), json.loads(json.dumps(position)))
        assert [row for _, row in itertools.islice(restarted, 3)] == [row for _, row in rows[k:k + 3]]
    # The rows are the training documents of the shards packed in order, as in memory.
    documents = [d for shard in shards for i, d in enumerate(file_documents(shard.path, "blank_line", DataStats()))
                 if not is_eval_document(i, 0.1) and d.strip()]
    packed = pack_documents(encode_documents(documents, tokenizer, DataStats()), 32)
    np.testing.assert_array_equal([row[0] for _, row in rows], packed.tokens)
    np.testing.assert_array_equal([row[1] for _, row in rows], packed.piece_ids)


def iterator(root, tokenizer, process_index, window=7, batch_size=32, **kwargs):
    config = data_config(root, tokenizer)
    shards = [Shard(str(root / f"shard{i}.txt")) for i in range(5)]
    return StreamingMLMIterator(shards, ShardReader(config, tokenizer, DataStats()), 32, batch_size, vocab_size=400,
                                window=window, process_index=process_index, process_count=2, **kwargs)


def test_resuming_from_any_saved_state_reproduces_the_batches(corpus):
    root, tokenizer = corpus
    straight = iterator(root, tokenizer, 1)
    states, batches, epochs = [], [], []
    for _ in range(40):  # windows of 7 rows, 16 rows a process: batches span windows; several epochs
        states.append(json.loads(json.dumps(straight.get_state())))  # what a checkpoint keeps
        batches.append(next(straight))
        epochs.append(straight.epoch)
    positions = [s["processes"]["1"] for s in states]
    assert straight.epoch >= 2 and len({p["window"] for p in positions}) > 3
    assert any(0 < p["used"] < 7 for p in positions)  # states inside a window
    for k in range(0, 40, 3):
        resumed = iterator(root, tokenizer, 1)
        resumed.set_state(states[k])
        for expected in batches[k:k + 3]:
            assert_same(next(resumed), expected)
    first, second = (np.concatenate([b["targets"] for b, e in zip(batches, epochs) if e == n]) for n in (0, 1))
    assert sorted(map(bytes, first)) == sorted(map(bytes, second))  # one epoch: the same rows ...
    assert not np.array_equal(first, second)  # ... in a new order
    with pytest.raises(ValueError, match=r"saved for other data .*'window_size': \(7, 5\)"):
        iterator(root, tokenizer, 1, window=5).set_state(states[3])
    with pytest.raises(ValueError, match=r"no stream position for process 0 \(it has processes \['1'\]\)"):
        iterator(root, tokenizer, 0).set_state(states[3])


def test_processes_read_disjoint_shards(corpus):
    root, tokenizer = corpus
    for p, mine in ((0, (0, 2, 4)), (1, (1, 3))):
        it = iterator(root, tokenizer, p, window=10_000, batch_size=8, shuffle=False)
        assert [s.path for s in it.shards] == [str(root / f"shard{i}.txt") for i in mine]
        documents = [d for i in mine for j, d in enumerate(file_documents(str(root / f"shard{i}.txt"), "blank_line",
                                                                         DataStats()))
                     if not is_eval_document(j, 0.1) and d.strip()]
        expected = pack_documents(encode_documents(documents, tokenizer, DataStats()), 32).tokens
        epoch = len(expected) // 4
        got = np.concatenate([next(it)["targets"] for _ in range(epoch)])
        np.testing.assert_array_equal(got, expected[:epoch * 4])  # its own shards, nothing else
        assert next(it)["targets"].shape == (4, 32) and it.epoch == 1
    with pytest.raises(ValueError, match="the shard list is empty"):
        process_shards([], 0, 1)
    with pytest.raises(ValueError, match="3 shard.s. for 4 processes; .* at least 4"):
        process_shards([Shard("a"), Shard("b"), Shard("c")], 0, 4)
    with pytest.raises(ValueError, match="5 shard.s. for 8 processes"):
        build_mlm_data(data_config(root, tokenizer, streaming=True), 16, str(root / "run"), process_index=0,
                       process_count=8)
    tiny = data_config(root, tokenizer, "shard0.txt", streaming=True)
    data = build_mlm_data(tiny, 4096, str(root / "run"), process_index=0, process_count=1, eval_rows=4)
    with pytest.raises(ValueError, match=r"process 0's 1 shard\(s\) pack into \d+ rows of 32 tokens, fewer than"):
        next(data.train)


def test_the_tokenizer_command_trains_what_a_run_would(corpus, tmp_path, capsys):
    root, _ = corpus
    args = ["tokenizer", "--config", "configs/mlm/tiny.py", "--out", str(tmp_path / "tok.model"),
            "--config.data.source=text", f"--config.data.paths={root}/shard1.txt", "--config.data.vocab_size=300",
            "--config.data.eval_fraction=0.1", "--config.data.streaming=True"]
    assert main(args) == 0
    assert f"--config.data.tokenizer_path={tmp_path / 'tok.model'}" in capsys.readouterr().out
    vocab = (tmp_path / "tok.vocab").read_text()  # pieces and scores (the .model also records scratch paths)
    assert json.loads((tmp_path / "tok.json").read_text())["vocab_size"] == 300
    for streaming in (True, False):  # a small corpus: both paths train on all of its sentences
        config = data_config(root, load_tokenizer(str(tmp_path / "tok.model")), "shard1.txt", vocab_size=300,
                             tokenizer_path="", streaming=streaming)
        run = build_mlm_data(config, 4, str(tmp_path / f"run{streaming}"), process_index=0, process_count=1)
        assert run.tokenizer_trained and (tmp_path / f"run{streaming}" / "spm_mlm.vocab").read_text() == vocab
    assert main(["tokenizer", "--config", "configs/finetune/tiny.py", "--out", str(tmp_path / "x")]) == 2
    assert "is a 'finetune' config" in capsys.readouterr().err


def test_process_zero_trains_the_tokenizer_and_the_others_wait_for_it(corpus, tmp_path):
    root, _ = corpus
    sentences = [s for d in embedded_documents()[:20] for s in split_sentences(d)]
    workdir, results = str(tmp_path / "shared"), {}

    def waiter():
        results[1] = load_or_train_tokenizer(workdir, iter(()), 300, process_index=1, process_count=2, wait_s=60)

    thread = threading.Thread(target=waiter)
    thread.start()  # process 1 starts first and waits: it reads no sentences
    results[0] = load_or_train_tokenizer(workdir, iter(sentences), 300, process_index=0, process_count=2)
    thread.join(60)
    (first, trained0), (second, trained1) = results[0], results[1]
    assert trained0 and not trained1 and first.path == second.path
    assert second.encode("The value of the attribute.") == first.encode("The value of the attribute.")
    with pytest.raises(FileNotFoundError, match=r"process 1 of 2 waited 0 s for .*other/spm_mlm.model, which "
                                                r"process 0 trains.*jaxpos tokenizer --config CFG --out PATH"):
        load_or_train_tokenizer(str(tmp_path / "other"), iter(()), 300, process_index=1, process_count=2,
                                wait_s=0.2)


@pytest.mark.slow  # three compiled runs (~1 minute); the resume logic itself is covered by the test above
def test_a_resumed_training_run_continues_the_stream_exactly(corpus, tmp_path):
    """Through the loop's checkpoints (orbax JSON): a 4-step run stopped after 2, resumed to 4 == 4 steps straight."""
    import jax

    from jaxpos.config.run import run_config
    from jaxpos.models import BertForMaskedLM
    from jaxpos.training.loop import Trainer
    from jaxpos.training.mlm import MaskedLMTask
    from tests.training import synthetic

    root, tokenizer = corpus

    def run(workdir, stop_at=None):
        config = synthetic.config(4, checkpoint_every=2)
        config.model.vocab_size = tokenizer.vocab_size
        shards = [Shard(str(root / f"shard{i}.txt")) for i in range(5)]
        data = StreamingMLMIterator(shards, ShardReader(data_config(root, tokenizer), tokenizer, DataStats()), 16, 8,
                                    vocab_size=tokenizer.vocab_size, window=5, process_index=0, process_count=1)
        run = run_config(config, task="mlm")
        trainer = Trainer(run.train, str(workdir), MaskedLMTask(BertForMaskedLM(run.model), 16), log=False)
        synthetic.stopping(trainer, stop_at)  # the schedule still that of 4 steps: the same compiled step
        try:
            return trainer.run(data), data
        finally:
            trainer.close()

    straight, _ = run(tmp_path / "straight")
    run(tmp_path / "resumed", stop_at=2)
    resumed, data = run(tmp_path / "resumed")
    assert resumed.resumed_from == 2 and data.step == 4 and data.window > 0
    for a, b in zip(jax.tree.leaves(straight.state.params), jax.tree.leaves(resumed.state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # one process, one compiled step: bit for bit


def gather_worker(args) -> None:
    """One of 2 jax.distributed processes: 3 batches, the (collective) state, then the 4th batch, saved to OUT."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # cross-process collectives on the CPU
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}", num_processes=2,
                               process_id=args.process_id, initialization_timeout=60)
    root = __import__("pathlib").Path(args.root)
    config = data_config(root, load_tokenizer(str(root / "spm.model")))
    shards = [Shard(str(root / f"shard{i}.txt")) for i in range(5)]
    it = StreamingMLMIterator(shards, ShardReader(config, load_tokenizer(str(root / "spm.model")), DataStats()), 32,
                              32, vocab_size=400, window=7)
    first = [next(it) for _ in range(3)]
    state = it.get_state()
    np.savez(os.path.join(args.out, f"batches{jax.process_index()}.npz"), first=np.stack([b["targets"] for b in first]),
             fourth=next(it)["input_ids"])
    if jax.process_index() == 0:
        with open(os.path.join(args.out, "state.json"), "w") as f:
            json.dump(state, f)
    jax.distributed.shutdown()


def test_the_saved_state_holds_every_process_position(corpus, tmp_path):
    """Two real jax.distributed processes: process 0's checkpointed state resumes both."""
    root, tokenizer = corpus
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    workers = [subprocess.Popen([sys.executable, "-m", "tests.data.test_stream", "--port", str(port), "--process-id",
                                 str(p), "--root", str(root), "--out", str(tmp_path)], env=env,
                                cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for p in range(2)]
    try:
        outputs = [w.communicate(timeout=90)[0].decode() for w in workers]
    finally:
        for w in workers:
            w.kill()
    assert all(w.returncode == 0 for w in workers), outputs
    state = json.loads((tmp_path / "state.json").read_text())
    assert sorted(state["processes"]) == ["0", "1"]
    for p in range(2):
        saved = np.load(tmp_path / f"batches{p}.npz")
        alone = iterator(root, tokenizer, p)  # the same process index without jax.distributed
        np.testing.assert_array_equal(np.stack([next(alone)["targets"] for _ in range(3)]), saved["first"])
        resumed = iterator(root, tokenizer, p)
        resumed.set_state(state)
        np.testing.assert_array_equal(next(resumed)["input_ids"], saved["fourth"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for flag in ("--port", "--process-id"):
        parser.add_argument(flag, type=int, required=True)
    for flag in ("--root", "--out"):
        parser.add_argument(flag, required=True)
    gather_worker(parser.parse_args())
