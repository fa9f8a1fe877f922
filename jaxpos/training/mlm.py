"""The masked-LM task: BERT-style pretraining loss, accuracy and perplexity for the shared loop."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxpos.config.model import ModelConfig
from jaxpos.config.rng import step_rngs
from jaxpos.config.run import RunConfig
from jaxpos.models import BertForMaskedLM
from jaxpos.training.flops import mlm_step_flops


def token_losses(logits, targets, label_smoothing: float = 0.0):
    """Each token's (smoothed) cross-entropy and whether the argmax is its target: logits [..., V], targets [...]
    -> (nll [...], correct [...]) float32."""
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    if label_smoothing:
        nll = (1.0 - label_smoothing) * nll - label_smoothing * jnp.mean(log_probs, axis=-1)
    return nll, (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)


def token_cross_entropy(logits, targets, weights, label_smoothing: float = 0.0):
    """Summed (smoothed) cross-entropy and correct count over weighted tokens.

    logits [..., V], targets [...], weights [...] -> (loss_sum, correct_sum, weight_sum).
    """
    nll, correct = token_losses(logits, targets, label_smoothing)
    return jnp.sum(nll * weights), jnp.sum(correct * weights), jnp.sum(weights)


def summarize_token_sums(sums: dict) -> dict:
    """loss, accuracy and perplexity from summed token statistics."""
    weight = jnp.maximum(sums["weight"], 1.0)
    loss = sums["loss"] / weight
    out = {"loss": loss, "accuracy": sums["correct"] / weight, "perplexity": jnp.exp(loss)}
    if "nll" in sums:  # label-smoothed training: also report the plain cross-entropy
        out["nll"] = sums["nll"] / weight
        out["perplexity"] = jnp.exp(out["nll"])
    return out


@dataclasses.dataclass(frozen=True)
class MaskedLMTask:
    """Batches: input_ids, targets, mask_weights, piece_ids, token_types, and optionally positions (within each
    packed piece; absent: 0..T-1), all [B, T].

    With `max_predictions`, the head runs only at the (at most) P masked positions of each row instead of all
    T, which saves most of the [B, T, V] vocabulary product.
    """

    model: BertForMaskedLM
    seq_len: int
    max_predictions: int = 0

    @classmethod
    def of(cls, run: RunConfig, *, model: ModelConfig | None = None, seq_len: int | None = None,
           max_predictions: int | None = None) -> "MaskedLMTask":
        """The task of a masked-LM run config: its model (or `model`, e.g. a reader's unscanned copy), rows of
        data.seq_len and the head at train.max_predictions positions, unless given."""
        return cls(BertForMaskedLM(model or run.model), run.data.seq_len if seq_len is None else seq_len,
                   run.train.max_predictions if max_predictions is None else max_predictions)

    @property
    def tokens_per_example(self) -> int:
        return self.seq_len

    def init_inputs(self):
        ids = jnp.zeros((1, self.seq_len), jnp.int32)
        return (ids,), dict(piece_ids=jnp.ones_like(ids), token_types=jnp.zeros_like(ids))

    def step_flops(self, batch_size: int) -> float:
        """Model FLOPs of a training step on `batch_size` rows (the head at the positions it runs at)."""
        return mlm_step_flops(self.model.cfg, batch_size, self.seq_len, self.max_predictions or self.seq_len)

    def predictions(self, params, batch, rng, train) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        """(logits [B, P, V], targets [B, P], weights [B, P], columns [B, P]) at the P positions the head runs at:
        the masked ones first with `max_predictions` (a row of fewer takes them all), else every column."""
        weights, targets = batch["mask_weights"].astype(jnp.float32), batch["targets"]
        predicted = None
        columns = jnp.broadcast_to(jnp.arange(weights.shape[1]), weights.shape)
        if self.max_predictions:
            _, predicted = jax.lax.top_k(weights, min(self.max_predictions, weights.shape[1]))
            weights, targets, columns = (jnp.take_along_axis(x, predicted, axis=1)
                                         for x in (weights, targets, columns))
        logits = self.model.apply(
            {"params": params}, batch["input_ids"], piece_ids=batch["piece_ids"],
            token_types=batch["token_types"], input_positions=batch.get("positions"),
            predict_positions=predicted, deterministic=not train,
            rngs=step_rngs(rng) if train else {})
        return logits, targets, weights, columns

    def loss(self, params, batch, rng, train):
        logits, targets, weights, _ = self.predictions(params, batch, rng, train)
        loss, correct, weight = token_cross_entropy(logits, targets, weights)
        return loss, {"loss": loss, "correct": correct, "weight": weight}

    def summarize(self, sums):
        return summarize_token_sums(sums)
