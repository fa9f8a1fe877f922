"""The MLM pipeline end to end: batches, resumable order, host sharding, held-out batches, clear errors."""

import json
import types

import numpy as np
import pytest

from jaxpos.data import CLS_ID, MASK_ID, PAD_ID, SEP_ID, MLMTrainIterator, PackedExamples, build_mlm_data, eval_batches
from jaxpos.data.pipeline import held_out_rows
from jaxpos.config.data import default_data_config

KEYS = ("input_ids", "targets", "mask_weights", "piece_ids", "positions", "token_types")


def data_config(**overrides):
    config = default_data_config()
    config.update(overrides)
    return config


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("mlm"))
    return build_mlm_data(data_config(vocab_size=1000, seq_len=64), 16, workdir, process_index=0,
                          process_count=1), workdir


def synthetic_iterator(num_examples=40, seq_len=12, batch_size=8, seed=3, **kwargs):
    rng = np.random.default_rng(1)
    tokens = rng.integers(5, 50, (num_examples, seq_len)).astype(np.int32)
    tokens[:, 0] = CLS_ID
    examples = PackedExamples(tokens, np.ones_like(tokens))
    return MLMTrainIterator(examples, types.SimpleNamespace(vocab_size=50), batch_size, seed=seed,
                            process_index=kwargs.get("process_index", 0), process_count=kwargs.get("hosts", 1))


def test_embedded_batches_have_the_documented_layout(embedded):
    data, _ = embedded
    batch = next(data.train)
    assert {k: (v.shape, v.dtype.name) for k, v in batch.items()} == {
        "input_ids": ((16, 64), "int32"), "targets": ((16, 64), "int32"), "mask_weights": ((16, 64), "float32"),
        "piece_ids": ((16, 64), "int32"), "positions": ((16, 64), "int32"), "token_types": ((16, 64), "int32")}
    targets, weights = batch["targets"], batch["mask_weights"]
    assert np.all(targets[:, 0] == CLS_ID) and not batch["token_types"].any()
    special = np.isin(targets, [PAD_ID, CLS_ID, SEP_ID])
    assert not weights[special].any() and np.array_equal(batch["input_ids"][special], targets[special])
    assert np.array_equal(batch["piece_ids"] == 0, targets == PAD_ID)
    for row, piece_ids, positions in zip(targets, batch["piece_ids"], batch["positions"]):  # a brute-force reading
        starts = [t for t in range(64) if piece_ids[t] and (t == 0 or piece_ids[t] != piece_ids[t - 1])]
        expected = [t - max(s for s in starts if s <= t) if piece_ids[t] else 0 for t in range(64)]
        np.testing.assert_array_equal(positions, expected)
        assert all(row[s - 1] == SEP_ID for s in starts[1:])  # each later piece starts right after a [SEP]
    assert 0.13 < weights.sum() / (targets >= 5).sum() < 0.17
    assert (batch["input_ids"] == MASK_ID).sum() > 0.6 * weights.sum()
    stats = data.stats
    assert stats.documents > 150 and stats.packed_examples == len(data.train.examples) > 16
    assert stats.sentences > 2500 and stats.tokens > 50_000 and data.eval_stats.documents >= 10
    assert "packed_examples=" in data.summary() and data.tokenizer.vocab_size == 1000
    assert 4.0 < data.unigram_entropy < np.log(1000)
    assert data.tokenizer_trained


def test_a_rebuilt_pipeline_reuses_the_tokenizer_and_continues_the_batches(embedded):
    data, workdir = embedded
    again = build_mlm_data(data_config(vocab_size=1000, seq_len=64), 16, workdir, process_index=0,
                           process_count=1)
    assert not again.tokenizer_trained
    again.train.set_state(json.loads(json.dumps(data.train.get_state())))  # a checkpoint round trip
    expected, got = next(data.train), next(again.train)
    for key in KEYS:
        np.testing.assert_array_equal(got[key], expected[key])


