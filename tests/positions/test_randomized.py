"""Randomized positions (Ruoss et al.): a sorted uniform sample of T distinct positions of [0, N) per pass, one for
the whole batch; a model at those positions computes what the same model computes for the tokens placed at those
columns of a row of N (the other columns padding), for every mechanism that reads positions."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.core import meta

from jaxpos.positions import MECHANISMS
from jaxpos.training.validate import model_facts as model_call
from jaxpos.config.rng import DROPOUT, POSITIONS
from jaxpos.models import BertForMaskedLM
from jaxpos.positions.base import LengthError, randomized_positions
from tests.helpers import tiny_config
from tests.training import synthetic

T, N = 8, 24  # a row's tokens and the range its positions are drawn from (model.max_length 16)
OPTIONS = {"tupe": dict(tupe=dict(untie_cls=False)), "shaw": dict(shaw=dict(clip=3))}
KINDS = [kind for kind, m in MECHANISMS.items() if not m.no_randomized_positions]
# Dynamic NTK's length is the range N the positions are drawn from, not the row's T: then a randomized pass is the
# tokens at those columns of a row of N (T = 8 < L0 = 16 would leave RoPE's own frequencies, N = 24 > L0 does not)
CASES = [(kind, dict(kind=kind, **OPTIONS.get(kind, {}))) for kind in KINDS] + [
    ("rope_dynamic", dict(kind="rope", rope=dict(scaling="dynamic", factor=4.0, original_max_length=16)))]


def test_the_sample_is_sorted_distinct_in_range_and_uniform():
    keys = jax.random.split(jax.random.PRNGKey(0), 4000)
    samples = np.asarray(jax.vmap(lambda k: randomized_positions(k, 5, 20))(keys))
    assert samples.dtype == np.int32 and samples.min() >= 0 and samples.max() < 20
    assert (np.diff(samples, axis=1) > 0).all()  # sorted and distinct
    np.testing.assert_array_equal(randomized_positions(keys[7], 5, 20), samples[7])  # a key decides its sample
    inclusion = np.bincount(samples.ravel(), minlength=20) / len(samples)  # each position kept with p = 5/20
    assert np.abs(inclusion - 0.25).max() < 5 * np.sqrt(0.25 * 0.75 / len(samples))
    with pytest.raises(LengthError, match=r"drawn from \[0, 20\).*length 21"):
        randomized_positions(keys[0], 21, 20)


def models(kind: str, position: dict | None = None):
    position = position or dict(kind=kind, **OPTIONS.get(kind, {}))
    randomized = tiny_config(dict(position, randomized_max_length=N), max_length=16)
    reference = tiny_config(position, max_length=N)  # the same parameters: tables over N positions
    return randomized, reference


@pytest.mark.parametrize("kind,position", CASES, ids=[name for name, _ in CASES])
def test_a_pass_at_sampled_positions_equals_the_tokens_at_those_columns_of_a_padded_row(kind, position):
    randomized, reference = models(kind, position)
    rng = np.random.default_rng(1)
    ids = jnp.asarray(rng.integers(5, 61, (2, T)))
    pieces = jnp.asarray([[1] * T, [1] * 5 + [2] * 3])  # a row of one sequence and a row packing two
    model = BertForMaskedLM(randomized)
    params = model.init(jax.random.PRNGKey(0), ids, piece_ids=pieces)["params"]
    logits, taps = model.apply({"params": params}, ids, piece_ids=pieces, deterministic=False,
                               rngs={POSITIONS: jax.random.PRNGKey(3), DROPOUT: jax.random.PRNGKey(4)},
                               mutable=["intermediates"])
    columns = np.asarray(jax.tree.leaves(taps["intermediates"]["bert"]["encoder"]["positions"])[0])
    assert columns.shape == (T,) and (np.diff(columns) > 0).all() and columns.max() < N
    row_ids = jnp.ones((2, N), jnp.int32).at[:, columns].set(ids)
    row_pieces = jnp.zeros((2, N), jnp.int32).at[:, columns].set(pieces)  # the other columns: padding
    want, want_taps = BertForMaskedLM(reference).apply({"params": meta.unbox(params)}, row_ids, piece_ids=row_pieces,
                                                       mutable=["intermediates"])
    np.testing.assert_allclose(np.asarray(logits), np.asarray(want)[:, columns], rtol=2e-5, atol=2e-5)
    # the attention weights too: at initialisation the MLM logits barely read them
    weights = [np.asarray(w) for w in jax.tree.leaves(attention_weights(taps))]
    for got, full in zip(weights, jax.tree.leaves(attention_weights(want_taps)), strict=True):
        np.testing.assert_allclose(got, np.asarray(full)[..., columns, :][..., columns], rtol=1e-5, atol=1e-6)


def attention_weights(taps) -> list:
    """Each layer's sown attention weights [B, H, T, S], in layer order."""
    encoder = taps["intermediates"]["bert"]["encoder"]
    return [encoder[name]["self_attention"]["attention_weights"] for name in sorted(encoder) if name.startswith("layer_")]


