"""The modern encoder block (ModernBERT's): gated MLPs against their formula in numpy, local attention windows
against a brute-force mask, local layers against the window in every positional mechanism, RoPE's per-kind bases
against tables computed alone, scanned groups of layers against the unscanned stack, and the config's refusals."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.core import meta
from scipy.special import erf

from jaxpos.attention.mask import AttentionMask
from jaxpos.models import BertEncoder, BertForMaskedLM
from jaxpos.models.layers import MlpBlock
from tests.helpers import tiny_config
from tests.models.test_scan_remat import assert_scanned_equals_unscanned

MODERN = dict(layer_norm="pre", layer_norm_eps=1e-5, mlp="geglu", use_bias=False, norm_bias=False,
              first_layer_attention_norm=False, local_window=4, global_every=3)


def modern_config(position=None, **overrides):
    return tiny_config(position or dict(kind="rope", rope=dict(base=160_000.0, local_base=10_000.0)),
                       **{**MODERN, **overrides})


# --- the gated MLP -------------------------------------------------------------------------------------------------

def numpy_mlp(x, params, mlp, activation):
    """W2 (act(x W1[:, 0]) * x W1[:, 1]) + b2 in float64, act: erf GELU, tanh GELU or SiLU."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    x = np.asarray(x, np.float64)
    wi, bi = p["wi"]["kernel"], p["wi"].get("bias", np.zeros(p["wi"]["kernel"].shape[1:]))
    u, g = x @ wi[:, 0] + bi[0], x @ wi[:, 1] + bi[1]
    if mlp == "swiglu":
        act = u / (1 + np.exp(-u))
    elif activation == "gelu":
        act = 0.5 * u * (1 + erf(u / math.sqrt(2)))
    else:
        act = 0.5 * u * (1 + np.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u**3)))
    return (act * g) @ p["wo"]["kernel"] + p["wo"].get("bias", 0.0)


@pytest.mark.parametrize("mlp,activation,use_bias", [("geglu", "gelu", False), ("geglu", "gelu_tanh", True),
                                                     ("swiglu", "gelu", True)])
def test_gated_mlp_matches_its_formula(mlp, activation, use_bias):
    cfg = tiny_config(dict(kind="none"), mlp=mlp, activation=activation, use_bias=use_bias, init_std=0.5)
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, cfg.d_model))
    params = meta.unbox(MlpBlock(cfg).init(jax.random.PRNGKey(1), x)["params"])
    if use_bias:  # biases away from their zero initialisation
        params = jax.tree_util.tree_map_with_path(
            lambda path, a: a + 0.3 if path[-1].key == "bias" else a, params)
    assert params["wi"]["kernel"].shape == (cfg.d_model, 2, cfg.mlp_dim)
    assert ("bias" in params["wi"]) == use_bias
    got = np.asarray(MlpBlock(cfg).apply({"params": params}, x))
    want = numpy_mlp(x, params, mlp, activation)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# --- windows -------------------------------------------------------------------------------------------------------

def brute_force_mask(piece_ids, causal, window):
    """[B, 1, T, T]: key j visible to query i when it is not padding, in i's piece, at or before i when causal,
    and |j - i| <= window // 2."""
    batch, length = piece_ids.shape
    out = np.zeros((batch, 1, length, length), bool)
    for b in range(batch):
        for i in range(length):
            for j in range(length):
                out[b, 0, i, j] = (piece_ids[b, j] != 0 and piece_ids[b, i] == piece_ids[b, j]
                                   and (not causal or j <= i) and abs(j - i) <= window // 2)
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [2, 3, 8, 40])  # 40: longer than the row, padding and packing alone decide
def test_window_mask_matches_brute_force(window, causal):
    pieces = np.asarray([[1] * 7 + [2] * 9 + [0] * 4, [1] * 20, [3] * 5 + [0] * 15])
    positions = jnp.arange(20)
    got = AttentionMask.within_pieces(jnp.asarray(pieces), causal=causal, window=window).dense(positions, positions)
    np.testing.assert_array_equal(np.asarray(got), brute_force_mask(pieces, causal, window))


LOCAL_KINDS = ["rope", "alibi", "t5", "tisa", "none", "diet_rel", "cope", "attenuated"]


