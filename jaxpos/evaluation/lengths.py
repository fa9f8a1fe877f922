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
"""

from __future__ import annotations

from typing import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxpos.positions import mechanism
from jaxpos.data.pipeline import contiguous_batches, contiguous_row_count, held_out_stream, masked_stream
from jaxpos.data.tokenizer import Tokenizer
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


def cannot_run(run: Run, length: int) -> str | None:
    """Why `run`'s mechanism cannot run at `length` (one line), or None."""
    cfg = run.model_config
    kind = cfg.position.kind
    randomized = cfg.position.randomized_max_length
    if randomized and length > randomized:  # its positions are drawn from [0, N): no sample of more
        return f"randomized positions are drawn from [0, {randomized}) (position.randomized_max_length)"
    if length <= cfg.position_range or mechanism(kind).is_inductive(cfg.position.options):
        return None
    return f"no learned position past {cfg.position_range} ({mechanism(kind).label} is not inductive)"


def length_batches(stream: np.ndarray, lengths: Sequence[int], tokenizer: Tokenizer, seed: int, mask_prob: float,
                   batch_size: int = 8) -> dict[int, list[dict]]:
    """{length: its batches of the held-out `stream` [N]}: every length's rows predict the same tokens (the stream
    masked once, `masked_stream`; tokens past the part of the stream that rows of every length cover score nothing).
    Raises ValueError when not one row of the longest length fits."""
    input_ids, weights = masked_stream(stream, seed, tokenizer.vocab_size, mask_prob)
    covered = min(contiguous_row_count(len(stream), n) * (n - 2) for n in lengths)
    weights = np.where(np.arange(len(stream)) < covered, weights, 0.0)
    return {n: list(contiguous_batches(stream, input_ids, weights, n, batch_size)) for n in lengths}


def evaluate_lengths(run: Run, lengths: Sequence[int], batch_size: int = 8, max_tokens: int = 0,
                     step: int | None = None) -> dict:
    """The held-out masked-LM loss and accuracy of RUN (checkpoint `step`, default the newest) at each length:
    {"step", "train_length", "bucket_width", "lengths": [{"length", "rows", "predicted", "loss", "accuracy",
    "by_position", "passkey"} or {"length", "skipped": why}]}, `by_position` the loss by column bucket
    (`masked_lm_metrics`), `passkey` the passkey probe by depth (`jaxpos.evaluation.passkey`). `max_tokens`: the first that many tokens of the held-out stream at every length (0 = all)."""
    if run.task != "mlm":
        raise ValueError(f"{run.workdir} is a {run.task} run; lengths are evaluated for masked-LM runs")
    bad = [n for n in lengths if n < 3]
    if bad or not lengths:
        raise ValueError(f"--lengths {','.join(map(str, lengths))}: give lengths of at least 3 tokens")
    tokenizer = run.tokenizer()
    step, params = run.params(step)
    data = run.config.data
    stream = held_out_stream(data, tokenizer, max_tokens)  # read and tokenized once for every length
    batches = length_batches(stream, lengths, tokenizer, data.seed, data.mask_prob, batch_size)
    predict = model_predictor(BertForMaskedLM(run.model_config), params)
    entries = []
    for length in lengths:
        reason = cannot_run(run, length)
        if reason is None:
            # The head at the masked positions only (the most a row holds): the same sums as everywhere.
            most = max(int(batch["mask_weights"].sum(1).max()) for batch in batches[length])
            task = MaskedLMTask.of(run.config, model=run.model_config, seq_len=length, max_predictions=max(1, most))
            try:
                metrics = masked_lm_metrics(task, params, batches[length], bucket_width(data.seq_len))
                passkey = passkey_by_depth(predict, stream, tokenizer, length, seed=data.seed)
            except LengthError as err:  # a limit the registry does not name: its own first clause
                reason = str(err).split(";")[0]
            else:
                entries.append(dict(length=length, rows=contiguous_row_count(len(stream), length),
                                    predicted=metrics["predicted"], loss=metrics["loss"], accuracy=metrics["accuracy"],
                                    by_position=metrics["by_position"], passkey=passkey))
                continue
        entries.append(dict(length=length, skipped=reason))
    return dict(step=step, train_length=data.seq_len, bucket_width=bucket_width(data.seq_len), lengths=entries)
