"""Fine-tuning on the shared loop: the task (cross-entropy for classification, squared error for regression such as
STS-B, on BertForSequenceClassification, summed over weighted examples so that eval padding rows count 0), the
Trainer that starts from a pretrained encoder, and the jitted prediction over evaluation batches."""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from jaxpos.config.rng import step_rngs
from jaxpos.config.run import TrainConfig
from jaxpos.models import BertForSequenceClassification
from jaxpos.models.layout import relayout
from jaxpos.sharding import replicated
from jaxpos.training.flops import classification_step_flops
from jaxpos.training.loop import Trainer, with_activation_sharding


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

    def step_flops(self, batch_size: int) -> float:
        """Model FLOPs of a training step on `batch_size` rows."""
        return classification_step_flops(self.model.cfg, batch_size, self.seq_len, self.model.num_labels)

    def logits(self, params, batch, rng=None, train: bool = False):
        """[B, num_labels] float32."""
        return self.model.apply({"params": params}, batch["input_ids"], piece_ids=batch["piece_ids"],
                                token_types=batch["token_types"], deterministic=not train,
                                rngs=step_rngs(rng) if train else {})

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


def merge_params(params: dict, encoder: dict, pooler: dict | None, shardings) -> dict:
    """`params` (a fresh BertForSequenceClassification init) with a pretrained `encoder` (BertEncoder parameters)
    and `pooler` (or None: the fresh one stays) in place, put onto `shardings`. A shape or name mismatch is a clear
    error."""
    new = {"bert": encoder}
    if pooler is not None:
        new["pooler"] = pooler
    for name, tree in new.items():
        want = jax.tree_util.tree_structure(params[name])
        if jax.tree_util.tree_structure(tree) != want:
            have = {jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(tree)[0]}
            need = {jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(params[name])[0]}
            raise ValueError(f"the pretrained {name} parameters do not fit the model: missing "
                             f"{sorted(need - have)[:5]}, unexpected {sorted(have - need)[:5]}")
        for (key, a), b in zip(jax.tree_util.tree_flatten_with_path(tree)[0], jax.tree.leaves(params[name])):
            if np.shape(a) != b.shape:
                raise ValueError(f"pretrained {name}{jax.tree_util.keystr(key)} has shape {np.shape(a)}, the model "
                                 f"needs {b.shape}")
    out = dict(params, **new)
    return jax.tree.map(lambda x, ref, s: jax.device_put(np.asarray(x, dtype=ref.dtype), s), out, params, shardings)


class FinetuneTrainer(Trainer):
    """The shared Trainer; a fresh run starts from the pretrained encoder instead of a random one."""

    def __init__(self, train: TrainConfig, workdir: str, task: ClassificationTask, encoder: dict,
                 pooler: dict | None = None, **kwargs):
        """`encoder`, `pooler`: the pretrained parameters (numpy trees) a fresh run starts from; `kwargs` go to
        Trainer (mesh, log)."""
        super().__init__(train, workdir, task, **kwargs)
        self.encoder, self.pooler = encoder, pooler

    def initial_state(self, data):
        state, resumed = super().initial_state(data)
        if resumed is None:
            # Adam's moments start at zero whatever the parameters, so only the parameters are replaced; the
            # pretrained layers (read unscanned, jaxpos.run.Run) in this model's layout.
            encoder = relayout(self.encoder, scanned=self.scanned, group=self.scan_group)
            state = state.replace(params=merge_params(state.params, encoder, self.pooler,
                                                      self.state_shardings.params))
        return state, resumed


def make_predict_fn(task: ClassificationTask, trainer: Trainer | None = None) -> Callable:
    """jitted (params, batch) -> (logits [B, C], losses [B], labels [B], weights [B]); with a trainer, sharded
    like its steps (inputs are global batches; outputs replicated on every host)."""

    def fn(params, batch):
        logits = task.logits(params, batch)
        losses, _ = example_losses(logits, batch["labels"].astype(jnp.float32), task.model.num_labels)
        return logits, losses, batch["labels"], batch["weights"]

    if trainer is None:
        return jax.jit(fn)

    # under the trainer's mesh, as its steps: activation constraints, and the Pallas kernel per device
    return jax.jit(with_activation_sharding(fn, trainer.mesh),
                   in_shardings=(trainer.state_shardings.params, trainer.batch_sharding),
                   out_shardings=replicated(trainer.mesh))


def predict(predict_fn, params, batches: Iterable[dict], put: Callable = lambda b: b):
    """(logits [N, C], losses [N], labels [N]) over the real rows of `batches` (weight > 0), in order."""
    # Every batch is dispatched before any result is read: one wait for the device, not one per batch.
    pending = [predict_fn(params, put(batch)) for batch in batches]
    if not pending:
        raise ValueError("the evaluation data yielded no batch")
    out = []
    for logits, losses, labels, weights in jax.device_get(pending):
        keep = np.asarray(weights) > 0
        out.append((np.asarray(logits)[keep], np.asarray(losses)[keep], np.asarray(labels)[keep]))
    return tuple(np.concatenate(parts) for parts in zip(*out))