@pytest.mark.parametrize("kind", LOCAL_KINDS)
def test_local_layers_attend_inside_the_window_with_every_mechanism(kind):
    """Attention weights (the xla path sows them) of layers 1 and 2 vanish outside |j - i| <= 2 within each piece
    (a packed row), rows sum to one; layer 0 and 3 (global) reach further."""
    cfg = modern_config(dict(kind=kind), num_layers=4, attention_impl="xla")
    ids = jnp.asarray(np.random.default_rng(0).integers(5, 61, (2, 16)))
    pieces = jnp.asarray([[1] * 10 + [2] * 6, [1] * 13 + [0] * 3])
    model = BertEncoder(cfg)
    params = model.init(jax.random.PRNGKey(0), ids, piece_ids=pieces)["params"]
    _, state = model.apply({"params": params}, ids, piece_ids=pieces, mutable=["intermediates"])
    encoder = state["intermediates"]["encoder"]
    weights = [np.asarray(encoder[f"layer_{i}"]["self_attention"]["attention_weights"][0]) for i in range(4)]
    pieces = np.asarray(pieces)
    local = brute_force_mask(pieces, False, 4)
    rows = pieces != 0
    for layer, w in enumerate(weights):
        np.testing.assert_allclose(w.sum(-1)[np.broadcast_to(rows[:, None], w.shape[:3])], 1.0, rtol=1e-5)
        outside = np.broadcast_to(~local, w.shape) & np.broadcast_to(rows[:, None, :, None], w.shape)
        if cfg.is_local(layer):
            assert np.max(w[outside]) == 0.0, layer
        else:
            assert np.max(w[outside]) > 1e-4, layer


def test_rope_tables_of_local_and_global_layers_use_their_own_base():
    from jaxpos.positions.rope import RopePosition, inverse_frequencies, rotary_tables

    cfg = modern_config(num_layers=5)
    positions = jnp.arange(9)
    bias = RopePosition(cfg, num_layers=5).apply({}, positions, positions)
    assert bias.term("rotary").cos_q.shape == (5, 9, cfg.head_dim // 2)
    for layer in range(5):
        base = 10_000.0 if cfg.is_local(layer) else 160_000.0
        cos, sin = rotary_tables(positions, inverse_frequencies(cfg.head_dim, base))
        np.testing.assert_allclose(np.asarray(bias.term("rotary").cos_q[layer]), np.asarray(cos), rtol=0, atol=0)
        np.testing.assert_allclose(np.asarray(bias.term("rotary").sin_k[layer]), np.asarray(sin), rtol=0, atol=0)
    # one base for both kinds: one table shared by every layer, as before
    same = modern_config(num_layers=5, position=dict(kind="rope"))
    assert RopePosition(same, num_layers=5).apply({}, positions, positions).term("rotary").cos_q.shape[0] == 1


@pytest.mark.parametrize("scan", [False, True])
def test_a_causal_modern_stack_decodes_like_its_full_pass(scan):
    """Causal local layers see keys i - 2 .. i: one cached step at a time gives the full pass's logits, the cache of
    a scanned stack stacked over its groups."""
    cfg = modern_config(num_layers=4, global_every=2, causal=True, scan_layers=scan)
    ids = jax.random.randint(jax.random.PRNGKey(0), (2, 9), 1, cfg.vocab_size)
    model, stepper = BertForMaskedLM(cfg), BertForMaskedLM(cfg, decode=True)
    params = model.init(jax.random.PRNGKey(1), ids)["params"]
    full = model.apply({"params": params}, ids)
    cache = stepper.init(jax.random.PRNGKey(1), ids)["cache"]
    step = jax.jit(lambda c, tok: stepper.apply({"params": params, "cache": c}, tok, mutable=["cache"]))
    for t in range(ids.shape[1]):
        logits, mutated = step(cache, ids[:, t:t + 1])
        cache = mutated["cache"]
        np.testing.assert_allclose(logits[:, 0], full[:, t], rtol=1e-5, atol=1e-5, err_msg=f"step {t}")


# --- scanned groups of layers --------------------------------------------------------------------------------------

@pytest.mark.parametrize("layers,every,first_norm,remat", [
    (5, 3, False, "none"),  # layer 0 before the scan, one group of 3, layer 4 after it
    (4, 2, True, "full"),  # two groups of 2, nothing around them
    (2, 3, False, "save_projections"),  # no whole group: every layer outside the scan
    (7, 3, True, "none"),  # two groups and one layer after them
])
def test_scanned_groups_equal_the_unscanned_stack(layers, every, first_norm, remat):
    cfg = modern_config(num_layers=layers, global_every=every, first_layer_attention_norm=first_norm)
    assert_scanned_equals_unscanned(cfg, dataclasses.replace(cfg, scan_layers=True, remat=remat))


def test_grouped_layout_names_and_the_layer_trust_ratio():
    from jaxpos.training.optim import stacked_layers

    cfg = modern_config(num_layers=5)
    params = jax.eval_shape(lambda: BertForMaskedLM(dataclasses.replace(cfg, scan_layers=True)).init(
        jax.random.PRNGKey(0), jnp.ones((1, 8), jnp.int32))["params"])
    encoder = meta.unbox(params)["bert"]["encoder"]
    assert {"layer_0", "layer_4", "groups"} <= set(encoder) and set(encoder["groups"]) == {"layer_1", "layer_2",
                                                                                             "layer_3"}
    assert encoder["groups"]["layer_1"]["mlp"]["wi"]["kernel"].shape == (1, cfg.d_model, 2, cfg.mlp_dim)
    stacked = {jax.tree_util.keystr(path): stacked_layers(path)
               for path, _ in jax.tree_util.tree_leaves_with_path(meta.unbox(params))}
    assert all(flag == ("groups" in name) for name, flag in stacked.items())


def test_every_parameter_has_a_decay_role_and_logical_axes():
    from jaxpos.training.optim import decays, parameter_name

    cfg = modern_config(num_layers=4, scan_layers=True)
    boxed = jax.eval_shape(lambda: BertForMaskedLM(cfg).init(jax.random.PRNGKey(0), jnp.ones((1, 8), jnp.int32)))
    leaves = jax.tree_util.tree_leaves_with_path(boxed["params"], is_leaf=lambda x: isinstance(x, meta.Partitioned))
    names = set()
    for path, leaf in leaves:
        assert isinstance(leaf, meta.Partitioned) and len(leaf.names) == leaf.value.ndim, path
        names.add(parameter_name(path))
        decays(parameter_name(path), True)  # raises for a parameter without a role
    assert not any(name.endswith("/bias") for name in names if "output_bias" not in name)  # use_bias, norm_bias off
    assert "bert/encoder/layer_0/self_attention_norm/scale" not in names  # the first layer's identity


# --- the config ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, message", [
    (dict(mlp="glu"), "model.mlp='glu'; choose plain, geglu, swiglu"),
    (dict(mlp="geglu", activation="relu"), "model.mlp='geglu' gates with a GELU"),
    (dict(first_layer_attention_norm=False, layer_norm="post"), "only pre-LN layers have"),
    (dict(local_window=1), "model.local_window=1 must be an integer >= 2"),
    (dict(local_window=8, global_every=1), "model.global_every=1 makes every layer global"),
    (dict(local_window=8, num_decoder_layers=2), "model.local_window applies to encoder stacks"),
    (dict(local_window=8, share_layers=True), "model.local_window makes layers differ"),
    (dict(local_window=8, position=dict(kind="rope", randomized_max_length=64)), "scatter a row"),
    (dict(local_window=8, position=dict(kind="diet_abs", diet_abs=dict(linformer_k=4))), "Linformer"),
    (dict(position=dict(kind="rope", rope=dict(local_base=-1.0))), "position.rope.local_base=-1.0 must be"),
])
def test_modern_options_are_refused_in_one_line(overrides, message):
    position = overrides.pop("position", dict(kind="rope"))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as error:
        tiny_config(position, **{"layer_norm": "pre", **overrides})
    assert "\n" not in str(error.value)


