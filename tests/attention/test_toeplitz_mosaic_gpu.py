"""The Mosaic GPU (Hopper) Toeplitz kernels against the XLA reference `attend`, and their pieces against brute force.

On the CPU the kernels run in Pallas's Mosaic GPU interpreter: the three warpgroups as threads with simulated
shared memory, TMA copies and barriers, and a race detector that fails the call (`mosaic_gpu_common.run_kernel`).
On a GPU (`JAX_PLATFORMS=cuda pytest tests/attention/test_toeplitz_mosaic_gpu.py`) the same tests run the compiled
kernels.
Inputs are bf16 (f16 once), so outputs and gradients are compared at bf16 tolerances: what would catch a wrong
tile, base, mask or diagonal (errors of order one) but not bf16 rounding. Each call compiles four kernels in the
interpreter and simulates every pipeline step through host callbacks (tests/conftest.py keeps jax 0.10 from
compiling each warpgroup's program anew), so the shapes are the smallest that still have three blocks a side (a
pipeline slot refilled) where it matters.
"""

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.attention.kernels import mosaic_gpu as mgpu
from jaxpos.attention.kernels import toeplitz_attention
from jaxpos.attention.kernels.mosaic_gpu_common import (LOG2E, NEG, MosaicGpuSpec, check_interpreter_threads,
                                                        pipeline_stages)
from jaxpos.attention.kernels.mosaic_gpu_tiles import (diagonal_tiles, diagonal_visits, live_tiles,
                                                       live_within_limits, table_gradient, visit_lists)
from tests.attention.test_toeplitz_kernel import (DROPOUT_RNG, HEADS, check_against_reference, mechanism, random,
                                                  with_dropout)

RTOL = 2e-2  # bf16 operands: ~4e-3 measured on every output and gradient


def bf16(*arrays):
    return tuple(x.astype(jnp.bfloat16) for x in arrays)


@pytest.mark.long
def test_tisa_and_alibi_heads_padded_and_packed_with_segments(monkeypatch):
    """A TISA head and an ALiBi head (whose table grows with the offset: the per-tile base keeps it exact) over
    three blocks a side (T = S = 300: every kernel refills a pipeline slot), two packed pieces per row with
    trailing padding, and a per-head segment table over three token types (a rank-2 pair term, in every kernel's
    tiles): out, dq, dk, dv and the parameter gradients of both mechanisms and of the segment table (through du
    from the dQ kernel). (T5, DIET-Rel and the attenuated offset form reach the kernels the same way, as an
    [H|1, W] table.) The dK/dV kernel takes each query block and the dQ kernel each key block in two pieces, as
    at head width 128 (the table's tile, the ids, u and w read a piece at a time; du sums both pieces)."""
    monkeypatch.setattr(mgpu, "block_pieces", lambda *args: 2)
    length = 300
    (tisa, tisa_params), (alibi, alibi_params) = (mechanism(dict(kind=kind), length) for kind in ("tisa", "alibi"))

    def build_table(params):
        return jnp.concatenate([tisa(params["tisa"])[:1], alibi(params["alibi"])[1:]], axis=0)

    piece_ids = jnp.asarray([[1] * 170 + [2] * 110 + [0] * 20])
    types = jnp.asarray(np.random.default_rng(3).integers(0, 3, (1, length)))
    q, k, v = bf16(*(random((1, length, HEADS, 16), seed) for seed in (0, 1, 2)))
    params = dict(tisa=tisa_params, alibi=alibi_params, segment=random((HEADS, 3, 3), 7))
    check_against_reference((q, k, v, params), build_table,
                            dict(q_piece_ids=piece_ids, kv_piece_ids=piece_ids, backend="mosaic_gpu"),
                            dict(q_piece_ids=piece_ids, kv_piece_ids=piece_ids), rtol=RTOL, types=(types, types))


