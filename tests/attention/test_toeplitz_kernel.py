"""The Pallas Toeplitz attention kernel (interpret mode on the CPU) against the XLA reference `attend`.

Outputs and gradients of q, k, v and the table (and through it the mechanisms' parameters) with padding, packing,
causal masks, local windows, odd lengths, T != S, head-shared tables, no table and bf16 inputs; the fallbacks of
attend's "pallas" path; and what lowers for GPU (Triton) and TPU from this machine. Each kernel configuration
compiles once (a few seconds in the interpreter), so each test packs several features into one call.
"""

import logging

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.attention import AttentionMask, attend, dropout
from jaxpos.attention.bias import segment_pair_factors
from jaxpos.attention.kernels import toeplitz_attention
from jaxpos.models.layers import attention_terms
from jaxpos.positions import make_position
from tests.helpers import VARIANTS, bias_terms, tiny_config


def table_mechanisms() -> dict[str, dict]:
    """{id: position block} of each kind's first variant whose layers receive a Toeplitz table and nothing else."""
    first = {}
    for name, position in VARIANTS:
        if attention_terms(tiny_config(position)) == {"table"}:
            first.setdefault(position["kind"], (name, position))
    return dict(first.values())


TABLE_MECHANISMS = table_mechanisms()
HEADS, D = 2, 16
DROPOUT_RNG = jax.random.PRNGKey(17)


def with_dropout(rate, kernel_kwargs, reference_kwargs):
    """Kernel and reference arguments that drop the same weights at `rate` (the seed of DROPOUT_RNG)."""
    return (dict(kernel_kwargs, dropout_rate=rate, dropout_seed=dropout.seed_from_key(DROPOUT_RNG)),
            dict(reference_kwargs, dropout_rate=rate))


def random(shape, seed, dtype=jnp.float32):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), dtype)


def reference(q, k, v, table, *, q_piece_ids=None, kv_piece_ids=None, causal=False, window=None, q_offset=0,
              dropout_rate=0.0, segment=None):
    """attend(implementation="xla") with the same mask (and the dropout mask of DROPOUT_RNG's seed; segment:
    (per-head segment table, query types, key types)); -> (out, rows [B, T] that see at least one key)."""
    q_pos = q_offset + jnp.arange(q.shape[1])
    k_pos = jnp.arange(k.shape[1])
    mask = AttentionMask(q_piece_ids=q_piece_ids, kv_piece_ids=kv_piece_ids, causal=causal, window=window)
    seg_table, q_types, k_types = segment or (None, None, None)
    out, _ = attend(q, k, v, bias=bias_terms(table=table, segment_table=seg_table), q_pos=q_pos, k_pos=k_pos,
                    mask=mask, q_types=q_types, k_types=k_types, dropout_rng=DROPOUT_RNG, dropout_rate=dropout_rate)
    dense = mask.dense(q_pos, k_pos)
    rows = jnp.ones(q.shape[:2], bool) if dense is None else jnp.any(jnp.broadcast_to(
        dense, (q.shape[0], 1, q.shape[1], k.shape[1]))[:, 0], axis=-1)
    return out, rows


def assert_close(got, want, rtol=1e-4):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * max(np.abs(want).max(), 1e-6))


def with_segments(table, num_types, sizes, seed):
    """(params, types): the table with a per-head segment table [H, G, G] and random token types of queries [B, T]
    and keys [B, S] (random, so that the visible keys of a query differ in type), or the table alone (G = 0)."""
    if not num_types:
        return dict(table=table), None
    batch, t, s = sizes
    types = tuple(jnp.asarray(np.random.default_rng(seed + i).integers(0, num_types, (batch, n)))
                  for i, n in enumerate((t, s)))
    return dict(table=table, segment=random((HEADS, num_types, num_types), seed + 2)), types


