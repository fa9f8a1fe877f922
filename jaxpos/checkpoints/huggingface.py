"""Import Hugging Face BERT, ALBERT, DeBERTa-v2/v3 and ModernBERT checkpoints (PyTorch state dicts or local
folders) into jaxpos encoders.

Maps `BertModel` / `BertForMaskedLM` and `AlbertModel` / `AlbertForMaskedLM` weights onto `BertEncoder` /
`BertForMaskedLM` (absolute learned positions, post-LN; ALBERT's factorised embeddings and shared layers; a tied
or untied output layer; BERT's `is_decoder` as a causal encoder) and the pooler for classification heads.
`DebertaV2Model` / `DebertaV2ForMaskedLM` (model_type deberta-v2, v3 included) map onto position.kind='deberta':
the encoder, its shared relative embeddings and their LayerNorm, and the MLM head in either layout (`cls.predictions`
with legacy=true, `lm_predictions.lm_head` otherwise); DeBERTa-v3's replaced-token-detection head
(`mask_predictions`) and the sequence classifier's ContextPooler are not read.
`ModernBertModel` / `ModernBertForMaskedLM` (model_type modernbert) map onto the modern block: pre-LN, GeGLU (or
SwiGLU), no biases where the config has none, the first layer's attention norm an identity, a final norm, RoPE with
the global and local bases, local layers every layer but each global_attn_every_n_layers-th, and the MLM head (dense,
activation, norm, decoder with its bias); the fused Wqkv and Wi are split into jaxpos's projections.
A config.json field that would make transformers build a model jaxpos cannot represent is refused by name.
Needs no torch for safetensors folders; `pytorch_model.bin` needs torch.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any, Mapping

import numpy as np
import safetensors.numpy

from jaxpos.config import ModelConfig, model_config

# hidden_act names with an exact jaxpos equivalent (the *_tanh/new/fast/accurate names are one tanh formula).
_ACTIVATIONS = {"gelu": "gelu", "gelu_python": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                "gelu_python_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh", "gelu_accurate": "gelu_tanh",
                "relu": "relu"}

# config.json field -> (ModelConfig field, default when absent; None: required). The exporter writes them back.
CONFIG_FIELDS = {
    "vocab_size": ("vocab_size", None), "hidden_size": ("d_model", None), "num_hidden_layers": ("num_layers", None),
    "num_attention_heads": ("num_heads", None), "intermediate_size": ("mlp_dim", None),
    "max_position_embeddings": ("max_length", None), "type_vocab_size": ("type_vocab_size", 2),
    "hidden_dropout_prob": ("dropout", 0.1), "attention_probs_dropout_prob": ("attention_dropout", 0.1),
    "layer_norm_eps": ("layer_norm_eps", 1e-12), "initializer_range": ("init_std", 0.02)}

# DeBERTa-v2/v3 config.json fields: (transformers' default, the only value jaxpos imports or None: mapped, what
# jaxpos supports). The disentangled attention of v2/v3 is position.kind='deberta'.
_DEBERTA_FIELDS = {
    "relative_attention": (False, True, "relative attention, DeBERTa's c2p and p2c terms"),
    "position_biased_input": (True, False, "no absolute positions at the input"),
    "share_att_key": (False, True, "relative embeddings projected by each layer's own query and key projections"),
    "pos_att_type": (None, ["c2p", "p2c"], "both disentangled terms, c2p and p2c"),
    "norm_rel_ebd": ("none", ["layer_norm"], "relative embeddings normalised by a LayerNorm"),
    "conv_kernel_size": (0, 0, "no convolution layer after the first layer"),
    "position_buckets": (-1, None, ""), "max_relative_positions": (-1, None, ""), "legacy": (True, None, ""),
    "attention_head_size": (None, None, ""), "conv_groups": (1, None, ""), "conv_act": ("tanh", None, ""),
}
# Where a DeBERTa-v2 config.json leaves a field out, transformers' default differs from BERT's.
_DEBERTA_DEFAULTS = {"type_vocab_size": 0, "layer_norm_eps": 1e-7}

# config.json fields that config_from_hf maps onto ModelConfig.
_MAPPED = frozenset(CONFIG_FIELDS) | {"model_type", "hidden_act", "tie_word_embeddings", "is_decoder",
                                     "embedding_size"} | frozenset(_DEBERTA_FIELDS)

# Fields jaxpos can only import at their default: field -> (default, what jaxpos supports).
_DEFAULT_ONLY = {
    "position_embedding_type": ("absolute", "learned absolute positions ('relative_key*' adds distance tables)"),
    "add_cross_attention": (False, "encoders without cross-attention layers"),
    "pruned_heads": ({}, "the same number of heads in every layer"),
    "num_hidden_groups": (1, "one shared ALBERT layer group"),
    "inner_group_num": (1, "one layer per ALBERT group"),
}

# Fields that leave transformers' encoder and MLM forward pass unchanged: outputs, generation, task heads, special
# tokens, storage dtype (weights import as float32), attention kernels, bookkeeping, legacy TF-port keys.
_IRRELEVANT = frozenset({
    "architectures", "transformers_version", "_name_or_path", "name_or_path", "_commit_hash", "dtype",
    "torch_dtype", "use_bfloat16", "torchscript", "tf_legacy_loss", "xla_device", "gradient_checkpointing",
    "attn_implementation", "_attn_implementation", "_attn_implementation_autoset", "_attn_implementation_internal",
    "return_dict", "output_attentions", "output_hidden_states", "output_past", "use_cache",
    "chunk_size_feed_forward", "is_encoder_decoder", "tie_encoder_decoder", "cross_attention_hidden_size",
    "id2label", "label2id", "num_labels", "problem_type", "finetuning_task", "task_specific_params",
    "classifier_dropout", "classifier_dropout_prob", "tokenizer_class", "prefix",
    "pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "decoder_start_token_id",
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
    "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
    "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
    "directionality", "pooler_fc_size", "pooler_num_attention_heads", "pooler_num_fc_layers",
    "pooler_size_per_head", "pooler_type", "down_scale_factor", "gap_size", "net_structure_type",
    "num_memory_blocks", "pooler_dropout", "pooler_hidden_act", "pooler_hidden_size"})


# ModernBERT's config.json fields that config_from_hf reads (`_modernbert_values`), and those that leave its encoder
# and MLM forward pass unchanged (initialisation, the classifier's pooling, flash-attention and sparse-prediction
# switches, special tokens; layer_norm_eps is BERT's name, which ModernBERT does not read: norm_eps).
_MODERNBERT_MAPPED = frozenset({
    "model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
    "max_position_embeddings", "hidden_activation", "classifier_activation", "norm_eps", "norm_bias",
    "attention_bias", "mlp_bias", "classifier_bias", "decoder_bias", "local_attention", "global_attn_every_n_layers",
    "layer_types", "rope_parameters", "rope_scaling", "global_rope_theta", "local_rope_theta", "initializer_range",
    "tie_word_embeddings", "embedding_dropout", "mlp_dropout", "attention_dropout"})
_MODERNBERT_IRRELEVANT = frozenset({
    "initializer_cutoff_factor", "classifier_pooling", "deterministic_flash_attn", "sparse_prediction",
    "sparse_pred_ignore_index", "cls_token_id", "sep_token_id", "pad_token_id", "bos_token_id", "eos_token_id",
    "mask_token_id", "unk_token_id", "reference_compile", "repad_logits_with_grad", "layer_norm_eps"})


def _check_fields(hf: Mapping[str, Any], modernbert: bool = False) -> None:
    """Refuse a config.json field whose value jaxpos cannot represent; warn about fields it does not know."""
    for key, (default, supported) in _DEFAULT_ONLY.items():
        if key in hf and hf[key] != default:
            raise ValueError(f"config.json has {key}={hf[key]!r}; jaxpos imports only {key}={default!r} "
                             f"({supported})")
    for key in ("hidden_activation", "classifier_activation") if modernbert else ("hidden_act",):
        act = hf.get(key, "gelu")
        if act not in _ACTIVATIONS and not (key == "hidden_activation" and act in _GATE_SILU):
            raise ValueError(f"config.json has {key}={act!r}; jaxpos imports only {sorted(_ACTIVATIONS)}"
                             + (f" (or {' / '.join(_GATE_SILU)}: SwiGLU)" if key == "hidden_activation" else ""))
    known = (_MODERNBERT_MAPPED | _MODERNBERT_IRRELEVANT) if modernbert else _MAPPED
    unknown = sorted(set(hf) - known - set(_DEFAULT_ONLY) - _IRRELEVANT)
    # transformers' BERT/ALBERT ignore keys they do not define and hub configs carry odd extras: warn, don't refuse.
    if unknown:
        warnings.warn(f"config.json fields {unknown} are unknown to the jaxpos importer and ignored", stacklevel=3)


def config_from_hf(hf: Mapping[str, Any], **overrides) -> ModelConfig:
    """A jaxpos ModelConfig equivalent to a Hugging Face BertConfig, AlbertConfig, DebertaV2Config or
    ModernBertConfig (a dict from config.json). Raises ValueError naming a field whose value jaxpos cannot represent."""
    model_type = hf.get("model_type", "bert")
    if model_type not in ("bert", "albert", "deberta-v2", "modernbert"):
        raise ValueError(f"unsupported Hugging Face model_type {model_type!r}; jaxpos imports bert, albert, "
                         "deberta-v2 (DeBERTa-v2 and v3) and modernbert")
    _check_fields(hf, modernbert=model_type == "modernbert")
    if model_type == "modernbert":
        return model_config({**_modernbert_values(hf), **overrides})
    defaults = _DEBERTA_DEFAULTS if model_type == "deberta-v2" else {}
    values = {field: hf[key] if default is None else hf.get(key, defaults.get(key, default))
              for key, (field, default) in CONFIG_FIELDS.items()}
    values.update(activation=_ACTIVATIONS[hf.get("hidden_act", "gelu")], layer_norm="post",
                  tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
                  position=dict(kind="absolute", segment="input"))
    if model_type == "albert":  # transformers' AlbertModel ignores is_decoder: it is always bidirectional
        values.update(embedding_dim=hf["embedding_size"], share_layers=True)
    elif model_type == "deberta-v2":
        values.update(_deberta_values(hf, values))
    else:
        values.update(causal=bool(hf.get("is_decoder", False)))
    values.update(overrides)
    return model_config(values)


def _deberta_values(hf: Mapping[str, Any], values: Mapping[str, Any]) -> dict:
    """The ModelConfig values of a DeBERTa-v2/v3 config.json beyond BERT's; refuses what jaxpos cannot represent."""
    for key, (default, only, supported) in _DEBERTA_FIELDS.items():
        value = hf.get(key, default)
        if key in ("pos_att_type", "norm_rel_ebd") and value is not None:  # "p2c|c2p" as transformers splits it
            parts = value.lower().split("|") if isinstance(value, str) else value
            value = sorted({part.strip() for part in parts} - {"none"})
        if only is not None and value != only:
            raise ValueError(f"config.json has {key}={hf.get(key, default)!r}; jaxpos imports DeBERTa with "
                             f"{key}={only!r} ({supported})")
    head_size = hf.get("attention_head_size")
    if head_size is not None and head_size * hf["num_attention_heads"] != hf["hidden_size"]:
        raise ValueError(f"config.json has attention_head_size={head_size!r}; jaxpos imports only "
                         "hidden_size / num_attention_heads")
    if hf.get("embedding_size", hf["hidden_size"]) != hf["hidden_size"]:
        raise ValueError(f"config.json has embedding_size={hf['embedding_size']!r}; jaxpos imports DeBERTa only with "
                         "embedding_size = hidden_size (its projection of narrower embeddings precedes the LayerNorm)")
    # transformers: position_buckets <= 0 turns the log buckets off, max_relative_positions < 1 means
    # max_position_embeddings
    buckets, max_relative = hf.get("position_buckets", -1), hf.get("max_relative_positions", -1)
    deberta = dict(position_buckets=max(buckets, 0),
                   max_relative_positions=max_relative if max_relative >= 1 else hf["max_position_embeddings"])
    types = values["type_vocab_size"]
    # The legacy=false head multiplies by the input embeddings whatever tie_word_embeddings says.
    tied = bool(hf.get("tie_word_embeddings", True)) or not hf.get("legacy", True)
    return dict(type_vocab_size=max(types, 1), tie_embeddings=tied,
                position=dict(kind="deberta", segment="input" if types else "none", deberta=deberta))