def test_eval_batches_are_finite_fixed_and_padded_with_zero_weight(embedded):
    data, _ = embedded
    held_out = data.eval_examples
    batches = list(eval_batches(held_out, data.tokenizer, 16, seed=0))
    assert len(batches) == -(-len(held_out) // 16) and all(b["targets"].shape == (16, 64) for b in batches)
    again = list(eval_batches(held_out, data.tokenizer, 16, seed=0))
    for first, second in zip(batches, again):
        for key in KEYS:
            np.testing.assert_array_equal(first[key], second[key])
    rows = np.concatenate([b["targets"] for b in batches])
    np.testing.assert_array_equal(rows[:len(held_out)], held_out.tokens)
    weights = np.concatenate([b["mask_weights"] for b in batches])
    assert weights[:len(held_out)].sum(1).min() > 0 and not weights[len(held_out):].any()
    assert len(list(eval_batches(held_out, data.tokenizer, 16, max_batches=1))) == 1
    halves = [list(eval_batches(held_out, data.tokenizer, 16, process_index=h, process_count=2)) for h in (0, 1)]
    for whole, first, second in zip(batches, *halves):
        np.testing.assert_array_equal(np.concatenate([first["input_ids"], second["input_ids"]]), whole["input_ids"])


def test_held_out_rows_alone_are_the_pipelines_held_out_rows(embedded):
    data, _ = embedded
    rows = held_out_rows(data_config(vocab_size=1000, seq_len=64), data.tokenizer)
    np.testing.assert_array_equal(rows.tokens, data.eval_examples.tokens)
    np.testing.assert_array_equal(rows.piece_ids, data.eval_examples.piece_ids)
    with pytest.raises(ValueError, match="in-memory source"):
        held_out_rows(data_config(streaming=True, source="text", paths=["x.txt"]), data.tokenizer)


def test_resumed_iterator_sees_the_same_batches_and_epochs_reshuffle_and_remask():
    straight = synthetic_iterator()
    seen = [next(straight) for _ in range(12)]  # 5 batches per epoch: crosses two epoch boundaries
    interrupted = synthetic_iterator()
    for _ in range(7):
        next(interrupted)
    state = json.loads(json.dumps(interrupted.get_state()))  # plain ints survive JSON
    resumed = synthetic_iterator()
    resumed.set_state(state)
    for k in range(7, 12):
        got = next(resumed)
        for key in KEYS:
            np.testing.assert_array_equal(got[key], seen[k][key])
    epoch0, epoch1 = (np.concatenate([b["targets"] for b in seen[e * 5:(e + 1) * 5]]) for e in (0, 1))
    assert not np.array_equal(epoch0, epoch1)
    assert len({r.tobytes() for r in epoch0}) == 40  # an epoch visits every example once
    order0, order1 = straight.order(0), straight.order(1)
    shared = order0[:40][np.isin(order0[:40], order1[:40])][0]  # one example seen in both epochs
    row0 = np.flatnonzero(np.concatenate([straight.global_indices(k) for k in range(5)]) == shared)[0]
    row1 = np.flatnonzero(np.concatenate([straight.global_indices(k) for k in range(5, 10)]) == shared)[0]
    weights0 = np.concatenate([b["mask_weights"] for b in seen[:5]])[row0]
    weights1 = np.concatenate([b["mask_weights"] for b in seen[5:10]])[row1]
    assert not np.array_equal(weights0, weights1)  # fresh masks each epoch
    again = synthetic_iterator()
    np.testing.assert_array_equal(again.batch_at(6)["input_ids"], seen[6]["input_ids"])  # pure in (seed, step)
    assert not np.array_equal(synthetic_iterator(seed=4).batch_at(6)["targets"], seen[6]["targets"])
    with pytest.raises(ValueError, match=r"saved for other data .*'num_rows': \(40, 41\)"):
        synthetic_iterator(num_examples=41).set_state(state)


def test_hosts_get_disjoint_slices_whose_union_is_the_global_batch():
    whole = synthetic_iterator().batch_at(3)
    parts = [synthetic_iterator(process_index=h, hosts=4).batch_at(3) for h in range(4)]
    assert all(p["targets"].shape == (2, 12) for p in parts)
    for key in KEYS:
        np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), whole[key])
    indices = [synthetic_iterator(process_index=h, hosts=4) for h in range(4)]
    slices = [it.global_indices(3)[it.host_start:it.host_start + it.host_rows] for it in indices]
    assert len(set(np.concatenate(slices).tolist())) == 8
    with pytest.raises(ValueError, match="global batch size 8 does not divide over 3 hosts"):
        synthetic_iterator(hosts=3)


def test_a_corpus_too_small_for_one_batch_is_a_clear_error(embedded, tmp_path):
    data, _ = embedded
    (tmp_path / "small.txt").write_text("A very small corpus. Only two sentences.\n\nAnd one more document.\n\n"
                                        "A held-out document.")
    config = data_config(source="text", paths=[str(tmp_path / "small.txt")], eval_fraction=1 / 3, seq_len=16,
                         tokenizer_path=data.tokenizer.path)
    # three sentences of 7-9 tokens: no two fit together in a row of 16
    with pytest.raises(ValueError, match="packs into 3 examples of 16 tokens, fewer than one global batch of 8"):
        build_mlm_data(config, 8, str(tmp_path / "run"), process_index=0, process_count=1)
    config.eval_fraction = 0.0
    with pytest.raises(ValueError, match="held-out split is empty"):
        build_mlm_data(config, 8, str(tmp_path / "run"), process_index=0, process_count=1)


def test_text_files_with_bad_data_train_end_to_end(embedded, tmp_path):
    data, _ = embedded
    paragraph = " ".join(["Assignment statements bind names to values."] * 3)
    (tmp_path / "a.txt").write_bytes((("\n\n".join([paragraph] * 30)) + "\n\n\n  \n\nBad \xff\xfe bytes.").encode(
        "latin-1"))
    config = data_config(source="text", paths=[str(tmp_path / "*.txt")], seq_len=32, eval_fraction=0.1,
                         tokenizer_path=data.tokenizer.path)
    built = build_mlm_data(config, 4, str(tmp_path / "run"), process_index=0, process_count=1)
    assert built.stats.undecodable == 2 and built.stats.undecodable_files == 1
    assert built.stats.skipped_empty + built.eval_stats.skipped_empty == 1
    assert built.stats.documents + built.eval_stats.documents == 31
    assert built.tokenizer.path == data.tokenizer.path and not built.tokenizer_trained
    assert next(built.train)["input_ids"].shape == (4, 32)
