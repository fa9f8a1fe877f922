"""A passkey probe for masked-LM encoders (after LongEmbed's passkey retrieval): a key of D digits hidden at a chosen
depth of filler text and asked for again at the row's end with its digits masked, zero-shot.

A row of n tokens is `[CLS] filler[:m] K filler[m:] Q [SEP]`, the filler consecutive held-out text (a window of its
own per example), K = "the pass key is d1 ... dD ." and Q the same sentence with the D digits masked; the depth δ
places K after m = round(δ · filler length) tokens. The digits are tokens of the run's own vocabulary: each digit's
last piece ("▁4" or "4"), written into the rows as ids, so the key is the same D tokens in K and at
the masked positions of Q whatever the tokenizer makes of digits in running text. The model's answer at each
masked position is its most probable digit token; a key counts as retrieved when all D digits are right.
A uniform guess among the K candidate digits retrieves a key with probability (1/K)^D and a digit with 1/K: the
floors the report states beside each accuracy.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxpos.data.tokenizer import SpecialIds, Tokenizer

DIGITS = 5  # the key's length in digits
DEPTHS = (0.1, 0.5, 0.9)  # where the key sits in the filler
EXAMPLES = 16  # keys a length and depth
INTRO, OUTRO = "the pass key is", "."


@dataclasses.dataclass(frozen=True)
class PasskeyRows:
    """Rows of one length and depth: ids [E, n], the masked digits' columns [E, D], the hidden keys [E, D] (token
    ids) and the candidate digit ids [K] the keys are drawn from."""

    ids: np.ndarray
    columns: np.ndarray
    keys: np.ndarray
    candidates: np.ndarray


def digit_candidates(tokenizer: Tokenizer, specials: SpecialIds = SpecialIds()) -> np.ndarray:
    """The token id of each digit 0-9 (its encoding's last piece), the distinct ones not reserved -> [K] (K may be
    below 2: a vocabulary without digits, where no key can be hidden)."""
    ids = []
    for digit in "0123456789":
        pieces = tokenizer.encode(digit)
        if pieces and pieces[-1] not in specials.reserved and pieces[-1] not in ids:
            ids.append(pieces[-1])
    return np.asarray(ids, np.int32)


def passkey_rows(stream: np.ndarray, tokenizer: Tokenizer, length: int, depth: float, examples: int = EXAMPLES,
                 seed: int = 0, digits: int = DIGITS, specials: SpecialIds = SpecialIds()) -> PasskeyRows | str:
    """`examples` rows of `length` tokens with a key at `depth` (module docstring), the filler from the held-out
    `stream` [N] (each example's own window, read cyclically where the stream is short); or why rows of `length`
    cannot hold a key (one line). `specials`: the vocabulary's [CLS], [SEP] and [MASK]."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"passkey depth {depth} is not in [0, 1]")
    candidates = digit_candidates(tokenizer, specials)
    if len(candidates) < 2:
        return "the vocabulary gives fewer than two digits a piece of their own: no key to hide"
    intro, outro = tokenizer.encode(INTRO), tokenizer.encode(OUTRO)
    frame = 2 + 2 * (len(intro) + digits + len(outro))
    filler = length - frame
    if filler < 1:
        return f"rows of {length} tokens cannot hold a {digits}-digit key and its question ({frame} tokens)"
    if len(stream) == 0:
        raise ValueError("the held-out stream is empty: no filler text")
    rng = np.random.default_rng(seed)
    keys = candidates[rng.integers(0, len(candidates), (examples, digits))]
    at = int(round(depth * filler))
    rows, columns = [], []
    for example in range(examples):
        text = np.resize(np.roll(stream, -example * filler), filler)  # the example's own window of the stream
        asked = [*intro, *[specials.mask] * digits, *outro]
        row = [specials.cls, *text[:at], *intro, *keys[example], *outro, *text[at:], *asked, specials.sep]
        start = len(row) - 1 - len(asked) + len(intro)
        rows.append(row)
        columns.append(np.arange(start, start + digits))
    return PasskeyRows(np.asarray(rows, np.int32), np.asarray(columns, np.int32), keys, candidates)


def passkey_accuracy(predict: Callable[[np.ndarray, np.ndarray], np.ndarray], rows: PasskeyRows,
                     batch_size: int = 8) -> dict:
    """{"accuracy" (keys retrieved whole), "digit_accuracy", "examples", "floor", "digit_floor"} of `predict`
    (ids [B, n], columns [B, D] -> logits [B, D, V]) on `rows`: each masked digit answered by the most probable
    candidate digit."""
    answers = []
    for start in range(0, len(rows.ids), batch_size):
        logits = np.asarray(predict(rows.ids[start:start + batch_size], rows.columns[start:start + batch_size]))
        answers.append(rows.candidates[logits[..., rows.candidates].argmax(-1)])
    right = np.concatenate(answers) == rows.keys  # [E, D]
    k = len(rows.candidates)
    return dict(accuracy=float(right.all(-1).mean()), digit_accuracy=float(right.mean()), examples=len(rows.keys),
                floor=float(k ** -rows.keys.shape[1]), digit_floor=1.0 / k)


def model_predictor(model, params) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """`passkey_accuracy`'s `predict` of a `BertForMaskedLM` with `params`: its logits at the masked columns."""
    jitted = jax.jit(lambda p, ids, columns: model.apply(
        {"params": p}, ids, piece_ids=jnp.ones_like(ids), token_types=jnp.zeros_like(ids),
        predict_positions=columns))
    return lambda ids, columns: jitted(params, jnp.asarray(ids), jnp.asarray(columns))


def passkey_by_depth(predict, stream: np.ndarray, tokenizer: Tokenizer, length: int,
                     depths: Sequence[float] = DEPTHS, examples: int = EXAMPLES, seed: int = 0,
                     specials: SpecialIds = SpecialIds()) -> dict:
    """{"depths": {str(depth): passkey_accuracy's dict}} at `length`, or {"skipped": why}."""
    found = {}
    for depth in depths:
        rows = passkey_rows(stream, tokenizer, length, depth, examples, seed, specials=specials)
        if isinstance(rows, str):
            return dict(skipped=rows)
        found[f"{depth:g}"] = passkey_accuracy(predict, rows)
    return dict(depths=found)
