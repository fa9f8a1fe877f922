"""Zero-shot scoring with a masked LM: pseudo-log-likelihoods and minimal pairs.

A sentence's pseudo-log-likelihood (Salazar et al., 2020) is the sum over its tokens of log p(token | the rest),
each token masked in turn: one masked copy of the sentence per token, [CLS] ids [SEP] as in pretraining. A minimal
pair (BLiMP's protocol) is a sentence and a variant of it; the model prefers the sentence when it gives it the
higher score. No parameter is trained, so the score says what pretraining put into the model and nothing a
fine-tuning recipe adds or fails to extract.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxpos.data.order import padded_batches
from jaxpos.data.tokenizer import CLS_ID, MASK_ID, PAD_ID, SEP_ID
from jaxpos.evaluation.lengths import cannot_run
from jaxpos.evaluation.metrics import wilson_interval
from jaxpos.models import BertForMaskedLM
from jaxpos.run import Run

TIE_TOLERANCE = 1e-3  # nats: two sentences of the same tokens differ by float rounding only (about 1e-5)


class NothingToScore(ValueError):
    """Not one minimal pair fits the model's learned positions."""


def masked_copies(sentences: Sequence[Sequence[int]], length: int) -> dict[str, np.ndarray]:
    """Every token of every sentence masked in turn. sentences: token ids without special tokens, each at most
    length - 2 long. Returns input_ids [N, length] ([CLS] ids [SEP], one [MASK], [PAD] after), piece_ids
    [N, length], position [N] (of the mask), target [N] (the masked id) and sentence [N] (its index), N the total
    token count."""
    too_long = [k for k, s in enumerate(sentences) if len(s) > length - 2]
    if too_long:
        raise ValueError(f"sentence {too_long[0]} has {len(sentences[too_long[0]])} tokens; rows of {length} hold "
                         f"{length - 2}")
    total = sum(len(s) for s in sentences)
    input_ids = np.full((total, length), PAD_ID, np.int32)
    piece_ids = np.zeros((total, length), np.int32)
    position, target, sentence = (np.zeros(total, np.int32) for _ in range(3))
    row = 0
    for k, ids in enumerate(sentences):
        n = len(ids)
        rows = slice(row, row + n)
        input_ids[rows, :n + 2] = [CLS_ID, *ids, SEP_ID]
        piece_ids[rows, :n + 2] = 1
        position[rows] = np.arange(1, n + 1)
        target[rows] = ids
        sentence[rows] = k
        input_ids[np.arange(row, row + n), position[rows]] = MASK_ID
        row += n
    return dict(input_ids=input_ids, piece_ids=piece_ids, position=position, target=target, sentence=sentence)


@functools.partial(jax.jit, static_argnames="model")
def _masked_log_probs(model: BertForMaskedLM, params, input_ids, piece_ids, position, target):
    """log p(target | row) at each row's masked position: [B]."""
    logits = model.apply({"params": params}, input_ids, piece_ids=piece_ids, token_types=jnp.zeros_like(input_ids),
                         predict_positions=position[:, None])[:, 0].astype(jnp.float32)  # bf16 sums too coarsely
    return jnp.take_along_axis(jax.nn.log_softmax(logits), target[:, None], axis=1)[:, 0]


def pseudo_log_likelihoods(model: BertForMaskedLM, params, sentences: Sequence[Sequence[int]], *,
                           batch_size: int = 256) -> np.ndarray:
    """The pseudo-log-likelihood of each sentence (token ids without special tokens) [S] float64, in nats. Rows
    are as long as the longest sentence + 2 rounded up to a multiple of 16 (at most the model's max_length), and
    every batch has `batch_size` rows (the last filled up with row 0, which counts nothing), so a few shapes are
    compiled. Computed on this host alone, whatever the process count."""
    longest = max((len(s) for s in sentences), default=0) + 2
    length = min(-(-longest // 16) * 16, max(longest, model.cfg.max_length))
    copies = masked_copies(sentences, length)
    scores = np.zeros(len(sentences))
    for index, real in padded_batches(len(copies["target"]), batch_size, process_index=0, process_count=1):
        log_probs = _masked_log_probs(model, params, copies["input_ids"][index], copies["piece_ids"][index],
                                      copies["position"][index], copies["target"][index])
        np.add.at(scores, copies["sentence"][index[real]], np.asarray(log_probs, np.float64)[real])
    return scores


def preference(preferred: np.ndarray, other: np.ndarray, tolerance: float = TIE_TOLERANCE) -> dict:
    """How often a model scores the first sentence of each minimal pair above the second. preferred, other: [P]
    scores. A tie (|difference| <= tolerance) counts half. {"accuracy", "low", "high" (the Wilson 95% interval),
    "pairs", "ties", "mean_difference"}."""
    preferred, other = np.asarray(preferred, np.float64), np.asarray(other, np.float64)
    difference = preferred - other
    ties = np.abs(difference) <= tolerance
    wins = float(np.sum((difference > 0) & ~ties) + 0.5 * np.sum(ties))
    pairs = len(difference)
    if not pairs:
        raise ValueError("no minimal pairs to score")
    low, high = wilson_interval(wins, pairs)
    return dict(accuracy=wins / pairs, low=low, high=high, pairs=pairs, ties=int(ties.sum()),
                mean_difference=float(difference.mean()))


def minimal_pair_preference(run: Run, pairs: Sequence[tuple[str, str]], *, batch_size: int = 256,
                            step: int | None = None) -> dict:
    """How often masked-LM RUN (checkpoint `step`, default the newest) scores the first text of each pair above the
    second: `preference`'s dict with "step" and "too_long" (pairs left out: a side longer than max_length - 2
    tokens, for a mechanism with learned positions for max_length tokens only; inductive ones score any length)."""
    if run.task != "mlm":
        raise ValueError(f"{run.workdir} is a {run.task} run; minimal pairs are scored by masked-LM runs")
    tokenizer = run.tokenizer()
    step, params = run.params(step)
    model = BertForMaskedLM(run.model_config)
    encoded = [(tokenizer.encode(first), tokenizer.encode(second)) for first, second in pairs]
    kept = [pair for pair in encoded if cannot_run(run.model_config, max(map(len, pair)) + 2) is None]
    if not kept:
        raise NothingToScore(f"{run.workdir}: none of the {len(pairs)} minimal pairs fits its "
                             f"{model.cfg.max_length} learned positions")
    scores = pseudo_log_likelihoods(model, params, [ids for pair in kept for ids in pair], batch_size=batch_size)
    return dict(preference(scores[0::2], scores[1::2]), step=step, too_long=len(encoded) - len(kept))