def test_causal_cross_lengths_shared_clipped_table_key_padding_dropout(monkeypatch):
    """Causal T = 130 queries at positions 170..299 over S = 300 keys (decoder-style, T != S), one table for both
    heads and shorter than the offsets (its ends clip), the last keys padding (key ids only), attention dropout
    0.3: tiles past the causal limit skipped, diagonal tiles masked inside, the table-gradient kernel summing both
    heads into each block diagonal, and every kernel dropping the weights the XLA path drops (the keep mask hashed
    from each tile's query rows and key indices: in the dK/dV kernel's transposed tiles too). The table gradient's
    walk of each diagonal is cut into 3 CTAs, over 4 or 2 (head, tile) pairs: 2 + 2 + 0 and 1 + 1 + 0. The dK/dV
    and dQ kernels take each streamed block in two pieces, as at head width 128 (each piece hashes its own keep
    mask)."""
    monkeypatch.setattr(mgpu, "table_gradient_splits", lambda *args: 3)
    monkeypatch.setattr(mgpu, "block_pieces", lambda *args: 2)
    t, s, offset = 130, 300, 170
    q = bf16(random((1, t, HEADS, 16), 3))[0]
    k, v = bf16(random((1, s, HEADS, 16), 4), random((1, s, HEADS, 16), 5))
    kv_piece_ids = jnp.asarray([[1] * 280 + [0] * 20])
    check_against_reference((q, k, v, dict(table=random((1, 61), 9))), lambda p: p["table"],
                            *with_dropout(0.3, dict(kv_piece_ids=kv_piece_ids, causal=True, q_offset=offset,
                                                    backend="mosaic_gpu"),
                                          dict(kv_piece_ids=kv_piece_ids, causal=True, q_offset=offset)), rtol=RTOL)


@pytest.mark.parametrize("dtype", [pytest.param(jnp.bfloat16, marks=pytest.mark.slow), jnp.float16])
def test_causal_limit_in_the_tiles_only_rows_that_see_no_key(dtype):
    """Causal T = S = 256 with a T5 table and no ids and no padding: the causal limit is the only mask, and it rides
    in the tiles (NEG past the limit in bf16, -inf in f16), so no kernel computes a mask. q_offset = -100 leaves
    the first 100 query rows with no visible key: out 0 and zero gradients from them, not NaN."""
    length = 256
    t5, t5_params = mechanism(dict(kind="t5"), length)
    q, k, v = (random((1, length, HEADS, 16), seed).astype(dtype) for seed in (20, 21, 22))
    check_against_reference((q, k, v, t5_params), t5, dict(causal=True, q_offset=-100, backend="mosaic_gpu"),
                            dict(causal=True, q_offset=-100), rtol=RTOL)


@pytest.mark.parametrize("pieces", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_no_table_causal_wide_qk_f16(monkeypatch, pieces):
    """No table, f16, q and k 80 channels wide (folded factors: padded to 128) over v of 48 (padded to 64), T = 200
    queries at positions 126.. over S = 330 keys, causal (computed in the kernels: no table carries it) and the
    padded keys, an explicit scale: out and dq, dk, dv of sum(out * g) against the einsum formula in float32.
    Every kernel's walk has tiles wholly inside the causal limit (no mask arithmetic) and tiles across it, and
    some CTA walks only one kind (`walk`); a tile one key past the limit is walked as one across it. Streamed
    blocks whole, and in two pieces each masked on its own, as at head width 128 (`block_pieces`)."""
    monkeypatch.setattr(mgpu, "block_pieces", lambda *args: pieces)
    q = random((1, 200, 1, 80), 10).astype(jnp.float16)
    k = random((1, 330, 1, 80), 11).astype(jnp.float16)
    v = random((1, 330, 1, 48), 12).astype(jnp.float16)
    g = random((1, 200, 1, 48), 13)
    offset = 126  # some tiles end one key past the causal limit: keys 127 and 255 for queries 0 and 128
    k = k.at[0, (127, 255), 0].set(q[0, 0, 0] + q[0, 128, 0])  # so that a leak of those two keys weighs

    def kernel(q, k, v):
        return toeplitz_attention(q, k, v, None, scale=0.1, causal=True, q_offset=offset, backend="mosaic_gpu")

    def reference(q, k, v):
        q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
        visible = jnp.arange(330)[None, :] <= jnp.arange(200)[:, None] + offset
        logits = jnp.where(visible, jnp.einsum("bthd,bshd->bhts", q, k) * 0.1, -jnp.inf)
        return jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(logits, axis=-1), v)

    def grads(fn):
        return jax.value_and_grad(lambda *x: jnp.sum(fn(*x).astype(jnp.float32) * g), argnums=(0, 1, 2))(q, k, v)

    np.testing.assert_allclose(np.asarray(kernel(q, k, v), np.float32), reference(q, k, v), atol=RTOL)
    for got, want in zip(jax.tree.leaves(grads(kernel)), jax.tree.leaves(grads(reference))):
        got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
        assert np.linalg.norm(got - want) <= RTOL * np.linalg.norm(want)


