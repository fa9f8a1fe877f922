"""Token identifiability: the nearest-in-sentence rule against a loop, and probes on constructed cases."""

import numpy as np
import pytest

from jaxpos.analysis.identifiability import (identifiability_by_layer, identified, split_by_sentence,
                                             train_probe)


def test_identified_matches_a_loop():
    rng = np.random.default_rng(0)
    inputs = rng.normal(size=(30, 4))
    predictions = inputs + rng.normal(scale=0.8, size=(30, 4))
    sentences = np.repeat(np.arange(6), 5)
    got = identified(predictions, inputs, sentences)
    for i in range(30):
        same = np.flatnonzero(sentences == sentences[i])
        nearest = same[np.argmin([np.sum((predictions[i] - inputs[j]) ** 2) for j in same])]
        assert got[i] == (nearest == i)
    assert 0 < got.mean() < 1


def test_a_repeated_token_is_identified_at_each_copy():
    x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])  # token 0 twice, no position embeddings
    assert identified(x, x, np.zeros(3, int)).all()  # the naive probe at layer 0 identifies every token
    assert not identified(x[[1, 0, 0]], x, np.zeros(3, int))[0]


def test_split_keeps_sentences_whole():
    sentences = np.repeat(np.arange(40), 3)
    train, val, test = split_by_sentence(sentences)
    assert (train ^ val ^ test).all() and not (train & val).any()
    for mask in (train, val, test):
        assert set(sentences[mask]).isdisjoint(set(sentences[~mask]))
    assert train.sum() == 28 * 3 and val.sum() == 6 * 3


def test_probes_on_constructed_hidden_states():
    rng = np.random.default_rng(1)
    inputs = rng.normal(size=(600, 6)).astype(np.float32)
    sentences = np.repeat(np.arange(60), 10)
    mixing = rng.normal(size=(6, 6)).astype(np.float32)
    hidden = np.stack([inputs, inputs @ mixing, np.zeros_like(inputs)])  # identity, invertible map, no information
    naive = identifiability_by_layer(hidden[:1], inputs, sentences, kind="naive")
    assert naive[0] == 1.0
    linear = identifiability_by_layer(hidden, inputs, sentences, kind="linear", learning_rate=3e-2, patience=5)
    assert linear[0] > 0.97 and linear[1] > 0.97
    assert linear[2] < 0.3  # chance is 1/10 per sentence
    across = identifiability_by_layer(hidden[:2], inputs, sentences, kind="linear", train_layer=0,
                                      learning_rate=3e-2, patience=5)
    assert across[0] > 0.97 and across[1] < 0.9  # a probe for layer 0 does not transfer to the mixed layer
    mlp = identifiability_by_layer(hidden[1:2], inputs, sentences, kind="mlp", learning_rate=1e-3, patience=3,
                                   max_epochs=60)
    assert mlp[0] > 0.9
    with pytest.raises(ValueError, match="unknown probe 'cubic'"):
        train_probe("cubic", inputs, inputs, sentences < 40, sentences >= 40)
