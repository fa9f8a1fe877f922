"""The attention function against direct numpy formulas; implementations against each other."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.attention import AttentionMask, attend
from jaxpos.attention.bias import segment_logits
from tests.helpers import bias_terms

B, T, H, D = 2, 6, 3, 4


def random_qkv(seed=0, t=T, s=T):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=shape).astype(np.float32) for shape in ((B, t, H, D), (B, s, H, D), (B, s, H, D))]


def softmax(x):
    x = x - x.max(-1, keepdims=True)
    return np.exp(x) / np.exp(x).sum(-1, keepdims=True)


def reference(q, k, v, extra_logits=0.0, mask=None, rel_keys=None, rel_values=None, clip=0, content=True):
    """Loop-level reference: logits[b,h,i,j] = q.k/sqrt(D) + extra (+ q.r^K/sqrt(D)); z += sum_j p r^V."""
    logits = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(D) * (1.0 if content else 0.0) + extra_logits
    t, s = q.shape[1], k.shape[1]
    if rel_keys is not None:
        for i in range(t):
            for j in range(s):
                logits[:, :, i, j] += q[:, i] @ rel_keys[np.clip(j - i, -clip, clip) + clip] / np.sqrt(D)
    if mask is not None:
        logits = np.where(mask, logits, -1e30)
    p = softmax(logits)
    out = np.einsum("bhts,bshd->bthd", p, v)
    if rel_values is not None:
        for i in range(t):
            for j in range(s):
                out[:, i] += p[:, :, i, j, None] * rel_values[np.clip(j - i, -clip, clip) + clip]
    return out, p


def test_mask_helper_matches_loops():
    piece_ids = np.array([[1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 0, 0]])
    pos = np.arange(T)
    mask = np.asarray(AttentionMask.within_pieces(jnp.asarray(piece_ids), causal=True).dense(jnp.asarray(pos),
                                                                                             jnp.asarray(pos)))
    for b in range(B):
        for i in range(T):
            for j in range(T):
                assert mask[b, 0, i, j] == (piece_ids[b, j] != 0 and piece_ids[b, i] == piece_ids[b, j] and j <= i)


def test_dense_mask_matches_loops_for_other_query_and_key_ids():
    """Packed and padded rows with their own query and key ids, causal over query positions 4..8 against key
    positions 0..8 (a query block of a longer row); keys' padding alone when only key ids are given."""
    rng = np.random.default_rng(3)
    batch, tq, tk, offset = 3, 5, 9, 4
    q_ids = np.sort(rng.integers(0, 4, (batch, tq)), axis=1)[:, ::-1]  # pieces 3..1, then padding (0)
    kv_ids = np.sort(rng.integers(0, 4, (batch, tk)), axis=1)[:, ::-1]
    q_pos, k_pos = offset + np.arange(tq), np.arange(tk)
    mask = np.asarray(AttentionMask(q_piece_ids=jnp.asarray(q_ids), kv_piece_ids=jnp.asarray(kv_ids), causal=True)
                      .dense(jnp.asarray(q_pos), jnp.asarray(k_pos)))
    padding_only = np.asarray(AttentionMask(kv_piece_ids=jnp.asarray(kv_ids)).dense())
    assert mask.shape == (batch, 1, tq, tk) and padding_only.shape == (batch, 1, 1, tk)
    for b in range(batch):
        for i in range(tq):
            for j in range(tk):
                visible = kv_ids[b, j] != 0 and q_ids[b, i] == kv_ids[b, j] and k_pos[j] <= q_pos[i]
                assert mask[b, 0, i, j] == visible
                assert padding_only[b, 0, 0, j] == (kv_ids[b, j] != 0)
    assert AttentionMask().dense() is None