def check_against_reference(args, build_table, kernel_kwargs, reference_kwargs, rtol=1e-4, types=None):
    """Out and the gradients of q, k, v and the table's parameters of `sum(out * g)` over rows that see a key.

    args: (q, k, v, params); build_table(params) -> table [H|1, W] or None. types: (query types [B, T], key
    types [B, S]) of a per-head segment table params["segment"] [H, G, G], the kernel's pair term.
    """
    q, k, v, params = args

    def segment(params):
        return None if types is None else (params["segment"], *types)

    def pair(params):
        return {} if types is None else dict(pair_bias=segment_pair_factors(params["segment"], *types))

    _, rows = reference(q, k, v, build_table(params), **reference_kwargs, segment=segment(params))
    weight = random(q.shape, 99) * rows[:, :, None, None]  # rows with no visible key differ by design

    def loss_kernel(q, k, v, params):
        out = toeplitz_attention(q, k, v, build_table(params), **kernel_kwargs, **pair(params))
        return jnp.sum(out.astype(jnp.float32) * weight), out

    def loss_reference(q, k, v, params):
        up = [x.astype(jnp.float32) for x in (q, k, v)]
        out, _ = reference(*up, build_table(params), **reference_kwargs, segment=segment(params))
        return jnp.sum(out * weight), out

    (_, got), got_grads = jax.value_and_grad(loss_kernel, argnums=(0, 1, 2, 3), has_aux=True)(*args)
    (_, want), want_grads = jax.value_and_grad(loss_reference, argnums=(0, 1, 2, 3), has_aux=True)(*args)
    assert_close(got * rows[:, :, None, None], want * rows[:, :, None, None], rtol)
    np.testing.assert_array_equal(np.asarray(got)[~np.asarray(rows)], 0.0)  # no visible key: 0, not NaN
    for got_leaf, want_leaf in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
        assert_close(got_leaf, want_leaf, rtol)


def mechanism(kind_block, length):
    """(apply(params) -> table [H, 2*length - 1], params) of a mechanism built through its module."""
    cfg = tiny_config(kind_block, num_heads=HEADS, d_model=HEADS * D, max_length=length + 3)
    module = make_position(cfg, 1, False)
    pos = jnp.arange(length)
    params = flax.linen.unbox(module.init(jax.random.PRNGKey(5), pos, pos)).get("params", {})

    def apply(p):
        table = module.apply({"params": p}, pos, pos).term("table").table[0]
        return jnp.broadcast_to(table, (HEADS, table.shape[-1]))

    return apply, params


def test_every_mechanism_with_padding_and_packing():
    """The Toeplitz-table mechanisms side by side as heads (one kernel compile), odd length 37 with block 16, two
    packed pieces and trailing padding: out, dq, dk, dv and each mechanism's parameter gradients."""
    length, batch = 37, 2
    built = {name: mechanism(block, length) for name, block in TABLE_MECHANISMS.items()}
    heads = HEADS * len(built)

    def build_table(params):
        return jnp.concatenate([built[name][0](params[name]) for name in built], axis=0)

    params = {name: p for name, (_, p) in built.items()}
    piece_ids = jnp.asarray([[1] * 20 + [2] * 14 + [0] * 3, [1] * 9 + [2] * 26 + [0] * 2])
    q, k, v = (random((batch, length, heads, D), seed) for seed in (0, 1, 2))
    check_against_reference((q, k, v, params), build_table,
                            dict(q_piece_ids=piece_ids, kv_piece_ids=piece_ids, block_q=16, block_k=16, block_dq=16),
                            dict(q_piece_ids=piece_ids, kv_piece_ids=piece_ids))


