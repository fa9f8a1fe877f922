"""Word-order perturbations (Chen et al. §5) and the offline word_order task."""

from collections import Counter

import numpy as np
import pytest

from jaxpos.data.classification import Example, load_examples
from jaxpos.config.data import default_finetune_data_config
from jaxpos.data.word_order import (STOP_WORDS, can_shuffle, global_swap, is_content_word, local_shuffle,
                                    offline_word_order_examples, perturb_examples, split_sentence_pools)

SENTENCE = ("The quick brown fox jumps over the lazy dog while a small cat watches from the old wooden "
            "fence, silently.").split()


@pytest.mark.parametrize("window", [2, 3, 4, 5])
def test_local_shuffle_moves_words_only_inside_their_window(window):
    for trial in range(20):
        shuffled = local_shuffle(SENTENCE, window, np.random.default_rng(trial))
        assert shuffled != SENTENCE and Counter(shuffled) == Counter(SENTENCE)
        for start in range(0, len(SENTENCE), window):  # the same words in every window [k·w, (k+1)·w)
            assert Counter(shuffled[start:start + window]) == Counter(SENTENCE[start:start + window])


def test_local_shuffle_without_any_possible_change():
    words = ["na", "na", "ba", "ba"]
    assert not can_shuffle(words, 2) and local_shuffle(words, 2, np.random.default_rng(0)) == words
    assert can_shuffle(words, 3) and local_shuffle(words, 3, np.random.default_rng(0)) != words
    with pytest.raises(ValueError, match="at least 2 words"):
        local_shuffle(words, 1, np.random.default_rng(0))


def test_content_words():
    assert {w for w in ["the", "The", "it,", "to", "cat", "guitar.", "(Python)", "x1", "is", "ab"]
            if is_content_word(w)} == {"cat", "guitar.", "(Python)"}
    assert "the" in STOP_WORDS and "between" in STOP_WORDS


@pytest.mark.parametrize("min_distance", [2, 5, 9])
def test_global_swap_exchanges_two_distant_content_words(min_distance):
    for trial in range(20):
        swapped = global_swap(SENTENCE, np.random.default_rng(trial), min_distance)
        changed = [i for i, (a, b) in enumerate(zip(SENTENCE, swapped)) if a != b]
        assert len(changed) == 2 and len(swapped) == len(SENTENCE)
        i, j = changed
        assert j - i >= min_distance and is_content_word(SENTENCE[i]) and is_content_word(SENTENCE[j])
        # the cores trade places; punctuation stays: "fence," <-> "fox" gives "fox," and "fence"
        assert swapped[i].strip(",.") == SENTENCE[j].strip(",.") and swapped[j].strip(",.") == SENTENCE[i].strip(",.")
        assert [w[-1] == "," for w in swapped] == [w[-1] == "," for w in SENTENCE]


def test_global_swap_without_a_far_pair():
    words = "The cat sat on the mat".split()  # content words: cat, sat, mat; at most 4 apart
    assert global_swap(words, np.random.default_rng(0), 5) == words
    assert global_swap(words, np.random.default_rng(0), 4) == "The mat sat on the cat".split()


def test_perturb_examples():
    examples = [Example(" ".join(SENTENCE), "a hypothesis", 2.0), Example("short", None, 0.0)]
    local = perturb_examples(examples, "local", 3, seed=1)
    assert local == perturb_examples(examples, "local", 3, seed=1) != perturb_examples(examples, "local", 3, seed=2)
    assert local[0].text_b == "a hypothesis" and local[0].label == 2.0 and local[0].text_a != examples[0].text_a
    assert local[1] == examples[1]  # a single word: kept as it is
    glob = perturb_examples(examples, "global", 0, seed=1)
    assert glob[1] == examples[1] and perturb_examples(examples, "global", 0, 1, drop_unchanged=True) == glob[:1]
    with pytest.raises(ValueError, match="kind='random'"):
        perturb_examples(examples, "random", 2, 0)


def test_offline_task_is_balanced_deterministic_and_split_by_document():
    pools = split_sentence_pools()
    assert min(len(p) for p in pools.values()) > 100
    assert not (set(pools["train"]) & set(pools["dev"]) or set(pools["train"]) & set(pools["test"])
                or set(pools["dev"]) & set(pools["test"]))
    dev = offline_word_order_examples("dev", seed=3)
    assert dev == offline_word_order_examples("dev", seed=3) != offline_word_order_examples("dev", seed=4)
    assert Counter(e.label for e in dev) == {0.0: len(pools["dev"]), 1.0: len(pools["dev"]), 2.0: len(pools["dev"])}
    originals = {e.text_a for e in dev if e.label == 0}
    assert originals == set(pools["dev"]) and all(e.text_b is None for e in dev)
    def letters(text):  # both perturbations keep the characters (a swap moves the cores, not the punctuation)
        return "".join(sorted(text.replace(" ", "")))

    bags = {letters(t) for t in originals}
    for e in dev:
        if e.label:  # a real change of one of the split's sentences
            assert e.text_a not in originals and letters(e.text_a) in bags
    ten = offline_word_order_examples("train", num_examples=10, seed=0)
    assert sorted(Counter(e.label for e in ten).values()) == [3, 3, 4]
    with pytest.raises(ValueError, match=r"has \d+ sentences .* fewer than the 100000 asked for"):
        offline_word_order_examples("test", num_examples=100_000)


def test_load_examples_offline():
    config = default_finetune_data_config()
    config.update(offline_test_examples=30, seed=5)
    test = load_examples(config, "test")
    assert len(test) == 30 and test == offline_word_order_examples("test", num_examples=30, seed=5)
    config.max_train_examples = 12
    assert len(load_examples(config, "train")) == 12
    with pytest.raises(ValueError, match="has no split 'dev_matched'"):
        load_examples(config, "dev_matched")
