"""Packed translation rows: with per-pair positions, every pair in a packed row gets exactly the encoder states and
logits it gets in a row of its own, for every mechanism (absolute position-only terms read per piece)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.data.translation import one_pair_per_row, pack_pairs
from jaxpos.models import EncoderDecoder
from tests.helpers import tiny_config

PACKABLE = [dict(kind=k) for k in ("absolute", "sinusoidal", "tisa", "diet_rel", "t5", "rope", "alibi", "shaw",
                                   "cope", "deberta")]
# Mechanisms whose position-only term depends on absolute positions: read at each pair's own positions.
ABSOLUTE_TERMS = [
    dict(kind="diet_abs"),  # layer-shared, folded
    dict(kind="diet_abs", diet_abs=dict(fold=False)),
    dict(kind="diet_abs", diet_abs=dict(sharing="none", rank=6)),
    dict(kind="diet_abs", diet_abs=dict(sharing="head", fold=False)),
    dict(kind="tupe"),  # [CLS] untied: each pair's first token
    dict(kind="tupe", tupe=dict(untie_cls=False)),
    dict(kind="attenuated"),
    dict(kind="attenuated", attenuated=dict(form="matrix")),
    dict(kind="attenuated", attenuated=dict(form="matrix", sharing="head")),
    dict(kind="attenuated", attenuated=dict(form="offset", s=0.5)),
    dict(kind="attenuated", attenuated=dict(form="abs_offset")),
]


def pairs():
    rng = np.random.default_rng(0)
    sources = [rng.integers(4, 61, n).astype(np.int32) for n in (5, 4, 6)]
    targets = [rng.integers(4, 61, n).astype(np.int32) for n in (4, 6, 3)]
    return sources, targets


def variant_id(position):
    return "-".join([position["kind"]] + [f"{k}={v}" for block in position.values() if isinstance(block, dict)
                                          for k, v in block.items()])


def assert_packed_pairs_match_pairs_in_their_own_rows(cfg):
    sources, targets = pairs()
    packed, alone = pack_pairs(sources, targets, 16), one_pair_per_row(sources, targets, 16)
    assert len(packed) == 1 and len(alone) == 3  # all three pairs share one row
    model = EncoderDecoder(cfg)
    params = model.init(jax.random.PRNGKey(0), jnp.ones((1, 16), jnp.int32), jnp.ones((1, 16), jnp.int32))
    # Perturbed, so that learned forms initialised alike for every head and position (attenuated) differ.
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
    params = jax.tree.unflatten(tree, [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])

    def run(rows):
        batch = {k: jnp.asarray(v) for k, v in rows.rows(np.arange(len(rows))).items()}
        encoded = model.apply(params, batch["inputs"], input_piece_ids=batch["input_piece_ids"],
                              input_positions=batch["input_positions"], method=EncoderDecoder.encode)
        logits = model.apply(params, batch["inputs"], batch["targets"], **{
            k: batch[k] for k in ("input_piece_ids", "target_piece_ids", "input_positions",
                                  "target_positions")})
        return np.asarray(encoded), np.asarray(logits)

    (packed_encoded, packed_logits), (alone_encoded, alone_logits) = run(packed), run(alone)
    for i in range(3):
        in_source = packed.input_piece_ids[0] == i + 1
        np.testing.assert_allclose(packed_encoded[0, in_source], alone_encoded[i, :len(sources[i])], rtol=1e-5,
                                   atol=1e-5)
        in_packed = packed.target_piece_ids[0] == i + 1
        np.testing.assert_allclose(packed_logits[0, in_packed], alone_logits[i, :len(targets[i])], rtol=1e-5,
                                   atol=1e-5, err_msg=f"pair {i}")


@pytest.mark.parametrize("position", PACKABLE + ABSOLUTE_TERMS, ids=variant_id)
def test_packed_pairs_match_pairs_in_their_own_rows(position):
    assert_packed_pairs_match_pairs_in_their_own_rows(
        tiny_config(dict(position, segment="none"), num_layers=2, num_decoder_layers=2))


# Cross-attention with a positional term: in a packed row a pair's source and target start at different columns,
# so offsets and absolute reads must use each pair's own positions on both sides.
CROSS_POSITIONED = [dict(kind=k) for k in ("tisa", "t5", "diet_rel", "alibi", "rope", "shaw", "diet_abs", "tupe",
                                           "deberta")] + [
    dict(kind="diet_abs", diet_abs=dict(fold=False, sharing="none", rank=6)),
    dict(kind="attenuated"),
    dict(kind="attenuated", attenuated=dict(form="matrix")),
    dict(kind="attenuated", attenuated=dict(form="offset", s=0.5)),
]


@pytest.mark.parametrize("position", CROSS_POSITIONED, ids=variant_id)
def test_packed_pairs_with_cross_attention_positions_match_pairs_in_their_own_rows(position):
    assert_packed_pairs_match_pairs_in_their_own_rows(
        tiny_config(dict(position, segment="none"), num_layers=2, num_decoder_layers=2,
                    cross_attention_position=True))


MLM_MECHANISMS = [dict(kind="absolute"), dict(kind="diet_abs"), dict(kind="tupe"), dict(kind="tisa"),
                  dict(kind="cope")]


@pytest.mark.parametrize("position", MLM_MECHANISMS, ids=variant_id)
def test_packed_mlm_pieces_match_pieces_in_their_own_rows(position):
    from jaxpos.data.mlm import pack_documents
    from jaxpos.data.pipeline import masked_batch
    from jaxpos.models import BertForMaskedLM
    from jaxpos.training.mlm import MaskedLMTask

    rng = np.random.default_rng(3)
    documents = [[rng.integers(5, 61, 3).tolist(), rng.integers(5, 61, 2).tolist()],
                 [rng.integers(5, 61, 3).tolist()], [rng.integers(5, 61, 2).tolist()]]
    packed = pack_documents(documents, 16)
    assert len(packed) == 1 and packed.piece_ids.max() == 3  # three pieces share one row
    batch = masked_batch(packed, np.arange(1), (0, 0, 0), vocab_size=61, mask_prob=0.15)
    np.testing.assert_array_equal(batch["positions"][0, :14], [0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 0, 1, 2])
    # The reference: each piece's tokens alone at the start of a row, at the default positions 0..n-1.
    pieces = [batch["input_ids"][0][batch["piece_ids"][0] == k] for k in (1, 2, 3)]
    alone, alone_targets = np.zeros((2, 3, 16), np.int32)
    for i, piece in enumerate(pieces):
        alone[i, :len(piece)] = piece
        alone_targets[i, :len(piece)] = batch["targets"][0][batch["piece_ids"][0] == i + 1]
    alone_piece_ids = (alone > 0).astype(np.int32)

    model = BertForMaskedLM(tiny_config(position))
    params = model.init(jax.random.PRNGKey(0), jnp.ones((1, 16), jnp.int32))["params"]
    leaves, tree = jax.tree.flatten(params)  # perturbed, so that no term starts at a symmetric value
    keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
    params = jax.tree.unflatten(tree, [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])

    def encode(ids, piece_ids, positions=None):
        return np.asarray(model.apply({"params": params}, jnp.asarray(ids), piece_ids=jnp.asarray(piece_ids),
                                      input_positions=positions, method=BertForMaskedLM.encode))

    packed_hidden = encode(batch["input_ids"], batch["piece_ids"], jnp.asarray(batch["positions"]))
    alone_hidden = encode(alone, alone_piece_ids)
    for i, piece in enumerate(pieces):
        np.testing.assert_allclose(packed_hidden[0, batch["piece_ids"][0] == i + 1], alone_hidden[i, :len(piece)],
                                   rtol=1e-5, atol=1e-5)
    # Without per-piece positions the later pieces see other positions (TISA's offsets and CoPE's counts read none).
    if position["kind"] not in ("tisa", "cope"):
        unaware = encode(batch["input_ids"], batch["piece_ids"])
        gap = np.abs(unaware[0, batch["piece_ids"][0] == 3] - alone_hidden[2, :len(pieces[2])]).max()
        assert gap > 1e-4, gap  # ten times the tolerance above: the check has teeth for every mechanism here

    # The task passes the batch's positions: the summed loss of the packed row is that of the three rows.
    task = MaskedLMTask(model, 16)
    weights = (batch["piece_ids"] > 0).astype(np.float32)
    packed_sums = task.loss(params, {**batch, "mask_weights": weights}, None, False)[1]
    alone_batch = dict(input_ids=alone, targets=alone_targets, mask_weights=alone_piece_ids.astype(np.float32),
                       piece_ids=alone_piece_ids, token_types=np.zeros_like(alone))
    alone_sums = task.loss(params, alone_batch, None, False)[1]
    np.testing.assert_allclose(packed_sums["weight"], alone_sums["weight"])
    np.testing.assert_allclose(packed_sums["loss"], alone_sums["loss"], rtol=1e-5)
