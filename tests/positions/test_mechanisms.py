"""Every mechanism by name: brute-force references, translation invariance, parameter counts, gradients,
length limits."""

import math

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.attention.bias import position_logits
from jaxpos.config import model_config
from jaxpos.models import BertForMaskedLM
from jaxpos.positions import LengthError, make_position
from jaxpos.positions.alibi import alibi_slopes
from jaxpos.positions.t5 import t5_bucket
from tests.helpers import VARIANTS, tiny_config


def mechanism_bias(position, length=9, causal=False, **overrides):
    """(params, materialised [L', H', T, T] position-only bias) of a mechanism over positions 0..T-1."""
    cfg = tiny_config(position, **overrides)
    module = make_position(cfg, cfg.num_layers, causal)
    pos = jnp.arange(length)
    variables = module.init(jax.random.PRNGKey(3), pos, pos)
    bias = module.apply(variables, pos, pos)
    layers = max(x.shape[0] for x in jax.tree.leaves(bias))
    dense = jnp.stack([position_logits(bias.for_layer(l), pos, pos) for l in range(layers)])
    params = flax.linen.unbox(variables.get("params", {}))
    return jax.tree.map(np.asarray, params), np.asarray(dense), cfg


def brute_force(kind, params, cfg, n, causal=False):
    """The bias of each Toeplitz mechanism by a double loop over (i, j), from its parameters."""
    out = np.zeros((cfg.num_layers, cfg.num_heads, n, n))
    for layer in range(cfg.num_layers):
        for h in range(cfg.num_heads):
            for i in range(n):
                for j in range(n):
                    k = j - i
                    if kind == "tisa":
                        a, b, c = (params[x][min(layer, params[x].shape[0] - 1), min(h, params[x].shape[1] - 1)]
                                   for x in "abc")
                        out[layer, h, i, j] = sum(a * np.exp(-np.abs(b) * (k - c) ** 2))
                    elif kind == "diet_rel":
                        table = params["table"]
                        radius = (table.shape[-1] - 1) // 2
                        out[layer, h, i, j] = table[min(layer, table.shape[0] - 1), min(h, table.shape[1] - 1),
                                                    np.clip(k, -radius, radius) + radius]
                    elif kind == "t5":
                        bucket = int(t5_bucket(jnp.asarray(k), bidirectional=not causal))
                        out[layer, h, i, j] = params["embedding"][bucket, h]
                    elif kind == "alibi":
                        out[layer, h, i, j] = -alibi_slopes(cfg.num_heads)[h] * abs(k)
                    elif kind == "attenuated_offset":
                        table = params["table"]
                        out[layer, h, i, j] = table[layer, h, k + cfg.max_length - 1]
    return out


TOEPLITZ = [("tisa", dict(kind="tisa")), ("diet_rel", dict(kind="diet_rel")),
            ("diet_rel", dict(kind="diet_rel", diet_rel=dict(max_distance=3, sharing="head"))),
            ("t5", dict(kind="t5")), ("alibi", dict(kind="alibi")),
            ("attenuated_offset", dict(kind="attenuated", attenuated=dict(form="offset")))]


@pytest.mark.parametrize("kind,position", TOEPLITZ)
@pytest.mark.parametrize("causal", [False, True])
def test_toeplitz_mechanisms_match_brute_force_and_are_translation_invariant(kind, position, causal):
    n = 9
    params, dense, cfg = mechanism_bias(position, n, causal=causal)
    want = brute_force(kind, params, cfg, n, causal)
    np.testing.assert_allclose(np.broadcast_to(dense, want.shape), want, rtol=1e-5, atol=1e-6)
    for shift in (1, 3):  # shifting both positions leaves the bias unchanged
        np.testing.assert_allclose(dense[..., shift:, shift:], dense[..., :-shift, :-shift], rtol=1e-6)


def test_absolute_mechanisms_are_not_translation_invariant():
    _, dense, _ = mechanism_bias(dict(kind="diet_abs"), 9)
    assert not np.allclose(dense[..., 1:, 1:], dense[..., :-1, :-1])


def test_diet_abs_and_tupe_are_their_low_rank_products():
    params, dense, cfg = mechanism_bias(dict(kind="diet_abs", diet_abs=dict(sharing="none", rank=3)), 7)
    want = np.einsum("lhir,lhjr->lhij", params["p_q"][:, :, :7], params["p_k"][:, :, :7])
    np.testing.assert_allclose(dense, want, rtol=1e-5, atol=1e-6)
    params, dense, cfg = mechanism_bias(dict(kind="tupe"), 7)
    p = params["embedding"][:7]
    qh = np.einsum("td,ldhr->lhtr", p, params["u_q"])
    kh = np.einsum("td,ldhr->lhtr", p, params["u_k"])
    want = np.einsum("lhir,lhjr->lhij", qh, kh) / math.sqrt(2 * cfg.head_dim)
    np.testing.assert_allclose(dense, want, rtol=1e-4, atol=1e-6)


def test_attenuated_matrix_form_starts_at_the_fixed_form():
    _, fixed, _ = mechanism_bias(dict(kind="attenuated"), 16)
    _, learned, _ = mechanism_bias(dict(kind="attenuated", attenuated=dict(form="matrix")), 16)
    np.testing.assert_allclose(learned, np.broadcast_to(fixed, learned.shape), rtol=1e-6)


