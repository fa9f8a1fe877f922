"""Length generalisation of a masked-LM run: its held-out loss and accuracy at lengths other than the one it trained at
(TISA's first criterion, "inductive"; ALiBi, KERPLE and FIRE test it first).

At each length the rows are spans of the held-out text, each one contiguous piece (`contiguous_rows`: consecutive
held-out chapters joined). The text is masked once, as one sequence, by the run's own rule and seed
(`masked_stream`), and every length scores the same masked tokens (those of the text that rows of every length
cover), so the losses at two lengths differ by the context the model sees and nothing else. A mechanism with learned
positions for `model.max_length` tokens only (learned absolute positions, DIET-Abs, TUPE, an unclipped DIET-Rel
table, ...; the registry's `inductive` trait) is not run past it: its entry says so in one line.

Each length's entry also holds the loss by position within the row (`by_position`): the masked tokens grouped by
their column in buckets of a quarter of the training length, [0, w), [w, 2w), ..., so that bucket k holds the same
columns at every length and the buckets past the training length show where degradation starts (the ALiBi, KERPLE
and FIRE papers' view of length generalisation).

A local Hugging Face masked-LM folder is scored the same way (`folder_model`): on the held-out text of jaxpos's
default masked-LM data, in the folder's own tokens and special ids.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxpos.checkpoints.huggingface import bert_mlm_params, folder_config, load_hf_checkpoint
from jaxpos.config import ModelConfig
from jaxpos.config.run import MLMDataConfig
from jaxpos.positions import mechanism
from jaxpos.data.hf_tokenizer import require_folder_tokenizer
from jaxpos.data.pipeline import contiguous_batches, contiguous_row_count, held_out_stream, masked_stream
from jaxpos.data.tokenizer import SpecialIds, Tokenizer
from jaxpos.positions.base import LengthError
from jaxpos.run import Run
from jaxpos.evaluation.passkey import model_predictor, passkey_by_depth
from jaxpos.models import BertForMaskedLM
from jaxpos.training.mlm import MaskedLMTask, token_losses

BUCKETS_PER_TRAINING_LENGTH = 4  # the loss by position: buckets of a quarter of the training length


def bucket_width(train_length: int) -> int:
    """The columns of one position bucket: a quarter of the training length (at least one)."""
    return max(1, train_length // BUCKETS_PER_TRAINING_LENGTH)


def _bucket_sums(params, batch, *, task: MaskedLMTask, width: int, buckets: int) -> dict:
    """Summed loss, correct predictions and weight of the masked tokens of `batch` by the bucket of their column
    (column // width): three [buckets]."""
    logits, targets, weights, columns = task.predictions(params, batch, None, False)
    nll, correct = token_losses(logits, targets)
    bucket = jnp.minimum(columns // width, buckets - 1).reshape(-1)
    add = lambda x: jax.ops.segment_sum((x * weights).reshape(-1), bucket, num_segments=buckets)  # noqa: E731
    return dict(loss=add(nll), correct=add(correct), weight=add(jnp.ones_like(nll)))


_held_out_bucket_sums = jax.jit(_bucket_sums, static_argnames=("task", "width", "buckets"))


def masked_lm_metrics(task: MaskedLMTask, params, batches: Iterable[dict], width: int | None = None) -> dict:
    """{"loss", "accuracy", "perplexity", "predicted", "by_position"} of `task` over held-out `batches` (numpy dicts
    as `eval_batches` yields them): summed over every batch's predicted tokens, then divided, as training evaluates;
    `by_position`: [{"start", "end", "predicted", "loss", "accuracy"}] of the buckets of `width` columns (default:
    the whole row) that hold a masked token (loss and accuracy None where none was predicted)."""
    width = width or task.seq_len
    buckets = -(-task.seq_len // width)
    total = None
    for batch in batches:
        sums = _held_out_bucket_sums(params, batch, task=task, width=width, buckets=buckets)
        total = sums if total is None else jax.tree.map(lambda a, b: a + b, total, sums)
    if total is None:
        raise ValueError("the evaluation data yielded no batch")
    total = {k: np.asarray(jax.device_get(v), np.float64) for k, v in total.items()}
    summary = {k: float(v) for k, v in task.summarize({k: v.sum() for k, v in total.items()}).items()}
    by_position = []
    for k in range(buckets):
        weight = total["weight"][k]
        by_position.append(dict(start=k * width, end=min((k + 1) * width, task.seq_len), predicted=int(weight),
                                loss=float(total["loss"][k] / weight) if weight else None,
                                accuracy=float(total["correct"][k] / weight) if weight else None))
    return dict(summary, predicted=int(total["weight"].sum()), by_position=by_position)


def cannot_run(cfg: ModelConfig, length: int) -> str | None:
    """Why a model of `cfg` cannot run at `length` (one line), or None."""
    kind = cfg.position.kind
    randomized = cfg.position.randomized_max_length
    if randomized and length > randomized:  # its positions are drawn from [0, N): no sample of more
        return f"randomized positions are drawn from [0, {randomized}) (position.randomized_max_length)"
    if length <= cfg.position_range or mechanism(kind).is_inductive(cfg.position.options):
        return None
    return f"no learned position past {cfg.position_range} ({mechanism(kind).label} is not inductive)"


def length_batches(stream: np.ndarray, lengths: Sequence[int], tokenizer: Tokenizer, seed: int, mask_prob: float,
                   batch_size: int = 8, specials: SpecialIds = SpecialIds()) -> dict[int, list[dict]]:
    """{length: its batches of the held-out `stream` [N]}: every length's rows predict the same tokens (the stream
    masked once, `masked_stream`; tokens past the part of the stream that rows of every length cover score nothing).
    Raises ValueError when not one row of the longest length fits."""
    input_ids, weights = masked_stream(stream, seed, tokenizer.vocab_size, mask_prob, specials)
    covered = min(contiguous_row_count(len(stream), n) * (n - 2) for n in lengths)
    weights = np.where(np.arange(len(stream)) < covered, weights, 0.0)
    return {n: list(contiguous_batches(stream, input_ids, weights, n, batch_size, specials)) for n in lengths}


@dataclasses.dataclass(frozen=True)
class ScoredModel:
    """A masked-LM model as `score_lengths` reads it: its config and whole `BertForMaskedLM` parameter tree, its
    tokenizer (encode, encode_batch, vocab_size) and special ids, the data block whose held-out text it is scored
    on (source, seed, masking rate), the length it trained at (the 1x of the loss by position), and its step."""

    cfg: ModelConfig
    params: Any
    tokenizer: Any
    specials: SpecialIds
    data: MLMDataConfig
    train_length: int
    step: int | None = None


def check_lengths(lengths: Sequence[int]) -> None:
    """A one-line ValueError unless every length holds [CLS], a token and [SEP]."""
    if not lengths or any(n < 3 for n in lengths):
        raise ValueError(f"--lengths {','.join(map(str, lengths))}: give lengths of at least 3 tokens")


def evaluate_lengths(run: Run, lengths: Sequence[int], batch_size: int = 8, max_tokens: int = 0,
                     step: int | None = None) -> dict:
    """The held-out masked-LM loss and accuracy of RUN (checkpoint `step`, default the newest) at each length,
    on its own held-out text: `score_lengths`."""
    if run.task != "mlm":
        raise ValueError(f"{run.workdir} is a {run.task} run; lengths are evaluated for masked-LM runs")
    check_lengths(lengths)
    tokenizer = run.tokenizer()
    step, params = run.params(step)
    model = ScoredModel(run.model_config, params, tokenizer, SpecialIds(), run.config.data, run.config.data.seq_len,
                        step)
    return score_lengths(model, lengths, batch_size, max_tokens)


def score_lengths(model: ScoredModel, lengths: Sequence[int], batch_size: int = 8, max_tokens: int = 0) -> dict:
    """{"step", "train_length", "bucket_width", "lengths": [{"length", "rows", "predicted", "loss", "accuracy",
    "by_position", "passkey"} or {"length", "skipped": why}]} of `model` on the held-out text of its data block,
    `by_position` the loss by column bucket (`masked_lm_metrics`), `passkey` the passkey probe by depth
    (`jaxpos.evaluation.passkey`). `max_tokens`: the first that many tokens of the held-out stream at every length
    (0 = all)."""
    check_lengths(lengths)
    data, specials, tokenizer = model.data, model.specials, model.tokenizer
    stream = held_out_stream(data, tokenizer, max_tokens)  # read and tokenized once for every length
    batches = length_batches(stream, lengths, tokenizer, data.seed, data.mask_prob, batch_size, specials)
    predict = model_predictor(BertForMaskedLM(model.cfg), model.params)
    width = bucket_width(model.train_length)
    entries = []
    for length in lengths:
        reason = cannot_run(model.cfg, length)
        if reason is None:
            # The head at the masked positions only (the most a row holds): the same sums as everywhere.
            most = max(int(batch["mask_weights"].sum(1).max()) for batch in batches[length])
            task = MaskedLMTask(BertForMaskedLM(model.cfg), length, max(1, most))
            try:
                metrics = masked_lm_metrics(task, model.params, batches[length], width)
                passkey = passkey_by_depth(predict, stream, tokenizer, length, seed=data.seed, specials=specials)
            except LengthError as err:  # a limit the registry does not name: its own first clause
                reason = str(err).split(";")[0]
            else:
                entries.append(dict(length=length, rows=contiguous_row_count(len(stream), length),
                                    predicted=metrics["predicted"], loss=metrics["loss"], accuracy=metrics["accuracy"],
                                    by_position=metrics["by_position"], passkey=passkey))
                continue
        entries.append(dict(length=length, skipped=reason))
    return dict(step=model.step, train_length=model.train_length, bucket_width=width, lengths=entries)


def folder_model(folder: str, train_length: int | None = None) -> ScoredModel:
    """A local Hugging Face masked-LM folder (BERT, ALBERT, DeBERTa-v2 or ModernBERT: config.json, the weights of
    its *ForMaskedLM, and tokenizer.json, vocab.txt or spiece.model) as `score_lengths` reads it, scored on the
    held-out text of jaxpos's default masked-LM data (`MLMDataConfig()`: the embedded corpus, no download) in the
    folder's own tokens. `train_length`: the 1x of the loss by position (default: the model's max_position_embeddings,
    the context it declares). One-line errors for a folder without a tokenizer, a [MASK], or a masked-LM head."""
    hf, state = load_hf_checkpoint(folder)
    cfg = folder_config(folder, hf)
    tokenizer = require_folder_tokenizer(folder, hf.get("model_type", "bert"))
    specials = tokenizer.special_ids()
    tokenizer.check_fits(cfg.vocab_size, os.path.join(folder, "config.json"))
    try:
        params = bert_mlm_params(state, cfg)
    except KeyError as err:
        raise ValueError(f"{folder} has no masked-LM head to score ({err.args[0]}): save a *ForMaskedLM model")\
            from None
    return ScoredModel(cfg, params, tokenizer, specials, MLMDataConfig(), train_length or cfg.max_length)