# hidden_activation names that make ModernBERT's gated MLP a SwiGLU
_GATE_SILU = ("silu", "swish")


def modernbert_global_every(hf: Mapping[str, Any]) -> int | None:
    """ModernBERT's global_attn_every_n_layers G from config.json (layer l global when l % G == 0), from its
    layer_types where it lists them; None when every layer is global. A pattern of another form is refused."""
    layers = hf["num_hidden_layers"]
    every = hf.get("global_attn_every_n_layers", 3)
    if "layer_types" not in hf or hf["layer_types"] is None:
        return every if every > 1 and layers > 1 else None
    types = list(hf["layer_types"])
    if all(t == "full_attention" for t in types):
        return None
    for candidate in [every] + list(range(2, layers + 1)):
        if types == ["full_attention" if i % candidate == 0 else "sliding_attention" for i in range(layers)]:
            return candidate
    raise ValueError(f"config.json has layer_types={types!r}; jaxpos imports layer l global when "
                     "l % global_attn_every_n_layers == 0, every other layer local (sliding_attention)")


def _modernbert_theta(hf: Mapping[str, Any], kind: str, old_key: str, default: float) -> float:
    """A ModernBERT RoPE base: rope_parameters[kind] (transformers 5), else the older global/local_rope_theta."""
    params = (hf.get("rope_parameters") or {}).get(kind) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"config.json has rope_parameters.{kind}.rope_type={rope_type!r}; jaxpos imports "
                         "ModernBERT with rope_type='default' (no length rule)")
    return float(params.get("rope_theta", hf.get(old_key, default)))