def count(position, **model):
    cfg = model_config(dict(dict(vocab_size=10, d_model=768, num_layers=12, num_heads=12, mlp_dim=8, max_length=512),
                            position=position, **model))
    module = make_position(cfg, cfg.num_layers, False)
    pos = jnp.arange(8)
    shapes = jax.eval_shape(module.init, jax.random.PRNGKey(0), pos, pos)
    return sum(math.prod(x.shape) for x in jax.tree.leaves(flax.linen.unbox(shapes.get("params", {}))))


def test_parameter_counts_match_the_papers():
    assert count(dict(kind="tisa")) == 2160  # 3 * S * H * L, S=5, H=12, L=12
    assert count(dict(kind="tisa", tisa=dict(sharing="layer"))) == 3 * 5 * 12
    d_p, n = 64, 512
    assert count(dict(kind="diet_abs", diet_abs=dict(sharing="none"))) == 2 * n * d_p * 12 * 12
    assert count(dict(kind="diet_abs", diet_abs=dict(sharing="layer"))) == 2 * n * d_p * 12
    assert count(dict(kind="diet_abs", diet_abs=dict(sharing="head", rank=128))) == 2 * n * 128 * 12
    assert count(dict(kind="attenuated", attenuated=dict(form="matrix"))) == 37_748_736  # 512^2 * 12 * 12
    assert count(dict(kind="attenuated", attenuated=dict(form="matrix", sharing="head"))) == 3_145_728
    assert count(dict(kind="attenuated", attenuated=dict(form="offset"))) == (2 * n - 1) * 144
    assert count(dict(kind="attenuated")) == 0
    assert count(dict(kind="diet_rel")) == (2 * n - 1) * 144
    assert count(dict(kind="t5")) == 32 * 12
    assert count(dict(kind="alibi")) == 0 and count(dict(kind="rope")) == 0


PARAMETER_FREE = ("none", "sinusoidal", "rope", "alibi", "attenuated")


@pytest.mark.parametrize("name,position", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_gradients_reach_every_positional_parameter(name, position):
    cfg = tiny_config(position)
    model = BertForMaskedLM(cfg)
    ids = jax.random.randint(jax.random.PRNGKey(0), (2, cfg.max_length), 1, cfg.vocab_size)
    types = jnp.concatenate([jnp.zeros((2, 8), jnp.int32), jnp.ones((2, 8), jnp.int32)], axis=1)
    params = flax.linen.unbox(model.init(jax.random.PRNGKey(1), ids, token_types=types)["params"])

    def loss(p):
        logits = model.apply({"params": p}, ids, token_types=types)
        return jnp.mean(jax.nn.log_softmax(logits)[..., 3] * jnp.arange(cfg.max_length)[None, :])

    grads = flax.traverse_util.flatten_dict(jax.grad(loss)(params), sep="/")
    positional = {k: g for k, g in grads.items() if "/position/" in k or "/segments/" in k}
    if name not in PARAMETER_FREE:
        assert positional, f"{name} has no positional parameters"
    for key, g in positional.items():
        assert np.all(np.isfinite(g)), key
        assert np.abs(g).max() > 0, f"no gradient reaches {key}"
    if position["kind"] == "tisa":  # every kernel parameter of every head and layer is used
        for key, g in positional.items():
            if key.split("/")[-1] in "abc":
                assert np.all(np.abs(g) > 0), key


NOT_INDUCTIVE = [dict(kind="absolute"), dict(kind="diet_abs"), dict(kind="diet_rel"), dict(kind="tupe"),
                 dict(kind="attenuated", attenuated=dict(form="matrix")),
                 dict(kind="tisa", tisa=dict(input_positions=True))]
INDUCTIVE = [dict(kind="tisa"), dict(kind="t5"), dict(kind="alibi"), dict(kind="rope"), dict(kind="sinusoidal"),
             dict(kind="attenuated"), dict(kind="diet_rel", diet_rel=dict(max_distance=4)), dict(kind="shaw")]


@pytest.mark.parametrize("position", NOT_INDUCTIVE, ids=lambda p: p["kind"])
def test_longer_than_the_table_is_a_clear_error(position):
    cfg = tiny_config(position)
    model = BertForMaskedLM(cfg)
    ids = jnp.ones((1, cfg.max_length), jnp.int32)
    variables = model.init(jax.random.PRNGKey(0), ids)
    with pytest.raises(LengthError, match=rf"{position['kind']}.*16 positions.*length 20"):
        model.apply(variables, jnp.ones((1, 20), jnp.int32))


@pytest.mark.parametrize("position", INDUCTIVE, ids=lambda p: p["kind"])
def test_inductive_mechanisms_run_past_the_configured_length(position):
    cfg = tiny_config(position)
    model = BertForMaskedLM(cfg)
    variables = model.init(jax.random.PRNGKey(0), jnp.ones((1, cfg.max_length), jnp.int32))
    logits = model.apply(variables, jnp.ones((1, 3 * cfg.max_length), jnp.int32))
    assert logits.shape == (1, 48, cfg.vocab_size) and np.all(np.isfinite(logits))


def test_unknown_mechanism_names_the_choices():
    with pytest.raises(ValueError, match="unknown position mechanism 'xpos'.*tisa"):
        tiny_config(dict(kind="xpos"))
    with pytest.raises(ValueError, match="unknown config field model.position.tisa.kernels"):
        tiny_config(dict(kind="tisa", tisa=dict(kernels=3)))