def test_local_window_in_the_tiles_packed_padded_with_segments(monkeypatch):
    """A local window with a table, where it rides in the tiles like the causal limit (NEG outside it): T = 300
    queries at positions 40..339 over S = 384 keys (T != S), window 150 (75 keys a side: of the 3 x 3 tiles the
    two corners hold no visible key and are skipped in every kernel, and the table gradient has no tiles on
    their block diagonals), two packed pieces and trailing padding, a per-head table, a per-head segment table
    over 2 types: out, dq, dk, dv and the gradients of the table and the segment table against the XLA path with
    the same dense mask. Backward blocks taken in two pieces, as at head width 128."""
    monkeypatch.setattr(mgpu, "block_pieces", lambda *args: 2)
    t, s, offset = 300, 384, 40
    q = bf16(random((1, t, HEADS, 16), 50))[0]
    k, v = bf16(random((1, s, HEADS, 16), 51), random((1, s, HEADS, 16), 52))
    q_piece_ids = jnp.asarray([[1] * 180 + [2] * 120])
    kv_piece_ids = jnp.asarray([[1] * 210 + [2] * 150 + [0] * 24])
    types = tuple(jnp.asarray(np.random.default_rng(53 + i).integers(0, 2, (1, n))) for i, n in enumerate((t, s)))
    masks = dict(q_piece_ids=q_piece_ids, kv_piece_ids=kv_piece_ids, window=150, q_offset=offset)
    params = dict(table=random((HEADS, 2 * s - 1), 54), segment=random((HEADS, 2, 2), 55))
    check_against_reference((q, k, v, params), lambda p: p["table"], dict(masks, backend="mosaic_gpu"), masks,
                            rtol=RTOL, types=types)


def test_causal_local_window_shared_table_key_padding_dropout(monkeypatch):
    """Causal and windowed at once (ModernBERT's local layers in a decoder: keys 0..60 behind the query), T = S =
    384, a head-shared table, key padding, attention dropout 0.2, the table gradient's diagonals cut over 2 CTAs:
    the causal limit and the window's near side both in the tiles."""
    monkeypatch.setattr(mgpu, "table_gradient_splits", lambda *args: 2)
    length = 384
    q, k, v = bf16(*(random((1, length, HEADS, 16), seed) for seed in (56, 57, 58)))
    kv_piece_ids = jnp.asarray([[1] * 350 + [0] * 34])
    masks = dict(kv_piece_ids=kv_piece_ids, causal=True, window=121)
    check_against_reference((q, k, v, dict(table=random((1, 2 * length - 1), 59))), lambda p: p["table"],
                            *with_dropout(0.2, dict(masks, backend="mosaic_gpu"), masks), rtol=RTOL)


@pytest.mark.parametrize("causal,window,pieces", [(False, 400, 1),
                                                  pytest.param(True, 500, 2, marks=pytest.mark.slow)],
                         ids=["window", "causal_window_pieces"])  # causal windows: the shared-table test above
