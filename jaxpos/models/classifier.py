"""BERT-style sequence classification and regression: the encoder, BERT's pooler (on [CLS], or on the mean or max
over the tokens), and a linear head."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from jaxpos.attention.layer import dense
from jaxpos.config import ModelConfig
from jaxpos.models.bert import BertEncoder


class BertForSequenceClassification(nn.Module):
    """input_ids [B, T] -> logits [B, num_labels] (float32); num_labels=1 is a regression score.

    The pooler is BERT's, tanh(W h + b), on the first token's hidden state ([CLS]) or, as `cfg.pooling` says, on
    the mean or the featurewise max of the row's tokens (piece_ids > 0); then dropout and the linear head.
    Parameters: `bert` (a BertEncoder, the same subtree as BertForMaskedLM's), `pooler`, `classifier`.
    """

    cfg: ModelConfig
    num_labels: int

    def setup(self):
        cfg = self.cfg
        self.encoder = BertEncoder(cfg, name="bert")
        self.pooler = dense(cfg, cfg.d_model, -1, ("embed", None), (None,), "pooler")
        self.dropout = nn.Dropout(cfg.dropout)
        self.classifier = dense(cfg, self.num_labels, -1, ("embed", None), (None,), "classifier")

    def pool(self, input_ids, *, piece_ids=None, token_types=None, deterministic: bool = True):
        """The pooled representation [B, d] (`cfg.pooling` of the last hidden states, then the pooler)."""
        hidden = self.encoder(input_ids, piece_ids=piece_ids, token_types=token_types,
                              deterministic=deterministic)
        if self.cfg.pooling == "cls":
            return jnp.tanh(self.pooler(hidden[:, 0]))
        # the tokens the encoder attended to: piece 0 is padding; no piece_ids, every position is a token
        tokens = (jnp.ones(input_ids.shape, bool) if piece_ids is None else piece_ids > 0)[..., None]
        if self.cfg.pooling == "mean":
            summary = (hidden * tokens).sum(1) / jnp.maximum(tokens.sum(1), 1)
        else:
            summary = jnp.where(tokens, hidden, jnp.finfo(hidden.dtype).min).max(1)
        return jnp.tanh(self.pooler(summary))

    def __call__(self, input_ids, *, piece_ids=None, token_types=None, deterministic: bool = True):
        pooled = self.pool(input_ids, piece_ids=piece_ids, token_types=token_types, deterministic=deterministic)
        return self.classifier(self.dropout(pooled, deterministic=deterministic)).astype(jnp.float32)
