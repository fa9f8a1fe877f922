"""Typed model configuration, converted from ml_collections ConfigDicts where it enters the model.

Configs on disk are ConfigDicts (overridable from the command line); the model code only sees these frozen
dataclasses, so a typo in a field name fails loudly at conversion time instead of being silently ignored.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from jaxpos.config.attention import ATTENTION_IMPLS
from jaxpos.config.checks import check_count, check_number, typed
from jaxpos.config.mechanisms import MECHANISMS

SEGMENT_MODES = ("input", "per_head", "none")
# none: a set per head and layer | head: one set per layer, shared by that layer's heads |
# layer: one set per head, shared by all layers of the stack
SHARING_MODES = ("none", "head", "layer")
ATTENUATED_FORMS = ("fixed", "matrix", "offset", "abs_offset")
FLOAT_DTYPES = ("float32", "bfloat16", "float16", "float64")  # float64: exact analysis (needs jax_enable_x64)


@dataclasses.dataclass(frozen=True)
class TisaConfig:
    num_kernels: int = 5  # S radial basis functions per head
    sharing: str = "none"
    input_positions: bool = False  # TISA use (a): keep learned input position embeddings as well


@dataclasses.dataclass(frozen=True)
class DietRelConfig:
    sharing: str = "none"
    max_distance: int | None = None  # clip |j - i| to this; None = no clipping (paper), table covers max_length


@dataclasses.dataclass(frozen=True)
class DietAbsConfig:
    rank: int | None = None  # d_p; None = head dim D
    sharing: str = "layer"  # layer-wise sharing is the paper's recommendation
    fold: bool = True  # fold P_Q P_K^T into the q.k dot product instead of materialising [H, T, S]
    linformer_k: int | None = None  # project keys/values to k positions (DIET section 3.4)


def t5_exact_buckets(num_buckets: int, bidirectional: bool) -> int:
    """Offsets 0..count-1 (per direction) that get a T5 bucket each: num_buckets/4 bidirectional, /2 causal."""
    return num_buckets // 4 if bidirectional else num_buckets // 2


@dataclasses.dataclass(frozen=True)
class T5Config:
    num_buckets: int = 32  # bidirectional stacks: even and >= 4 (half per direction); causal stacks: >= 2
    max_distance: int = 128  # log-spaced buckets reach it; must exceed the exact-bucket count (t5_exact_buckets)

    def check(self, bidirectional: bool, stack: str) -> None:
        """Raises a ValueError unless the bucket function is well defined for a stack of this direction."""
        where = f"the {'bidirectional' if bidirectional else 'causal'} {stack}"
        if self.num_buckets < (4 if bidirectional else 2) or (bidirectional and self.num_buckets % 2):
            need = "even and >= 4 (half the buckets per direction)" if bidirectional else ">= 2"
            raise ValueError(f"position.t5.num_buckets={self.num_buckets} must be {need} for {where}")
        exact = t5_exact_buckets(self.num_buckets, bidirectional)
        if self.max_distance <= exact:
            raise ValueError(
                f"position.t5.max_distance={self.max_distance} must be greater than {exact}, the number of exact "
                f"buckets (num_buckets/{4 if bidirectional else 2}) of {where}: the log-spaced buckets divide by "
                f"log(max_distance/{exact}), which is 0 (NaN) or negative (buckets of the other direction)")


@dataclasses.dataclass(frozen=True)
class ShawConfig:
    clip: int = 16  # k: offsets are clipped to [-k, k]
    values: bool = True  # also add r^V to the values


# RoPE's length-extension rules (jaxpos/positions/rope.py has the formulas): none | linear (positions / factor) |
# ntk (static NTK-aware base) | dynamic (NTK at the pass's length) | yarn | llama3
ROPE_SCALINGS = ("none", "linear", "ntk", "dynamic", "yarn", "llama3")
# The rope fields that change no parameter, so a trained run may be evaluated under other values of them
ROPE_RULE_FIELDS = ("scaling", "factor", "original_max_length", "beta_fast", "beta_slow", "low_freq_factor",
                    "high_freq_factor")


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    base: float = 10_000.0
    scaling: str = "none"  # a length-extension rule of ROPE_SCALINGS
    factor: float = 1.0  # s: how many times L0 the rule stretches the positions to (>= 1)
    original_max_length: int | None = None  # L0 of dynamic, yarn and llama3; None: model.max_length
    beta_fast: float = 32.0  # yarn: pairs turning more than beta_fast times over L0 keep their frequency
    beta_slow: float = 1.0  # yarn: pairs turning less than beta_slow times over L0 are divided by the factor
    low_freq_factor: float = 1.0  # llama3: wavelengths above L0 / low_freq_factor are divided by the factor
    high_freq_factor: float = 4.0  # llama3: wavelengths below L0 / high_freq_factor keep their frequency
    # p-RoPE: the share of each head's channel pairs rotated, the highest frequencies; the pairs of the lowest
    # frequencies stay unrotated (1.0: every pair, plain RoPE)
    fraction: float = 1.0
    # The base of local layers (model.local_window), ModernBERT's 10,000 beside a global 160,000; None: `base`
    local_base: float | None = None

    def check(self) -> None:
        """Raises a one-line ValueError for an unknown rule or an option out of range."""
        if self.scaling not in ROPE_SCALINGS:
            raise ValueError(f"position.rope.scaling={self.scaling!r}; choose one of {', '.join(ROPE_SCALINGS)}")
        check_number("position.rope.base", self.base, 0.0, open_low=True)
        if self.local_base is not None:
            check_number("position.rope.local_base", self.local_base, 0.0, open_low=True)
        check_number("position.rope.factor", self.factor, 1.0)
        check_count("position.rope.original_max_length", self.original_max_length, 1, optional=True)
        check_number("position.rope.fraction", self.fraction, 0.0, 1.0, open_low=True, open_high=False)
        check_number("position.rope.beta_slow", self.beta_slow, 0.0, open_low=True)
        check_number("position.rope.low_freq_factor", self.low_freq_factor, 0.0, open_low=True)
        if not self.beta_fast > self.beta_slow:
            raise ValueError(f"position.rope.beta_fast={self.beta_fast!r} must be greater than beta_slow="
                             f"{self.beta_slow!r} (yarn's ramp runs from beta_fast rotations down to beta_slow)")
        if not self.low_freq_factor < self.high_freq_factor:
            raise ValueError(f"position.rope.low_freq_factor={self.low_freq_factor!r} must be less than "
                             f"high_freq_factor={self.high_freq_factor!r} (llama3's bands: wavelengths above "
                             "L0 / low_freq_factor are scaled, below L0 / high_freq_factor kept)")

    def rule(self, original_length: int) -> str:
        """The length rule and p-RoPE in a few words, e.g. "yarn ×4, L₀ 512", "p-RoPE 0.5" or "none"
        (`original_length`: L₀, named where the rule reads it)."""
        parts = []
        if self.scaling in ("linear", "ntk"):
            parts.append(f"{self.scaling} ×{self.factor:g}")
        elif self.scaling != "none":
            parts.append(f"{self.scaling} ×{self.factor:g}, L₀ {original_length}")
        if self.fraction < 1:
            parts.append(f"p-RoPE {self.fraction:g}")
        return ", ".join(parts) or "none"


@dataclasses.dataclass(frozen=True)
class TupeConfig:
    # Ke et al. reset the positional correlations of [CLS] (position 0 of each sequence) to two learned scalars
    # per head: theta_1 from [CLS] to every key, theta_2 from every other query to [CLS].
    untie_cls: bool = True


@dataclasses.dataclass(frozen=True)
class AttenuatedConfig:
    w: float = 0.05  # locality: larger w = more local
    s: float = 1.0  # symmetry: weight of keys after the query relative to keys before it
    # fixed | matrix (a learnable n x n matrix, Chen A.2) | offset (a learnable table over offsets j - i) |
    # abs_offset (a learnable table over |j - i|, as the authors' code; needs s = 1). Learned forms start at the
    # fixed form: the tables from its centre row.
    form: str = "fixed"
    sharing: str = "none"  # none = BERT-A* (per head); head = BERT-A*-s (shared by the heads of a layer)


@dataclasses.dataclass(frozen=True)
class KerpleConfig:
    sharing: str = "none"  # none: r1, r2 per layer and head (KERPLE); head; layer


@dataclasses.dataclass(frozen=True)
class FireConfig:
    hidden: int = 32  # the MLP's hidden width (FIRE: 32)
    c: float = 0.1  # initial c of psi(x) = log(c x + 1), learned (kept above 1e-3)
    threshold: float = 0.0  # initial L of psi(max(L, i)), learned; 0: model.max_length, the training length


@dataclasses.dataclass(frozen=True)
class CopeConfig:
    # npos_max: contextual positions are counts clamped to max_position - 1, each with a learned embedding per
    # direction; 0: model.max_length + 1 (the authors' default, block size + 1: a count can reach the length)
    max_position: int = 0
    # True: (q.k + q.e[p]) / sqrt(D), the authors' model by default; False: q.k / sqrt(D) + q.e[p], the paper's
    # listing (the authors' --cope-nodiv)
    divide: bool = True

    def positions(self, max_length: int) -> int:
        """npos_max for a model of `max_length` tokens."""
        return self.max_position or max_length + 1


@dataclasses.dataclass(frozen=True)
class DebertaConfig:
    # DeBERTa-v3-base's values. position_buckets: log-bucketed offsets (transformers' make_log_bucket_position),
    # 2 * position_buckets table rows; 0: offsets clamped to +-max_relative_positions, 2 * max_relative_positions
    # rows (transformers: position_buckets <= 0; its max_relative_positions < 1 means max_position_embeddings).
    position_buckets: int = 256
    max_relative_positions: int = 512  # with buckets: the offset at which the log buckets reach the table's end

    def check(self) -> None:
        """Raises a ValueError unless the bucket function is well defined (no log(0) or division by log(1))."""
        check_count("position.deberta.max_relative_positions", self.max_relative_positions, 1)
        if self.position_buckets == 0:
            return
        if isinstance(self.position_buckets, bool) or not isinstance(self.position_buckets, int) \
                or self.position_buckets < 2:
            raise ValueError(f"position.deberta.position_buckets={self.position_buckets!r} must be 0 (no buckets) "
                             "or an integer >= 2")
        if self.max_relative_positions <= self.position_buckets // 2 + 1:
            raise ValueError(
                f"position.deberta.max_relative_positions={self.max_relative_positions} must be greater than "
                f"position_buckets/2 + 1 = {self.position_buckets // 2 + 1}: the log buckets divide by "
                f"log((max_relative_positions - 1) / (position_buckets/2)); or set position_buckets=0")


@dataclasses.dataclass(frozen=True)
class PositionConfig:
    kind: str = "absolute"
    segment: str = "input"  # input embeddings | per-head segment attention (DIET) | none
    num_segments: int = 2
    content_only: bool = False  # analysis switch: drop the positional logit terms
    position_only: bool = False  # analysis switch: drop the content term q.k
    tisa: TisaConfig = TisaConfig()
    diet_rel: DietRelConfig = DietRelConfig()
    diet_abs: DietAbsConfig = DietAbsConfig()
    t5: T5Config = T5Config()
    shaw: ShawConfig = ShawConfig()
    rope: RopeConfig = RopeConfig()
    tupe: TupeConfig = TupeConfig()
    attenuated: AttenuatedConfig = AttenuatedConfig()
    kerple: KerpleConfig = KerpleConfig()
    fire: FireConfig = FireConfig()
    # Randomized positions (Ruoss et al.): N > model.max_length; each forward pass places a row's T tokens at a
    # sorted sample of T distinct positions of [0, N), one sample for the whole batch (None: positions 0..T-1)
    randomized_max_length: int | None = None
    cope: CopeConfig = CopeConfig()
    deberta: DebertaConfig = DebertaConfig()

    def __post_init__(self):
        if self.kind not in MECHANISMS:
            raise ValueError(f"unknown position mechanism {self.kind!r}; choose one of {', '.join(MECHANISMS)}")
        if self.segment not in SEGMENT_MODES:
            raise ValueError(f"unknown segment mode {self.segment!r}; choose one of {SEGMENT_MODES}")
        if self.content_only and self.position_only:
            raise ValueError("content_only and position_only cannot both be set")
        mechanism = MECHANISMS[self.kind]
        if self.position_only and mechanism.input_only:
            raise ValueError(f"position_only needs a positional logit term; {self.kind!r} adds positions at the "
                             "input only")
        if self.position_only and mechanism.no_position_only_term:
            raise ValueError(f"position_only is not defined for {self.kind!r}: {mechanism.no_position_only_term}")
        for name in ("tisa", "diet_rel", "diet_abs", "attenuated", "kerple"):
            sharing = getattr(self, name).sharing
            if sharing not in SHARING_MODES:
                raise ValueError(f"position.{name}.sharing={sharing!r}; choose one of {SHARING_MODES}")
        if not isinstance(self.tupe.untie_cls, bool):
            raise ValueError(f"position.tupe.untie_cls={self.tupe.untie_cls!r} must be true or false")
        if self.attenuated.form not in ATTENUATED_FORMS:
            raise ValueError(f"position.attenuated.form={self.attenuated.form!r}; choose one of {ATTENUATED_FORMS}")
        check_count("position.fire.hidden", self.fire.hidden, 1)
        if not (self.fire.c > 0 and self.fire.threshold >= 0):
            raise ValueError(f"position.fire.c={self.fire.c} must be positive and position.fire.threshold="
                             f"{self.fire.threshold} at least 0 (0: model.max_length)")
        check_count("position.randomized_max_length", self.randomized_max_length, 2, optional=True)
        if self.randomized_max_length is not None and MECHANISMS[self.kind].no_randomized_positions:
            raise ValueError(f"position.randomized_max_length does not apply to {self.kind!r}: "
                             f"{MECHANISMS[self.kind].no_randomized_positions}")
        check_count("position.cope.max_position", self.cope.max_position, 0)
        if self.cope.max_position == 1:
            raise ValueError("position.cope.max_position=1 must be 0 (model.max_length + 1) or at least 2: with one "
                             "position every count reads the same embedding")
        if not isinstance(self.cope.divide, bool):
            raise ValueError(f"position.cope.divide={self.cope.divide!r} must be true or false")
        self.deberta.check()
        check_count("position.num_segments", self.num_segments, 1)
        check_count("position.tisa.num_kernels", self.tisa.num_kernels, 1)
        check_count("position.diet_rel.max_distance", self.diet_rel.max_distance, 1, optional=True)
        check_count("position.diet_abs.rank", self.diet_abs.rank, 1, optional=True)
        check_count("position.diet_abs.linformer_k", self.diet_abs.linformer_k, 1, optional=True)
        check_count("position.shaw.clip", self.shaw.clip, 1)
        self.rope.check()
        # w > 0 sets locality, s >= 0 symmetry (Chen et al. eq. 8)
        check_number("position.attenuated.w", self.attenuated.w, 0.0, open_low=True)
        check_number("position.attenuated.s", self.attenuated.s, 0.0)
        if self.attenuated.form == "abs_offset" and self.attenuated.s != 1.0:
            raise ValueError(f"position.attenuated.form='abs_offset' indexes by |j - i|, so it is symmetric and "
                             f"needs s=1 (got s={self.attenuated.s}); use form='offset' for s != 1")


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
    # False: layer 0's self-attention reads its input as it comes, without its own LayerNorm (pre-LN stacks whose
    # embeddings are normalised once already, ModernBERT)
    first_layer_attention_norm: bool = True
    # Local attention: the local layers' queries see keys |j - i| <= local_window // 2 (ModernBERT's
    # local_attention: 128 gives 129 keys); None: every layer global
    local_window: int | None = None
    global_every: int = 3  # with local_window: layer l is global when l % global_every == 0 (ModernBERT: 3)
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
    # auto (per call, the fastest measured path that can run it: jaxpos/attention/auto.py) or a record of
    # jaxpos/config/attention.py: xla (einsum reference) | jax (jax.nn.dot_product_attention) | cudnn | pallas
    # (the Toeplitz-table kernel) | mosaic_gpu (its Hopper kernels, bf16/f16); what each can run is checked when
    # a run starts, and calls it cannot take at run time go to its record's fallbacks
    attention_impl: str = "auto"
    dtype: str = "float32"  # compute dtype; parameters stay param_dtype
    param_dtype: str = "float32"
    init_std: float = 0.02
    # Sequence classification: what the pooler reads. cls: the first token's last hidden state (BERT); mean / max:
    # each feature's mean or largest value over the row's tokens, which small models fine-tune more readily
    pooling: str = "cls"
    position: PositionConfig = PositionConfig()

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def position_range(self) -> int:
        """The positions a model's learned tables cover: position.randomized_max_length where set (its positions
        are drawn from [0, N)), else max_length."""
        return self.position.randomized_max_length or self.max_length

    def has_attention_norm(self, layer: int) -> bool:
        """Whether layer `layer` (0-based) normalises its attention input (ModernBERT's first layer does not)."""
        return self.first_layer_attention_norm or layer > 0

    def is_local(self, layer: int) -> bool:
        """Whether layer `layer` (0-based) of a stack attends within `local_window` (else to every key)."""
        return self.local_window is not None and layer % self.global_every != 0

    @property
    def scan_group(self) -> tuple[int, int]:
        """(start, size) of a scanned stack: layers 0..start-1 run before the scan (a first layer without its
        attention LayerNorm), then the scan steps over groups of `size` consecutive layers (global_every with
        local layers, so that each group repeats one static pattern of local and global layers), and the layers
        left over after the last whole group run after it."""
        return (0 if self.first_layer_attention_norm else 1), (self.global_every if self.local_window else 1)

    @property
    def embed_width(self) -> int:
        """Width of token and input-position embeddings (E for factorised embeddings, else d_model)."""
        return self.embedding_dim or self.d_model

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
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(f"attention_impl={self.attention_impl!r}; choose {', '.join(ATTENTION_IMPLS)}")
        for name in ("dropout", "attention_dropout"):
            check_number(name, getattr(self, name), 0.0, 1.0)
        if self.activation not in ("gelu", "gelu_tanh", "relu"):
            raise ValueError(f"activation={self.activation!r}; choose gelu, gelu_tanh or relu")
        self._check_block()
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
        check = MECHANISMS[self.position.kind].check
        if check is not None:
            check(self)


    def _check_block(self) -> None:
        """The modern block's options: the MLP kind, the first layer's norm, local and global layers."""
        if self.mlp not in MLP_KINDS:
            raise ValueError(f"model.mlp={self.mlp!r}; choose {', '.join(MLP_KINDS)}")
        if self.mlp == "geglu" and self.activation not in ("gelu", "gelu_tanh"):
            raise ValueError(f"model.mlp='geglu' gates with a GELU: set model.activation to gelu or gelu_tanh, not "
                             f"{self.activation!r} (or model.mlp='plain')")
        for name in ("use_bias", "norm_bias", "first_layer_attention_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"model.{name}={getattr(self, name)!r} must be true or false")
        if not self.first_layer_attention_norm and self.layer_norm != "pre":
            raise ValueError("model.first_layer_attention_norm=False drops the LayerNorm before layer 0's attention, "
                             "which only pre-LN layers have: set model.layer_norm='pre'")
        check_count("model.local_window", self.local_window, 2, optional=True)
        check_count("model.global_every", self.global_every, 1)
        modern = [name for name, on in (("local_window", self.local_window is not None),
                                        ("first_layer_attention_norm=False", not self.first_layer_attention_norm))
                  if on]
        if modern and self.num_decoder_layers:
            raise ValueError(f"model.{modern[0]} applies to encoder stacks; an encoder-decoder "
                             f"(num_decoder_layers={self.num_decoder_layers}) takes neither")
        if modern and self.share_layers:
            raise ValueError(f"model.{modern[0]} makes layers differ, and share_layers applies one layer to every "
                             "depth: set share_layers=False")
        if self.local_window is None:
            return
        if self.global_every < 2:
            raise ValueError(f"model.global_every={self.global_every} makes every layer global (layer l is global "
                             "when l % global_every == 0): set it >= 2, or model.local_window=None")
        pcfg = self.position
        if pcfg.randomized_max_length is not None:
            raise ValueError("model.local_window counts keys by their distance in the row; randomized positions "
                             "scatter a row over a wider range: set position.randomized_max_length=None")
        if pcfg.kind == "diet_abs" and pcfg.diet_abs.linformer_k:
            raise ValueError("model.local_window masks keys around each query; Linformer "
                             "(position.diet_abs.linformer_k) projects them along the whole row first, so no key "
                             "keeps its place: set one or the other")


def model_config(cfg: Mapping[str, Any] | ModelConfig) -> ModelConfig:
    """ModelConfig from a (nested) ConfigDict or dict such as `config.model`."""
    return typed(ModelConfig, cfg, "model")


def position_config(values: Mapping[str, Any]) -> PositionConfig:
    """PositionConfig from a (nested) dict such as a `model.position` block; fields it leaves out keep defaults."""
    return typed(PositionConfig, values, "model.position")


def position_defaults() -> dict:
    """The position block as a plain nested dict (for ConfigDicts in configs/)."""
    return dataclasses.asdict(PositionConfig())
