"""The passkey probe on predictors whose answer is known: one that reads the key where it is hidden retrieves every
key at every depth; one that sees only its own token (the [MASK] it predicts at) gives one answer whatever the row,
so it retrieves exactly the keys equal to that answer, counted here by hand (a trained run's entries:
tests/evaluation/test_lengths.py)."""

import numpy as np
import pytest

from jaxpos.data.corpus import embedded_documents
from jaxpos.data.mlm import split_sentences
from jaxpos.data.tokenizer import MASK_ID, train_sentencepiece
from jaxpos.evaluation.passkey import INTRO, digit_candidates, passkey_accuracy, passkey_by_depth, passkey_rows


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    texts = embedded_documents()[:30]
    return train_sentencepiece((s for d in texts for s in split_sentences(d)), str(tmp_path_factory.mktemp("spm") /
                                                                                   "spm"), 300)


@pytest.fixture(scope="module")
def stream(tokenizer):
    return np.asarray([t for d in embedded_documents()[30:34] for t in tokenizer.encode(d)], np.int32)


def one_hot(answers: np.ndarray, vocab: int) -> np.ndarray:
    return np.eye(vocab, dtype=np.float32)[answers]  # [B, D] -> [B, D, V]


def test_the_rows_hide_the_key_at_its_depth_and_ask_for_it_at_the_end(tokenizer, stream):
    rows = passkey_rows(stream, tokenizer, 96, 0.5, examples=6, seed=1)
    intro = tokenizer.encode(INTRO)
    assert rows.ids.shape == (6, 96) and rows.columns.shape == rows.keys.shape == (6, 5)
    for ids, columns, key in zip(rows.ids, rows.columns, rows.keys):
        assert (ids[columns] == MASK_ID).all() and list(ids[columns[0] - len(intro):columns[0]]) == intro
        hidden = next(i for i in range(len(ids)) if list(ids[i:i + len(intro)]) == intro) + len(intro)
        np.testing.assert_array_equal(ids[hidden:hidden + 5], key)
        filler = 96 - 2 - 2 * (len(intro) + 5 + len(tokenizer.encode(".")))
        assert hidden - len(intro) - 1 == round(0.5 * filler)  # after half the filler ([CLS] first)
    assert set(rows.keys.ravel()) <= set(digit_candidates(tokenizer))
    assert "cannot hold" in passkey_rows(stream, tokenizer, 12, 0.5)


def test_a_predictor_reading_the_hidden_key_retrieves_every_key(tokenizer, stream):
    intro = tokenizer.encode(INTRO)

    def oracle(ids, columns):  # the 5 tokens after the first "the pass key is" of each row
        answers = []
        for row in ids:
            at = next(i for i in range(len(row)) if list(row[i:i + len(intro)]) == intro) + len(intro)
            answers.append(row[at:at + 5])
        return one_hot(np.asarray(answers), tokenizer.vocab_size)

    got = passkey_by_depth(oracle, stream, tokenizer, 128, depths=(0.0, 0.5, 1.0), examples=8)
    assert {d: (r["accuracy"], r["digit_accuracy"]) for d, r in got["depths"].items()} == {
        "0": (1.0, 1.0), "0.5": (1.0, 1.0), "1": (1.0, 1.0)}


def test_a_predictor_that_sees_only_its_own_token_retrieves_by_chance(tokenizer, stream):
    candidates = digit_candidates(tokenizer)
    guess = candidates[3]  # what a model that only sees the [MASK] at a position says, whatever the row

    def own_token_only(ids, columns):
        return one_hot(np.where(np.take_along_axis(ids, columns, 1) == MASK_ID, guess, 0), tokenizer.vocab_size)

    rows = passkey_rows(stream, tokenizer, 96, 0.9, examples=400, seed=2)
    got = passkey_accuracy(own_token_only, rows)
    assert got["digit_accuracy"] == pytest.approx((rows.keys == guess).mean())  # counted by hand
    assert got["accuracy"] == float((rows.keys == guess).all(1).mean()) == 0.0
    k = len(candidates)
    assert got["floor"] == pytest.approx(k ** -5) and got["digit_floor"] == pytest.approx(1 / k)
    assert abs(got["digit_accuracy"] - 1 / k) < 4 * np.sqrt((1 / k) * (1 - 1 / k) / rows.keys.size)


def test_a_vocabulary_without_digits_says_so_instead_of_failing(tmp_path, stream):
    texts = [d.translate(str.maketrans("", "", "0123456789")) for d in embedded_documents()[:30]]
    letters = train_sentencepiece((s for d in texts for s in split_sentences(d)), str(tmp_path / "spm"), 300)
    assert len(digit_candidates(letters)) < 2
    assert passkey_by_depth(None, stream, letters, 128) == {
        "skipped": "the vocabulary gives fewer than two digits a piece of their own: no key to hide"}
