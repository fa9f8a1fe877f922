"""Attention dropout's counter-based mask (`jaxpos.attention.dropout`): the hash against a uint32 numpy
re-implementation, the keep rate and independence of neighbouring entries, distinct rows and seeds, the XLA path
applying it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.attention import PositionalBias, attend, dropout


def lowbias32(x):
    """Wellons' lowbias32 in uint32 numpy arithmetic (the reference for the int32 version)."""
    x = np.asarray(x, np.uint32)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint32(16)
        x *= np.uint32(0x7FEB352D)
        x ^= x >> np.uint32(15)
        x *= np.uint32(0x846CA68B)
        x ^= x >> np.uint32(16)
    return x


def test_hash_matches_uint32_reference_and_known_value():
    words = np.random.default_rng(0).integers(0, 2**32, size=4096, dtype=np.uint64).astype(np.uint32)
    got = np.asarray(dropout.mix32(jnp.asarray(words.view(np.int32)))).view(np.uint32)
    np.testing.assert_array_equal(got, lowbias32(words))
    assert int(lowbias32(1)) == int(np.asarray(dropout.mix32(jnp.int32(1))).view(np.uint32))
    assert lowbias32(0) == 0  # a bijection fixing 0: rows are xored with a mixed seed, never hashed bare


def test_mask_matches_its_definition():
    """keep(b, h, i, j) = top 24 bits of mix(rowkey + j * golden) >= rate * 2^24, rowkey = mix(row ^ mix(seed))."""
    seed, (b, h, t, s), rate = 12345, (2, 3, 5, 7), 0.3
    mask = np.asarray(dropout.keep_mask(jnp.int32(seed), b, h, t, s, rate))
    rows = np.arange(b * h * t, dtype=np.uint32).reshape(b, h, t)
    keys = lowbias32(rows ^ lowbias32(seed))
    with np.errstate(over="ignore"):
        bits = lowbias32(keys[..., None] + np.arange(s, dtype=np.uint32) * np.uint32(0x9E3779B9))
    np.testing.assert_array_equal(mask, (bits >> np.uint32(8)) >= round(rate * 2**24))


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_keep_rate_and_independence(rate):
    """Over 4 x 3 x 64 x 64 entries: the kept fraction is 1 - rate (5 standard deviations), in every (batch,
    head) block and on both halves of the key axis; neighbours along rows, columns and diagonals are uncorrelated."""
    seed = dropout.seed_from_key(jax.random.PRNGKey(0))
    mask = np.asarray(dropout.keep_mask(seed, 4, 3, 64, 64, rate), np.float64)
    keep, n = 1.0 - rate, mask.size
    assert abs(mask.mean() - keep) < 5 * np.sqrt(rate * keep / n)
    per_block = mask.mean(axis=(2, 3))
    assert np.all(np.abs(per_block - keep) < 5 * np.sqrt(rate * keep / 4096))
    for half in (mask[..., :32], mask[..., 32:]):
        assert abs(half.mean() - keep) < 5 * np.sqrt(rate * keep / half.size)
    centred = mask - mask.mean()
    for a, b in ((centred[..., :, 1:], centred[..., :, :-1]), (centred[..., 1:, :], centred[..., :-1, :]),
                 (centred[..., 1:, 1:], centred[..., :-1, :-1]), (centred[:, 1:], centred[:, :-1])):
        corr = np.mean(a * b) / centred.var()
        assert abs(corr) < 5 / np.sqrt(a.size), corr


def test_rows_and_seeds_differ():
    keys = np.asarray(dropout.row_keys(jnp.int32(3), 8, 12, 512))
    assert np.unique(keys).size == keys.size  # no two rows share a key
    one, two = (np.asarray(dropout.keep_mask(jnp.int32(seed), 2, 2, 32, 32, 0.1)) for seed in (1, 2))
    agree = np.mean(one == two)
    assert abs(agree - (0.9**2 + 0.1**2)) < 0.03  # independent masks agree as often as chance says
    np.testing.assert_array_equal(one, np.asarray(dropout.keep_mask(jnp.int32(1), 2, 2, 32, 32, 0.1)))


def test_rate_is_validated():
    for rate in (-0.1, 1.0):
        with pytest.raises(ValueError, match="attention dropout rate must be in"):
            dropout.keep_threshold(rate)
    assert dropout.keep_threshold(0.0) == 0 and np.all(dropout.keep_mask(jnp.int32(0), 1, 1, 8, 8, 0.0))


def test_xla_attention_drops_the_masked_weights():
    """attend's xla path: out = (weights * keep / (1 - rate)) v, with weights its own undropped softmax."""
    rng, rate = jax.random.PRNGKey(4), 0.25
    q, k, v = (jnp.asarray(np.random.default_rng(i).normal(size=(2, 9, 3, 8)), jnp.float32) for i in range(3))
    pos = jnp.arange(9)
    out, weights = attend(q, k, v, bias=PositionalBias(), q_pos=pos, k_pos=pos, dropout_rng=rng, dropout_rate=rate)
    keep = np.asarray(dropout.keep_mask(dropout.seed_from_key(rng), 2, 3, 9, 9, rate))
    assert 0 < keep.mean() < 1
    want = np.einsum("bhts,bshd->bthd", np.asarray(weights) * keep / (1 - rate), np.asarray(v))
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-6)