def test_no_table_local_window_computed_in_the_kernels(monkeypatch, causal, window, pieces):
    """No table, so the window (and the causal limit) are computed in the kernels from iotas: T = S = 512 in
    f16. Each consumer's visit list holds tiles across the window's near side, then tiles wholly inside (no mask
    arithmetic), then tiles across the far side or the causal limit, in that order along key blocks (forward,
    dQ) and the reverse along query blocks (dK/dV), and some consumers walk all three runs (`walk`); window 400
    (200 keys a side), or causal with window 500 (250 keys behind), streamed blocks whole or in two pieces."""
    monkeypatch.setattr(mgpu, "block_pieces", lambda *args: pieces)
    length = 512
    q, k, v = (random((1, length, HEADS, 16), seed).astype(jnp.float16) for seed in (60, 61, 62))
    masks = dict(causal=causal, window=window)
    check_against_reference((q, k, v, {}), lambda p: None, dict(masks, backend="mosaic_gpu"), masks, rtol=RTOL)


def test_model_through_mosaic_gpu_matches_xla(caplog):
    """A one-layer bf16 TISA model with per-head segment attention (DIET's recipe) and attention_impl="mosaic_gpu"
    against "xla", training with attention dropout: the model hands the kernel its piece ids (two packed pieces,
    padding), the layer's table, the segment table's pair term over the token types and the dropout keys of its
    rows; logits at real positions and every parameter gradient agree at bf16 tolerance, and no call fell back."""
    from jaxpos.models import BertForMaskedLM
    from tests.helpers import tiny_config

    ids = jax.random.randint(jax.random.PRNGKey(0), (2, 13), 1, 61)
    piece_ids = jnp.ones((2, 13), jnp.int32).at[1, 6:].set(2).at[0, 10:].set(0)
    types = jnp.zeros((2, 13), jnp.int32).at[:, 4:9].set(1)  # sentence A / B
    real = (piece_ids != 0)[..., None]
    weight = jax.random.normal(jax.random.PRNGKey(2), (2, 13, 61)) * real
    results = []
    caplog.set_level(logging.WARNING, logger="jaxpos.attention.core")
    for impl in ("xla", "mosaic_gpu"):
        model = BertForMaskedLM(tiny_config(dict(kind="tisa", segment="per_head"), attention_impl=impl, num_layers=1,
                                            num_heads=2, dtype="bfloat16", attention_dropout=0.2))
        params = model.init(jax.random.PRNGKey(1), ids)["params"]

        def loss(p):
            logits = model.apply({"params": p}, ids, piece_ids=piece_ids, token_types=types, deterministic=False,
                                 rngs={"dropout": DROPOUT_RNG}).astype(jnp.float32)
            return jnp.sum(logits * weight), logits

        (_, logits), grads = jax.value_and_grad(loss, has_aux=True)(params)
        results.append((logits * real, grads))
    assert "falls back" not in caplog.text and "hands this call" not in caplog.text
    (want, want_grads), (got, got_grads) = results
    np.testing.assert_allclose(got, want, atol=RTOL * float(np.abs(want).max()))
    want_leaves = dict(jax.tree_util.tree_leaves_with_path(want_grads))
    floor = RTOL * max(float(np.linalg.norm(np.asarray(w, np.float32))) for w in want_leaves.values())
    for path, g in jax.tree_util.tree_leaves_with_path(got_grads):  # floor: leaves whose true gradient is ~0
        w = np.asarray(want_leaves[path], np.float32)  # (the key bias: softmax ignores a constant per row)
        assert np.linalg.norm(np.asarray(g, np.float32) - w) <= 3 * RTOL * np.linalg.norm(w) + floor, \
            jax.tree_util.keystr(path)


# --- the pieces computed in XLA, against brute force ------------------------------------------------------------

