"""Pseudo-log-likelihoods against a brute-force loop over unpadded rows, the minimal-pair score's counting, and a
model without positions scoring a sentence and any reordering of it alike."""

import jax
import numpy as np
import pytest

from jaxpos.data.tokenizer import CLS_ID, MASK_ID, NUM_MLM_SPECIAL, PAD_ID, SEP_ID
from jaxpos.evaluation.pseudo_likelihood import masked_copies, preference, pseudo_log_likelihoods
from jaxpos.models import BertForMaskedLM
from tests.helpers import tiny_config


def model_and_params(kind: str, seed: int = 0):
    model = BertForMaskedLM(tiny_config(dict(kind=kind)))
    ids = np.zeros((1, model.cfg.max_length), np.int32)
    return model, jax.tree.map(np.asarray, model.init(jax.random.key(seed), ids)["params"])


def sentences(seed: int, count: int, vocab: int = 61, longest: int = 14) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [list(rng.integers(NUM_MLM_SPECIAL, vocab, int(rng.integers(1, longest + 1)))) for _ in range(count)]


def test_masked_copies_mask_each_token_once_in_a_cls_sep_row():
    copies = masked_copies([[7, 8, 9], [10]], 6)
    expected = [[CLS_ID, MASK_ID, 8, 9, SEP_ID, PAD_ID], [CLS_ID, 7, MASK_ID, 9, SEP_ID, PAD_ID],
                [CLS_ID, 7, 8, MASK_ID, SEP_ID, PAD_ID], [CLS_ID, MASK_ID, SEP_ID, PAD_ID, PAD_ID, PAD_ID]]
    np.testing.assert_array_equal(copies["input_ids"], expected)
    np.testing.assert_array_equal(copies["piece_ids"], np.array(expected) != PAD_ID)
    np.testing.assert_array_equal(copies["position"], [1, 2, 3, 1])
    np.testing.assert_array_equal(copies["target"], [7, 8, 9, 10])
    np.testing.assert_array_equal(copies["sentence"], [0, 0, 0, 1])
    with pytest.raises(ValueError, match="sentence 0 has 3 tokens; rows of 4 hold 2"):
        masked_copies([[7, 8, 9]], 4)


@pytest.mark.parametrize("kind", [pytest.param("absolute", marks=pytest.mark.slow), "tisa"])
def test_pseudo_log_likelihood_matches_a_loop_over_unpadded_rows(kind):
    model, params = model_and_params(kind)
    batch = sentences(1, 6)
    got = pseudo_log_likelihoods(model, params, batch, batch_size=5)  # batches split sentences and are padded
    for k, ids in enumerate(batch):
        total = 0.0
        for i in range(len(ids)):
            row = np.array([[CLS_ID, *ids, SEP_ID]], np.int32)
            row[0, i + 1] = MASK_ID
            logits = np.asarray(model.apply({"params": params}, row, piece_ids=np.ones_like(row),
                                            token_types=np.zeros_like(row)), np.float64)[0, i + 1]
            total += logits[ids[i]] - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
        assert abs(got[k] - total) < 1e-4 * max(1.0, abs(total)), (k, got[k], total)


def test_without_positions_a_reordered_sentence_scores_the_same_and_ties():
    model, params = model_and_params("none")
    originals = sentences(2, 8)
    reordered = [list(np.random.default_rng(k).permutation(s)) for k, s in enumerate(originals)]
    scores = pseudo_log_likelihoods(model, params, originals + reordered, batch_size=16)
    score = preference(scores[:8], scores[8:])
    assert score["ties"] == 8 and score["accuracy"] == 0.5
    model, params = model_and_params("absolute")  # with positions the order changes the scores
    scores = pseudo_log_likelihoods(model, params, originals + reordered, batch_size=16)
    changed = [k for k in range(8) if originals[k] != reordered[k]]
    assert np.all(np.abs(scores[:8] - scores[8:])[changed] > 1e-3)


def test_preference_counts_wins_and_half_ties_with_a_wilson_interval():
    score = preference(np.array([-1.0, -2.0, -3.0, -4.0]), np.array([-2.0, -1.0, -3.0 + 1e-5, -5.0]))
    assert score["accuracy"] == pytest.approx(2.5 / 4) and score["ties"] == 1 and score["pairs"] == 4
    assert score["low"] < 2.5 / 4 < score["high"]
    assert score["mean_difference"] == pytest.approx((1 - 1 - 1e-5 + 1) / 4)
    with pytest.raises(ValueError, match="no minimal pairs"):
        preference(np.array([]), np.array([]))
