"""The positional mechanisms by `model.position.kind`: one record each, holding what the rest of jaxpos asks of it.

Config validation, `jaxpos.positions.make_position`, the length errors, the position_only checks, the
reproduction's runs, the smoke table, the tests' variants and the README's table all read `MECHANISMS`. It lives
in the config layer, the lowest, so that a config with an unknown kind fails when it is converted; a mechanism's
module class is therefore named by its import path and imported only where a model is built. Traits that depend on
options are `When` rules over the position block. A new mechanism is a record here, its module under
jaxpos/positions/ and a row of the README's table (its options, if any, a block of `PositionConfig`); the tests
over `tests.helpers.VARIANTS` take it up from here.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from jaxpos.config.model import ModelConfig, PositionConfig

KERNEL_FORMS = ("table", "factors", "none")  # attention.auto's BIAS_FORMS that the kernels take (not "other")


@dataclasses.dataclass(frozen=True)
class When:
    """A trait that holds under some options only: `text` as the README and error messages say it."""

    text: str
    holds: Callable[[PositionConfig], bool]


@dataclasses.dataclass(frozen=True)
class Mechanism:
    """One positional mechanism and its traits; `bool | When` traits are read through `is_inductive` and
    `is_learned`."""

    kind: str  # the value of model.position.kind
    module: str  # "package.module:Class" of its PositionMechanism
    label: str  # short name in reports, for the default options
    description: str  # the term it adds, in one line (the README's "mechanism" column)
    inductive: bool | When  # works at any sequence length: no learned table over model.max_length positions
    learned: bool | When  # has learned positional parameters
    input_only: bool = False  # its positional signal, if any, enters with the input embeddings: no logit term
    no_position_only_term: str | None = None  # why position_only is undefined (positions act through q's content)
    # What reaches the attention kernels, in attention.auto's bias forms: "table" (Toeplitz), "factors" (low-rank,
    # folded into q and k) or "none" (no logit term; RoPE rotates q and k before attention); None: a term only the
    # xla path computes (dense matrices, Shaw vectors, Linformer projections). A function of the position block
    # where options decide.
    kernel_form: str | None | Callable[[PositionConfig], str | None] = None
    # In a causal stack its term depends on the query position as well as the offset (FIRE): a dense position-only
    # matrix there, whatever `kernel_form` says of a bidirectional stack.
    dense_when_causal: bool = False
    check: Callable[[ModelConfig], None] | None = None  # raises a ValueError for a model block it cannot run
    no_randomized_positions: str | None = None  # why position.randomized_max_length does not apply

    def is_inductive(self, pcfg: PositionConfig) -> bool:
        """Whether it works at any length under the position block `pcfg`."""
        return _holds(self.inductive, pcfg)

    def is_learned(self, pcfg: PositionConfig) -> bool:
        """Whether it has learned positional parameters under the position block `pcfg`."""
        return _holds(self.learned, pcfg)

    def kernel_form_for(self, pcfg: PositionConfig, causal: bool = False) -> str | None:
        """The bias form the attention kernels receive under the position block `pcfg` in a bidirectional or a
        `causal` stack (see `kernel_form`)."""
        if causal and self.dense_when_causal:
            return None
        return self.kernel_form(pcfg) if callable(self.kernel_form) else self.kernel_form


def _holds(trait: bool | When, pcfg: PositionConfig) -> bool:
    return trait.holds(pcfg) if isinstance(trait, When) else trait


def trait_text(trait: bool | When) -> str:
    """"yes", "no" or the rule of a trait, as the README's table says it (without its backticks)."""
    return trait.text if isinstance(trait, When) else ("yes" if trait else "no")