def test_diagonal_tiles_and_their_gradient():
    """Tile d [r, c] + base d = ext[d*128 + 127 + c - r] * log2(e) (bf16 residuals around the main diagonal), and
    `table_gradient` is the adjoint of that expansion: <tiles(ext), G> = <ext, grad(G)> for any G."""
    rng = np.random.default_rng(0)
    ext = jnp.asarray(rng.normal(size=(2, 512)) * 50, jnp.float32)  # 3 block diagonals of 128
    tiles, bases = diagonal_tiles(ext, jnp.bfloat16)
    assert tiles.shape == (2, 3, 128, 128) and bases.shape == (2, 32)
    r, c = np.meshgrid(np.arange(128), np.arange(128), indexing="ij")
    for d in range(3):
        want = np.asarray(ext)[:, d * 128 + 127 + c - r] * LOG2E
        got = np.asarray(tiles[:, d], np.float32) + np.asarray(bases[:, d])[:, None, None]
        np.testing.assert_allclose(got, want, rtol=0, atol=np.abs(want - want[:, :1, :1]).max() * 2**-8)
        np.testing.assert_array_equal(np.asarray(tiles[:, d]).diagonal(axis1=1, axis2=2), 0.0)
    limit = 300  # a causal limit: entries of ext index > 300 are NEG, the rest and the bases unchanged
    causal_tiles, causal_bases = diagonal_tiles(ext, jnp.bfloat16, limit)
    np.testing.assert_array_equal(causal_bases, bases)
    index = np.arange(3)[:, None, None] * 128 + 127 + c - r
    np.testing.assert_array_equal(np.asarray(causal_tiles, np.float32),
                                  np.where(index <= limit, np.asarray(tiles, np.float32), np.float32(
                                      jnp.asarray(NEG, jnp.bfloat16))))
    window_tiles, _ = diagonal_tiles(ext, jnp.bfloat16, 300, 200)  # a window: entries of index < 200 NEG too
    np.testing.assert_array_equal(np.asarray(window_tiles, np.float32),
                                  np.where(index >= 200, np.asarray(causal_tiles, np.float32), np.float32(
                                      jnp.asarray(NEG, jnp.bfloat16))))
    grads = rng.normal(size=(2, 3, 128, 128))
    d_ext = np.zeros((2, 512))
    for d in range(3):  # brute force: every tile entry back onto its offset
        np.add.at(d_ext, (slice(None), d * 128 + 127 + c - r), grads[:, d])
    np.testing.assert_allclose(table_gradient(jnp.asarray(grads, jnp.float32)), d_ext, rtol=1e-5, atol=1e-4)
    # a band of block diagonals (a local layer's): its tiles alone, and its gradient placed at its offsets
    band, band_bases = diagonal_tiles(ext, jnp.bfloat16, diagonals=(1, 2))
    np.testing.assert_array_equal(band, tiles[:, 1:])
    np.testing.assert_array_equal(band_bases[:, :2], bases[:, 1:3])
    d_band = np.zeros((2, 512))
    for d in (1, 2):
        np.add.at(d_band, (slice(None), d * 128 + 127 + c - r), grads[:, d])
    np.testing.assert_allclose(table_gradient(jnp.asarray(grads[:, 1:], jnp.float32), 1, 512), d_band, rtol=1e-5,
                               atol=1e-4)


@pytest.mark.parametrize("batch,length,heads,group,causal", [
    (32, 512, 12, 1, False), (8, 2048, 12, 1, False), (2, 8192, 12, 1, False), (32, 512, 12, 12, False),
    (32, 512, 12, 1, True), (1, 300, 2, 2, True)])
