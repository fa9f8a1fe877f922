"""Additive decomposition of a post-LN encoder's hidden states (Mickus et al., "How to Dissect a Muppet").

Every hidden state is split as e = i + h + f + c:
  i  the input embeddings (token, scaled as the model scales it, + position + type), carried through residuals
     and LayerNorm scalings;
  h  every attention sublayer's output without its biases (value biases and b_O go to c);
  f  every feed-forward sublayer's output without its output bias b2 (b2 goes to c);
  c  LayerNorm biases and mean shifts, b_O + W_O b_V, b2.
A LayerNorm g*(x - m)/sqrt(var + eps) + b is linear in x for the fixed per-token scale g/sqrt(var + eps), so each
term is scaled by it and -scale*m + b joins c. Attention weights come from the model itself, so the bookkeeping
holds for any positional mechanism whose values carry no positional term and are not mixed along the sequence
(everything but Shaw's r^V and Linformer: `jaxpos.analysis.taps.value_path_problem`).
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import numpy as np
from scipy.special import erf

from jaxpos.analysis.taps import (input_position_embedding, layer_params, run_encoder, token_embedding_scale,
                                 value_path_problem)
from jaxpos.config import ModelConfig

TERMS = ("i", "h", "f", "c")


@dataclasses.dataclass
class Decomposition:
    """The terms i, h, f, c of a post-LN encoder's hidden states (sum over axis 1 = the hidden states) for a
    batch of B sequences of length T, L layers, width d; `decompose` builds it."""

    terms: np.ndarray  # [L+1, 4, B, T, d]: i, h, f, c after the embeddings (index 0) and after each layer
    hidden: np.ndarray  # [L+1, B, T, d]: the model's own hidden states (sown by the encoder), for comparison
    mask: np.ndarray  # [B, T] bool: real (non-padding) tokens
    feedforward_io: list  # per layer (input z [B, T, d], output W2 act(W1 z + b1) + b2 [B, T, d])

    def feedforward_linear_r2(self) -> np.ndarray:
        """r^2 of the least-squares linear fit (with intercept) of each feed-forward sublayer's output from its
        input over the real tokens (Muppet section 2.3): [L]."""
        scores = []
        for z, out in self.feedforward_io:
            x, y = z[self.mask], out[self.mask]
            design = np.concatenate([x, np.ones((len(x), 1), x.dtype)], axis=1)
            coef, *_ = np.linalg.lstsq(design, y, rcond=None)
            residual = ((y - design @ coef) ** 2).sum()
            scores.append(1.0 - residual / ((y - y.mean(axis=0)) ** 2).sum())
        return np.asarray(scores)

    def importance(self) -> np.ndarray:
        """mu(e, t) = e.t / |e|^2 per layer and term, averaged over real tokens: [L+1, 4], rows sum to 1."""
        e = self.terms.sum(axis=1)  # [L+1, B, T, d]
        mu = np.einsum("lbtd,lkbtd->lkbt", e, self.terms) / np.einsum("lbtd,lbtd->lbt", e, e)[:, None]
        return mu[:, :, self.mask].mean(axis=-1)


def _layer_norm_parts(x, p, eps):
    """(scale [.., d], shift [.., d]) with LN(x) = scale * x + shift for this x."""
    mean = x.mean(-1, keepdims=True)
    inv = 1.0 / np.sqrt(x.var(-1, keepdims=True) + eps)
    scale = p["scale"] * inv
    return scale, p.get("bias", 0.0) - scale * mean  # no shift without model.norm_bias


def _gelu(x, approximate):
    if approximate:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))

    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def _activation(name):
    if name == "relu":
        return lambda x: np.maximum(x, 0)
    return lambda x: _gelu(x, name == "gelu_tanh")


def decompose(cfg: ModelConfig, params, input_ids, *, piece_ids=None, token_types=None,
              dtype=np.float64) -> Decomposition:
    """Decomposes the hidden states of a post-LN `BertEncoder` with parameters `params` (its own tree, not
    the MLM wrapper's) for input_ids [B, T]. Computation in `dtype` (float64 by default)."""
    if cfg.layer_norm != "post":
        raise ValueError("the additive decomposition is defined for post-LN encoders (model.layer_norm='post')")
    if cfg.mlp != "plain":
        raise ValueError(f"the additive decomposition reads a plain MLP, not model.mlp={cfg.mlp!r}")
    problem = value_path_problem(cfg)
    if problem is not None:
        raise ValueError(f"the additive decomposition does not apply to this model: {problem}")
    ids = np.asarray(input_ids)
    piece_ids = np.ones_like(ids) if piece_ids is None else np.asarray(piece_ids)
    types = np.zeros_like(ids) if token_types is None else np.asarray(token_types)
    weights, hidden_states = (np.asarray(x) for x in run_encoder(cfg, params, ids, piece_ids, types))
    p = jax.tree.map(lambda x: np.asarray(x, dtype), nn.unbox(params))
    enc = p["encoder"]

    x = token_embedding_scale(cfg) * p["token_embed"]["embedding"][ids]
    if cfg.position.segment == "input" and cfg.type_vocab_size > 0:
        x = x + p["type_embed"]["embedding"][types]
    position_embedding = input_position_embedding(cfg, enc, ids.shape[1])
    if position_embedding is not None:
        x = x + np.asarray(position_embedding, dtype)[None]
    if cfg.embed_layer_norm:
        scale, shift = _layer_norm_parts(x, enc["embed_norm"], cfg.layer_norm_eps)
        terms = [scale * x, 0 * x, 0 * x, shift]
    else:
        terms = [x, 0 * x, 0 * x, 0 * x]
    if cfg.embedding_dim:
        proj = enc["embed_projection"]
        terms = [t @ proj["kernel"] for t in terms]
        terms[3] = terms[3] + proj.get("bias", 0.0)
    history = [np.stack(terms)]
    feedforward_io = []
    act = _activation(cfg.activation)
    for layer in range(cfg.num_layers):
        lp = layer_params(cfg, p, layer)
        att = lp["self_attention"]
        e = sum(terms)
        values = np.einsum("btd,dhk->bthk", e, att["value"]["kernel"])  # value biases excluded from h
        mixed = np.einsum("bhts,bshk->bthk", weights[layer].astype(dtype), values)
        attention = np.einsum("bthk,hkd->btd", mixed, att["out"]["kernel"])
        value_bias = att["value"].get("bias", np.zeros(att["value"]["kernel"].shape[1:], dtype))
        attention_bias = np.einsum("hk,hkd->d", value_bias, att["out"]["kernel"]) + att["out"].get("bias", 0.0)
        i, h, f, c = terms
        residual = [i, h + attention, f, c + attention_bias]
        scale, shift = _layer_norm_parts(sum(residual), lp["self_attention_norm"], cfg.layer_norm_eps)
        terms = [scale * t for t in residual]
        terms[3] = terms[3] + shift
        z = sum(terms)
        mlp = lp["mlp"]
        ff = act(z @ mlp["wi"]["kernel"] + mlp["wi"].get("bias", 0.0)) @ mlp["wo"]["kernel"]  # b2 excluded from f
        i, h, f, c = terms
        out_bias = mlp["wo"].get("bias", 0.0)
        feedforward_io.append((z, ff + out_bias))
        residual = [i, h, f + ff, c + out_bias]
        scale, shift = _layer_norm_parts(sum(residual), lp["mlp_norm"], cfg.layer_norm_eps)
        terms = [scale * t for t in residual]
        terms[3] = terms[3] + shift
        history.append(np.stack(terms))
    return Decomposition(np.stack(history), hidden_states.astype(dtype), piece_ids != 0, feedforward_io)
