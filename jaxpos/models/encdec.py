"""Transformer encoder-decoder (Vaswani et al.) with causal decoder self-attention, cross-attention and a
decoding cache."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from jaxpos.attention.layer import dense
from jaxpos.config import ModelConfig
from jaxpos.models.embedding import embedding
from jaxpos.models.layers import TransformerStack


DECODER_START_ID = 0  # the decoder's first input in training (shift_right) and decoding alike (flax wmt: padding)


def shift_right(targets, piece_ids=None, bos_id: int = DECODER_START_ID):
    """Decoder inputs: targets shifted one step right with `bos_id` first (and at each packed piece's start).

    targets [B, T] -> [B, T].
    """
    shifted = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=bos_id)[:, :-1]
    if piece_ids is not None:
        starts = piece_ids != jnp.pad(piece_ids, ((0, 0), (1, 0)))[:, :-1]
        shifted = jnp.where(starts, bos_id, shifted)
    return shifted


class EncoderDecoder(nn.Module):
    """inputs [B, S], targets [B, T] -> logits [B, T, V] (teacher forcing).

    The positional mechanism applies to encoder and decoder self-attention; cross-attention gets one only with
    model.cross_attention_position. With `decode`, `decode_step` consumes one target token per call.
    """

    cfg: ModelConfig
    decode: bool = False

    def setup(self):
        cfg = self.cfg
        self.embed = embedding(cfg, cfg.vocab_size, ("vocab", "embed"), "embed", std=cfg.d_model**-0.5)
        self.encoder = TransformerStack(cfg, cfg.num_layers, causal=False, name="encoder")
        self.decoder = TransformerStack(cfg, cfg.num_decoder_layers, causal=True, cross_attention=True,
                                        decode=self.decode, name="decoder")
        if not cfg.tie_embeddings:
            self.output = dense(cfg, cfg.vocab_size, -1, ("embed", "vocab"), ("vocab",), "output")

    def _embed(self, ids):
        x = self.embed(ids)
        if self.cfg.scale_embeddings:
            x = x * jnp.sqrt(self.cfg.d_model).astype(x.dtype)
        return x

    def encode(self, inputs, *, input_piece_ids=None, input_positions=None, deterministic: bool = True):
        """inputs [B, S] -> encoded [B, S, d]. Padding is id 0 unless piece ids are given; `input_positions`
        [B, S] restarts at 0 in every pair of a packed row."""
        piece_ids = input_piece_ids if input_piece_ids is not None else (inputs != 0).astype(jnp.int32)
        return self.encoder(self._embed(inputs), piece_ids=piece_ids, input_positions=input_positions,
                            deterministic=deterministic)

    def decode_logits(self, encoded, inputs, decoder_inputs, *, input_piece_ids=None,
                      target_piece_ids=None, input_positions=None, target_positions=None,
                      deterministic: bool = True):
        """Decoder logits [B, T, V] for decoder inputs [B, T] (already shifted), given the encoder output.
        Packed rows: `input_positions` [B, S] / `target_positions` [B, T] restart at 0 in every pair."""
        encoded_piece_ids = input_piece_ids if input_piece_ids is not None else (inputs != 0).astype(jnp.int32)
        y = self.decoder(self._embed(decoder_inputs), piece_ids=target_piece_ids,
                         input_positions=target_positions, encoded=encoded, encoded_piece_ids=encoded_piece_ids,
                         encoded_positions=input_positions, deterministic=deterministic)
        logits = self.embed.attend(y) if self.cfg.tie_embeddings else self.output(y)
        return logits.astype(jnp.float32)

    def __call__(self, inputs, targets, *, input_piece_ids=None, target_piece_ids=None,
                 input_positions=None, target_positions=None, deterministic: bool = True):
        encoded = self.encode(inputs, input_piece_ids=input_piece_ids, input_positions=input_positions,
                              deterministic=deterministic)
        decoder_inputs = shift_right(targets, target_piece_ids)
        return self.decode_logits(encoded, inputs, decoder_inputs, input_piece_ids=input_piece_ids,
                                  target_piece_ids=target_piece_ids, input_positions=input_positions,
                                  target_positions=target_positions, deterministic=deterministic)