def _modernbert_values(hf: Mapping[str, Any]) -> dict:
    """The ModelConfig values of a ModernBERT config.json; refuses what jaxpos cannot represent. Dropout rates map
    onto jaxpos's two (the hidden states', from mlp_dropout, and the attention weights'), training settings only."""
    if hf.get("rope_scaling") is not None:
        raise ValueError(f"config.json has rope_scaling={hf['rope_scaling']!r}; jaxpos imports ModernBERT without "
                         "a RoPE length rule")
    biases = {key: bool(hf.get(key, False)) for key in ("attention_bias", "mlp_bias", "classifier_bias")}
    if len(set(biases.values())) > 1:
        raise ValueError(f"config.json has {', '.join(f'{k}={v}' for k, v in biases.items())}; jaxpos imports "
                         "ModernBERT with all three the same (model.use_bias)")
    hidden, head = hf.get("hidden_activation", "gelu"), hf.get("classifier_activation", "gelu")
    mlp = "swiglu" if hidden in _GATE_SILU else "geglu"
    if mlp == "geglu" and _ACTIVATIONS[hidden] != _ACTIVATIONS[head]:
        raise ValueError(f"config.json has hidden_activation={hidden!r} and classifier_activation={head!r}; jaxpos "
                         "imports ModernBERT with one GELU for both (model.activation)")
    if mlp == "geglu" and _ACTIVATIONS[hidden] == "relu":
        raise ValueError("config.json has hidden_activation='relu'; jaxpos's gated MLPs are GeGLU and SwiGLU")
    every = modernbert_global_every(hf)
    rope = dict(base=_modernbert_theta(hf, "full_attention", "global_rope_theta", 160_000.0),
                local_base=_modernbert_theta(hf, "sliding_attention", "local_rope_theta", 10_000.0))
    return dict(
        vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"], mlp_dim=hf["intermediate_size"],
        max_length=hf.get("max_position_embeddings", 8192), type_vocab_size=1,
        dropout=hf.get("mlp_dropout", 0.0), attention_dropout=hf.get("attention_dropout", 0.0),
        activation=_ACTIVATIONS[head], mlp=mlp, layer_norm="pre", layer_norm_eps=hf.get("norm_eps", 1e-5),
        use_bias=biases["attention_bias"], norm_bias=bool(hf.get("norm_bias", False)),
        first_layer_attention_norm=False, embed_layer_norm=True,
        local_window=hf.get("local_attention", 128) if every else None, global_every=every or 3,
        init_std=hf.get("initializer_range", 0.02), tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        position=dict(kind="rope", segment="none", rope=rope))


