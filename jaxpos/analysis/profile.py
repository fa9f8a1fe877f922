"""The positional profile F-hat_P of an absolute-position model (TISA, Wennberg & Henter, eq. 9-12).

F-hat_P[h] = (w Q K^T P^T + P Q K^T w^T + P Q K^T P^T) / sqrt(D): the positional part of the first layer's
attention logits of head h, with every word embedding replaced by the vocabulary average w (times sqrt(d_model)
where the model scales its token embeddings). As in the paper's formula, LayerNorm and the projection biases are
left out; factorised (ALBERT) embeddings go through the embedding projection first.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np

from jaxpos.analysis.taps import has_learned_input_positions, token_embedding_scale
from jaxpos.config import ModelConfig


def positional_profile(cfg: ModelConfig, params) -> np.ndarray:
    """F-hat_P of every head of the first layer: [H, n, n] for n = model.max_length.

    `params` is a `BertEncoder` parameter tree of a model with learned input positions.
    """
    if not has_learned_input_positions(cfg):
        raise ValueError(f"the positional profile needs learned input position embeddings; model.position.kind="
                         f"{cfg.position.kind!r} has none")
    p = jax.tree.map(lambda x: np.asarray(x, np.float64), nn.unbox(params))
    enc = p["encoder"]
    positions = enc["position"]["embedding"]  # [n, E]
    mean_word = token_embedding_scale(cfg) * p["token_embed"]["embedding"].mean(axis=0)  # [E], as the model adds it
    if cfg.embedding_dim:
        positions, mean_word = positions @ enc["embed_projection"]["kernel"], mean_word @ enc["embed_projection"]["kernel"]
    layer = enc["layer_shared"] if cfg.share_layers else enc["layer_0"]
    w_q, w_k = layer["self_attention"]["query"]["kernel"], layer["self_attention"]["key"]["kernel"]  # [d, H, D]
    q_pos = np.einsum("nd,dhk->hnk", positions, w_q)
    k_pos = np.einsum("nd,dhk->hnk", positions, w_k)
    q_word = np.einsum("d,dhk->hk", mean_word, w_q)
    k_word = np.einsum("d,dhk->hk", mean_word, w_k)
    word_to_position = np.einsum("hk,hnk->hn", q_word, k_pos)[:, None, :]  # same for every query row
    position_to_word = np.einsum("hnk,hk->hn", q_pos, k_word)[:, :, None]  # same for every key column
    position_to_position = np.einsum("hik,hjk->hij", q_pos, k_pos)
    return (word_to_position + position_to_word + position_to_position) / np.sqrt(cfg.head_dim)
