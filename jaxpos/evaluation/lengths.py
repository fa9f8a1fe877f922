"""Length generalisation of a masked-LM run: its held-out loss and accuracy at lengths other than the one it
trained at (TISA's first criterion, "inductive"; ALiBi, KERPLE and FIRE test it first).

At each length the rows are spans of the held-out text, each one contiguous piece (`contiguous_rows`: consecutive
held-out chapters joined), masked by the run's own rule and seed, and every row's prediction is scored with the
head at every position. A mechanism with learned positions for `model.max_length` tokens only (learned absolute
positions, DIET-Abs, TUPE, an unclipped DIET-Rel table, ...; the registry's `inductive` trait) is not run past it:
its entry says so in one line.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import jax

from jaxpos.config.mechanisms import MECHANISMS
from jaxpos.data.pipeline import contiguous_rows, eval_batches, held_out_stream
from jaxpos.models import BertForMaskedLM
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
    if length <= cfg.max_length or MECHANISMS[kind].is_inductive(cfg.position):
        return None
    return f"no learned position past {cfg.max_length} ({MECHANISMS[kind].label} is not inductive)"


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
    model = BertForMaskedLM(run.model_config)
    data = run.config.data
    stream = held_out_stream(data, tokenizer, max_tokens)  # read and tokenized once for every length
    entries = []
    for length in lengths:
        reason = cannot_run(run, length)
        if reason is None:
            rows = contiguous_rows(stream, length)
            # The head at the masked positions only (at most ceil(mask_prob * length) a row): the same sums.
            task = MaskedLMTask(model, length, max_predictions=math.ceil(data.mask_prob * length))
            try:
                metrics = masked_lm_metrics(task, params,
                                            eval_batches(rows, tokenizer, batch_size, 0, data.seed, data.mask_prob))
            except LengthError as err:  # a limit the registry does not name: its own first clause
                reason = str(err).split(";")[0]
            else:
                entries.append(dict(length=length, rows=len(rows), predicted=metrics["predicted"],
                                    loss=metrics["loss"], accuracy=metrics["accuracy"]))
                continue
        entries.append(dict(length=length, skipped=reason))
    return dict(step=step, train_length=data.seq_len, lengths=entries)
