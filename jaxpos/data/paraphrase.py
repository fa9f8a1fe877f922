"""Offline paraphrase identification from Bible editions (TaskSpec "bible_paraphrase", data.source='offline'), and
the data of Chen et al.'s word-order probe on it.

Pairs: for every two editions A, B of `editions` (A the earlier one in the list) and every verse v that both have
(a verse that cleans to "" in either is skipped):
  label 1  paraphrase      (A's v, B's v): the same verse in two translations
  label 0  not paraphrase  (A's v, B's w): w another verse of the same chapter, the one whose B text has the word
                           count closest to that of B's v (ties drawn from a generator seeded by (seed, chapter,
                           editions)); a verse whose B text equals B's v is never chosen (Psalm 136's refrains)
so length and topic say little about the label. Each (verse, A, B) gives one pair of each label, so the classes are
balanced; a verse whose chapter offers no other verse of another text is skipped. Splits are whole chapters by
`chapter_split` (data/bible.py; dev and test fractions 0.02 each by default, the translation split), the same in
every edition, so no chapter crosses splits. web, kjv, bbe (3 edition pairs), all verses: 178,088 / 3,518 / 4,854 pairs
(train / dev / test). At these default fractions, a masked-LM model pretrained on source=bible with
eval_fraction >= 0.04 saw no dev or test chapter.

Chen et al.'s probe (§5 and A.3; `probe_sets`), on a split's pairs, with the perturbations of data/word_order.py:
  local_x  every pair with sentence A shuffled inside windows of x words (Chen: constituents of x words of the
           premise); the meaning survives, so the label is kept
  global   the paraphrase pairs with two content words at least `min_distance` apart swapped in sentence A, or in B
           when A has no such pair (Chen swap agent and patient in the premise, else the hypothesis, of entailment
           pairs, which then contradict); the meaning changes, so they are labelled 0, not paraphrase
Pairs a perturbation cannot change are left out. The probe's score is the share of global pairs the model still
calls paraphrases (`jaxpos.evaluation.probes.swapped_paraphrase_share`); a model blind to word order calls them
paraphrases as often as it does the original pairs.

The offline word-order pair task (TaskSpec "bible_order"), in the spirit of PAWS: from every paraphrase pair
(A's v, B's v) above,
  label 1  same meaning  (A's v, B's v) as it is
  label 0  swapped       the same pair with two content words at least `min_distance` apart exchanged in one side
                         (the probe's global swap, which changes who does what to whom)
Both members of a couple hold the same words on each side, so a model blind to word order (no positions: bag of
words) gives both the same output and is at chance by construction; only word order tells the classes apart.
Words are not pieces: a tokenizer can split a word differently beside a mark glued to it ('"Many' and '"excel' lose
the word-start piece that 'Many' and 'excel' have), so the draws take a `keep` test of the couples as a tokenizer
encodes them (jaxpos.data.classification.same_pieces): a couple it refuses is left out and the next couple drawn
takes its place. Splits, balance and sizes follow the paraphrase task's (its chapters, its couples less the few
verses with no two content words far enough apart, and those `keep` refuses).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from typing import Callable, Sequence

import numpy as np

from jaxpos.config.rng import BIBLE_ORDER, BIBLE_PARAPHRASE
from jaxpos.data.bible import SPLITS, Verse, chapter_split, check_fractions, edition_chapters
from jaxpos.data.examples import Example
from jaxpos.data.word_order import perturb_examples, perturb_one_side

NOT_PARAPHRASE, PARAPHRASE = 0.0, 1.0  # class ids of TaskSpec "bible_paraphrase"
SWAPPED, SAME_MEANING = 0.0, 1.0  # class ids of TaskSpec "bible_order"


@dataclasses.dataclass(frozen=True)
class VersePair:
    """One example of the task with where it comes from: verse_a of edition_a, verse_b of edition_b."""

    edition_a: str
    edition_b: str
    verse_a: Verse  # (book, chapter, verse)
    verse_b: Verse  # verse_a for a paraphrase; another verse of the same chapter otherwise
    text_a: str
    text_b: str
    label: float

    def example(self) -> Example:
        return Example(self.text_a, self.text_b, self.label)


Keep = Callable[[list[tuple[VersePair, VersePair]]], Sequence[bool]]  # couples -> whether each may be drawn


def length_matched_foils(chapter: dict[Verse, str], rng: np.random.Generator) -> dict[Verse, Verse]:
    """verse -> the other verse of `chapter` (verse -> text of edition B) whose word count is closest to its own,
    ties drawn from `rng` (verses in canonical order); a verse with the same text is never chosen. A verse without
    any other is left out."""
    by_length: dict[int, list[Verse]] = {}
    for verse, text in chapter.items():
        by_length.setdefault(len(text.split()), []).append(verse)
    longest = max(by_length, default=0)
    foils = {}
    for verse, text in chapter.items():
        length = len(text.split())
        for gap in range(longest + 1):  # the nearest lengths first: most verses find a foil within a few words
            closest = sorted(other for other in by_length.get(length - gap, []) + (
                by_length.get(length + gap, []) if gap else []) if chapter[other] != text)
            if closest:
                foils[verse] = closest[rng.integers(len(closest))] if len(closest) > 1 else closest[0]
                break
    return foils


@functools.lru_cache(maxsize=2)  # the whole Bible's pools of one seed: ~100 MB
def paraphrase_pools(editions: tuple[str, ...], seed: int = 0, dev_fraction: float = 0.02,
                     test_fraction: float = 0.02, books: tuple[int, ...] = ()
                     ) -> dict[str, tuple[tuple[VersePair, VersePair], ...]]:
    """{"train", "dev", "test"} -> every (paraphrase, non-paraphrase) couple of the split, in canonical verse order,
    the edition pairs in list order for each verse; `books` = () reads all 66 books."""
    if len(set(editions)) < 2 or len(set(editions)) != len(editions):
        raise ValueError(f"bible_paraphrase pairs editions: give at least two different ones, not {editions}")
    check_fractions(dev_fraction, test_fraction)
    chapters = {name: edition_chapters(name, books) for name in editions}
    pools: dict[str, list[tuple[VersePair, VersePair]]] = {split: [] for split in SPLITS}
    for book, chapter in chapters[editions[0]]:
        pool = pools[chapter_split(book, chapter, dev_fraction, test_fraction)]
        for (ia, a), (ib, b) in itertools.combinations(enumerate(editions), 2):
            verses_a, verses_b = chapters[a].get((book, chapter), {}), chapters[b].get((book, chapter), {})
            rng = np.random.default_rng([seed, BIBLE_PARAPHRASE, book, chapter, ia, ib])
            foils = length_matched_foils(verses_b, rng)
            for verse, text_a in verses_a.items():
                other = foils.get(verse)
                if other is not None:
                    pool.append((VersePair(a, b, verse, verse, text_a, verses_b[verse], PARAPHRASE),
                                 VersePair(a, b, verse, other, text_a, verses_b[other], NOT_PARAPHRASE)))
    return {split: tuple(pool) for split, pool in pools.items()}


def bible_paraphrase_pairs(split: str, *, editions: Sequence[str] = ("web", "kjv", "bbe"), num_examples: int = 0,
                           seed: int = 0, dev_fraction: float = 0.02, test_fraction: float = 0.02,
                           books: Sequence[int] = ()) -> list[VersePair]:
    """The task's `split` ("train", "dev", "test"), in a seeded random order: `num_examples` pairs (0 = all) from
    ceil(num_examples / 2) couples drawn at random, so the classes are balanced (within one). Deterministic in
    `seed`. Raises ValueError when the split has fewer pairs than asked for."""
    pools = paraphrase_pools(tuple(editions), seed, dev_fraction, test_fraction, tuple(int(b) for b in books))
    return sample_couples(pools, "bible_paraphrase", split, num_examples, [seed, BIBLE_PARAPHRASE])


def draw_couples(pools: dict[str, Sequence[tuple[VersePair, VersePair]]], task: str, split: str, num_examples: int,
                 stream: list[int], keep: Keep | None = None) -> list[tuple[VersePair, VersePair]]:
    """The ceil(num_examples / 2) couples (0 = all) of `split`'s pool drawn at random from `stream` (with the
    split). `keep` (couples -> a flag each) leaves out the couples it refuses, the next ones drawn taking their
    places. Raises ValueError for an unknown split and when the pool has fewer."""
    if split not in SPLITS:
        raise ValueError(f"the {task} task has splits {', '.join(SPLITS)}, not {split!r}")
    pool = pools[split]
    couples = math.ceil(num_examples / 2) if num_examples else len(pool)
    if couples > len(pool):
        raise ValueError(f"the {task} {split!r} split has {2 * len(pool)} pairs, fewer than the {num_examples} "
                         "asked for")
    order = np.random.default_rng([*stream, SPLITS.index(split)]).permutation(len(pool))
    if keep is None:
        return [pool[i] for i in order[:couples]]
    chosen: list[tuple[VersePair, VersePair]] = []
    start = 0
    while len(chosen) < couples and start < len(order):  # usually one pass: few couples are refused
        batch = [pool[i] for i in order[start:start + couples - len(chosen)]]
        start += len(batch)
        chosen += [couple for couple, kept in zip(batch, keep(batch)) if kept]
    if num_examples and len(chosen) < couples:
        raise ValueError(f"the {task} {split!r} split has {2 * len(chosen)} pairs once the couples `keep` refuses "
                         f"are left out, fewer than the {num_examples} asked for")
    return chosen


def sample_couples(pools: dict[str, Sequence[tuple[VersePair, VersePair]]], task: str, split: str, num_examples: int,
                   stream: list[int], keep: Keep | None = None) -> list[VersePair]:
    """`num_examples` pairs (0 = all) of the couples `draw_couples` draws, in a random order: the classes balanced
    within one."""
    pairs = [pair for couple in draw_couples(pools, task, split, num_examples, stream, keep) for pair in couple]
    if num_examples:
        pairs = pairs[:num_examples]
    order = np.random.default_rng([*stream, SPLITS.index(split), len(pools[split])]).permutation(len(pairs))
    return [pairs[i] for i in order]


@functools.lru_cache(maxsize=2)
def order_pools(editions: tuple[str, ...], seed: int = 0, dev_fraction: float = 0.02, test_fraction: float = 0.02,
                books: tuple[int, ...] = (), min_distance: int = 5
                ) -> dict[str, tuple[tuple[VersePair, VersePair], ...]]:
    """{"train", "dev", "test"} -> the bible_order task's couples (the module docstring): each paraphrase pair of
    `paraphrase_pools` (a verse in two editions) with its swapped twin. The side swapped is drawn from (seed,
    verse, editions), the other side tried when it has no two content words `min_distance` apart; a pair
    neither side of which can be swapped is left out."""
    pools = paraphrase_pools(editions, seed, dev_fraction, test_fraction, books)
    out = {}
    for split, couples in pools.items():
        pool = []
        for same, _ in couples:
            ia, ib = editions.index(same.edition_a), editions.index(same.edition_b)
            rng = np.random.default_rng([seed, BIBLE_ORDER, *same.verse_a, ia, ib])
            sides = ("a", "b") if rng.integers(2) == 0 else ("b", "a")
            changed = perturb_one_side({"a": same.text_a, "b": same.text_b}, sides, "global", 0, rng, min_distance)
            if changed is not None:
                pool.append((dataclasses.replace(same, label=SAME_MEANING),
                             dataclasses.replace(same, text_a=changed["a"], text_b=changed["b"], label=SWAPPED)))
        out[split] = tuple(pool)
    return out


def bible_order_pairs(split: str, *, editions: Sequence[str] = ("web", "kjv", "bbe"), num_examples: int = 0,
                      seed: int = 0, dev_fraction: float = 0.02, test_fraction: float = 0.02,
                      books: Sequence[int] = (), min_distance: int = 5,
                      keep: Keep | None = None) -> list[VersePair]:
    """The bible_order task's `split` as `bible_paraphrase_pairs` draws its own: balanced couples in a seeded
    random order, less those `keep` refuses (`draw_couples`)."""
    pools = order_pools(tuple(editions), seed, dev_fraction, test_fraction, tuple(int(b) for b in books),
                        min_distance)
    return sample_couples(pools, "bible_order", split, num_examples, [seed, BIBLE_ORDER], keep)


def bible_order_minimal_pairs(split: str, *, editions: Sequence[str] = ("web", "kjv", "bbe"), num_examples: int = 0,
                              seed: int = 0, dev_fraction: float = 0.02, test_fraction: float = 0.02,
                              books: Sequence[int] = (), min_distance: int = 5,
                              keep: Keep | None = None) -> list[tuple[str, str]]:
    """The side each couple of `bible_order_pairs(split, ...)` swaps, as (as it is, swapped): the minimal pairs a
    masked LM can score without fine-tuning. One per couple, in drawing order."""
    pools = order_pools(tuple(editions), seed, dev_fraction, test_fraction, tuple(int(b) for b in books),
                        min_distance)
    couples = draw_couples(pools, "bible_order", split, num_examples, [seed, BIBLE_ORDER], keep)
    return [(same.text_a, swapped.text_a) if same.text_a != swapped.text_a else (same.text_b, swapped.text_b)
            for same, swapped in couples]


def bible_order_examples(split: str, **options) -> list[Example]:
    """`bible_order_pairs(split, **options)` as classification Examples (sentence A, sentence B, label)."""
    return [pair.example() for pair in bible_order_pairs(split, **options)]


def bible_paraphrase_examples(split: str, **options) -> list[Example]:
    """`bible_paraphrase_pairs(split, **options)` as classification Examples (sentence A, sentence B, label)."""
    return [pair.example() for pair in bible_paraphrase_pairs(split, **options)]


def probe_sets(examples: Sequence[Example], windows: Sequence[int] = (2, 3, 4, 5), min_distance: int = 5,
               seed: int = 0) -> dict[str, list[Example]]:
    """Chen et al.'s probe sets of pair examples (see the module docstring): "local_x" for x in `windows` (labels
    kept) and "global" (paraphrases swapped in one sentence, labelled NOT_PARAPHRASE); unchangeable pairs left out."""
    sets = {f"local_{x}": perturb_examples(examples, "local", int(x), seed, drop_unchanged=True) for x in windows}
    paraphrases = [example for example in examples if example.label == PARAPHRASE]
    sets["global"] = perturb_examples(paraphrases, "global", 0, seed, min_distance=min_distance, drop_unchanged=True,
                                      sides=("a", "b"), label=NOT_PARAPHRASE)
    return sets