def rotated_pairs(head_dim: int, fraction: float) -> int:
    """How many of a head's D/2 channel pairs p-RoPE rotates: ⌊fraction·D/2⌋, as Hugging Face's `proportional`."""
    return int(fraction * head_dim // 2)


def _check_rope(cfg: ModelConfig) -> None:
    if cfg.head_dim % 2:
        raise ValueError(f"RoPE rotates channel pairs: it needs an even head dimension, got d_model / "
                         f"num_heads = {cfg.d_model} / {cfg.num_heads} = {cfg.head_dim}")
    fraction = cfg.position.rope.fraction
    if rotated_pairs(cfg.head_dim, fraction) < 1:
        raise ValueError(f"position.rope.fraction={fraction!r} rotates no channel pair of a head of {cfg.head_dim} "
                         f"dimensions: it needs at least 2 / {cfg.head_dim} = {2 / cfg.head_dim:g}")


def _check_t5(cfg: ModelConfig) -> None:
    stacks = [("stack", not cfg.causal)]  # every stack the model builds: (name, bidirectional)
    if cfg.num_decoder_layers:  # encoder-decoder: a bidirectional encoder and a causal decoder
        stacks = [("encoder", True), ("decoder", False)]
    for stack, bidirectional in stacks:
        cfg.position.t5.check(bidirectional, stack)


def _check_cope(cfg: ModelConfig) -> None:
    if cfg.cross_attention_position and cfg.num_decoder_layers:
        raise ValueError("cope counts the keys between a query and a key of its own sequence; cross-attention has "
                         "no such order: set model.cross_attention_position=False")


def _check_diet_abs(cfg: ModelConfig) -> None:
    if cfg.position.diet_abs.linformer_k and (cfg.causal or cfg.num_decoder_layers):
        raise ValueError("diet_abs with linformer_k mixes all key positions and cannot be causal (model.causal, or "
                         "the decoder of an encoder-decoder); use it in encoder (bidirectional) stacks only")
    if cfg.position.diet_abs.linformer_k and cfg.position.randomized_max_length:
        raise ValueError("diet_abs with linformer_k projects the keys of a row's columns, not of its positions: "
                         "it cannot take position.randomized_max_length")


def _check_tupe(cfg: ModelConfig) -> None:
    if cfg.position.tupe.untie_cls and cfg.position.randomized_max_length:
        raise ValueError("tupe's untie_cls finds [CLS] at position 0, which randomized positions do not keep: set "
                         "position.tupe.untie_cls=False to randomize TUPE's positions")


MECHANISMS: dict[str, Mechanism] = {m.kind: m for m in (
    Mechanism("none", "jaxpos.positions.base:PositionMechanism", "none (bag of words)", "bag of words",
              inductive=True, learned=False, input_only=True, kernel_form="none",
              no_randomized_positions="a bag of words reads no positions"),
    Mechanism("absolute", "jaxpos.positions.absolute:AbsolutePosition", "absolute, learned (BERT)",
              "learned input embeddings (BERT)", inductive=False, learned=True, input_only=True, kernel_form="none"),
    Mechanism("sinusoidal", "jaxpos.positions.absolute:SinusoidalPosition", "absolute, sinusoidal",
              "fixed input embeddings (Vaswani)", inductive=True, learned=False, input_only=True, kernel_form="none"),
    Mechanism("tisa", "jaxpos.positions.tisa:TisaPosition", "TISA", "Σ_s a_s exp(−|b_s|(k − c_s)²) per head",
              inductive=When("without input_positions", lambda p: not p.tisa.input_positions), learned=True,
              kernel_form="table"),
    Mechanism("diet_rel", "jaxpos.positions.diet:DietRelPosition", "DIET-Rel", "one scalar per head per offset",
              inductive=When("with max_distance", lambda p: p.diet_rel.max_distance is not None), learned=True,
              kernel_form="table"),
    Mechanism("diet_abs", "jaxpos.positions.diet:DietAbsPosition", "DIET-Abs, shared by layer",
              "P_Q P_Kᵀ per head, folded into q·k", inductive=False, learned=True,
              kernel_form=lambda p: None if p.diet_abs.linformer_k else "factors", check=_check_diet_abs),
    Mechanism("t5", "jaxpos.positions.t5:T5Position", "T5 buckets", "bucketed relative bias per head",
              inductive=True, learned=True, kernel_form="table", check=_check_t5),
    Mechanism("shaw", "jaxpos.positions.shaw:ShawPosition", "Shaw et al.", "r^K, r^V per clipped offset",
              inductive=True, learned=True,
              no_position_only_term="Shaw's relative term q.r^K is a product with the query's content"),
    Mechanism("tupe", "jaxpos.positions.tupe:TupePosition", "TUPE",
              "(p_i U_Q)(p_j U_K)ᵀ/√(2D), and q·k/√(2D) instead of q·k/√D (TUPE paper)", inductive=False,
              learned=True, kernel_form="factors", check=_check_tupe),
    Mechanism("rope", "jaxpos.positions.rope:RopePosition", "RoPE", "rotary queries and keys", inductive=True,
              learned=False, no_position_only_term="RoPE rotates q and k, so positions act only through the "
                                                   "content term q.k",
              kernel_form="none", check=_check_rope),
    Mechanism("alibi", "jaxpos.positions.alibi:AlibiPosition", "ALiBi", "−m_h|j − i|", inductive=True,
              learned=False, kernel_form="table"),
    Mechanism("attenuated", "jaxpos.positions.attenuated:AttenuatedPosition", "attenuated, fixed",
              "softmax_j(−w(j−i)², ×s after the query)",
              inductive=When("fixed form", lambda p: p.attenuated.form == "fixed"),
              learned=When("learned forms", lambda p: p.attenuated.form != "fixed"),
              kernel_form=lambda p: "table" if p.attenuated.form in ("offset", "abs_offset") else None),
    Mechanism("kerple", "jaxpos.positions.kerple:KerplePosition", "KERPLE (log)", "−r₁ log(1 + r₂|j − i|) per head",
              inductive=True, learned=True, kernel_form="table"),
    Mechanism("fire", "jaxpos.positions.fire:FirePosition", "FIRE",
              "MLP(ψ(i − j) / ψ(max(L, i))) per head, ψ(x) = log(cx + 1); an encoder's: MLP(sign(j − i) "
              "ψ(|j − i|) / ψ(max(L, T)))", inductive=True, learned=True, kernel_form="table", dense_when_causal=True),
    # Positions are counts clamped at max_position - 1: any length runs, with the far counts sharing the last one.
    Mechanism("cope", "jaxpos.positions.cope:CopePosition", "CoPE",
              "q_i·e[p_ij], p_ij = Σ_t σ(q_i·k_t/√D) over keys t from j to i (an encoder's: per direction)",
              inductive=True, learned=True,
              no_position_only_term="CoPE's positions are counts of gates σ(q.k/√D), so its term depends on the "
                                    "query's and the keys' content",
              check=_check_cope, no_randomized_positions="CoPE counts its positions from gates on the content, "
                                                          "not from the tokens' positions"),
    Mechanism("deberta", "jaxpos.positions.deberta:DebertaPosition", "DeBERTa",
              "(q_i·k_j + q_i·K_r[δ] + k_j·Q_r[δ])/√(3D), δ = bucket(i − j); Q_r, K_r: the layer's own q, k "
              "projections of shared relative embeddings", inductive=True, learned=True,
              no_position_only_term="DeBERTa's relative terms q_i.K_r and k_j.Q_r are products with the query's and "
                                    "the key's content"),
)}


def inductive_summary() -> str:
    """The mechanisms that work at any length, with their conditions: "none, sinusoidal, tisa (without ...), ..."."""
    return ", ".join(m.kind if m.inductive is True else f"{m.kind} ({m.inductive.text})"
                     for m in MECHANISMS.values() if m.inductive is not False)
