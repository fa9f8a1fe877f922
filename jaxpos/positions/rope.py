"""RoPE (Su et al.): queries and keys rotated by position-dependent angles, q.k then depends on j - i.

Channel pair k of a head is (x[k], x[k + D/2]) (`apply_rotary`'s half-split layout), turning at the inverse
frequency θ_k = base^(−2k/D): pair 0 fastest. The length-extension rules of `rope.scaling` change the θ_k (and YaRN
the scale of cos and sin); p-RoPE (`rope.fraction` < 1) sets θ_k = 0 for the pairs of the lowest frequencies, which
then pass unrotated. None of them has parameters.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from jaxpos.attention.bias import PositionalBias, Rotary
from jaxpos.config.checks import check_count, check_number
from jaxpos.config.position import MechanismOptions, config_dict
from jaxpos.positions.base import PositionMechanism
from jaxpos.positions.registry import Mechanism, register

# RoPE's length-extension rules: none | linear (positions / factor) | ntk (static NTK-aware base) | dynamic (NTK at
# the pass's length) | yarn | llama3
ROPE_SCALINGS = ("none", "linear", "ntk", "dynamic", "yarn", "llama3")


def rotated_pairs(head_dim: int, fraction: float) -> int:
    """How many of a head's D/2 channel pairs p-RoPE rotates: ⌊fraction·D/2⌋, as Hugging Face's `proportional`."""
    return int(fraction * head_dim // 2)


@dataclasses.dataclass(frozen=True)
class RopeOptions(MechanismOptions):
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
    # The base of local layers (the plan's windowed layers), ModernBERT's 10,000 beside a global 160,000; None: `base`
    local_base: float | None = None
    heads: int | None = None  # RoPE on the first `heads` heads of each layer, the rest NoPE; None: every head

    # The fields that change no parameter, so a trained run may be evaluated under other values of them
    evaluation_fields: ClassVar = ("scaling", "factor", "original_max_length", "beta_fast", "beta_slow",
                                   "low_freq_factor", "high_freq_factor")

    def check(self, model) -> None:
        """Raises a one-line ValueError for an unknown rule, an option out of range, or a head it cannot rotate."""
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
        if model is None:
            return
        if model.head_dim % 2:
            raise ValueError(f"RoPE rotates channel pairs: it needs an even head dimension, got d_model / "
                             f"num_heads = {model.d_model} / {model.num_heads} = {model.head_dim}")
        check_count("position.rope.heads", self.heads, 1, optional=True)
        if self.heads is not None and self.heads > model.num_heads:
            raise ValueError(f"position.rope.heads={self.heads} rotates more heads than a layer has "
                             f"(model.num_heads={model.num_heads})")
        if rotated_pairs(model.head_dim, self.fraction) < 1:
            raise ValueError(f"position.rope.fraction={self.fraction!r} rotates no channel pair of a head of "
                             f"{model.head_dim} dimensions: it needs at least 2 / {model.head_dim} = "
                             f"{2 / model.head_dim:g}")

    def evaluation_rule(self, model) -> str:
        rule = self.rule(self.original_max_length or model.max_length)
        return "" if rule == "none" else rule

    def evaluation_tag(self) -> str:
        return f"{self.scaling}_x{self.factor:g}"

    def evaluation_record(self, model) -> dict:
        return dict(config_dict(self), original_max_length=self.original_max_length or model.max_length)

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


def inverse_frequencies(head_dim: int, base: float) -> np.ndarray:
    """θ_k = base^(−2k/D) of the D/2 channel pairs, k = 0..D/2−1 -> [D/2] float64."""
    return float(base) ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def ntk_base(base: float, head_dim: int, stretch: float) -> float:
    """NTK-aware base for positions stretched `stretch` times: base · stretch^(D/(D−2)), which divides the lowest
    frequency by `stretch` and leaves the highest (θ_0 = 1); a single pair (D = 2) turns at 1 whatever the base."""
    return base * stretch ** (head_dim / (head_dim - 2)) if head_dim > 2 else base


def yarn_frequencies(theta: np.ndarray, rope: RopeOptions, original_length: int) -> np.ndarray:
    """YaRN's θ_k [D/2] as the authors' code and Hugging Face compute them: θ_k kept up to pair ⌊k(beta_fast)⌋,
    θ_k / s from pair ⌈k(beta_slow)⌉ on, and a ramp linear in the pair index k in between, k(r) being the
    (fractional) pair that turns r times over L₀. (The paper ramps linearly in the rotations r = L₀ θ_k / 2π
    instead; the two differ inside the band only.)"""
    head_dim = 2 * len(theta)

    def pair_turning(rotations):  # k with L₀ θ_k = 2π · rotations
        return head_dim * math.log(original_length / (rotations * 2 * math.pi)) / (2 * math.log(rope.base))

    low = max(math.floor(pair_turning(rope.beta_fast)), 0)
    high = min(math.ceil(pair_turning(rope.beta_slow)), head_dim - 1)
    if low == high:  # as the authors: a band of one pair still ramps
        high += 0.001
    interpolated = np.clip((np.arange(len(theta)) - low) / (high - low), 0.0, 1.0)  # 1: θ_k / s
    return theta / rope.factor * interpolated + theta * (1.0 - interpolated)


def llama3_frequencies(theta: np.ndarray, rope: RopeOptions, original_length: int) -> np.ndarray:
    """Llama 3.1's θ_k [D/2]: wavelengths 2π/θ_k above L₀/low_freq_factor divided by s, below L₀/high_freq_factor
    kept, and in between mixed by (L₀/wavelength − low_freq_factor) / (high_freq_factor − low_freq_factor)."""
    s, low, high = rope.factor, rope.low_freq_factor, rope.high_freq_factor
    wavelength = 2 * math.pi / theta
    smooth = (original_length / wavelength - low) / (high - low)
    between = (1.0 - smooth) * theta / s + smooth * theta
    return np.where(wavelength > original_length / low, theta / s,
                    np.where(wavelength < original_length / high, theta, between))


def rope_frequencies(rope: RopeOptions, head_dim: int, original_length: int, length: int) -> tuple[np.ndarray, float]:
    """(θ_k [D/2] float64, attention factor) of `rope`'s rule for a pass over `length` positions (only `dynamic`
    reads it), L₀ = `original_length`; the pairs p-RoPE leaves unrotated have θ_k = 0. The attention factor
    multiplies cos and sin, so the logits scale by its square (YaRN's 0.1 ln s + 1; 1 elsewhere)."""
    s = rope.factor
    theta, factor = inverse_frequencies(head_dim, rope.base), 1.0
    if rope.scaling == "linear":  # position interpolation: θ_k i/s = (θ_k/s) i
        theta = theta / s
    elif rope.scaling == "ntk":
        theta = inverse_frequencies(head_dim, ntk_base(rope.base, head_dim, s))
    elif rope.scaling == "dynamic" and length > original_length:
        theta = inverse_frequencies(head_dim, ntk_base(rope.base, head_dim, s * length / original_length - (s - 1)))
    elif rope.scaling == "yarn":
        theta, factor = yarn_frequencies(theta, rope, original_length), (0.1 * math.log(s) + 1.0 if s > 1 else 1.0)
    elif rope.scaling == "llama3":
        theta = llama3_frequencies(theta, rope, original_length)
    theta = np.array(theta)
    theta[rotated_pairs(head_dim, rope.fraction):] = 0.0  # p-RoPE: the lowest frequencies pass unrotated
    return theta, factor


def rotary_tables(positions: jax.Array, theta: np.ndarray, factor: float = 1.0) -> tuple[jax.Array, jax.Array]:
    """factor · cos, factor · sin of the angles positions · θ_k. positions [T], θ [D/2] -> two [T, D/2]."""
    angles = positions.astype(jnp.float32)[:, None] * jnp.asarray(theta, jnp.float32)[None, :]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    return (cos, sin) if factor == 1.0 else (factor * cos, factor * sin)


class RopePosition(PositionMechanism):
    """Fixed rotations; inductive. The tables for the query and key positions are computed once per pass, with one
    set of frequencies for both (dynamic NTK: at the pass's length, the longer of T and S). With local layers
    (model.local_window) and `rope.local_base`, the tables of both bases are computed once and each layer reads
    its own kind's: tables [L, T, D/2] instead of [1, T, D/2]."""

    def tables(self, rope: RopeOptions, q_pos, k_pos):
        """(cos, sin at q_pos [T, D/2], cos, sin at k_pos [S, D/2]) of the frequencies of `rope`."""
        theta, factor = rope_frequencies(rope, self.cfg.head_dim, rope.original_max_length or self.cfg.max_length,
                                         self.span(q_pos, k_pos))
        return (*rotary_tables(q_pos, theta, factor), *rotary_tables(k_pos, theta, factor))

    def __call__(self, q_pos, k_pos):
        rope = self.pcfg.rope
        tables = [t[None] for t in self.tables(rope, q_pos, k_pos)]
        if self.cfg.has_local_layers and rope.local_base not in (None, rope.base):
            local = self.tables(dataclasses.replace(rope, base=rope.local_base), q_pos, k_pos)
            kinds = np.asarray([self.cfg.is_local(layer) for layer in range(self.num_layers)], np.int32)
            tables = [jnp.concatenate([g, l[None]])[kinds] for g, l in zip(tables, local)]  # [L, T|S, D/2]
        return PositionalBias.of(Rotary(*tables, heads=rope.heads))


MECHANISM = register(Mechanism(
    "rope", RopePosition, "RoPE", "rotary queries and keys", inductive=True, learned=False, options=RopeOptions,
    options_text="`rope.base`; `rope.scaling` (length rules, no parameters: [docs/mechanisms.md](docs/mechanisms.md"
                 "#rope-length-extension-rules-and-p-rope)): `none`, `linear`, `ntk`, `dynamic`, `yarn`, `llama3`, "
                 "with `rope.factor` (s ≥ 1), `rope.original_max_length` (L₀, default `model.max_length`), "
                 "`rope.beta_fast`, `rope.beta_slow` (yarn), `rope.low_freq_factor`, `rope.high_freq_factor` "
                 "(llama3); `rope.fraction` (p-RoPE: the highest-frequency share of each head's channel pairs "
                 "rotated, the lowest left unrotated); `rope.local_base` (the base of local layers); `rope.heads` (RoPE on "
                 "the first h heads, the rest NoPE)",
    reference="Su et al., 2021",
    no_position_only_term="RoPE rotates q and k, so positions act only through the content term q.k"))