def test_evaluation_takes_one_fixed_sample_a_length():
    randomized, _ = models("alibi")
    model = BertForMaskedLM(randomized)
    ids = jnp.ones((1, T), jnp.int32)
    params = model.init(jax.random.PRNGKey(0), ids)["params"]
    runs = [model.apply({"params": params}, ids, mutable=["intermediates"])[1] for _ in range(2)]
    first, second = (jax.tree.leaves(r["intermediates"]["bert"]["encoder"]["positions"])[0] for r in runs)
    np.testing.assert_array_equal(first, second)
    assert not np.array_equal(np.asarray(first), np.arange(T))  # drawn from [0, N), not 0..T-1


@pytest.mark.parametrize("position, message", [
    (dict(kind="none", randomized_max_length=N), "a bag of words reads no positions"),
    (dict(kind="tupe", randomized_max_length=N), "untie_cls finds \\[CLS\\] at position 0"),
    (dict(kind="alibi", randomized_max_length=16), "must exceed model.max_length=16"),
    (dict(kind="diet_abs", randomized_max_length=N, diet_abs=dict(linformer_k=4)), "cannot take position.random")])
def test_what_cannot_be_randomized_is_refused_in_one_line(position, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(position, max_length=16)
    with pytest.raises(ValueError, match="implemented for encoder"):
        tiny_config(dict(kind="alibi", randomized_max_length=N), max_length=16, causal=True)


def test_a_toeplitz_table_at_sampled_positions_is_a_dense_term_the_kernels_do_not_take():
    randomized, reference = models("tisa")
    assert model_call(reference, training=True).form == "table"
    assert model_call(randomized, training=True).form == "other"
    with pytest.raises(ValueError, match="attention_impl='pallas' cannot"):
        from jaxpos.training.validate import check_model_attention
        check_model_attention(dataclasses.replace(randomized, attention_impl="pallas"), training=True)


def test_a_resumed_run_draws_the_same_positions(tmp_path):
    """The positions of step s come from the state's key and s: stopped and resumed equals straight (the same
    program on the same inputs, so exactly); without randomized positions the parameters differ."""
    straight = synthetic.run(str(tmp_path / "straight"), 6, checkpoint_every=3, randomized=40)
    synthetic.run(str(tmp_path / "resumed"), 6, checkpoint_every=3, randomized=40, stop_at=3)
    resumed = synthetic.run(str(tmp_path / "resumed"), 6, checkpoint_every=3, randomized=40)
    assert resumed.resumed_from == 3
    for a, b in zip(jax.tree.leaves(straight.state.params), jax.tree.leaves(resumed.state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    plain = synthetic.run(str(tmp_path / "plain"), 6, checkpoint_every=3, kind="tisa")
    tisa = [np.asarray(x) for x in jax.tree.leaves(plain.state.params["bert"]["encoder"]["layer_0"])]
    randomized = [np.asarray(x) for x in jax.tree.leaves(straight.state.params["bert"]["encoder"]["layer_0"])]
    assert max(np.abs(a - b).max() for a, b in zip(tisa, randomized)) > 1e-4