@pytest.mark.parametrize("table_grad,rate", [("tiles", 0.0), ("diagonals", 0.2)], ids=["tiles", "diagonals_dropout"])
def test_causal_cross_lengths_shared_clipped_table(table_grad, rate):
    """T = 37 queries at positions 13..49 over S = 50 keys, causal, a head-shared table [1, 2*20 - 1] whose
    ends are clipped, packing with per-side ids, unequal blocks (q 16, k 32); the table gradient summed per tile
    in the dq kernel or per block diagonal over the batch (diagonals above the causal limit left out), the latter
    with attention dropout (the weights the XLA path drops, recomputed in each backward kernel) and a per-head
    segment table (2 types: a rank-1 pair term)."""
    batch, t, s, offset = 2, 37, 50, 13
    q = random((batch, t, HEADS, D), 3)
    k, v = random((batch, s, HEADS, D), 4), random((batch, s, HEADS, D), 5)
    table = random((1, 39), 6)
    q_piece_ids = jnp.asarray([[1] * 10 + [2] * 27, [1] * 30 + [0] * 7])
    kv_piece_ids = jnp.asarray([[1] * 23 + [2] * 27, [1] * 45 + [0] * 5])
    # the diagonals kernel recomputes dS with the pair term too
    params, types = with_segments(table, 2 if table_grad == "diagonals" else 0, (batch, t, s), 7)
    check_against_reference((q, k, v, params), lambda p: p["table"], *with_dropout(
        rate, dict(q_piece_ids=q_piece_ids, kv_piece_ids=kv_piece_ids, causal=True, q_offset=offset, block_q=16,
                   block_k=32, block_dq=16, table_grad=table_grad),
        dict(q_piece_ids=q_piece_ids, kv_piece_ids=kv_piece_ids, causal=True, q_offset=offset)), types=types)


@pytest.mark.parametrize("group,packed,rate", [(2, True, 0.1), (4, True, 0.0), (4, False, 0.0)],
                         ids=["2_packed_dropout_segments", "4_packed", "4_causal_only"])
def test_grouped_query_blocks_give_the_same_gradients(group, packed, rate):
    """G query blocks per dq program (what long sequences get, to keep the table-gradient rows linear in T): causal
    T = 64 queries at positions 7..70 over S = 75 keys, per-head table with clipped ends, packed pieces (tiles
    skipped by their ids) or none (K and V read once per key block for the group); one case with dropout and a
    per-head segment table over 3 token types (a rank-2 pair term; its gradient from the dq kernel)."""
    batch, t, s, offset = 2, 64, 75, 7
    q = random((batch, t, HEADS, D), 20)
    k, v = random((batch, s, HEADS, D), 21), random((batch, s, HEADS, D), 22)
    table = random((HEADS, 61), 23)
    q_piece_ids = jnp.asarray([[1] * 40 + [2] * 24, [1] * 50 + [0] * 14]) if packed else None
    kv_piece_ids = jnp.asarray([[1] * 47 + [2] * 28, [1] * 60 + [0] * 15]) if packed else None
    params, types = with_segments(table, 3 if rate else 0, (batch, t, s), 24)
    check_against_reference((q, k, v, params), lambda p: p["table"], *with_dropout(
        rate, dict(q_piece_ids=q_piece_ids, kv_piece_ids=kv_piece_ids, causal=True, q_offset=offset, block_q=16,
                   block_k=16, block_dq=16, dq_group=group),
        dict(q_piece_ids=q_piece_ids, kv_piece_ids=kv_piece_ids, causal=True, q_offset=offset)), types=types)


@pytest.mark.parametrize("table_grad,window,causal,group,rate", [
    ("tiles", 40, False, 1, 0.0), ("tiles", 40, False, 2, 0.0), ("diagonals", 9, True, 1, 0.2),
    ("tiles", 3, False, 1, 0.0)], ids=["tiles", "grouped", "diagonals_causal_dropout_segments", "three_keys"])
