"""The fine-tuning task for the shared loop: cross-entropy (classification) or squared error (regression, STS-B)
on BertForSequenceClassification, summed over weighted examples so that eval padding rows count 0."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxpos.config.rng import DROPOUT
from jaxpos.models import BertForSequenceClassification


def example_losses(logits, labels, num_labels: int):
    """Per-example loss and correctness. logits [B, C], labels [B] (class ids or scores, float) -> ([B], [B]).

    Regression (C = 1): squared error, and `correct` is 0 (accuracy is not defined)."""
    if num_labels == 1:
        error = logits[:, 0] - labels
        return error * error, jnp.zeros_like(error)
    targets = labels.astype(jnp.int32)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(log_probs, targets[:, None], axis=-1)[:, 0]
    return nll, (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class ClassificationTask:
    """Batches: input_ids, token_types, piece_ids [B, T]; labels [B] (float32); optional weights [B]
    (0 on the padding rows of an eval batch)."""

    model: BertForSequenceClassification
    seq_len: int

    @property
    def tokens_per_example(self) -> int:
        return self.seq_len

    @property
    def regression(self) -> bool:
        return self.model.num_labels == 1

    def init_inputs(self):
        ids = jnp.zeros((1, self.seq_len), jnp.int32)
        return (ids,), dict(piece_ids=jnp.ones_like(ids), token_types=jnp.zeros_like(ids))

    def logits(self, params, batch, rng=None, train: bool = False):
        """[B, num_labels] float32."""
        return self.model.apply({"params": params}, batch["input_ids"], piece_ids=batch["piece_ids"],
                                token_types=batch["token_types"], deterministic=not train,
                                rngs={DROPOUT: rng} if train else {})

    def loss(self, params, batch, rng, train):
        logits = self.logits(params, batch, rng, train)
        labels = batch["labels"].astype(jnp.float32)
        weights = batch["weights"].astype(jnp.float32) if "weights" in batch else jnp.ones_like(labels)
        losses, correct = example_losses(logits, labels, self.model.num_labels)
        loss = jnp.sum(losses * weights)
        sums = {"loss": loss, "weight": jnp.sum(weights)}
        if not self.regression:
            sums["correct"] = jnp.sum(correct * weights)
        return loss, sums

    def summarize(self, sums):
        weight = jnp.maximum(sums["weight"], 1.0)
        out = {"loss": sums["loss"] / weight}
        if "correct" in sums:
            out["accuracy"] = sums["correct"] / weight
        return out


def predictions_from_logits(logits: np.ndarray) -> np.ndarray:
    """[N, C] -> [N]: the class id (argmax) or, with one output, the regression score."""
    logits = np.asarray(logits)
    return logits[:, 0] if logits.shape[1] == 1 else np.argmax(logits, axis=-1).astype(np.float32)
