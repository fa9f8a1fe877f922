"""DeBERTa's relative positions and disentangled terms against transformers' functions, literal values and loops."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.attention.bias import disentangled_logits
from jaxpos.positions.deberta import log_bucket, relative_rows

torch = pytest.importorskip("torch")
deberta_v2 = pytest.importorskip("transformers.models.deberta_v2.modeling_deberta_v2")


# (position_buckets, max_relative_positions): DeBERTa-v3's, others of the released models' kind, small ones, and odd
# bucket counts.
SIZES = [(256, 512), (128, 512), (256, 1024), (512, 1024), (16, 40), (8, 12), (19, 26), (2, 3), (3, 5)]


@pytest.mark.parametrize("buckets, max_relative", SIZES)
def test_log_buckets_and_rows_match_transformers(buckets, max_relative):
    rel = np.arange(-4 * max_relative, 4 * max_relative + 1)
    want = deberta_v2.make_log_bucket_position(torch.tensor(rel), buckets, max_relative).long().numpy()
    np.testing.assert_array_equal(log_bucket(rel, buckets, max_relative), want)
    # transformers' c2p index, the row p2c reads too: clamp(relative_pos + att_span, 0, 2 att_span - 1)
    np.testing.assert_array_equal(relative_rows(rel, buckets, max_relative),
                                  np.clip(want + buckets, 0, 2 * buckets - 1))


def test_buckets_are_float32_arithmetic():
    """19 buckets reaching 26, i - j = 15: log(15/9) / log(25/9) * 8 is 4 exactly, which float32 keeps (bucket 13,
    as transformers) and float64 rounds up (ceil: 14)."""
    assert log_bucket(np.array([15, -15]), 19, 26).tolist() == [13, -13]
    assert np.ceil(np.log(15 / 9) / np.log(25 / 9) * 8) + 9 == 14


def test_rows_without_buckets_clamp_the_offset():
    rel = np.arange(-9, 10)
    np.testing.assert_array_equal(relative_rows(rel, 0, 6), np.clip(rel + 6, 0, 11))
    q = torch.zeros(1, 5, 4)
    built = deberta_v2.build_relative_position(q, q, bucket_size=-1, max_position=6)[0].numpy()
    np.testing.assert_array_equal(built, np.arange(5)[:, None] - np.arange(5)[None, :])  # query minus key


def loops(q, k, rel_q, rel_k, rows):
    """c2p + p2c by loops: q_i . K_r[rows[i, j]] + k_j . Q_r[rows[i, j]] for every batch, head and pair."""
    batch, length, heads, _ = q.shape
    out = np.zeros((batch, heads, length, k.shape[1]))
    for b in range(batch):
        r = rows[b] if rows.ndim == 3 else rows
        for h in range(heads):
            for i in range(length):
                for j in range(k.shape[1]):
                    out[b, h, i, j] = q[b, i, h] @ rel_k[r[i, j], h] + k[b, j, h] @ rel_q[r[i, j], h]
    return out


@pytest.mark.parametrize("per_example", [False, True], ids=["shared_rows", "per_example_rows"])
def test_disentangled_logits_against_loops(per_example):
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(2, 2, 5, 3, 4)).astype(np.float32)
    rel_q, rel_k = rng.normal(size=(2, 8, 3, 4)).astype(np.float32)
    pos = np.arange(5)
    rows = relative_rows(pos[:, None] - pos[None, :], 4, 6)  # [T, S], not symmetric
    if per_example:
        rows = np.stack([rows, relative_rows(pos[:, None] - pos[None, :] + 2, 4, 6)])
    got = disentangled_logits(*map(jnp.asarray, (q, k, rel_q, rel_k, rows)))
    np.testing.assert_allclose(np.asarray(got), loops(q, k, rel_q, rel_k, rows), rtol=1e-5, atol=1e-5)
    # the paper's p2c at delta(j, i) is another term: transformers (and jaxpos) read it at the row of i - j
    paper = loops(q, 0 * k, rel_q, rel_k, rows) + loops(0 * q, k, rel_q, rel_k, np.swapaxes(rows, -1, -2))
    assert np.abs(np.asarray(got) - paper).max() > 0.1


def test_the_mechanism_hands_attention_compact_terms():
    from flax import linen as nn

    from jaxpos.positions import make_position
    from tests.helpers import tiny_config

    cfg = tiny_config(dict(kind="deberta", deberta=dict(position_buckets=8, max_relative_positions=12)))
    module = make_position(cfg, cfg.num_layers, causal=False)
    pos = jnp.arange(9)
    bias = module.apply(nn.unbox(module.init(jax.random.PRNGKey(0), pos, pos)), pos, pos)
    assert bias.term("disentangled").rel_embeddings.shape == (1, 16, cfg.d_model) and bias.content_scale == pytest.approx(3 ** -0.5)
    assert bias.term("disentangled").rel_index.shape == (1, 17) and bias.term("disentangled").rel_index.dtype == jnp.int32  # offsets j - i = -8 .. 8
    np.testing.assert_array_equal(bias.term("disentangled").rel_index[0], relative_rows(-np.arange(-8, 9), 8, 12))
    # normalised: each row has mean 0 and variance 1 (LayerNorm at its initial scale 1 and bias 0)
    np.testing.assert_allclose(np.asarray(bias.term("disentangled").rel_embeddings[0].mean(-1)), 0.0, atol=1e-5)


def ceil_ties(rel: np.ndarray, buckets: int, max_relative: int) -> np.ndarray:
    """The offsets whose bucket rests on the last bit of a float32 log: ceil's argument log(|r|/m)/log((M-1)/m)·(m-1)
    (m = buckets/2, M = max_relative), exact in float64, within 2 float32 ulps of an integer."""
    mid = buckets // 2
    r = np.maximum(np.abs(rel), mid).astype(np.float64)
    x = np.log(r / mid) / np.log((max_relative - 1) / mid) * (mid - 1)
    return (np.abs(x - np.round(x)) <= 2 * np.spacing(np.float32(np.abs(x)), dtype=np.float32)) & (np.abs(rel) > mid)


# The pairs an independent check found one row apart from transformers, and a grid of sizes around the released ones
GRID = [(403, 207), (333, 229), (530, 429), (188, 635), *[(b, m) for b in (2, 3, 8, 17, 64, 255, 256, 257, 511)
                                                         for m in (b // 2 + 2, b + 1, 3 * b, 512, 1000)]]


@pytest.mark.parametrize("buckets, max_relative", GRID)
def test_rows_equal_transformers_but_where_a_float32_log_bit_decides(buckets, max_relative):
    """Computed as transformers does (float32 division, log, division, product, ceil, in its order), the rows equal
    its rows at every offset but where ceil's argument lies within 2 float32 ulps of an integer: there the last bit
    of the float32 log decides, and torch's (MKL's vmsLn on CPU builds) differs from the correctly rounded one
    jaxpos uses (the same on every machine) on about 3% of inputs. A wrong dtype or order moves rows elsewhere."""
    rel = np.arange(-2500, 2501)
    bucket = deberta_v2.make_log_bucket_position(torch.tensor(rel), buckets, max_relative).numpy()
    want = np.clip(bucket.astype(np.int64) + buckets, 0, 2 * buckets - 1)
    got = relative_rows(rel, buckets, max_relative)
    apart = got != want
    assert not (apart & ~ceil_ties(rel, buckets, max_relative)).any(), rel[apart & ~ceil_ties(rel, buckets,
                                                                                               max_relative)]
    assert np.abs(got - want).max(initial=0) <= 1 and apart.sum() <= 2  # one offset and its mirror at most
