"""Import Hugging Face BERT and ALBERT checkpoints (PyTorch state dicts or local folders) into jaxpos encoders.

Maps `BertModel` / `BertForMaskedLM` and `AlbertModel` / `AlbertForMaskedLM` weights onto `BertEncoder` /
`BertForMaskedLM` (absolute learned positions, post-LN; ALBERT's factorised embeddings and shared layers).
Needs no torch for safetensors folders; `pytorch_model.bin` needs torch.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import numpy as np

from jaxpos.config import ModelConfig, model_config

_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}


def config_from_hf(hf: Mapping[str, Any], **overrides) -> ModelConfig:
    """A jaxpos ModelConfig equivalent to a Hugging Face BertConfig or AlbertConfig (a dict from config.json)."""
    model_type = hf.get("model_type", "bert")
    if model_type not in ("bert", "albert"):
        raise ValueError(f"unsupported Hugging Face model_type {model_type!r}; jaxpos imports bert and albert")
    if model_type == "albert" and (hf.get("num_hidden_groups", 1) != 1 or hf.get("inner_group_num", 1) != 1):
        raise ValueError("only ALBERT checkpoints with one layer group of one layer (all published ones) import")
    act = hf.get("hidden_act", "gelu")
    if act not in _ACTIVATIONS:
        raise ValueError(f"unsupported hidden_act {act!r} in the Hugging Face config; known: {list(_ACTIVATIONS)}")
    values = dict(
        vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"], mlp_dim=hf["intermediate_size"],
        max_length=hf["max_position_embeddings"], type_vocab_size=hf.get("type_vocab_size", 2),
        dropout=hf.get("hidden_dropout_prob", 0.1), attention_dropout=hf.get("attention_probs_dropout_prob", 0.1),
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12), activation=_ACTIVATIONS[act],
        init_std=hf.get("initializer_range", 0.02), layer_norm="post",
        position=dict(kind="absolute", segment="input"))
    if model_type == "albert":
        values.update(embedding_dim=hf["embedding_size"], share_layers=True)
    values.update(overrides)
    return model_config(values)


class _Weights:
    """A state dict with its prefix resolved and a clear error for a missing key."""

    def __init__(self, state: Mapping[str, Any], prefix: str):
        self.state, self.prefix = state, prefix

    def __call__(self, key: str) -> np.ndarray:
        for name in (self.prefix + key, self.prefix + key.replace(".weight", ".gamma").replace(".bias", ".beta")):
            if name in self.state:
                return _to_numpy(self.state[name])
        raise KeyError(f"checkpoint has no weight {self.prefix + key!r}")


def _to_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().float().numpy()
    return np.asarray(x, dtype=np.float32)


def _norm(w, key):
    return {"scale": w(f"{key}.weight"), "bias": w(f"{key}.bias")}


def _heads(w, key, cfg, kind):
    """torch Linear [out, in] -> DenseGeneral kernels in the layout of the attention layer."""
    weight, bias = w(f"{key}.weight"), w(f"{key}.bias")
    h, dh = cfg.num_heads, cfg.head_dim
    if kind == "in":  # query/key/value: [d, H, D]
        return {"kernel": weight.T.reshape(cfg.d_model, h, dh), "bias": bias.reshape(h, dh)}
    return {"kernel": weight.T.reshape(h, dh, cfg.d_model), "bias": bias}


def _linear(w, key):
    return {"kernel": w(f"{key}.weight").T, "bias": w(f"{key}.bias")}


# Sub-module names of one layer in each family: attention q/k/v/out, attention LN, MLP in/out, MLP LN.
_LAYER_NAMES = {
    "bert": ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
             "attention.output.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm"),
    "albert": ("attention.query", "attention.key", "attention.value", "attention.dense", "attention.LayerNorm",
               "ffn", "ffn_output", "full_layer_layer_norm"),
}


def _layer(w, p, cfg, family):
    q, k, v, o, attn_norm, wi, wo, mlp_norm = (p + name for name in _LAYER_NAMES[family])
    return {"self_attention": {"query": _heads(w, q, cfg, "in"), "key": _heads(w, k, cfg, "in"),
                               "value": _heads(w, v, cfg, "in"), "out": _heads(w, o, cfg, "out")},
            "self_attention_norm": _norm(w, attn_norm),
            "mlp": {"wi": _linear(w, wi), "wo": _linear(w, wo)},
            "mlp_norm": _norm(w, mlp_norm)}


def _family(state) -> str:
    return "albert" if any("albert_layer_groups" in k for k in state) else "bert"


def bert_encoder_params(state: Mapping[str, Any], cfg: ModelConfig) -> dict:
    """Parameters of a jaxpos `BertEncoder` from a Hugging Face BERT or ALBERT state dict (`BertModel`,
    `BertForMaskedLM`, `AlbertModel`, `AlbertForMaskedLM`, ...; a leading `bert.`/`albert.` is detected)."""
    family = _family(state)
    prefix = f"{family}." if any(k.startswith(f"{family}.") for k in state) else ""
    w = _Weights(state, prefix)
    encoder = {"embed_norm": _norm(w, "embeddings.LayerNorm"),
               "position": {"embedding": w("embeddings.position_embeddings.weight")}}
    if family == "albert":
        encoder["embed_projection"] = _linear(w, "encoder.embedding_hidden_mapping_in")
        encoder["layer_shared"] = _layer(w, "encoder.albert_layer_groups.0.albert_layers.0.", cfg, family)
    else:
        for i in range(cfg.num_layers):
            encoder[f"layer_{i}"] = _layer(w, f"encoder.layer.{i}.", cfg, family)
    return {"token_embed": {"embedding": w("embeddings.word_embeddings.weight")},
            "type_embed": {"embedding": w("embeddings.token_type_embeddings.weight")},
            "encoder": encoder}


def bert_mlm_params(state: Mapping[str, Any], cfg: ModelConfig) -> dict:
    """Parameters of a jaxpos `BertForMaskedLM` from a Hugging Face `BertForMaskedLM`/`BertForPreTraining`
    or `AlbertForMaskedLM`."""
    family = _family(state)
    w = _Weights(state, "predictions." if family == "albert" else "cls.predictions.")
    dense_name, norm_name = ("dense", "LayerNorm") if family == "albert" else ("transform.dense",
                                                                               "transform.LayerNorm")
    return {"bert": bert_encoder_params(state, cfg), "head_dense": _linear(w, dense_name),
            "head_norm": _norm(w, norm_name), "output_bias": w("bias")}


def load_hf_checkpoint(path: str) -> tuple[dict, dict[str, np.ndarray]]:
    """(config dict, state dict of numpy arrays) from a local folder holding config.json and
    model.safetensors or pytorch_model.bin. Nothing is downloaded."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"Hugging Face checkpoint folder {path!r} does not exist")
    config_path = os.path.join(path, "config.json")
    if not os.path.exists(config_path):
        raise FileNotFoundError(f"{path!r} has no config.json; a Hugging Face checkpoint folder needs one")
    with open(config_path) as f:
        hf_config = json.load(f)
    safetensors_path = os.path.join(path, "model.safetensors")
    torch_path = os.path.join(path, "pytorch_model.bin")
    if os.path.exists(safetensors_path):
        from safetensors.numpy import load_file
        state = load_file(safetensors_path)
    elif os.path.exists(torch_path):
        import torch
        state = {k: _to_numpy(v) for k, v in torch.load(torch_path, map_location="cpu").items()}
    else:
        raise FileNotFoundError(f"{path!r} has neither model.safetensors nor pytorch_model.bin; "
                                f"found: {sorted(os.listdir(path))}")
    return hf_config, {k: np.asarray(v, np.float32) for k, v in state.items()}
