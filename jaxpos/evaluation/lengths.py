"""Length generalisation of a masked-LM run: its held-out loss and accuracy at lengths other than the one it trained at
(TISA's first criterion, "inductive"; ALiBi, KERPLE and FIRE test it first).

At each length the rows are spans of the held-out text, each one contiguous piece (`contiguous_rows`: consecutive
held-out chapters joined). The text is masked once, as one sequence, by the run's own rule and seed
(`masked_stream`), and every length scores the same masked tokens (those of the text that rows of every length
cover), so the losses at two lengths differ by the context the model sees and nothing else. A mechanism with learned
positions for `model.max_length` tokens only (learned absolute positions, DIET-Abs, TUPE, an unclipped DIET-Rel
table, ...; the registry's `inductive` trait) is not run past it: its entry says so in one line.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import jax
import numpy as np

from jaxpos.positions import mechanism
from jaxpos.data.pipeline import contiguous_batches, contiguous_row_count, held_out_stream, masked_stream
from jaxpos.data.tokenizer import Tokenizer
from jaxpos.positions.base import LengthError
from jaxpos.run import Run
from jaxpos.training.loop import eval_sums
from jaxpos.training.mlm import MaskedLMTask


# The training loop's evaluation sums, compiled once a task (tasks compare by value) and batch shape.
_held_out_sums = jax.jit(eval_sums, static_argnames="task")


def masked_lm_metrics(task: MaskedLMTask, params, batches: Iterable[dict]) -> dict:
    """{"loss", "accuracy", "perplexity", "predicted"} of `task` over held-out `batches` (numpy dicts as
    `eval_batches` yields them): summed over every batch's predicted tokens, then divided, as training evaluates."""
    total = None
    for batch in batches:
        sums = _held_out_sums(params, batch, task=task)
        total = sums if total is None else jax.tree.map(lambda a, b: a + b, total, sums)
    if total is None:
        raise ValueError("the evaluation data yielded no batch")
    summary = {k: float(v) for k, v in jax.device_get(task.summarize(total)).items()}
    return dict(summary, predicted=int(jax.device_get(total["weight"])))


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
    {"step", "train_length", "lengths": [{"length", "rows", "predicted", "loss", "accuracy"} or {"length",
    "skipped": why}]}. `max_tokens`: the first that many tokens of the held-out stream at every length (0 = all)."""
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
    entries = []
    for length in lengths:
        reason = cannot_run(run, length)
        if reason is None:
            # The head at the masked positions only (the most a row holds): the same sums as everywhere.
            most = max(int(batch["mask_weights"].sum(1).max()) for batch in batches[length])
            task = MaskedLMTask.of(run.config, model=run.model_config, seq_len=length, max_predictions=max(1, most))
            try:
                metrics = masked_lm_metrics(task, params, batches[length])
            except LengthError as err:  # a limit the registry does not name: its own first clause
                reason = str(err).split(";")[0]
            else:
                entries.append(dict(length=length, rows=contiguous_row_count(len(stream), length),
                                    predicted=metrics["predicted"], loss=metrics["loss"], accuracy=metrics["accuracy"]))
                continue
        entries.append(dict(length=length, skipped=reason))
    return dict(step=step, train_length=data.seq_len, lengths=entries)
