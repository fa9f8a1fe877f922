"""Typed model configuration, converted from ml_collections ConfigDicts where it enters the model.

Configs on disk are ConfigDicts (overridable from the command line); the model code only sees these frozen
dataclasses, so a typo in a field name fails loudly at conversion time instead of being silently ignored. The
position block is the mechanism's tagged union (jaxpos/config/position.py); what a layer of the stack varies
(its window, whether it reads positions) is one plan of layers (`ModelConfig.plan`) that the shorthands fill.
Checks that need the layers above (a mechanism's own, the attention implementation's) are registered with
`register_model_check` and run whenever a ModelConfig is made.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping

from jaxpos.config.checks import ITEM_TYPES, check_count, check_number, typed
from jaxpos.config.position import SEGMENT_MODES, SHARING_MODES, PositionConfig, catalog

__all__ = ["FLOAT_DTYPES", "LayerPlan", "MLP_KINDS", "ModelConfig", "NOPE_LAYERS", "POOLINGS", "REMAT_POLICIES",
           "SAVED_NAMES", "SEGMENT_MODES", "SHARING_MODES", "model_config", "register_model_check"]

FLOAT_DTYPES = ("float32", "bfloat16", "float16", "float64")  # float64: exact analysis (needs jax_enable_x64)
# model.nope_layers: which layers of a stack with local layers drop the positional mechanism (NoPE): none | global
# (Command A / R7B, RNoPE-SWA: local layers with RoPE, global layers without) | local
NOPE_LAYERS = ("none", "global", "local")

_MODEL_CHECKS: list[Callable[[Any], None]] = []


def register_model_check(check: Callable[[Any], None]) -> Callable[[Any], None]:
    """Adds `check(model_config)` (raises a one-line ValueError) to the checks every ModelConfig runs when made;
    the layers above config register theirs (a mechanism's options against the model, the attention
    implementation's name). Returns `check`."""
    if check not in _MODEL_CHECKS:
        _MODEL_CHECKS.append(check)
    return check


@dataclasses.dataclass(frozen=True)
class LayerPlan:
    """What one layer of a stack varies: its attention window, whether it reads the positional mechanism, and
    whether it normalises its attention input."""

    # Local attention: queries see keys |j - i| <= window // 2 (ModernBERT's local_attention = 128: 129 keys);
    # None: every key
    window: int | None = None
    positions: bool = True  # False: no positional term in this layer (NoPE); input positions are the stack's
    attention_norm: bool = True  # False: a pre-LN layer's attention reads x as it comes (ModernBERT's first layer)

    def describe(self) -> str:
        """"global", "local 128", with "NoPE" and "no attention norm" where they apply."""
        parts = ["global" if self.window is None else f"local {self.window}"]
        parts += [] if self.positions else ["NoPE"]
        parts += [] if self.attention_norm else ["no attention norm"]
        return ", ".join(parts)


# model.remat: what a layer keeps for the backward pass. none: everything (no recomputation); full: only its input
# (O(L·B·T·d) memory, one more forward pass of compute); save_dots: the outputs of its matrix products without a
# batch dimension (jax.checkpoint_policies.dots_with_no_batch_dims_saveable); save_projections: the tensors named
# in the layer (checkpoint_name): the query, key and value projections and the MLP's input.
REMAT_POLICIES = ("none", "full", "save_dots", "save_projections")
SAVED_NAMES = ("query", "key", "value", "mlp_input")  # the names save_projections keeps


POOLINGS = ("cls", "mean", "max")
# model.mlp: plain: W2 act(W1 x) (BERT); geglu: W2 (act(x W1) * x W1'), act a GELU (model.activation gelu or
# gelu_tanh); swiglu: the same with SiLU. The gated ones project once to 2 x mlp_dim (act half, then gate half).
MLP_KINDS = ("plain", "geglu", "swiglu")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 30522
    d_model: int = 768
    num_layers: int = 12
    num_decoder_layers: int = 0  # > 0 makes an encoder-decoder
    num_heads: int = 12
    mlp_dim: int = 3072
    max_length: int = 512  # n: the longest sequence that learned position tables support
    dropout: float = 0.1
    attention_dropout: float = 0.1
    activation: str = "gelu"  # gelu (exact, as BERT) | gelu_tanh | relu: the plain MLP's, geglu's, the MLM head's
    mlp: str = "plain"  # the feed-forward sublayer (MLP_KINDS): plain | geglu | swiglu
    layer_norm: str = "post"  # post (BERT, Vaswani) | pre
    layer_norm_eps: float = 1e-12
    use_bias: bool = True  # biases of the attention projections, the MLP and the MLM head's dense layer
    norm_bias: bool = True  # LayerNorm's shift; False: g * (x - mean) / sqrt(var + eps) (ModernBERT)
    # The plan of layers (`plan`): each layer's window, positions and attention norm. These four shorthands fill
    # it; `layers` gives it whole instead (a LayerPlan per encoder layer), with the shorthands at their defaults.
    # False: layer 0's self-attention reads its input as it comes, without its own LayerNorm (pre-LN stacks whose
    # embeddings are normalised once already, ModernBERT)
    first_layer_attention_norm: bool = True
    # Local attention: the local layers' queries see keys |j - i| <= local_window // 2 (ModernBERT's
    # local_attention: 128 gives 129 keys); None: every layer global
    local_window: int | None = None
    global_every: int = 3  # with local_window: layer l is global when l % global_every == 0 (ModernBERT: 3)
    # NoPE layers: layer l reads no positional term when (l + 1) % nope_every == 0 (0: none; SmolLM3 and Llama 4
    # drop it from every fourth layer), or, with local layers, every global (or local) layer (NOPE_LAYERS)
    nope_every: int = 0
    nope_layers: str = "none"
    layers: tuple = ()  # () or num_layers LayerPlan blocks: the plan given layer by layer
    # Attention options that compose with every mechanism (the 2025-26 wave):
    qk_norm: bool = False  # an RMSNorm of each head's queries and keys, a learned scale [D] each (Gemma 3, OLMo 2,
    # Qwen 3), before any rotation
    output_gate: bool = False  # σ(x W_g) elementwise on each head's output before the output projection (Qwen3-Next)
    attention_sinks: bool = False  # a learned sink logit per head in the softmax's denominator (gpt-oss)
    length_scaled_logits: bool = False  # Scalable-Softmax: logits × s_h log n, n the keys a query attends
    # Llama 4's query temperature in NoPE layers: q × (log(⌊(i + 1) / floor⌋ + 1) · scale + 1) at position i;
    # nope_temperature is the scale (0: off; Llama 4: 0.1), nope_temperature_floor the floor (Llama 4: 8192)
    nope_temperature: float = 0.0
    nope_temperature_floor: int = 8192
    type_vocab_size: int = 2
    embedding_dim: int | None = None  # ALBERT's factorised embeddings: E-wide embeddings projected to d_model
    share_layers: bool = False  # ALBERT: one set of layer parameters applied num_layers times
    # The stack's layers as one scan over parameters stacked on a leading "layers" axis: compile time flat in
    # depth. Checkpoints keep that layout; jaxpos.run.Run reads them as unscanned (analysis, export, fine-tuning).
    scan_layers: bool = False
    remat: str = "none"  # recompute each layer in the backward pass: none | full | save_dots | save_projections
    embed_layer_norm: bool = True  # LayerNorm on the summed input embeddings (BERT); off for Vaswani
    scale_embeddings: bool = False  # multiply token embeddings by sqrt(d_model) (Vaswani)
    causal: bool = False  # causal self-attention in the encoder stack (decoder-only use)
    tie_embeddings: bool = True  # MLM head / decoder output shares the input embedding matrix
    cross_attention_position: bool = False  # relative/positional bias in encoder-decoder attention too
    # auto (per call, the fastest measured path that can run it: jaxpos/attention/auto.py) or a registered
    # implementation (jaxpos/attention/registry.py): xla (einsum reference) | jax (jax.nn.dot_product_attention) |
    # cudnn | pallas (the Toeplitz-table kernel) | mosaic_gpu (its Hopper kernels, bf16/f16); what each can run is
    # checked when a run starts, and calls it cannot take at run time go to its record's fallbacks
    attention_impl: str = "auto"
    dtype: str = "float32"  # compute dtype; parameters stay param_dtype
    param_dtype: str = "float32"
    init_std: float = 0.02
    # Sequence classification: what the pooler reads. cls: the first token's last hidden state (BERT); mean / max:
    # each feature's mean or largest value over the row's tokens, which small models fine-tune more readily
    pooling: str = "cls"
    position: PositionConfig = dataclasses.field(default_factory=PositionConfig)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def position_range(self) -> int:
        """The positions a model's learned tables cover: position.randomized_max_length where set (its positions
        are drawn from [0, N)), else max_length."""
        return self.position.randomized_max_length or self.max_length

    @functools.cached_property
    def plan(self) -> tuple[LayerPlan, ...]:
        """The plan of the encoder stack's layers: `layers` as given, else the shorthands' (local_window and
        global_every, nope_every and nope_layers, first_layer_attention_norm)."""
        if self.layers:
            return tuple(self.layers)
        plan = []
        for layer in range(self.num_layers):
            local = self.local_window is not None and layer % self.global_every != 0
            nope = (self.nope_every and (layer + 1) % self.nope_every == 0) or \
                (self.nope_layers == "global" and self.local_window is not None and not local) or \
                (self.nope_layers == "local" and local)
            plan.append(LayerPlan(window=self.local_window if local else None, positions=not nope,
                                  attention_norm=self.first_layer_attention_norm or layer > 0))
        return tuple(plan)

    def has_attention_norm(self, layer: int) -> bool:
        """Whether layer `layer` (0-based) normalises its attention input (ModernBERT's first layer does not)."""
        return self.plan[layer].attention_norm

    def is_local(self, layer: int) -> bool:
        """Whether layer `layer` (0-based) of a stack attends within a window (else to every key)."""
        return self.plan[layer].window is not None

    @property
    def has_local_layers(self) -> bool:
        return any(layer.window is not None for layer in self.plan)

    @property
    def scan_group(self) -> tuple[int, int]:
        """(start, size) of a scanned stack: layers 0..start-1 run before the scan (a first layer without its
        attention LayerNorm), then the scan steps over groups of `size` consecutive layers, the plan's period from
        `start` (each group repeats one static pattern of windows and positions), and the layers left over after
        the last whole group run after it."""
        plan = self.plan
        start = 0 if plan[0].attention_norm or len(plan) == 1 else 1
        rest = plan[start:]
        size = next(p for p in range(1, len(rest) + 1)
                    if all(rest[i] == rest[i + p] for i in range(len(rest) - p)))
        return start, size

    @property
    def embed_width(self) -> int:
        """Width of token and input-position embeddings (E for factorised embeddings, else d_model)."""
        return self.embedding_dim or self.d_model

    def to_dict(self) -> dict:
        """The block as config files and config.json hold it (the position block's tagged union in the user's
        format)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def __post_init__(self):
        for name, least in (("vocab_size", 1), ("d_model", 1), ("num_layers", 1), ("num_decoder_layers", 0),
                            ("num_heads", 1), ("mlp_dim", 1), ("max_length", 1), ("type_vocab_size", 1)):
            check_count(name, getattr(self, name), least)
        check_count("embedding_dim", self.embedding_dim, 1, optional=True)
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"model.remat={self.remat!r}; choose one of {', '.join(REMAT_POLICIES)}")
        if self.scan_layers and self.share_layers:
            raise ValueError("model.scan_layers stacks each layer's own parameters; with share_layers every layer "
                             "uses one set, so there is nothing to stack: set scan_layers=False")
        check_number("layer_norm_eps", self.layer_norm_eps, 0.0, open_low=True)
        check_number("init_std", self.init_std, 0.0, open_low=True)
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in FLOAT_DTYPES:
                raise ValueError(f"{name}={getattr(self, name)!r}; choose one of {', '.join(FLOAT_DTYPES)}")
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}")
        if self.layer_norm not in ("post", "pre"):
            raise ValueError(f"layer_norm={self.layer_norm!r}; choose post or pre")
        if not isinstance(self.attention_impl, str):
            raise ValueError(f"attention_impl={self.attention_impl!r} must name an attention implementation")
        for name in ("dropout", "attention_dropout"):
            check_number(name, getattr(self, name), 0.0, 1.0)
        if self.activation not in ("gelu", "gelu_tanh", "relu"):
            raise ValueError(f"activation={self.activation!r}; choose gelu, gelu_tanh or relu")
        self._check_block()
        self._check_plan()
        self._check_attention_options()
        if self.pooling not in POOLINGS:
            raise ValueError(f"model.pooling={self.pooling!r}; choose {', '.join(POOLINGS)}")
        randomized = self.position.randomized_max_length
        if randomized is not None and randomized <= self.max_length:
            raise ValueError(f"position.randomized_max_length={randomized} must exceed model.max_length="
                             f"{self.max_length}: positions are drawn from a range wider than any sequence")
        if randomized is not None and (self.causal or self.num_decoder_layers):
            raise ValueError("position.randomized_max_length is implemented for encoder (bidirectional) stacks: "
                             "a causal stack or the decoder of an encoder-decoder decodes step by step at fixed "
                             "positions")
        if randomized is not None and self.has_local_layers:
            raise ValueError("model.local_window counts keys by their distance in the row; randomized positions "
                             "scatter a row over a wider range: set position.randomized_max_length=None")
        catalog().check_model(self)
        for check in _MODEL_CHECKS:
            check(self)

    def _check_block(self) -> None:
        """The modern block's options: the MLP kind, biases and norms."""
        if self.mlp not in MLP_KINDS:
            raise ValueError(f"model.mlp={self.mlp!r}; choose {', '.join(MLP_KINDS)}")
        if self.mlp == "geglu" and self.activation not in ("gelu", "gelu_tanh"):
            raise ValueError(f"model.mlp='geglu' gates with a GELU: set model.activation to gelu or gelu_tanh, not "
                             f"{self.activation!r} (or model.mlp='plain')")
        for name in ("use_bias", "norm_bias", "first_layer_attention_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"model.{name}={getattr(self, name)!r} must be true or false")

    def _check_attention_options(self) -> None:
        """The attention options that compose with every mechanism."""
        for name in ("qk_norm", "output_gate", "attention_sinks", "length_scaled_logits"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"model.{name}={getattr(self, name)!r} must be true or false")
        check_number("model.nope_temperature", self.nope_temperature, 0.0)
        check_count("model.nope_temperature_floor", self.nope_temperature_floor, 1)
        if self.nope_temperature and all(layer.positions for layer in self.plan):
            raise ValueError("model.nope_temperature scales the queries of NoPE layers, and this plan has none: set "
                             "model.nope_every, model.nope_layers or model.layers")

    def _check_plan(self) -> None:
        """The plan of layers and the shorthands that fill it."""
        check_count("model.local_window", self.local_window, 2, optional=True)
        check_count("model.global_every", self.global_every, 1)
        check_count("model.nope_every", self.nope_every, 0)
        if self.nope_layers not in NOPE_LAYERS:
            raise ValueError(f"model.nope_layers={self.nope_layers!r}; choose {', '.join(NOPE_LAYERS)}")
        if self.nope_layers != "none" and self.local_window is None:
            raise ValueError(f"model.nope_layers={self.nope_layers!r} picks layers by their window: it needs "
                             "model.local_window (or give model.layers)")
        if self.local_window is not None and self.global_every < 2:
            raise ValueError(f"model.global_every={self.global_every} makes every layer global (layer l is global "
                             "when l % global_every == 0): set it >= 2, or model.local_window=None")
        if self.layers:
            shorthands = [name for name, default in (("local_window", None), ("nope_every", 0),
                                                     ("nope_layers", "none"), ("first_layer_attention_norm", True))
                          if getattr(self, name) != default]
            if shorthands:
                raise ValueError(f"model.layers gives the plan layer by layer; model.{shorthands[0]} would fill it "
                                 "too: set one or the other")
            if len(self.layers) != self.num_layers:
                raise ValueError(f"model.layers has {len(self.layers)} layers, model.num_layers={self.num_layers}")
            for i, layer in enumerate(self.layers):
                if not isinstance(layer, LayerPlan):
                    raise ValueError(f"model.layers[{i}]={layer!r} must be a block of window, positions and "
                                     "attention_norm")
                check_count(f"model.layers[{i}].window", layer.window, 2, optional=True)
                for name in ("positions", "attention_norm"):
                    if not isinstance(getattr(layer, name), bool):
                        raise ValueError(f"model.layers[{i}].{name}={getattr(layer, name)!r} must be true or false")
        plan = self.plan
        if not plan[0].attention_norm and self.layer_norm != "pre":
            raise ValueError("model.first_layer_attention_norm=False drops the LayerNorm before layer 0's attention, "
                             "which only pre-LN layers have: set model.layer_norm='pre'")
        if any(not layer.attention_norm for layer in plan[1:]):
            raise ValueError("only layer 0 may go without its attention norm (its input is the normalised "
                             "embeddings)")
        given = "layers" if self.layers else None  # the field that made the plan vary, as the messages name it
        varied = [given or what for what, on in (
            ("local_window", self.has_local_layers), ("nope_every" if self.nope_every else "nope_layers",
                                                      any(not layer.positions for layer in plan)),
            ("first_layer_attention_norm=False", not plan[0].attention_norm)) if on]
        if varied and self.num_decoder_layers:
            raise ValueError(f"model.{varied[0]} applies to encoder stacks; an encoder-decoder "
                             f"(num_decoder_layers={self.num_decoder_layers}) takes neither")
        if varied and self.share_layers:
            raise ValueError(f"model.{varied[0]} makes layers differ, and share_layers applies one layer to every "
                             "depth: set share_layers=False")


ITEM_TYPES[ModelConfig] = {"layers": LayerPlan}


def model_config(cfg: Mapping[str, Any] | ModelConfig, saved: bool = False) -> ModelConfig:
    """ModelConfig from a (nested) ConfigDict or dict such as `config.model` (`saved`: a run's own config.json,
    read leniently where older jaxpos saved more: `PositionConfig.from_values`)."""
    return typed(ModelConfig, cfg, "model", saved)