def test_local_window_against_the_masked_reference(table_grad, window, causal, group, rate):
    """A local window (keys |k_pos - q_pos| <= window // 2) against the XLA path with the same dense mask: T = 64
    queries at positions 13..76 over S = 90 keys (T != S), packed pieces and padding, a per-head table with
    clipped ends, blocks of 16: key blocks wholly outside the window skipped on both sides (the near side too,
    whose rows of diagonal sums the dq kernel then clears), partially covered tiles masked. Window 40 (20 keys a
    side: up to four blocks of six), with one or two query blocks per dq program; window 9 with a causal mask
    (keys 0..4 behind the query: smaller than a block), the table gradient per block diagonal (diagonals outside
    the band have no tiles), attention dropout and a per-head segment table; window 3 (one key a side)."""
    batch, t, s, offset = 2, 64, 90, 13
    q = random((batch, t, HEADS, D), 40)
    k, v = random((batch, s, HEADS, D), 41), random((batch, s, HEADS, D), 42)
    table = random((HEADS, 61), 43)
    q_piece_ids = jnp.asarray([[1] * 30 + [2] * 34, [1] * 50 + [0] * 14])
    kv_piece_ids = jnp.asarray([[1] * 43 + [2] * 47, [1] * 80 + [0] * 10])
    params, types = with_segments(table, 2 if rate else 0, (batch, t, s), 44)
    masks = dict(q_piece_ids=q_piece_ids, kv_piece_ids=kv_piece_ids, causal=causal, window=window, q_offset=offset)
    check_against_reference((q, k, v, params), lambda p: p["table"], *with_dropout(
        rate, dict(masks, block_q=16, block_k=16, block_dq=16, dq_group=group, table_grad=table_grad), masks),
        types=types)


def test_window_limits_and_refusals():
    """A window that covers every offset of the call is the global layer (the same numbers, no mask arithmetic);
    window 1 or 0 sees the query's own key only (out = v there); negative windows and traced offsets are
    refused."""
    q, k, v = (random((1, 20, HEADS, D), seed) for seed in (45, 46, 47))
    table = random((HEADS, 39), 48)
    call = dict(block_q=16, block_k=16, block_dq=16)
    whole = toeplitz_attention(q, k, v, table, **call)
    for window in (38, 39, 1000):  # 19 keys a side: every offset from -19 to 19
        np.testing.assert_array_equal(toeplitz_attention(q, k, v, table, window=window, **call), whole)
    narrower = toeplitz_attention(q, k, v, table, window=36, **call)
    assert np.abs(np.asarray(narrower - whole)).max() > 1e-3
    for window in (0, 1):
        assert_close(toeplitz_attention(q, k, v, table, window=window, **call), v, 1e-6)
    with pytest.raises(ValueError, match="window=-2 must be a non-negative int"):
        toeplitz_attention(q, k, v, table, window=-2)
    with pytest.raises(ValueError, match="a causal mask or a window needs a static"):
        jax.jit(lambda offset: toeplitz_attention(q, k, v, table, window=8, q_offset=offset))(3)


