"""Identical-word probing (Chen, Varoquaux & Suchanek, A.1): attention on sentences made of one repeated word
exposes the purely positional part of a model's attention."""

from __future__ import annotations

import functools
import re
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxpos.analysis.taps import run_encoder
from jaxpos.config import ModelConfig

_WORD = re.compile(r"^[A-Za-z]{2,}$")


def whole_word_ids(vocabulary: Sequence[str]) -> list[int]:
    """Ids of vocabulary entries that are whole words of two or more letters: SentencePiece pieces that start a
    word ("▁house"), byte-level BPE pieces that start one after a space ("Ġhouse"), or WordPiece tokens that are not
    continuations ("house", not "##ing"); no single characters, no sub-word pieces, no special tokens."""
    # the word-start marker of the vocabulary's convention; None: WordPiece's, which marks continuations instead
    marker = next((m for m in ("\u2581", "\u0120") if any(piece.startswith(m) for piece in vocabulary)), None)
    ids = []
    for index, piece in enumerate(vocabulary):
        if marker is not None:
            if not piece.startswith(marker):
                continue  # a piece inside a word
            word = piece[1:]
        else:
            word = piece  # "##..." continuations and "[SPECIAL]" tokens fail the letters-only test
        if _WORD.match(word):
            ids.append(index)
    return ids


def sample_probe_words(vocabulary: Sequence[str], count: int = 100, seed: int = 0) -> np.ndarray:
    """`count` random whole-word ids (fewer if the vocabulary has fewer), reproducible for a seed."""
    candidates = whole_word_ids(vocabulary)
    if not candidates:
        raise ValueError("the vocabulary has no whole-word entries of two or more letters to probe with")
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(candidates, size=min(count, len(candidates)), replace=False))


@functools.lru_cache(maxsize=32)
def _summed_weights(cfg: ModelConfig):
    """(params, ids [B, T]) -> attention weights summed over the batch [L, H, T, T], jitted once per config (the
    parameters are an argument, so the checkpoints of a run share one compilation)."""
    return jax.jit(lambda params, ids: run_encoder(cfg, params, ids)[0].sum(axis=1))


def identical_word_attention(cfg: ModelConfig, params, word_ids: Sequence[int], length: int = 128,
                             batch_size: int = 25) -> np.ndarray:
    """Attention weights averaged over sentences that repeat one word `length` times: [L, H, length, length].

    Averaging further over heads and layers gives the model's positional weight matrix (Chen et al. Fig. 1).
    """

    weights_of = _summed_weights(cfg)
    words = np.asarray(word_ids, np.int32)
    if words.size == 0:
        raise ValueError("no probe words given")
    total = 0.0
    for start in range(0, len(words), batch_size):  # a short last chunk compiles once more
        chunk = words[start:start + batch_size]
        total = total + np.asarray(weights_of(params, jnp.asarray(np.repeat(chunk[:, None], length, axis=1))),
                                   np.float64)
    return total / len(words)
