"""Masked-LM example construction: BERT masking statistics, packing against a brute-force reading, sentences."""

import numpy as np
import pytest

from jaxpos.data import DataStats, hash_uniform, mask_batch, pack_documents, split_sentences, unigram_entropy
from jaxpos.data.tokenizer import CLS_ID, MASK_ID, NUM_MLM_SPECIAL, PAD_ID, SEP_ID, UNK_ID

VOCAB = 1000


def binomial_ok(count, trials, p, sigmas=5.0):
    return abs(count - p * trials) <= sigmas * np.sqrt(trials * p * (1 - p))


def test_masking_statistics_are_bert_s():
    rng = np.random.default_rng(0)
    targets = rng.integers(0, VOCAB, size=(2000, 128))  # ~0.5% special ids scattered inside the rows
    targets[:, 0] = CLS_ID
    lengths = rng.integers(10, 128, size=2000)
    targets[np.arange(128)[None, :] >= lengths[:, None]] = PAD_ID  # padded tails
    input_ids, weights = mask_batch(targets, np.arange(2000), (0, 0, 0), vocab_size=VOCAB)
    assert input_ids.dtype == np.int32 and weights.dtype == np.float32
    candidates = targets >= NUM_MLM_SPECIAL
    chosen = weights > 0
    assert not chosen[~candidates].any()  # [PAD], [UNK], [CLS], [SEP], [MASK] are never chosen
    assert np.array_equal(input_ids[~chosen], targets[~chosen])
    n = candidates.sum(1)
    np.testing.assert_array_equal(chosen.sum(1), np.maximum(1, np.floor(0.15 * n + 0.5)))  # BERT's count
    assert abs(chosen.sum() / candidates.sum() - 0.15) < 0.002
    k = chosen.sum()
    masked = chosen & (input_ids == MASK_ID)
    kept = chosen & (input_ids == targets)
    replaced = chosen & ~masked & ~kept
    p_same = 1 / (VOCAB - NUM_MLM_SPECIAL)  # a random replacement can draw the original token
    assert binomial_ok(masked.sum(), k, 0.8), masked.sum() / k
    assert binomial_ok(kept.sum(), k, 0.1 + 0.1 * p_same), kept.sum() / k
    assert binomial_ok(replaced.sum(), k, 0.1 - 0.1 * p_same), replaced.sum() / k
    random_ids = input_ids[replaced]
    assert random_ids.min() >= NUM_MLM_SPECIAL and random_ids.max() < VOCAB  # from the non-special vocabulary
    counts = np.bincount(random_ids // 100, minlength=10)  # uniform over it: each tenth gets its share
    assert all(binomial_ok(c, len(random_ids), p) for c, p in zip(counts, [95 / 995] + [100 / 995] * 9))


def test_masking_depends_on_the_example_and_key_not_on_the_batch():
    rng = np.random.default_rng(1)
    rows = rng.integers(NUM_MLM_SPECIAL, VOCAB, size=(3, 64))
    together = mask_batch(rows, np.array([7, 8, 9]), (5, 0, 2), vocab_size=VOCAB)
    alone = mask_batch(rows[1:2], np.array([8]), (5, 0, 2), vocab_size=VOCAB)
    np.testing.assert_array_equal(together[0][1], alone[0][0])
    np.testing.assert_array_equal(together[1][1], alone[1][0])
    next_epoch = mask_batch(rows[1:2], np.array([8]), (5, 0, 3), vocab_size=VOCAB)
    assert not np.array_equal(next_epoch[1], alone[1])  # a fresh draw each epoch


def test_masking_a_vocabulary_whose_special_ids_sit_elsewhere():
    """A Hugging Face vocabulary (special tokens at the end, [MASK] among them): the reserved ids are never chosen
    nor drawn as replacements, the mask token is its own, and reserving 0..4 gives the default's masking exactly."""
    rng = np.random.default_rng(2)
    targets = rng.integers(0, VOCAB, size=(500, 64))
    reserved = (995, 996, 997, 998, 999, 3)
    key = (0, 1, 0)
    input_ids, weights = mask_batch(targets, np.arange(500), key, vocab_size=VOCAB, mask_id=999, reserved=reserved)
    chosen = weights > 0
    assert not chosen[np.isin(targets, reserved)].any()
    n = (~np.isin(targets, reserved)).sum(1)
    np.testing.assert_array_equal(chosen.sum(1), np.maximum(1, np.floor(0.15 * n + 0.5)))
    replaced = chosen & (input_ids != 999) & (input_ids != targets)
    assert replaced.sum() > 200 and not np.isin(input_ids[replaced], reserved).any()
    assert binomial_ok((chosen & (input_ids == 999)).sum(), chosen.sum(), 0.8)
    assert input_ids[replaced].min() < 10 and input_ids[replaced].max() > 990  # the whole rest of the range
    default = mask_batch(targets, np.arange(500), key, vocab_size=VOCAB)
    same = mask_batch(targets, np.arange(500), key, vocab_size=VOCAB, reserved=range(NUM_MLM_SPECIAL))
    for a, b in zip(default, same):
        np.testing.assert_array_equal(a, b)


def test_hash_uniform_is_uniform_and_pure():
    u = hash_uniform(3, 0, np.arange(1000)[:, None], np.arange(1000)[None, :])
    assert u.shape == (1000, 1000) and 0 <= u.min() and u.max() < 1
    assert abs(u.mean() - 0.5) < 5 * np.sqrt(1 / 12 / u.size)
    assert abs(u.var() - 1 / 12) < 1e-3
    assert abs(np.corrcoef(u[:, :-1].ravel(), u[:, 1:].ravel())[0, 1]) < 5e-3  # neighbours uncorrelated
    np.testing.assert_array_equal(u[17, 40], hash_uniform(3, 0, 17, 40))


def test_packing_literal_rows():
    docs = [[[10, 11, 12], [13, 14]], [[20, 21]]]
    packed = pack_documents(docs, 10)
    np.testing.assert_array_equal(packed.tokens, [[CLS_ID, 10, 11, 12, 13, 14, SEP_ID, 20, 21, SEP_ID]])
    np.testing.assert_array_equal(packed.piece_ids, [[1, 1, 1, 1, 1, 1, 1, 2, 2, 2]])
    np.testing.assert_array_equal(packed.positions, [[0, 1, 2, 3, 4, 5, 6, 0, 1, 2]])  # restarting per piece
    packed = pack_documents(docs, 8)  # the second document does not fit: it starts the next row
    np.testing.assert_array_equal(packed.tokens, [[CLS_ID, 10, 11, 12, 13, 14, SEP_ID, PAD_ID],
                                                  [CLS_ID, 20, 21, SEP_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID]])
    np.testing.assert_array_equal(packed.piece_ids, [[1, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(packed.positions, [[0, 1, 2, 3, 4, 5, 6, 0], [0, 1, 2, 3, 0, 0, 0, 0]])
    packed = pack_documents([[[10, 11], [12, 13, 14, 15]]], 6)  # a document continues in the next row
    np.testing.assert_array_equal(packed.tokens, [[CLS_ID, 10, 11, SEP_ID, 0, 0], [CLS_ID, 12, 13, 14, 15, SEP_ID]])


def test_packing_matches_a_brute_force_reading():
    rng = np.random.default_rng(2)
    seq_len, next_id = 16, 100
    docs, owner, sentence_of = [], {}, {}
    for d in range(60):
        doc = []
        for _ in range(rng.integers(1, 6)):
            length = int(rng.integers(1, 9) if rng.random() < 0.9 else rng.integers(15, 40))
            sentence = list(range(next_id, next_id + length))  # unique ids: each token names its sentence
            owner.update(dict.fromkeys(sentence, d))
            sentence_of.update(dict.fromkeys(sentence, len(sentence_of)))
            next_id += length
            doc.append(sentence)
        docs.append(doc)
    stats = DataStats()
    packed = pack_documents(docs, seq_len, stats)
    assert packed.tokens.shape[1] == seq_len and packed.tokens.dtype == np.int32
    assert stats.packed_examples == len(packed)
    assert stats.split_long == sum(len(s) > seq_len - 2 for d in docs for s in d)
    content = [t for row in packed.tokens for t in row if t >= NUM_MLM_SPECIAL]
    assert content == [t for d in docs for s in d for t in s]  # every sentence, in order, nothing else
    rows_of_sentence = {}
    for r, (row, piece_ids) in enumerate(zip(packed.tokens, packed.piece_ids)):
        assert row[0] == CLS_ID and piece_ids[0] == 1
        used = int((piece_ids > 0).sum())
        assert np.all(piece_ids[used:] == 0) and np.all(row[used:] == PAD_ID) and np.all(piece_ids[:used] > 0)
        assert row[used - 1] == SEP_ID
        for i in range(1, used):
            if row[i] >= NUM_MLM_SPECIAL:
                rows_of_sentence.setdefault(sentence_of[row[i]], set()).add(r)
            if i + 1 < used and row[i] >= NUM_MLM_SPECIAL and row[i + 1] >= NUM_MLM_SPECIAL:
                assert owner[row[i]] == owner[row[i + 1]]  # no document changes without a [SEP]
            if row[i] == SEP_ID:  # a piece ends: the piece id changes exactly when the document does
                assert piece_ids[i] == piece_ids[i - 1]
                if i + 1 < used:
                    assert piece_ids[i + 1] == piece_ids[i] + 1 and owner[row[i - 1]] != owner[row[i + 1]]
    for sentence, rows in rows_of_sentence.items():
        length = sum(1 for v in sentence_of.values() if v == sentence)
        assert len(rows) == 1 or length > seq_len - 2  # only long sentences span rows


def test_sentence_splitting():
    text = 'One. Two is "here!" Three?\nstill three.\n\nA new paragraph (e.g. this) 3.5 stays'
    assert split_sentences(text) == ["One.", 'Two is "here!"', "Three? still three.",
                                     "A new paragraph (e.g. this) 3.5 stays"]
    assert split_sentences("Line one\nLine two. Next", newline_ends_sentence=True) == ["Line one", "Line two.",
                                                                                       "Next"]
    assert split_sentences(" \n\n \t ") == []


def test_unigram_entropy_from_tokens_or_counts():
    tokens = np.array([[CLS_ID, 5, 5, 6], [7, 7, 7, SEP_ID]])
    p = np.array([2, 1, 3]) / 6
    expected = -(p * np.log(p)).sum()
    assert unigram_entropy(tokens) == pytest.approx(expected)
    assert unigram_entropy([[5, 5], [6, 7, 7, 7, UNK_ID]]) == pytest.approx(expected)
    assert unigram_entropy(counts={5: 2, 6: 1, 7: 3, PAD_ID: 50}) == pytest.approx(expected)
    assert unigram_entropy(counts=np.array([9, 9, 9, 9, 9, 2, 1, 3])) == pytest.approx(expected)
    assert unigram_entropy(np.arange(5, 5 + 64)) == pytest.approx(np.log(64))
    with pytest.raises(ValueError, match="no non-special tokens"):
        unigram_entropy(np.array([PAD_ID, CLS_ID]))
