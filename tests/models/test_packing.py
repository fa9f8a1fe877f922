"""Packed translation rows: with per-pair positions, every pair in a packed row gets exactly the logits it gets
in a row of its own, for every mechanism that allows packing; the others are refused with a clear error."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.data.translation import one_pair_per_row, pack_pairs
from jaxpos.models import EncoderDecoder
from jaxpos.positions import ROW_POSITION_BIAS, check_packable
from tests.helpers import tiny_config

PACKABLE = ["absolute", "sinusoidal", "tisa", "diet_rel", "t5", "rope", "alibi", "shaw"]


def pairs():
    rng = np.random.default_rng(0)
    sources = [rng.integers(4, 61, n).astype(np.int32) for n in (5, 4, 6)]
    targets = [rng.integers(4, 61, n).astype(np.int32) for n in (4, 6, 3)]
    return sources, targets


@pytest.mark.parametrize("kind", PACKABLE)
def test_packed_pairs_match_pairs_in_their_own_rows(kind):
    cfg = tiny_config(dict(kind=kind, segment="none"), num_layers=1, num_decoder_layers=1)
    sources, targets = pairs()
    packed, alone = pack_pairs(sources, targets, 16), one_pair_per_row(sources, targets, 16)
    assert len(packed) == 1 and len(alone) == 3  # all three pairs share one row
    model = EncoderDecoder(cfg)
    params = model.init(jax.random.PRNGKey(0), jnp.ones((1, 16), jnp.int32), jnp.ones((1, 16), jnp.int32))

    def logits(rows):
        batch = {k: jnp.asarray(v) for k, v in rows.rows(np.arange(len(rows))).items()}
        return np.asarray(model.apply(params, batch["inputs"], batch["targets"], **{
            k: batch[k] for k in ("inputs_segmentation", "targets_segmentation", "inputs_position",
                                  "targets_position")}))

    packed_logits, alone_logits = logits(packed), logits(alone)
    for i in range(3):
        in_packed = packed.targets_segmentation[0] == i + 1
        np.testing.assert_allclose(packed_logits[0, in_packed], alone_logits[i, :len(targets[i])], rtol=2e-5,
                                   atol=2e-5)


@pytest.mark.parametrize("kind", ROW_POSITION_BIAS)
def test_row_position_biases_refuse_packing(kind):
    with pytest.raises(ValueError, match=f"{kind}.*data.pack=False"):
        check_packable(tiny_config(dict(kind=kind)))
    check_packable(tiny_config(dict(kind="tisa")))