def brute_force_blocks(t, s, b, q_offset, half_window, causal):
    """[T/b, S/b] bool: which (query block, key block) tiles hold an entry inside the window and causal limit."""
    offsets = np.arange(s)[None, :] - np.arange(t)[:, None] - q_offset
    visible = np.abs(offsets) <= half_window
    if causal:
        visible &= offsets <= 0
    return visible.reshape(t // b, b, s // b, b).any(axis=(1, 3))


@pytest.mark.parametrize("t,s,q_offset,window,causal", [(8192, 8192, 0, 128, False), (1024, 1024, 0, 128, True),
                                                         (512, 768, 100, 90, False), (256, 256, -40, 30, True)])
def test_a_local_layer_visits_blocks_linear_in_length(t, s, q_offset, window, causal):
    """The loop bounds of every Pallas kernel (`key_blocks`: forward and dq, per query block and per group of
    four; `query_blocks`: dK/dV) hold exactly the tiles with an entry inside the window (brute force over the
    [T, S] mask), so a local layer's work is O(T * window): at T = S = 8192, window 128 and blocks of 64, three
    key blocks of 64 per query block (2 at the ends), against 128 for a global layer."""
    from jaxpos.attention.kernels.pallas_common import PallasSpec
    from jaxpos.attention.kernels.pallas_tiles import key_blocks, query_blocks

    b = 64
    st = PallasSpec(scale=1.0, causal=causal, q_offset=q_offset, half_window=window // 2, block_q=b, block_k=b,
                    block_dq=b, dq_group=4, table_grad="tiles", t_pad=t, s_pad=s, use_q_pieces=False, masked=True,
                    skip_tiles=False, dropout_rate=0.0, interpret=True, backend="triton", num_warps=4, num_stages=3)
    want = brute_force_blocks(t, s, b, q_offset, window // 2, causal)
    nq, nk = t // b, s // b
    for qb in range(nq):
        first, end = (int(x) for x in key_blocks(qb * b, b, b, st, nk))
        live = np.flatnonzero(want[qb])
        assert (first, end) == ((live[0], live[-1] + 1) if live.size else (first, first))
    for kb in range(nk):
        first, end = (int(x) for x in query_blocks(kb * b, b, b, st, nq))
        live = np.flatnonzero(want[:, kb])
        assert (first, end) == ((live[0], live[-1] + 1) if live.size else (first, first))
    for g in range(0, nq, 4):  # a dq group's loop: the first block's first key block to the last block's end
        live = np.flatnonzero(want[g:g + 4].any(axis=0))
        assert (int(key_blocks(g * b, b, b, st, nk)[0]), int(key_blocks((g + 3) * b, b, b, st, nk)[1])) == (
            live[0], live[-1] + 1)
    if (t, s, window, causal) == (8192, 8192, 128, False):
        visited = sum(int(end) - int(first) for first, end in (key_blocks(qb * b, b, b, st, nk) for qb in range(nq)))
        assert visited == 3 * nq - 2 and nq * nk == 128 * 128


def test_table_gradient_rows_grow_linearly():
    """The automatic group keeps the table-gradient rows within twice q's size (2*T*D floats per batch and head),
    with one query block per program up to T = S = 2048 (the measured configurations); a group must divide."""
    from jaxpos.attention.kernels.pallas import default_dq_group

    b, dim = 32, 64
    assert [default_dq_group(t, t, b, dim) for t in (512, 2048, 8192, 32768)] == [1, 1, 4, 16]
    for t in (512, 2048, 8192, 32768):
        group = default_dq_group(t, t, b, dim)
        assert (t // b // group) * (t + group * b) <= 2 * t * dim
    assert default_dq_group(96, 96, 32, 64) == 1  # 3 query blocks: no power of two above 1 divides
    q = random((1, 48, HEADS, D), 24)
    with pytest.raises(ValueError, match="dq_group=2 must divide the 3 query blocks"):
        toeplitz_attention(q, q, q, random((HEADS, 95), 25), block_dq=16, block_q=16, dq_group=2)


def test_no_table_bf16_key_padding_only():
    """No table, bf16 inputs (float32 accumulation), padding keys only (no query ids), D = 8 padded to 16,
    T = 21 != S = 30, against the reference on the upcast inputs at bf16 tolerance."""
    batch, t, s, dim = 2, 21, 30, 8
    q = random((batch, t, HEADS, dim), 7, jnp.bfloat16)
    k, v = random((batch, s, HEADS, dim), 8, jnp.bfloat16), random((batch, s, HEADS, dim), 9, jnp.bfloat16)
    kv_piece_ids = jnp.asarray([[1] * 30, [1] * 17 + [0] * 13])
    check_against_reference((q, k, v, {}), lambda p: None, dict(kv_piece_ids=kv_piece_ids, block_q=16, block_k=16,
                                                                block_dq=16),
                            dict(kv_piece_ids=kv_piece_ids), rtol=2e-2)


def test_attend_pallas_path_and_fallbacks(caplog):
    """attend(implementation="pallas") equals the xla path for a table with packed causal pieces, and for a table
    plus low-rank factors read at the pieces' positions with a content scale (folded into q and k: q, k wider than
    v); terms the kernel cannot express fall back to xla with one logged note."""
    batch, length = 1, 20
    q, k, v = (random((batch, length, HEADS, D), seed) for seed in (10, 11, 12))
    pos = jnp.arange(length)
    piece_ids = jnp.asarray([[1] * 8 + [2] * 10 + [0] * 2])
    mask = AttentionMask.within_pieces(piece_ids, causal=True)
    bias = bias_terms(table=random((HEADS, 2 * length - 1), 13))
    pieces = jnp.asarray([list(range(8)) + list(range(10)) + [0, 0]])
    with_factors = bias_terms(table=bias.terms[0].table, factors=(random((HEADS, length, 3), 14),
                                                             random((HEADS, length, 3), 15)),
                                  piece_positions=(pieces, pieces), content_scale=0.5)
    valid = np.asarray(piece_ids != 0)
    with caplog.at_level(logging.WARNING, logger="jaxpos.attention.core"):
        for terms in (bias, with_factors):
            want, _ = attend(q, k, v, bias=terms, q_pos=pos, k_pos=pos, mask=mask)
            got, weights = attend(q, k, v, bias=terms, q_pos=pos, k_pos=pos, mask=mask, implementation="pallas")
            assert weights is None and got.shape == want.shape
            assert_close(np.asarray(got)[valid], np.asarray(want)[valid])
    assert "falls back" not in caplog.text

    dense = bias_terms(table=bias.terms[0].table, dense=random((HEADS, length, length), 16))
    want, _ = attend(q, k, v, bias=dense, q_pos=pos, k_pos=pos, mask=mask)
    with caplog.at_level(logging.WARNING, logger="jaxpos.attention.core"):
        for _ in range(2):
            got, _ = attend(q, k, v, bias=dense, q_pos=pos, k_pos=pos, mask=mask, implementation="pallas")
    assert_close(got, want, 1e-5)
    notes = [r.message for r in caplog.records if "falls back" in r.message]
    assert len(notes) == 1 and "dense" in notes[0]


@pytest.mark.parametrize("implementation,dtype", [("pallas", jnp.float32), ("mosaic_gpu", jnp.bfloat16)])
def test_attend_passes_a_local_window_to_the_kernels(monkeypatch, caplog, implementation, dtype):
    """attend with a local layer's mask (window 6: 3 keys a side) over packed causal pieces and a table, through
    each kernel's path: the window reaches the kernel (no hand-off to a fallback) and the outputs equal the XLA
    path's at real positions."""
    from jaxpos.attention import core

    monkeypatch.setattr(core, "_NOTED", set())
    batch, length = 1, 40
    q, k, v = (random((batch, length, HEADS, D), seed, dtype) for seed in (70, 71, 72))
    pos = jnp.arange(length)
    piece_ids = jnp.asarray([[1] * 17 + [2] * 20 + [0] * 3])
    bias = bias_terms(table=random((HEADS, 2 * length - 1), 73))
    valid = np.asarray(piece_ids != 0)
    for causal in (False, True):
        mask = AttentionMask.within_pieces(piece_ids, causal=causal, window=6)
        call = core.call_facts(q, k, bias, pos, pos, mask, True, True)
        assert call.window and core.resolve(implementation, call) == implementation
        with caplog.at_level(logging.INFO, logger="jaxpos.attention.core"):
            got, _ = attend(q, k, v, bias=bias, q_pos=pos, k_pos=pos, mask=mask, implementation=implementation)
        want, _ = attend(*(x.astype(jnp.float32) for x in (q, k, v)), bias=bias, q_pos=pos, k_pos=pos, mask=mask)
        assert_close(np.asarray(got, np.float32)[valid], np.asarray(want)[valid], 1e-4 if dtype == jnp.float32
                     else 2e-2)
        narrow, _ = attend(q, k, v, bias=bias, q_pos=pos, k_pos=pos, implementation=implementation,
                           mask=AttentionMask.within_pieces(piece_ids, causal=causal, window=4))
        assert np.abs(np.asarray(narrow, np.float32) - np.asarray(got, np.float32))[valid].max() > 0.05
    assert "falls back" not in caplog.text and "hands this call" not in caplog.text


def test_fallback_takes_cudnn_only_where_it_can_train(monkeypatch):
    """On a GPU, calls the kernel cannot take go to cuDNN only with half-precision inputs, no Shaw terms, no
    dropout and even lengths (cuDNN trains with a bias only then); else to the XLA reference."""
    from jaxpos.attention.core import call_facts, resolve

    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    dense = bias_terms(dense=jnp.zeros((HEADS, 8, 8)))

    def choice(t=8, s=8, dtype=jnp.bfloat16, bias=dense, rng=None, rate=0.0):
        q, k = jnp.zeros((1, t, HEADS, D), dtype), jnp.zeros((1, s, HEADS, D), dtype)
        return resolve("pallas", call_facts(q, k, bias, jnp.arange(t), jnp.arange(s), None, True, True, rng, rate))

    assert choice() == "cudnn"
    assert choice(t=7) == choice(s=9) == choice(dtype=jnp.float32) == "xla"
    assert choice(rng=jax.random.PRNGKey(0), rate=0.1) == "xla"
    assert choice(bias=bias_terms(rel_keys=jnp.zeros((3, D)))) == "xla"
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    assert choice() == "xla"


def lowered_text(platform, backend, grad, **kwargs):
    """The StableHLO of the kernel (forward, or forward and backward; with dropout) lowered for `platform` from
    this host."""
    shape = jax.ShapeDtypeStruct((2, 256, 4, 64), jnp.bfloat16)
    table = jax.ShapeDtypeStruct((4, 511), jnp.float32)
    piece_ids = jax.ShapeDtypeStruct((2, 256), jnp.int32)

    def forward(q, k, v, table, piece_ids):
        return toeplitz_attention(q, k, v, table, q_piece_ids=piece_ids, kv_piece_ids=piece_ids, causal=True,
                                  interpret=False, backend=backend, dropout_rate=0.1, dropout_seed=7, **kwargs)

    def both(*args):
        return jax.grad(lambda *a: forward(*a).astype(jnp.float32).sum(), argnums=(0, 1, 2, 3))(*args)

    fn = both if grad else forward
    return jax.jit(fn).trace(shape, shape, shape, table, piece_ids).lower(lowering_platforms=(platform,)).as_text()


def triton_lowering_available():
    try:
        from jax._src.lib import triton  # noqa: F401  (the Triton MLIR dialect shipped with jaxlib)
        from jax.experimental.pallas import triton as plgpu  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not triton_lowering_available(), reason="this jaxlib has no Pallas Triton lowering")
@pytest.mark.parametrize("grad,kwargs,kernels", [(False, {}, 1), (True, {}, 3), (True, dict(dq_group=2), 3),
                                                 (True, dict(table_grad="diagonals"), 4),
                                                 (True, dict(window=100, dq_group=2, table_grad="diagonals"), 4)],
                         ids=["forward", "forward_backward", "forward_backward_grouped", "table_grad_diagonals",
                              "window"])
def test_lowers_for_gpu_triton(grad, kwargs, kernels):
    """Lowering only (no GPU here): the kernels become Triton custom calls in the CUDA module (one or two query
    blocks per dq program; the table gradient in the dq kernel or in a kernel of its own; a local window beside
    the causal mask: loop bounds from both sides)."""
    text = lowered_text("cuda", "triton", grad, **kwargs)
    assert text.count("__gpu$xla.gpu.triton") == kernels


@pytest.mark.parametrize("kwargs", [{}, dict(window=100)], ids=["causal", "causal_window"])
def test_lowers_for_tpu(kwargs):
    """Lowering only (no TPU here): the three kernels become Mosaic custom calls (with a local window too: loops
    that start past the first block). This checks the Pallas-to-Mosaic lowering and the block shapes; Mosaic's own
    compilation (layouts, VMEM) runs on a TPU and is not checked."""
    text = lowered_text("tpu", "mosaic_tpu", grad=True, **kwargs)
    assert text.count("tpu_custom_call") == 3


def test_mosaic_tpu_kernels_in_the_tpu_interpreter():
    """The Mosaic variant (heads-major layout, bias tile and diagonal sums by strided rolls of diagonal windows,
    the table gradient accumulated in one resident block per head over the batch and the query groups, tiles
    skipped by id ranges read from SMEM) in the TPU interpreter, which also faults reads out of bounds: causal
    T = 400 queries at positions 100..499 over S = 300 keys (4 x 3 blocks of 128: 6 block diagonals), batch 2 with
    packed pieces and padding (tiles of disjoint pieces skipped), a per-head table with clipped ends, two query
    blocks per dq program (two groups), attention dropout, a per-head segment table over 2 types."""
    batch, t, s, offset = 2, 400, 300, 100
    q = random((batch, t, HEADS, D), 30)
    k, v = random((batch, s, HEADS, D), 31), random((batch, s, HEADS, D), 32)
    table = random((HEADS, 301), 33)
    q_piece_ids = jnp.asarray([[1] * 190 + [2] * 210, [1] * 400])
    kv_piece_ids = jnp.asarray([[1] * 150 + [2] * 140 + [0] * 10, [1] * 280 + [0] * 20])
    params, types = with_segments(table, 2, (batch, t, s), 34)
    check_against_reference((q, k, v, params), lambda p: p["table"], *with_dropout(
        0.1, dict(q_piece_ids=q_piece_ids, kv_piece_ids=kv_piece_ids, causal=True, q_offset=offset,
                  backend="mosaic_tpu", dq_group=2, interpret=True),
        dict(q_piece_ids=q_piece_ids, kv_piece_ids=kv_piece_ids, causal=True, q_offset=offset)), types=types)
    with pytest.raises(ValueError, match="Mosaic TPU blocks must be equal multiples of 128"):
        toeplitz_attention(q, k, v, table, backend="mosaic_tpu", block_q=64)
    with pytest.raises(ValueError, match="table_grad='diagonals'; choose tiles or"):
        toeplitz_attention(q, k, v, table, backend="mosaic_tpu", table_grad="diagonals")


def test_mosaic_tpu_local_window_in_the_tpu_interpreter():
    """The Mosaic variant with a local window: T = 512 queries at positions 60..571 over S = 400 keys, window 200
    (100 keys a side: each query block of 128 sees two or three of the four key blocks, the near side skipped
    too), packed pieces and padding (id ranges from SMEM), a per-head table, two query blocks per dq program whose
    rows of diagonal sums go into the head's resident gradient block."""
    batch, t, s, offset = 1, 512, 400, 60
    q = random((batch, t, HEADS, D), 35)
    k, v = random((batch, s, HEADS, D), 36), random((batch, s, HEADS, D), 37)
    table = random((HEADS, 401), 38)
    q_piece_ids = jnp.asarray([[1] * 300 + [2] * 212])
    kv_piece_ids = jnp.asarray([[1] * 250 + [2] * 130 + [0] * 20])
    masks = dict(q_piece_ids=q_piece_ids, kv_piece_ids=kv_piece_ids, window=200, q_offset=offset)
    check_against_reference((q, k, v, dict(table=table)), lambda p: p["table"],
                            dict(masks, backend="mosaic_tpu", dq_group=2, interpret=True), masks)