def test_table_factor_segment_and_mask_terms():
    q, k, v = random_qkv()
    rng = np.random.default_rng(1)
    table = rng.normal(size=(H, 2 * T - 1)).astype(np.float32)
    p_q, p_k = rng.normal(size=(2, 1, T, 2)).astype(np.float32)  # head-shared low-rank factors
    seg_table = rng.normal(size=(H, 2, 2)).astype(np.float32)
    types = np.array([[0, 0, 0, 1, 1, 1], [0, 1, 0, 1, 0, 1]])
    piece_ids = np.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    pos = np.arange(T)
    extra = np.zeros((B, H, T, T), np.float32)
    for h in range(H):
        for i in range(T):
            for j in range(T):
                extra[:, h, i, j] += table[h, j - i + T - 1] + p_q[0, i] @ p_k[0, j]
                extra[:, h, i, j] += seg_table[h, types[:, i], types[:, j]]
    mask = AttentionMask.within_pieces(jnp.asarray(piece_ids))
    want, want_p = reference(q, k, v, extra, np.asarray(mask.dense()))
    for fold in (False, True):
        bias = bias_terms(table=jnp.asarray(table), factors=(jnp.asarray(p_q), jnp.asarray(p_k)),
                              segment_table=jnp.asarray(seg_table), fold_factors=fold)
        out, weights = attend(q, k, v, bias=bias, q_pos=jnp.asarray(pos), k_pos=jnp.asarray(pos), mask=mask,
                              q_types=jnp.asarray(types), k_types=jnp.asarray(types))
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(weights, want_p, rtol=1e-5, atol=1e-6)


def test_segment_table_picks_the_right_cells():
    table = jnp.arange(2 * 3 * 3, dtype=jnp.float32).reshape(2, 3, 3)
    q_types, k_types = jnp.asarray([[0, 2, 1]]), jnp.asarray([[1, 1, 2, 0]])
    got = np.asarray(segment_logits(table, q_types, k_types))
    for h in range(2):
        for i in range(3):
            for j in range(4):
                assert got[0, h, i, j] == table[h, q_types[0, i], k_types[0, j]]


def test_shaw_relative_keys_and_values():
    q, k, v = random_qkv(2)
    rng = np.random.default_rng(3)
    clip = 2
    rel_keys, rel_values = rng.normal(size=(2, 2 * clip + 1, D)).astype(np.float32)
    pos = jnp.arange(T)
    want, _ = reference(q, k, v, rel_keys=rel_keys, rel_values=rel_values, clip=clip)
    out, _ = attend(q, k, v, bias=bias_terms(rel_keys=jnp.asarray(rel_keys), rel_values=jnp.asarray(rel_values)),
                    q_pos=pos, k_pos=pos)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_content_only_and_position_only_switches():
    q, k, v = random_qkv(4)
    table = np.random.default_rng(5).normal(size=(H, 2 * T - 1)).astype(np.float32)
    pos = jnp.arange(T)
    bias = bias_terms(table=jnp.asarray(table))
    dense = np.stack([[[table[h, j - i + T - 1] for j in range(T)] for i in range(T)] for h in range(H)])
    _, p_pos = attend(q, k, v, bias=bias, q_pos=pos, k_pos=pos, content=False)
    np.testing.assert_allclose(p_pos, np.broadcast_to(softmax(dense), (B, H, T, T)), rtol=1e-5)
    _, p_content = attend(q, k, v, bias=bias, q_pos=pos, k_pos=pos, position=False)
    np.testing.assert_allclose(p_content, reference(q, k, v)[1], rtol=1e-5)


def test_jax_dot_product_attention_path_matches_reference():
    q, k, v = random_qkv(6)
    rng = np.random.default_rng(7)
    table = rng.normal(size=(H, 2 * T - 1)).astype(np.float32)
    p_q, p_k = rng.normal(size=(2, H, T, 3)).astype(np.float32)
    piece_ids = jnp.asarray([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1]])
    pos = jnp.arange(T)
    mask = AttentionMask.within_pieces(piece_ids, causal=True)
    bias = bias_terms(table=jnp.asarray(table), factors=(jnp.asarray(p_q), jnp.asarray(p_k)))
    want, _ = attend(q, k, v, bias=bias, q_pos=pos, k_pos=pos, mask=mask)
    got, _ = attend(q, k, v, bias=bias, q_pos=pos, k_pos=pos, mask=mask, implementation="jax")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="Shaw"):
        attend(q, k, v, bias=bias_terms(rel_keys=jnp.zeros((3, D))), q_pos=pos, k_pos=pos, implementation="jax")