class _Weights:
    """A state dict with its prefix resolved and a clear error for a missing key."""

    def __init__(self, state: Mapping[str, Any], prefix: str):
        self.state, self.prefix = state, prefix

    def _name(self, key: str) -> str | None:
        for name in (self.prefix + key, self.prefix + key.replace(".weight", ".gamma").replace(".bias", ".beta")):
            if name in self.state:
                return name
        return None

    def __contains__(self, key: str) -> bool:
        return self._name(key) is not None

    def __call__(self, key: str, *fallbacks: str) -> np.ndarray:
        """The weight under `key`, else under the first of `fallbacks` present."""
        for k in (key, *fallbacks):
            if k in self:
                return _to_numpy(self.state[self._name(k)])
        raise KeyError(f"checkpoint has no weight {self.prefix + key!r}")


def _to_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().float().numpy()
    return np.asarray(x, dtype=np.float32)


# --- the one name and layout mapping, used by the importer here and the exporter (jaxpos/checkpoints/export.py) --

# Sub-module names of one layer in each family: attention q/k/v/out, attention LN, MLP in/out, MLP LN.
_LAYER_NAMES = {
    "bert": ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
             "attention.output.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm"),
    "albert": ("attention.query", "attention.key", "attention.value", "attention.dense", "attention.LayerNorm",
               "ffn", "ffn_output", "full_layer_layer_norm"),
    "deberta": ("attention.self.query_proj", "attention.self.key_proj", "attention.self.value_proj",
                "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense", "output.dense",
                "output.LayerNorm"),
}
# of the encoder inside *ForMaskedLM
ENCODER_PREFIX = {"bert": "bert.", "albert": "albert.", "deberta": "deberta.", "modernbert": "model."}
# DeBERTa's MLM head is `cls.predictions.` (BERT's layout) with legacy=true, else `DEBERTA_HEAD_PREFIX`; ModernBERT's
# `head.` and `decoder` sit at the top of ModernBertForMaskedLM.
MLM_HEAD_PREFIX = {"bert": "cls.predictions.", "albert": "predictions.", "deberta": "cls.predictions.",
                   "modernbert": ""}