def test_a_path_without_the_window_is_refused_and_auto_picks_one_with_it(monkeypatch):
    """Read through the registry: a record without the window (the Pallas kernel's, made so here whatever the
    registry says now) is refused in one line when named, and left out of auto's choice."""
    from jaxpos.attention.auto import choose_for
    from jaxpos.attention.registry import IMPLEMENTATIONS
    from jaxpos.training.validate import check_model_attention as check_attention, model_facts as model_call

    monkeypatch.setitem(IMPLEMENTATIONS, "pallas", dataclasses.replace(IMPLEMENTATIONS["pallas"], window=False))
    hopper = dict(platform="gpu", gpu_capability="9.0", cpu_mesh_devices=1)
    cfg = modern_config(dict(kind="alibi"), dtype="bfloat16", local_window=8, attention_dropout=0.1)
    assert model_call(cfg, training=True, **hopper).window
    assert not model_call(dataclasses.replace(cfg, local_window=None), training=True, **hopper).window
    with_window = {name for name, impl in IMPLEMENTATIONS.items() if impl.window}
    for training in (True, False):
        assert choose_for(model_call(cfg, training=training, **hopper))[0] in with_window
    with pytest.raises(ValueError, match="attention_impl='pallas' .* lacks a local attention window; use ") as error:
        check_attention(dataclasses.replace(cfg, attention_impl="pallas"), training=True, **hopper)
    assert "\n" not in str(error.value)
    check_attention(dataclasses.replace(cfg, attention_impl="xla"), training=True, **hopper)


def test_model_flops_count_the_gated_mlp_and_the_local_keys():
    from jaxpos.training.flops import encoder_flops

    cfg = modern_config(num_layers=3, local_window=4, d_model=32, mlp_dim=48)
    tokens, length, d, m = 2 * 16, 16, 32, 48

    def layer(keys):  # projections, q.k and weighted values, the GeGLU's d x 2m and m x d products
        return 2 * d * d * 4 * tokens + 4 * tokens * keys * d + 2 * 3 * tokens * d * m

    assert encoder_flops(cfg, 2, length) == layer(16) + 2 * layer(5)  # layers 1 and 2 local: 2 + 1 + 2 keys
