"""Attention dropout from a counter-based hash: one mask for every attention implementation.

Whether weight (b, h, i, j) is kept depends on a per-call seed and those four indices alone, so a kernel
recomputes it tile by tile in its backward pass (nothing stored, no random state), and the XLA path and the Pallas
kernel drop exactly the same weights. A row key mixes the seed with the row's index (b*H + h)*T + i (a bijection
for a given seed: no two rows of a call share a key); an entry mixes its row key with the key index j. The mixer is
Wellons' `lowbias32` (xorshift-multiply, full avalanche), in int32 arithmetic that wraps like uint32 on every
backend; the top 24 bits of the hash decide, so the keep probability is 1 - rate to within 2^-24.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

KEEP_BITS = 24  # bits of the hash compared with the threshold (int32 comparisons stay non-negative)


def _signed(constant: int) -> int:
    """A uint32 constant as the int32 with the same bits (int32 multiplication wraps like uint32's)."""
    return constant - (1 << 32) if constant >= 1 << 31 else constant


_MUL_1, _MUL_2, _GOLDEN = _signed(0x7FEB352D), _signed(0x846CA68B), _signed(0x9E3779B9)


def _shift(x: jax.Array, bits: int) -> jax.Array:
    return lax.shift_right_logical(x, jnp.full((), bits, x.dtype))


def mix32(x: jax.Array) -> jax.Array:
    """lowbias32 on int32 bits: a bijection of 32-bit words whose output bits each depend on every input bit."""
    x = x ^ _shift(x, 16)
    x = x * _MUL_1
    x = x ^ _shift(x, 15)
    x = x * _MUL_2
    return x ^ _shift(x, 16)


def seed_from_key(rng: jax.Array) -> jax.Array:
    """A PRNG key -> the int32 seed of one call."""
    return lax.bitcast_convert_type(jax.random.bits(rng, (), jnp.uint32), jnp.int32)


def row_keys(seed: jax.Array, batch: int, heads: int, length: int) -> jax.Array:
    """Keys of the query rows of a call: seed int32 [] -> [B, H, T] int32."""
    rows = jnp.arange(batch * heads * length, dtype=jnp.int32).reshape(batch, heads, length)
    return mix32(rows ^ mix32(jnp.asarray(seed, jnp.int32)))


def keep_threshold(rate: float) -> int:
    """The hash's top KEEP_BITS bits keep an entry when >= this."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"attention dropout rate must be in [0, 1), got {rate}")
    return round(rate * (1 << KEEP_BITS))


def keep(row_key: jax.Array, key_index: jax.Array, rate: float) -> jax.Array:
    """Whether each weight is kept: row keys [..., T, 1] and key indices [..., 1, S] (int32) -> bool [..., T, S]."""
    bits = mix32(row_key + key_index * _GOLDEN)
    return _shift(bits, 32 - KEEP_BITS) >= keep_threshold(rate)


def keep_mask(seed: jax.Array, batch: int, heads: int, length_q: int, length_k: int, rate: float) -> jax.Array:
    """The whole mask of a call, [B, H, T, S] bool (what the XLA path applies; kernels compute it per tile)."""
    keys = row_keys(seed, batch, heads, length_q)[..., None]
    return keep(keys, jnp.arange(length_k, dtype=jnp.int32), rate)