DEBERTA_HEAD_PREFIX = "lm_predictions.lm_head."


def encoder_layout(cfg: ModelConfig, family: str) -> list[tuple[str, tuple[str, ...], str]]:
    """(Hugging Face module name, path in the `BertEncoder` parameters, kind) of every encoder weight; kinds are
    those of `from_hf` / `to_hf`. Names are relative to the encoder (no `bert.` / `albert.` prefix)."""
    if family == "modernbert":
        return modernbert_layout(cfg)
    layout = [("embeddings.word_embeddings", ("token_embed",), "embedding"),
              ("embeddings.token_type_embeddings", ("type_embed",), "embedding"),
              ("embeddings.position_embeddings", ("encoder", "position"), "embedding"),
              ("embeddings.LayerNorm", ("encoder", "embed_norm"), "norm")]
    if family == "deberta":  # relative embeddings instead of absolute ones; token types only where configured
        layout = [entry for entry in layout[:2] if entry[1] != ("type_embed",) or cfg.position.segment == "input"]
        layout += [("embeddings.LayerNorm", ("encoder", "embed_norm"), "norm"),
                   ("encoder.rel_embeddings.weight", ("encoder", "position", "embedding"), "vector"),
                   ("encoder.LayerNorm", ("encoder", "position", "norm"), "norm")]
    if family == "albert":
        layout.append(("encoder.embedding_hidden_mapping_in", ("encoder", "embed_projection"), "linear"))
        layers = [("encoder.albert_layer_groups.0.albert_layers.0.", "layer_shared")]
    else:
        layers = [(f"encoder.layer.{i}.", f"layer_{i}") for i in range(cfg.num_layers)]
    for prefix, name in layers:
        q, k, v, o, attn_norm, wi, wo, mlp_norm = (prefix + n for n in _LAYER_NAMES[family])
        path = ("encoder", name)
        layout += [(q, path + ("self_attention", "query"), "heads_in"),
                   (k, path + ("self_attention", "key"), "heads_in"),
                   (v, path + ("self_attention", "value"), "heads_in"),
                   (o, path + ("self_attention", "out"), "heads_out"),
                   (attn_norm, path + ("self_attention_norm",), "norm"),
                   (wi, path + ("mlp", "wi"), "linear"), (wo, path + ("mlp", "wo"), "linear"),
                   (mlp_norm, path + ("mlp_norm",), "norm")]
    return layout


