"""RoPE (Su et al.): queries and keys rotated by position-dependent angles, q.k then depends on j - i.

Channel pair k of a head is (x[k], x[k + D/2]) (`apply_rotary`'s half-split layout), turning at the inverse
frequency θ_k = base^(−2k/D): pair 0 fastest. The length-extension rules of `rope.scaling` change the θ_k (and YaRN
the scale of cos and sin); p-RoPE (`rope.fraction` < 1) sets θ_k = 0 for the pairs of the lowest frequencies, which
then pass unrotated. None of them has parameters.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxpos.attention.bias import PositionalBias
from jaxpos.config.mechanisms import rotated_pairs
from jaxpos.config.model import RopeConfig
from jaxpos.positions.base import PositionMechanism


def inverse_frequencies(head_dim: int, base: float) -> np.ndarray:
    """θ_k = base^(−2k/D) of the D/2 channel pairs, k = 0..D/2−1 -> [D/2] float64."""
    return float(base) ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def ntk_base(base: float, head_dim: int, stretch: float) -> float:
    """NTK-aware base for positions stretched `stretch` times: base · stretch^(D/(D−2)), which divides the lowest
    frequency by `stretch` and leaves the highest (θ_0 = 1); a single pair (D = 2) turns at 1 whatever the base."""
    return base * stretch ** (head_dim / (head_dim - 2)) if head_dim > 2 else base


def yarn_frequencies(theta: np.ndarray, rope: RopeConfig, original_length: int) -> np.ndarray:
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


def llama3_frequencies(theta: np.ndarray, rope: RopeConfig, original_length: int) -> np.ndarray:
    """Llama 3.1's θ_k [D/2]: wavelengths 2π/θ_k above L₀/low_freq_factor divided by s, below L₀/high_freq_factor
    kept, and in between mixed by (L₀/wavelength − low_freq_factor) / (high_freq_factor − low_freq_factor)."""
    s, low, high = rope.factor, rope.low_freq_factor, rope.high_freq_factor
    wavelength = 2 * math.pi / theta
    smooth = (original_length / wavelength - low) / (high - low)
    between = (1.0 - smooth) * theta / s + smooth * theta
    return np.where(wavelength > original_length / low, theta / s,
                    np.where(wavelength < original_length / high, theta, between))


def rope_frequencies(rope: RopeConfig, head_dim: int, original_length: int, length: int) -> tuple[np.ndarray, float]:
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

    def tables(self, rope: RopeConfig, q_pos, k_pos):
        """(cos, sin at q_pos [T, D/2], cos, sin at k_pos [S, D/2]) of the frequencies of `rope`."""
        theta, factor = rope_frequencies(rope, self.cfg.head_dim, rope.original_max_length or self.cfg.max_length,
                                         self.span(q_pos, k_pos))
        return (*rotary_tables(q_pos, theta, factor), *rotary_tables(k_pos, theta, factor))

    def __call__(self, q_pos, k_pos):
        rope = self.pcfg.rope
        tables = [t[None] for t in self.tables(rope, q_pos, k_pos)]
        if self.cfg.local_window is not None and rope.local_base not in (None, rope.base):
            local = self.tables(dataclasses.replace(rope, base=rope.local_base), q_pos, k_pos)
            kinds = np.asarray([self.cfg.is_local(layer) for layer in range(self.num_layers)], np.int32)
            tables = [jnp.concatenate([g, l[None]])[kinds] for g, l in zip(tables, local)]  # [L, T|S, D/2]
        cos_q, sin_q, cos_k, sin_k = tables
        return PositionalBias(rotary=(cos_q, sin_q), rotary_keys=(cos_k, sin_k))