def test_table_gradient_grid_keeps_every_sm_busy(batch, length, heads, group, causal):
    """The table-gradient kernel's CTAs per diagonal: the longest diagonal's pieces hold at most half of an H100
    SM's share of all tiles (counted by brute force over the tile grid), or one tile each; no more pieces than
    needed for that (one fewer would break it)."""
    padded = -(-length // 128) * 128
    st = MosaicGpuSpec(scale=1.0, causal=causal, q_offset=0, t_pad=padded, s_pad=padded, use_q_ids=False,
                       masked=False, interpret=False)
    blocks = padded // 128
    live = {(qc, kc) for qc in range(blocks) for kc in range(blocks) if not causal or kc * 128 <= qc * 128 + 127}
    longest = max(sum((qc, qc + d) in live for qc in range(blocks)) for d in range(1 - blocks, blocks)) * batch * group
    share = len(live) * batch * heads / 132

    def fits(splits):
        return -(-longest // splits) <= share / 2 or splits >= longest

    splits = mgpu.table_gradient_splits(batch, heads, group, st)
    assert fits(splits) and (splits == 1 or not fits(splits - 1))


def interpreted_spec(t, s, use_q_ids, causal, q_offset=0, half_window=None):
    return MosaicGpuSpec(scale=1.0, causal=causal, q_offset=q_offset, t_pad=t, s_pad=s, use_q_ids=use_q_ids,
                         masked=True, interpret=True, half_window=half_window)


@pytest.mark.parametrize("use_q_ids,causal,q_offset,half_window", [
    (True, False, 0, None), (False, True, 40, None), (True, True, -130, None), (False, False, 70, 100),
    (False, True, -30, 200), (True, False, -100, 0)])
def test_live_tiles_and_visit_lists(use_q_ids, causal, q_offset, half_window):
    """A tile is visited exactly when some entry of it is visible (brute force over the [T, S] mask), in order,
    by the per-CTA lists of the forward/dQ (key blocks) and dK/dV (query blocks) kernels and by the per-diagonal
    lists of the table-gradient kernel: with causal limits, windows (100 and 200 keys a side, and the query's
    own key only) and both."""
    rng = np.random.default_rng(1)
    t, s, batch = 384, 512, 3
    q_pieces = np.sort(rng.integers(0, 4, (batch, t)), axis=1)  # packed pieces 1..3 after some padding (0)
    k_pieces = np.sort(rng.integers(0, 4, (batch, s)), axis=1)
    k_pieces[2] = 0  # a row of padding only: no tile visited
    st = interpreted_spec(t, s, use_q_ids, causal, q_offset, half_window)
    visible = k_pieces[:, None, :] != 0
    if use_q_ids:
        visible = visible & (q_pieces[:, :, None] == k_pieces[:, None, :])
    offsets = np.arange(s)[None, None, :] - np.arange(t)[None, :, None] - q_offset  # k_pos - q_pos
    if causal:
        visible = visible & (offsets <= 0)
    if half_window is not None:
        visible = visible & (np.abs(offsets) <= half_window)
    want = visible.reshape(batch, t // 128, 128, s // 128, 128).any(axis=(2, 4))
    live = live_tiles(jnp.asarray(q_pieces, jnp.int32), jnp.asarray(k_pieces, jnp.int32), st)
    live_np = np.asarray(live)
    assert np.all(live_np >= want)  # no tile with a visible entry is skipped
    if not use_q_ids:  # padding and the limits each decide exactly; id ranges may only over-approximate
        keys = (k_pieces != 0).reshape(batch, 1, s // 128, 128).any(axis=-1)
        within = np.ones((t, s), bool)
        if causal:
            within &= offsets[0] <= 0
        if half_window is not None:
            within &= np.abs(offsets[0]) <= half_window
        np.testing.assert_array_equal(live_np, keys & within.reshape(t // 128, 128, s // 128, 128).any(axis=(1, 3)))
    for lists, live_rows in ((visit_lists(live), np.asarray(live)),
                             (visit_lists(jnp.swapaxes(live, 1, 2)), np.asarray(live).swapaxes(1, 2))):
        assert lists.shape[-1] % 32 == 0
        for index in np.ndindex(live_rows.shape[:-1]):
            row = np.asarray(lists[index])
            assert list(row[1:1 + row[0]]) == list(np.flatnonzero(live_rows[index]))
    diagonal = diagonal_visits(live, st)
    first, count = st.diagonals  # the block diagonals the limits leave a visible entry on: the first and last do
    nq = t // 128
    assert diagonal.shape[0] == count and all(np.trace(live_within_limits(st), offset=d - (nq - 1)) > 0
                                              for d in (first, first + count - 1))
    for d in range(nq + s // 128 - 1):
        want_entries = [b * nq + qc for b in range(batch) for qc in range(nq)
                        if 0 <= qc + d - (nq - 1) < s // 128 and live_np[b, qc, qc + d - (nq - 1)]]
        if first <= d < first + count:
            row = np.asarray(diagonal[d - first])
            assert list(row[1:1 + row[0]]) == want_entries
        else:  # outside the band: no tile of the table, and none to walk
            assert not want_entries


@pytest.mark.parametrize("length", [1024, 4096, 8192])
def test_a_local_layer_walks_blocks_linear_in_length(length):
    """The O(T * window) claim, from the visit lists the kernels walk: at window 128 (64 keys a side) every query
    block of 128 visits the key blocks before, at and after it (2 at the ends), 3T/128 - 2 tiles in all, for the
    forward and dQ (key blocks per query block) and for dK/dV (query blocks per key block), where a global layer
    visits (T/128)^2 (at T = 8192: 190 against 4096); the table's tiles and the table-gradient kernel's grid cover
    3 of the 2T/128 - 1 block diagonals. Each list against a brute-force count over the [T, S] mask's tiles."""
    from tests.attention.test_toeplitz_kernel import brute_force_blocks

    nq = length // 128
    st = MosaicGpuSpec(scale=1.0, causal=False, q_offset=0, t_pad=length, s_pad=length, use_q_ids=False,
                       masked=False, interpret=False, half_window=64)
    ids = jnp.ones((1, length), jnp.int32)
    live = live_tiles(ids, ids, st)
    want = brute_force_blocks(length, length, 128, 0, 64, False)
    forward, dkdv = visit_lists(live)[0, :, 0], visit_lists(jnp.swapaxes(live, 1, 2))[0, :, 0]
    np.testing.assert_array_equal(forward, want.sum(axis=1))
    np.testing.assert_array_equal(dkdv, want.sum(axis=0))
    assert int(forward.sum()) == int(dkdv.sum()) == 3 * nq - 2
    assert st.diagonals == (nq - 2, 3)  # of the 2 nq - 1 block diagonals: the table's tiles and their gradient
    np.testing.assert_array_equal(diagonal_visits(live, st)[:, 0], [np.trace(want, offset=d) for d in (-1, 0, 1)])
    whole = dataclasses.replace(st, half_window=None)
    assert int(visit_lists(live_tiles(ids, ids, whole))[0, :, 0].sum()) == nq * nq


# --- what the compiled path is checked by on the CPU: its CUDA lowering --------------------------------------------

@pytest.mark.parametrize("table,width,width_v,rate,rank,window,kernels", [
    (True, 64, 64, 0.0, 0, None, 4), (False, 128, 64, 0.0, 0, None, 3), (True, 128, 128, 0.0, 0, None, 4),
    (True, 64, 64, 0.1, 1, None, 4), (True, 128, 128, 0.1, 1, None, 4), (True, 64, 64, 0.0, 0, 128, 4),
    (False, 64, 64, 0.0, 0, 300, 3)],
    ids=["table", "no_table_wide", "table_wide", "table_dropout_pair", "wide_dropout_pair", "table_window",
         "no_table_window"])
def test_lowers_for_cuda(table, width, width_v, rate, rank, window, kernels):
    """Lowering for CUDA from this host runs Mosaic GPU's layout inference and shared-memory accounting on every
    kernel (forward, dQ, dK/dV, and with a table the table gradient): they become mosaic_gpu custom calls. With
    dropout, the keep-mask hash (int32 multiply, xor, shifts) runs on the wgmma register layout; with a pair term
    (rank 1), its vectors are broadcast into the tiles and du is a row sum. Head width 128 with a table is where
    the forward's two stages would exceed shared memory by Mosaic's own count (SMEM_HEADROOM). At head width 128
    the dQ and dK/dV kernels take their streamed blocks in [64, 64] pieces (column slices of the tiles, and of the
    ids, dropout keys and pair vectors, in the wgmma layouts). A local window beside the causal mask rides in the
    table's tiles, or without a table is computed in the kernels (visit lists walked in three runs: across the
    window's near side, wholly inside, across the causal limit)."""
    shape = jax.ShapeDtypeStruct((2, 384, 4, width), jnp.bfloat16)
    v_shape = jax.ShapeDtypeStruct((2, 384, 4, width_v), jnp.bfloat16)
    piece_ids = jax.ShapeDtypeStruct((2, 384), jnp.int32)
    table_shape = jax.ShapeDtypeStruct((4, 767), jnp.float32) if table else None

    def loss(q, k, v, table, piece_ids):
        pair = (jnp.ones(q.shape[:3] + (rank,)), jnp.ones(k.shape[:2] + (rank,))) if rank else None
        out = toeplitz_attention(q, k, v, table, q_piece_ids=piece_ids, kv_piece_ids=piece_ids, causal=True,
                                 window=window, backend="mosaic_gpu", interpret=False, dropout_rate=rate,
                                 dropout_seed=jnp.int32(5) if rate else None, pair_bias=pair)
        return jnp.sum(out.astype(jnp.float32))

    argnums = (0, 1, 2, 3) if table else (0, 1, 2)
    lowered = jax.jit(jax.grad(loss, argnums=argnums)).trace(shape, shape, v_shape, table_shape, piece_ids)
    text = lowered.lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("custom_call @mosaic_gpu") == kernels


def test_calls_it_does_not_take_are_refused_by_name(monkeypatch):
    q = random((1, 16, 1, 64), 0, jnp.bfloat16)
    table = random((1, 31), 1)
    with pytest.raises(ValueError, match="does not take float32 inputs"):
        toeplitz_attention(q.astype(jnp.float32), q, q, table, backend="mosaic_gpu")
    with pytest.raises(ValueError, match="drop block_q"):
        toeplitz_attention(q, q, q, table, backend="mosaic_gpu", block_q=64)
    with pytest.raises(ValueError, match="more than .*head widths too large"):
        pipeline_stages(per_stage=200 * 1024, fixed=64 * 1024, what="forward")
    monkeypatch.setenv("PJRT_NPROC", "2")
    with pytest.raises(RuntimeError, match="needs 3 CPU threads"):
        check_interpreter_threads()


def test_only_hopper_gpus_and_the_cpu_interpreter(monkeypatch):
    """attention_impl="mosaic_gpu" hands calls to the Triton kernel on GPUs without wgmma (an A100), on TPUs, and
    on CPU meshes (where the interpreter would run kernels on several devices at once)."""
    class Device:
        def __init__(self, capability):
            self.compute_capability = capability

    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")  # the same checks when this suite runs on a GPU
    assert mgpu.unsupported(jnp.bfloat16) is None  # the CPU: the interpreter
    mesh = jax.sharding.AbstractMesh((2, 1), ("data", "tensor"))
    with jax.sharding.use_abstract_mesh(mesh):  # concurrent kernels on two devices: not in the interpreter
        assert "a mesh of 2 CPU devices" in mgpu.unsupported(jnp.bfloat16)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    for capability, reason in (("9.0", None), ("8.0", "compute capability 8.0 (wgmma needs Hopper")):
        monkeypatch.setattr(jax, "devices", lambda *a, c=capability: [Device(c)])
        got = mgpu.unsupported(jnp.bfloat16)
        assert got is None if reason is None else reason in got
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert mgpu.unsupported(jnp.bfloat16) == "the tpu backend"