def modernbert_layout(cfg: ModelConfig) -> list[tuple[str, tuple[str, ...], str]]:
    """`encoder_layout` of ModernBERT: token embeddings and their norm, each layer's attention norm (none in layer
    0), fused Wqkv (kind "qkv": the whole self_attention subtree but `out`), Wo, MLP norm, fused Wi (kind "gated":
    [2 m, d] -> [d, 2, m], input half first, gate half second), Wo, and the final norm."""
    layout = [("embeddings.tok_embeddings", ("token_embed",), "embedding"),
              ("embeddings.norm", ("encoder", "embed_norm"), "norm")]
    for i in range(cfg.num_layers):
        prefix, path = f"layers.{i}.", ("encoder", f"layer_{i}")
        if cfg.has_attention_norm(i):
            layout.append((prefix + "attn_norm", path + ("self_attention_norm",), "norm"))
        layout += [(prefix + "attn.Wqkv", path + ("self_attention",), "qkv"),
                   (prefix + "attn.Wo", path + ("self_attention", "out"), "heads_out"),
                   (prefix + "mlp_norm", path + ("mlp_norm",), "norm"),
                   (prefix + "mlp.Wi", path + ("mlp", "wi"), "gated"),
                   (prefix + "mlp.Wo", path + ("mlp", "wo"), "linear")]
    return layout + [("final_norm", ("encoder", "final_norm"), "norm")]


def mlm_head_layout(cfg: ModelConfig, family: str) -> list[tuple[str, tuple[str, ...], str]]:
    """(name under MLM_HEAD_PREFIX, path in the `BertForMaskedLM` parameters, kind) of the MLM head's weights.
    `decoder` exists only with tie_embeddings off (tie_word_embeddings=false). Family "deberta_lm_head": DeBERTa's
    head under DEBERTA_HEAD_PREFIX (legacy=false), tied to the input embeddings."""
    if family == "modernbert":  # a tied decoder's bias is jaxpos's output bias (zeros where decoder_bias is off)
        layout = [("head.dense", ("head_dense",), "linear"), ("head.norm", ("head_norm",), "norm")]
        return layout + ([("decoder.bias", ("output_bias",), "output_bias")] if cfg.tie_embeddings else
                         [("decoder", ("decoder",), "decoder")])
    flat = family in ("albert", "deberta_lm_head")
    dense, norm = ("dense", "LayerNorm") if flat else ("transform.dense", "transform.LayerNorm")
    layout = [(dense, ("head_dense",), "linear"), (norm, ("head_norm",), "norm")]
    # An untied decoder holds its bias (BERT's `bias` is the same tensor as decoder.bias)
    return layout + ([("bias", ("output_bias",), "vector")] if cfg.tie_embeddings else
                     [("decoder", ("decoder",), "decoder")])


def _optional(get, key: str, *fallbacks: str, default=None):
    """`get(key, *fallbacks)`, or `default` where the checkpoint has none of them (a module without a bias)."""
    try:
        return get(key, *fallbacks)
    except KeyError:
        return default


