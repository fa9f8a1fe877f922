"""The translation task: label-smoothed cross-entropy of an encoder-decoder for the shared loop.

Batches: `inputs` [B, S] and `targets` [B, T] (0 = padding, targets end with EOS), optionally
`input_piece_ids` / `target_piece_ids` [B, S] / [B, T] for packed pairs (0 = padding) with
`input_positions` / `target_positions` (restarting at 0 in every pair).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxpos.config.rng import step_rngs
from jaxpos.models import EncoderDecoder
from jaxpos.training.flops import translation_step_flops
from jaxpos.training.mlm import summarize_token_sums, token_cross_entropy


@dataclasses.dataclass(frozen=True)
class TranslationTask:
    model: EncoderDecoder
    max_source_len: int
    max_target_len: int
    label_smoothing: float = 0.1  # Vaswani et al.

    @property
    def tokens_per_example(self) -> int:
        return self.max_source_len + self.max_target_len

    def init_inputs(self):
        return (jnp.ones((1, self.max_source_len), jnp.int32), jnp.ones((1, self.max_target_len), jnp.int32)), {}

    def step_flops(self, batch_size: int) -> float:
        """Model FLOPs of a training step on `batch_size` rows."""
        return translation_step_flops(self.model.cfg, batch_size, self.max_source_len, self.max_target_len)

    def loss(self, params, batch, rng, train):
        targets = batch["targets"]
        target_piece_ids = batch.get("target_piece_ids")
        logits = self.model.apply(
            {"params": params}, batch["inputs"], targets, input_piece_ids=batch.get("input_piece_ids"),
            target_piece_ids=target_piece_ids, input_positions=batch.get("input_positions"),
            target_positions=batch.get("target_positions"), deterministic=not train,
            rngs=step_rngs(rng) if train else {})
        weights = (targets != 0).astype(jnp.float32)
        if target_piece_ids is not None:
            weights = weights * (target_piece_ids != 0)
        loss, correct, weight = token_cross_entropy(logits, targets, weights, self.label_smoothing)
        sums = {"loss": loss, "correct": correct, "weight": weight}
        if self.label_smoothing:  # report the plain cross-entropy (and its perplexity) too
            sums["nll"] = token_cross_entropy(logits, targets, weights)[0]
        return loss, sums

    def summarize(self, sums):
        return summarize_token_sums(sums)
