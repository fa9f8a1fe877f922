"""BERT-style encoder with a masked-LM head tied to the input embeddings."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from jaxpos.attention.layer import dense
from jaxpos.config import ModelConfig
from jaxpos.models.embedding import embedding
from jaxpos.models.layers import TransformerStack, activation, layer_norm
from jaxpos.positions import token_embedding_scale


class BertEncoder(nn.Module):
    """Token (+ token-type) embeddings and a TransformerStack. input_ids [B, T] -> hidden [B, T, d].

    `piece_ids` [B, T] are packing-piece ids (0 = padding); `token_types` [B, T] BERT's sentence A/B ids,
    embedded at the input (position.segment='input') or used by per-head segment attention ('per_head');
    `input_positions` [B, T] positions within each packed piece (None: 0..T-1, one sequence per row).
    With `decode` (and model.causal) it runs one token per call against a key/value cache.
    """

    cfg: ModelConfig
    decode: bool = False

    def setup(self):
        cfg = self.cfg
        std, self.token_scale = token_embedding_scale(cfg)  # the mechanism's (sinusoidal: its source's) or the model's
        self.token_embed = embedding(cfg, cfg.vocab_size, ("vocab", "embed"), "token_embed", std=std)
        if cfg.position.segment == "input" and cfg.type_vocab_size > 0:
            self.type_embed = embedding(cfg, cfg.type_vocab_size, (None, "embed"), "type_embed")
        self.stack = TransformerStack(cfg, cfg.num_layers, causal=cfg.causal, decode=self.decode, name="encoder")

    def __call__(self, input_ids, *, piece_ids=None, token_types=None, input_positions=None,
                 deterministic: bool = True):
        cfg = self.cfg
        x = self.token_embed(input_ids)
        if self.token_scale != 1.0:
            x = x * jnp.asarray(self.token_scale, x.dtype)
        if cfg.position.segment == "input" and cfg.type_vocab_size > 0:
            types = token_types if token_types is not None else jnp.zeros_like(input_ids)
            x = x + self.type_embed(types)
        return self.stack(x, piece_ids=piece_ids, token_types=token_types, input_positions=input_positions,
                          deterministic=deterministic)

    def attend(self, hidden):
        return self.token_embed.attend(hidden)


class BertForMaskedLM(nn.Module):
    """Encoder + MLM head (dense to the embedding width, activation, LayerNorm, tied decoder + bias; ModernBERT's
    head has the same form).
    -> logits [B, T, V].

    `encode` gives the hidden states; `__call__` the vocabulary logits at every position (or at
    `predict_positions` [B, P] only, which saves the [B, T, V] product during pretraining).
    """

    cfg: ModelConfig
    decode: bool = False

    def setup(self):
        cfg = self.cfg
        self.encoder = BertEncoder(cfg, decode=self.decode, name="bert")
        self.head_dense = dense(cfg, cfg.embed_width, -1, ("embed", None), (None,), "head_dense", cfg.use_bias)
        self.head_norm = layer_norm(cfg, "head_norm")
        if cfg.tie_embeddings:  # the tied decoder's bias; an untied decoder has its own
            self.output_bias = self.param("output_bias", nn.with_logical_partitioning(nn.initializers.zeros,
                                                                                       ("vocab",)),
                                          (cfg.vocab_size,), jnp.dtype(cfg.param_dtype))
        else:
            self.decoder = dense(cfg, cfg.vocab_size, -1, ("embed", "vocab"), ("vocab",), "decoder")

    def encode(self, input_ids, *, piece_ids=None, token_types=None, input_positions=None,
               deterministic: bool = True):
        return self.encoder(input_ids, piece_ids=piece_ids, token_types=token_types,
                            input_positions=input_positions, deterministic=deterministic)

    def __call__(self, input_ids, *, piece_ids=None, token_types=None, input_positions=None,
                 predict_positions=None, deterministic: bool = True):
        hidden = self.encode(input_ids, piece_ids=piece_ids, token_types=token_types,
                             input_positions=input_positions, deterministic=deterministic)
        if predict_positions is not None:
            hidden = jnp.take_along_axis(hidden, predict_positions[..., None], axis=1)
        h = self.head_norm(activation(self.cfg.activation)(self.head_dense(hidden)))
        if self.cfg.tie_embeddings:
            logits = self.encoder.attend(h) + self.output_bias.astype(h.dtype)
        else:
            logits = self.decoder(h)
        return logits.astype(jnp.float32)


def position_params(params) -> dict:
    """The positional mechanism's parameters ("position") of an encoder's tree: a BertForMaskedLM's (under
    "bert"), a BertEncoder's or a classifier's (under "encoder"), or the stack's own."""
    for scope in ("bert", "encoder"):
        if scope in params and "position" not in params:
            params = params[scope]
    return params["position"]