def from_hf(get, name: str, kind: str, cfg: ModelConfig | None):
    """The jaxpos parameters of one Hugging Face module. `get(key, *fallbacks)` returns a tensor as numpy. Biases
    are read where `cfg` has them (model.use_bias for dense layers, model.norm_bias for LayerNorms; every one
    without a cfg)."""
    dense_bias = cfg is None or cfg.use_bias
    if kind == "embedding":  # [N, E] both sides
        return {"embedding": get(f"{name}.weight")}
    if kind == "norm":
        scale = {"scale": get(f"{name}.weight")}
        return {**scale, "bias": get(f"{name}.bias")} if cfg is None or cfg.norm_bias else scale
    if kind == "vector":
        return get(name)
    if kind == "output_bias":  # ModernBERT's decoder bias; with decoder_bias off the output has none: zeros
        return _optional(get, name, default=np.zeros(cfg.vocab_size, np.float32))
    weight = get(f"{name}.weight")  # torch Linear [out, in]
    if kind == "decoder":  # transformers < 5 shares decoder.bias with the head's `bias` and may save only the latter
        bias = _optional(get, f"{name}.bias", "bias", default=np.zeros(weight.shape[0], np.float32))
        return {"kernel": weight.T, "bias": bias}
    bias = get(f"{name}.bias") if dense_bias else None
    if kind == "qkv":  # ModernBERT's Wqkv [3 H Dh, d] -> query, key, value [d, H, Dh] (of the self_attention subtree)
        kernels = weight.T.reshape(cfg.d_model, 3, cfg.num_heads, cfg.head_dim)
        biases = bias.reshape(3, cfg.num_heads, cfg.head_dim) if dense_bias else None
        return {part: _dense(kernels[:, i], None if biases is None else biases[i])
                for i, part in enumerate(("query", "key", "value"))}
    if kind == "gated":  # Wi [2 m, d] -> [d, 2, m]: the activated half [:, 0], the gate [:, 1]
        return _dense(weight.T.reshape(weight.shape[1], 2, -1), None if bias is None else bias.reshape(2, -1))
    if kind == "heads_in":  # query/key/value DenseGeneral: [d, H, Dh]
        return _dense(weight.T.reshape(cfg.d_model, cfg.num_heads, cfg.head_dim),
                      None if bias is None else bias.reshape(cfg.num_heads, cfg.head_dim))
    if kind == "heads_out":  # [H, Dh, d]
        return _dense(weight.T.reshape(cfg.num_heads, cfg.head_dim, cfg.d_model), bias)
    return _dense(weight.T, bias)  # linear: [in, out]


def _dense(kernel: np.ndarray, bias: np.ndarray | None) -> dict:
    return {"kernel": kernel} if bias is None else {"kernel": kernel, "bias": bias}


def to_hf(value, name: str, kind: str) -> dict[str, np.ndarray]:
    """The inverse of `from_hf`: Hugging Face tensors {full name: array} of one module's jaxpos parameters."""
    if kind == "embedding":
        return {f"{name}.weight": value["embedding"]}
    if kind == "norm":
        return {f"{name}.weight": value["scale"], **({f"{name}.bias": value["bias"]} if "bias" in value else {})}
    if kind in ("vector", "output_bias"):
        return {name: value}
    if kind == "qkv":  # [d, H, Dh] x 3 -> [3 H Dh, d]
        parts = [value[part] for part in ("query", "key", "value")]
        out = {f"{name}.weight": np.concatenate([p["kernel"].reshape(p["kernel"].shape[0], -1) for p in parts], 1).T}
        if "bias" in parts[0]:
            out[f"{name}.bias"] = np.concatenate([p["bias"].reshape(-1) for p in parts])
        return out
    kernel, bias = value["kernel"], value.get("bias")
    if kind in ("gated", "heads_in"):  # [d, 2, m] -> [2 m, d]; [d, H, Dh] -> [H*Dh, d]
        kernel, bias = kernel.reshape(kernel.shape[0], -1), None if bias is None else bias.reshape(-1)
    elif kind == "heads_out":  # [H, Dh, d] -> [d, H*Dh]
        kernel = kernel.reshape(-1, kernel.shape[-1])
    return {f"{name}.weight": kernel.T, **({} if bias is None else {f"{name}.bias": bias})}


def _nested(entries) -> dict:
    """{path tuple: value} -> nested dict."""
    tree: dict = {}
    for path, value in entries:
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return tree


def _family(state) -> str:
    if any("albert_layer_groups" in k for k in state):
        return "albert"
    if any(".attn.Wqkv." in k for k in state):
        return "modernbert"
    return "deberta" if any(k.endswith("encoder.rel_embeddings.weight") for k in state) else "bert"


def _encoder_weights(state: Mapping[str, Any]) -> tuple[str, _Weights]:
    """The family and the encoder's weights (a leading `bert.`/`albert.` of a model with heads is detected)."""
    family = _family(state)
    prefix = ENCODER_PREFIX[family] if any(k.startswith(ENCODER_PREFIX[family]) for k in state) else ""
    return family, _Weights(state, prefix)


