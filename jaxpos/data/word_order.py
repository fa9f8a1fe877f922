"""Word-order perturbations (Chen et al. 2021, §5 and Table 3) and an offline task built from them.

Chen et al. shuffle the words inside parsed constituents of 3-5 words ("Shuffle-x": the meaning survives) and
swap the agent and the patient of a sentence ("Shuffle-SR": the meaning changes). jaxpos needs no parser, so:
  local   `local_shuffle`: fixed windows of x consecutive words (x = 2..5) stand in for the constituents; the
          words of every window are put in a random order, so no word moves x or more positions.
  global  `global_swap`: two content words at least `min_distance` (default 5) words apart stand in for the
          semantic roles; they exchange places, the punctuation around them staying where it was. 5 is more
          than any local window of at most 5 words can move a word, so the two kinds never overlap.
Words are whitespace-separated tokens. A content word has at least 3 letters once the punctuation around it is
stripped, and is not in `STOP_WORDS` (articles, pronouns, prepositions, conjunctions, auxiliaries and a few
quantifiers and adverbs, compared in lower case). `perturb_examples` applies either kind to one sentence of each
example of any task (Chen et al.'s probe: evaluation/probes.py; on the Bible paraphrase task: data/paraphrase.py).

The offline task (`offline_word_order_examples`, TaskSpec "word_order"): single sentences labelled 0 original,
1 locally shuffled, 2 globally swapped, from the embedded corpus (CPython's documentation) split into sentences
as the MLM pipeline does. Splits are by document, as `is_eval_document` picks them, so they share no document;
sentences that occur in more than one split are kept in the first only (train, then dev, then test).
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import numpy as np

from jaxpos.config.rng import WORD_ORDER_GLOBAL, WORD_ORDER_LOCAL, WORD_ORDER_TASK
from jaxpos.data.corpus import embedded_documents, is_eval_document
from jaxpos.data.examples import Example
from jaxpos.data.mlm import split_sentences

STOP_WORDS = frozenset("""
a an the and or but nor so yet if then than as because while although though whether
of in on at by to from with without into onto over under about above below between among through during
before after since until upon within across along against toward towards via per
i me my mine we us our ours you your yours he him his she her hers it its itself they them their theirs
this that these those there here where when which who whom whose what why how
is are was were be been being am has have had having do does did doing done
can could may might must shall should will would not no nor
all any both each every either neither few more most less other some such own same only also very just too
""".split())
_PUNCTUATION = "\"'()[]{}<>.,;:!?-–—“”‘’«»*`"
_KINDS = {"local": WORD_ORDER_LOCAL, "global": WORD_ORDER_GLOBAL}  # the random stream of each kind
_SPLITS = {"train": 0, "dev": 1, "test": 2}


def _parts(word: str) -> tuple[str, str, str]:
    """(leading punctuation, core, trailing punctuation) of a token."""
    core = word.strip(_PUNCTUATION)
    if not core:
        return word, "", ""
    start = word.index(core)
    return word[:start], core, word[start + len(core):]


def is_content_word(word: str) -> bool:
    """At least 3 letters and not a stop word, the surrounding punctuation ignored."""
    core = _parts(word)[1]
    return sum(c.isalpha() for c in core) >= 3 and core.lower() not in STOP_WORDS


def can_shuffle(words: Sequence[str], window: int) -> bool:
    """Whether some window [k·window, (k+1)·window) of `words` holds two different words."""
    return any(len(set(words[k:k + window])) > 1 for k in range(0, len(words), window))


def local_shuffle(words: Sequence[str], window: int, rng: np.random.Generator) -> list[str]:
    """`words` with the order inside every window [k·window, (k+1)·window) redrawn (the last, shorter window too).

    Draws again until the result differs from `words`; returns an unchanged copy only when no reordering can
    change it (no window holds two different words).
    """
    if window < 2:
        raise ValueError(f"window={window}: a window needs at least 2 words to shuffle")
    words = list(words)
    windows = [words[k:k + window] for k in range(0, len(words), window)]
    if not can_shuffle(words, window):
        return words
    while True:
        shuffled = [w[i] for w in windows for i in rng.permutation(len(w))]
        if shuffled != words:
            return shuffled


def swappable_pairs(words: Sequence[str], min_distance: int) -> list[tuple[int, int]]:
    """Positions (i, j), j - i >= min_distance, of two content words whose cores differ."""
    content = [i for i, w in enumerate(words) if is_content_word(w)]
    cores = {i: _parts(words[i])[1] for i in content}
    return [(i, j) for i in content for j in content if j - i >= min_distance and cores[i] != cores[j]]


def global_swap(words: Sequence[str], rng: np.random.Generator, min_distance: int = 5) -> list[str]:
    """`words` with two content words at least `min_distance` apart exchanged (a uniformly drawn such pair;
    each keeps the other's surrounding punctuation). An unchanged copy when the sentence has no such pair."""
    words = list(words)
    pairs = swappable_pairs(words, min_distance)
    if not pairs:
        return words
    i, j = pairs[rng.integers(len(pairs))]
    (pre_i, core_i, post_i), (pre_j, core_j, post_j) = _parts(words[i]), _parts(words[j])
    words[i], words[j] = pre_i + core_j + post_i, pre_j + core_i + post_j
    return words


def perturb_examples(examples: Sequence[Example], kind: str, window: int, seed: int, *, min_distance: int = 5,
                     drop_unchanged: bool = False, sides: Sequence[str] = ("a",),
                     label: float | None = None) -> list[Example]:
    """Variants of `examples` with one sentence perturbed by `kind` ("local" with `window`, or "global"; the window
    is ignored there): the first of `sides` ("a": text_a, "b": text_b) that the perturbation can change (Chen et
    al. try the premise, then the hypothesis); the other sentence is kept. A perturbed example keeps its label, or
    takes `label`. Example i's draw depends on (seed, kind, window, i) only. An example no perturbation can change
    is kept as it is, or left out with `drop_unchanged`."""
    if kind not in _KINDS:
        raise ValueError(f"kind={kind!r}; choose 'local' or 'global'")
    if not sides or not set(sides) <= {"a", "b"}:
        raise ValueError(f"sides={tuple(sides)!r}; choose sentences among 'a' and 'b'")
    out = []
    for i, example in enumerate(examples):
        rng = np.random.default_rng([seed, _KINDS[kind], window if kind == "local" else 0, i])
        texts = perturb_one_side({"a": example.text_a, "b": example.text_b}, sides, kind, window, rng, min_distance)
        if texts is not None:
            out.append(Example(texts["a"], texts["b"], example.label if label is None else label))
        elif not drop_unchanged:
            out.append(example)
    return out


def perturb_one_side(texts: dict[str, str | None], sides: Sequence[str], kind: str, window: int,
                     rng: np.random.Generator, min_distance: int = 5) -> dict[str, str | None] | None:
    """`texts` ({"a": ..., "b": ...}) with the first of `sides` that a `kind` perturbation can change perturbed
    (drawn from `rng`), or None when none can."""
    for side in sides:
        if texts[side] is None:
            continue
        words = texts[side].split()
        new = local_shuffle(words, window, rng) if kind == "local" else global_swap(words, rng, min_distance)
        if new != words:  # neither draws from `rng` when it cannot change the sentence
            return dict(texts, **{side: " ".join(new)})
    return None


@functools.lru_cache(maxsize=8)
def split_sentence_pools(held_out_fraction: float = 0.2, windows: tuple[int, ...] = (2, 3, 4, 5),
                         min_distance: int = 5, min_words: int = 8,
                         max_words: int = 60) -> dict[str, tuple[str, ...]]:
    """{"train", "dev", "test"} -> distinct sentences (whitespace collapsed) of the embedded corpus with
    min_words..max_words words that every perturbation can change: a local shuffle with each of `windows`, and a
    global swap. Held-out documents (`is_eval_document`) alternate between dev and test; a sentence already in an
    earlier split is left out of the later ones."""
    documents: dict[str, list[str]] = {split: [] for split in _SPLITS}
    held_out = 0
    for index, document in enumerate(embedded_documents()):
        if is_eval_document(index, held_out_fraction):
            documents["dev" if held_out % 2 == 0 else "test"].append(document)
            held_out += 1
        else:
            documents["train"].append(document)
    seen: set[str] = set()
    pools = {}
    for split in _SPLITS:  # train first: a sentence repeated in a held-out document stays in train only
        pool = []
        for document in documents[split]:
            for sentence in split_sentences(document):
                words = sentence.split()
                text = " ".join(words)
                if (min_words <= len(words) <= max_words and text not in seen
                        and all(can_shuffle(words, w) for w in windows) and swappable_pairs(words, min_distance)):
                    seen.add(text)
                    pool.append(text)
        pools[split] = tuple(pool)
    return pools


def offline_word_order_examples(split: str, *, num_examples: int = 0, seed: int = 0,
                                windows: Sequence[int] = (2, 3, 4, 5), min_distance: int = 5,
                                held_out_fraction: float = 0.2) -> list[Example]:
    """The word-order task's `split` ("train", "dev", "test"): each sentence drawn gives three examples, the
    original (label 0), a local shuffle with a window drawn from `windows` (1) and a global swap (2), so the
    classes are balanced (within one when num_examples is not a multiple of 3). num_examples = 0: every
    sentence of the split. Deterministic in `seed`; the examples come in a seeded random order."""
    if split not in _SPLITS:
        raise ValueError(f"the word_order task has splits train, dev, test, not {split!r}")
    if not windows or min(windows) < 2:
        raise ValueError(f"offline windows {tuple(windows)}: give window sizes of at least 2")
    pool = split_sentence_pools(held_out_fraction, tuple(int(w) for w in windows), min_distance)[split]
    sentences = len(pool) if not num_examples else math.ceil(num_examples / 3)
    if sentences > len(pool):
        raise ValueError(f"the word_order {split!r} split has {len(pool)} sentences ({3 * len(pool)} examples), "
                         f"fewer than the {num_examples} asked for")
    stream = [seed, WORD_ORDER_TASK, _SPLITS[split]]
    examples = []
    for index in np.random.default_rng(stream).permutation(len(pool))[:sentences]:
        rng = np.random.default_rng([*stream, int(index)])
        words = pool[index].split()
        local = local_shuffle(words, int(windows[rng.integers(len(windows))]), rng)  # the pool ensures a change
        examples += [Example(pool[index], None, 0.0), Example(" ".join(local), None, 1.0),
                     Example(" ".join(global_swap(words, rng, min_distance)), None, 2.0)]
    if num_examples:
        examples = examples[:num_examples]
    order = np.random.default_rng([*stream, len(pool)]).permutation(len(examples))
    return [examples[i] for i in order]