def bert_encoder_params(state: Mapping[str, Any], cfg: ModelConfig) -> dict:
    """Parameters of a jaxpos `BertEncoder` from a Hugging Face BERT, ALBERT, DeBERTa-v2/v3 or ModernBERT state
    dict (`BertModel`, `BertForMaskedLM`, `AlbertModel`, `AlbertForMaskedLM`, `DebertaV2Model`, `ModernBertModel`,
    ...)."""
    family, w = _encoder_weights(state)
    return _nested((path, from_hf(w, name, kind, cfg)) for name, path, kind in encoder_layout(cfg, family))


def bert_mlm_params(state: Mapping[str, Any], cfg: ModelConfig) -> dict:
    """Parameters of a jaxpos `BertForMaskedLM` from a Hugging Face `BertForMaskedLM`/`BertForPreTraining`,
    `AlbertForMaskedLM`, `DebertaV2ForMaskedLM` (either head layout) or `ModernBertForMaskedLM`; with
    `cfg.tie_embeddings` off
    (tie_word_embeddings=false) the checkpoint's own decoder [V, E] becomes `decoder` {"kernel": [E, V],
    "bias": [V]}."""
    family = _family(state)
    prefix = MLM_HEAD_PREFIX[family]
    if family == "deberta" and any(k.startswith(DEBERTA_HEAD_PREFIX) for k in state):
        family, prefix = "deberta_lm_head", DEBERTA_HEAD_PREFIX
    w = _Weights(state, prefix)
    params = _nested((path, from_hf(w, name, kind, cfg)) for name, path, kind in mlm_head_layout(cfg, family))
    return {"bert": bert_encoder_params(state, cfg), **params}


def bert_pooler_params(state: Mapping[str, Any]) -> dict | None:
    """The pooler of a BERT or ALBERT state dict as a flax Dense {"kernel": [d, d], "bias": [d]}
    (pooled = tanh(hidden[:, 0] @ kernel + bias)), or None when the checkpoint has none (e.g. *ForMaskedLM) or it
    is DeBERTa's ContextPooler (its activation is pooler_hidden_act, not tanh: a classifier starts a new one) or
    ModernBERT's classifier head (dense, activation, norm)."""
    family, w = _encoder_weights(state)
    if family in ("deberta", "modernbert"):
        return None
    key = "pooler" if family == "albert" else "pooler.dense"
    return from_hf(w, key, "linear", None) if f"{key}.weight" in w else None


def hf_pooler_params(path: str) -> dict | None:
    """`bert_pooler_params` of a local Hugging Face folder (see `load_hf_checkpoint`)."""
    return bert_pooler_params(load_hf_checkpoint(path)[1])


def folder_config(path: str, hf_config: Mapping[str, Any]) -> ModelConfig:
    """`config_from_hf` of the folder PATH's config.json, a field it lacks or cannot express a one-line ValueError
    naming the file."""
    try:
        return config_from_hf(hf_config)
    except (KeyError, ValueError) as err:
        raise ValueError(f"{os.path.join(path, 'config.json')}: "
                         f"{err if not isinstance(err, KeyError) else f'missing field {err}'}") from None


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
        state = safetensors.numpy.load_file(safetensors_path)
    elif os.path.exists(torch_path):
        state = {k: _to_numpy(v) for k, v in _load_torch_tensors(torch_path).items()}
    else:
        raise FileNotFoundError(f"{path!r} has neither model.safetensors nor pytorch_model.bin; "
                                f"found: {sorted(os.listdir(path))}")
    return hf_config, {k: np.asarray(v, np.float32) for k, v in state.items()}


def _load_torch_tensors(path: str) -> dict:
    """The tensors of a `pytorch_model.bin`, unpickled with `weights_only=True` (as transformers loads them): a file
    holding anything but tensors and plain containers (a callable that would run on load) is refused in one line."""
    import pickle  # lazy: only pytorch_model.bin needs it, for the error it raises

    import torch  # lazy: torch costs ~2.3 s at import; only pytorch_model.bin needs it

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        first = (str(error).splitlines() or [""])[0][:160]
        raise ValueError(f"{path} holds more than tensors ({first}); jaxpos loads only tensors from a pickle, "
                         "never code: convert the checkpoint to model.safetensors") from None
    if not isinstance(state, Mapping):
        raise ValueError(f"{path} holds a {type(state).__name__}, not a state dict of tensors")
    return state
