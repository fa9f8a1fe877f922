"""Every mechanism by name: brute-force references, translation invariance, parameter counts, gradients,
length limits."""

import dataclasses
import math

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.attention.bias import position_logits
from jaxpos.config import model_config
from jaxpos.positions import MECHANISMS
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


def untie_cls(logits, theta):
    """Ke et al.'s reset_theta in numpy: row 0 (from [CLS], [CLS]->[CLS] included) = theta_1, column 0 of the
    other rows = theta_2. logits [L, H, T, S], theta [L, H, 2]."""
    out = np.array(logits, copy=True)
    out[..., 0, :] = theta[..., 0, None]
    out[..., 1:, 0] = theta[..., 1, None]
    return out


def test_diet_abs_and_tupe_are_their_low_rank_products():
    params, dense, cfg = mechanism_bias(dict(kind="diet_abs", diet_abs=dict(sharing="none", rank=3)), 7)
    want = np.einsum("lhir,lhjr->lhij", params["p_q"][:, :, :7], params["p_k"][:, :, :7])
    np.testing.assert_allclose(dense, want, rtol=1e-5, atol=1e-6)
    for untie in (False, True):
        params, dense, cfg = mechanism_bias(dict(kind="tupe", tupe=dict(untie_cls=untie)), 7)
        p = params["embedding"][:7]
        qh = np.einsum("td,ldhr->lhtr", p, params["u_q"])
        kh = np.einsum("td,ldhr->lhtr", p, params["u_k"])
        want = np.einsum("lhir,lhjr->lhij", qh, kh) / math.sqrt(2 * cfg.head_dim)
        if untie:
            want = untie_cls(want, params["cls_theta"])
            assert not np.allclose(want[..., 1:, 1:], dense[..., 0:1, 0:1])  # theta differs from the rest
        else:
            assert "cls_theta" not in params
        np.testing.assert_allclose(dense, want, rtol=1e-4, atol=1e-6)


def test_tupe_unties_the_first_token_of_every_packed_piece():
    """Read at per-piece positions, row/column 0 of each piece (not of the row) carry theta_1 / theta_2."""
    params, dense, cfg = mechanism_bias(dict(kind="tupe"), 9)
    module = make_position(cfg, cfg.num_layers, False)
    pos = jnp.arange(9)
    variables = module.init(jax.random.PRNGKey(3), pos, pos)
    pieces = jnp.asarray([[0, 1, 2, 3, 0, 1, 2, 0, 1]])  # three pieces in one row
    bias = module.apply(variables, pos, pos).replace(piece_positions=(pieces, pieces))
    for layer in range(cfg.num_layers):
        got = np.asarray(position_logits(bias.for_layer(layer), pos, pos))[0]  # [H, T, S]
        index = np.asarray(pieces[0])
        np.testing.assert_allclose(got, dense[layer][:, index][:, :, index], rtol=1e-5, atol=1e-6)
        theta = params["cls_theta"][layer]
        for start in (0, 4, 7):
            np.testing.assert_allclose(got[:, start, :], np.broadcast_to(theta[:, :1], got[:, 0].shape), rtol=1e-6)
        for i, j in [(1, 0), (5, 4), (8, 7), (5, 0)]:  # others to the [CLS] of their piece; (5, 0): row 0 of the row
            np.testing.assert_allclose(got[:, i, j], theta[:, 1], rtol=1e-6)


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
    assert count(dict(kind="attenuated", attenuated=dict(form="abs_offset"))) == n * 144
    assert count(dict(kind="attenuated")) == 0
    assert count(dict(kind="diet_rel")) == (2 * n - 1) * 144
    assert count(dict(kind="t5")) == 32 * 12
    assert count(dict(kind="alibi")) == 0 and count(dict(kind="rope")) == 0


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
    if MECHANISMS[position["kind"]].is_learned(cfg.position.options):
        assert positional, f"{name} has no positional parameters"
    else:  # the registry says it has none
        assert not any("/position/" in k for k in positional), f"{name} has positional parameters"
    for key, g in positional.items():
        assert np.all(np.isfinite(g)), key
        assert np.abs(g).max() > 0, f"no gradient reaches {key}"
    if position["kind"] == "tisa":  # every kernel parameter of every head and layer is used
        for key, g in positional.items():
            if key.split("/")[-1] in "abc":
                assert np.all(np.abs(g) > 0), key


# Every variant and three more option sets, split by the registry's inductive trait.
LENGTH_CASES = VARIANTS + [("attenuated_matrix_unshared", dict(kind="attenuated", attenuated=dict(form="matrix"))),
                           ("diet_rel_clipped_4", dict(kind="diet_rel", diet_rel=dict(max_distance=4))),
                           ("shaw_default_clip", dict(kind="shaw"))]


def inductive(position: dict) -> bool:
    return MECHANISMS[position["kind"]].is_inductive(tiny_config(position).position.options)


INDUCTIVE = [case for case in LENGTH_CASES if inductive(case[1])]
NOT_INDUCTIVE = [case for case in LENGTH_CASES if not inductive(case[1])]


@pytest.mark.parametrize("name,position", NOT_INDUCTIVE, ids=[case[0] for case in NOT_INDUCTIVE])
def test_longer_than_the_table_is_a_clear_error(name, position):
    cfg = tiny_config(position)
    model = BertForMaskedLM(cfg)
    ids = jnp.ones((1, cfg.max_length), jnp.int32)
    variables = model.init(jax.random.PRNGKey(0), ids)
    with pytest.raises(LengthError, match=rf"{position['kind']}.*16 positions.*length 20"):
        model.apply(variables, jnp.ones((1, 20), jnp.int32))


@pytest.mark.parametrize("name,position", INDUCTIVE, ids=[case[0] for case in INDUCTIVE])
def test_inductive_mechanisms_run_past_the_configured_length(name, position):
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


@pytest.mark.parametrize("num_buckets", [4, 8, 32])
@pytest.mark.parametrize("causal", [False, True])
def test_t5_smallest_max_distance_keeps_buckets_in_their_direction(num_buckets, causal):
    exact = num_buckets // 2 if causal else num_buckets // 4
    with pytest.raises(ValueError, match=f"greater than {exact}"):
        tiny_config(dict(kind="t5", t5=dict(num_buckets=num_buckets, max_distance=exact)), causal=causal)
    tcfg = tiny_config(dict(kind="t5", t5=dict(num_buckets=num_buckets, max_distance=exact + 1)),
                       causal=causal).position.t5
    rel = np.arange(-300, 301)
    buckets = np.asarray(t5_bucket(jnp.asarray(rel), bidirectional=not causal, num_buckets=tcfg.num_buckets,
                                   max_distance=tcfg.max_distance))
    half = num_buckets if causal else num_buckets // 2
    for k, bucket in zip(rel, buckets):
        if k > 0 and causal:  # keys after the query: one bucket, 0
            assert bucket == 0, (k, bucket)
        elif k > 0:  # keys after the query: the upper half, exact for the first offsets
            assert half <= bucket < num_buckets and (k >= exact or bucket == half + k), (k, bucket)
        else:  # the query itself and keys before it: the lower half, exact for the first offsets
            assert 0 <= bucket < half and (-k >= exact or bucket == -k), (k, bucket)
    for side in (rel < 0, rel > 0):  # further keys never get a nearer bucket
        ordered = buckets[side][np.argsort(np.abs(rel[side]))]
        assert np.all(np.diff(ordered) >= 0)
    torch = pytest.importorskip("torch")
    from transformers.models.t5.modeling_t5 import T5Attention
    want = T5Attention._relative_position_bucket(torch.tensor(rel), bidirectional=not causal,
                                                 num_buckets=num_buckets, max_distance=exact + 1).numpy()
    np.testing.assert_array_equal(buckets, want)


def test_t5_smallest_max_distance_gives_finite_outputs():
    from jaxpos.models import EncoderDecoder

    ids = jax.random.randint(jax.random.PRNGKey(0), (1, 40), 1, 61)  # offsets well past max_distance
    for overrides, max_distance in ((dict(), 9), (dict(causal=True), 17)):
        cfg = tiny_config(dict(kind="t5", t5=dict(num_buckets=32, max_distance=max_distance)), **overrides)
        model = BertForMaskedLM(cfg)
        logits = model.apply(model.init(jax.random.PRNGKey(1), ids), ids)
        assert np.all(np.isfinite(logits))
    cfg = tiny_config(dict(kind="t5", t5=dict(num_buckets=32, max_distance=17)), num_decoder_layers=2)
    model = EncoderDecoder(cfg)
    logits = model.apply(model.init(jax.random.PRNGKey(1), ids, ids), ids, ids)
    assert np.all(np.isfinite(logits))


def test_tupe_scales_content_and_position_by_one_over_sqrt_2d():
    """alpha = (x W_Q + b_Q)(x W_K + b_K)^T / sqrt(2D) + (p U_Q)(p U_K)^T / sqrt(2D), from the captured layer inputs."""
    cfg = tiny_config(dict(kind="tupe"), init_std=0.3)
    ids = jax.random.randint(jax.random.PRNGKey(0), (2, cfg.max_length), 1, cfg.vocab_size)
    model = BertForMaskedLM(cfg)
    variables = model.init(jax.random.PRNGKey(1), ids)
    logits, state = model.apply(variables, ids, mutable=["intermediates"])
    params = jax.tree.map(lambda x: np.asarray(x, np.float64), flax.linen.unbox(variables["params"]))["bert"]
    encoder, inter = params["encoder"], state["intermediates"]["bert"]["encoder"]
    p = params["encoder"]["position"]["embedding"]
    root = math.sqrt(2 * cfg.head_dim)
    for layer in range(cfg.num_layers):
        attention = encoder[f"layer_{layer}"]["self_attention"]
        x = np.asarray(inter["hidden_states"][layer], np.float64)  # [B, T, d], the layer's input
        q = np.einsum("btd,dhr->bhtr", x, attention["query"]["kernel"]) + attention["query"]["bias"][None, :, None]
        k = np.einsum("btd,dhr->bhtr", x, attention["key"]["kernel"]) + attention["key"]["bias"][None, :, None]
        p_q = np.einsum("td,dhr->htr", p, encoder["position"]["u_q"][layer])
        p_k = np.einsum("td,dhr->htr", p, encoder["position"]["u_k"][layer])
        theta = encoder["position"]["cls_theta"][layer][None]
        positional = untie_cls(np.einsum("hir,hjr->hij", p_q, p_k)[None] / root, theta)[0]
        want = np.einsum("bhir,bhjr->bhij", q, k) / root + positional[None]
        got = np.log(np.asarray(inter[f"layer_{layer}"]["self_attention"]["attention_weights"][0], np.float64))
        np.testing.assert_allclose(got - got.mean(-1, keepdims=True), want - want.mean(-1, keepdims=True),
                                   atol=1e-5)
    folded = BertForMaskedLM(dataclasses.replace(cfg, attention_impl="jax"))  # the content scale when folded
    np.testing.assert_allclose(folded.apply(variables, ids), logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form,w,s", [("offset", 0.05, 1.0), ("offset", 0.001, 1.0), ("offset", 0.05, 0.5),
                                      ("abs_offset", 0.05, 1.0), ("abs_offset", 0.001, 1.0)])
def test_attenuated_tables_start_at_the_fixed_forms_interior_row(form, w, s):
    n, centre = 16, 7  # the centre row (n-1)//2
    _, learned, _ = mechanism_bias(dict(kind="attenuated", attenuated=dict(form=form, w=w, s=s)), n)
    k = np.arange(n) - centre
    alpha = np.where(k >= 0, -s * w * k**2, -w * k**2)
    want = np.exp(alpha) / np.exp(alpha).sum()
    np.testing.assert_allclose(learned[:, :, centre], np.broadcast_to(want, learned[:, :, centre].shape), atol=1e-7,
                               rtol=1e-6)
    # With 64 positions, every row 20 or more from both ends matches as well (the tails it misses are < 1e-6).
    _, learned, _ = mechanism_bias(dict(kind="attenuated", attenuated=dict(form=form, w=0.05, s=s)), 64,
                                   max_length=64)
    _, fixed, _ = mechanism_bias(dict(kind="attenuated", attenuated=dict(w=0.05, s=s)), 64, max_length=64)
    np.testing.assert_allclose(learned[:, :, 20:44], np.broadcast_to(fixed, learned.shape)[:, :, 20:44], atol=1e-6)


def test_attenuated_abs_offset_is_a_symmetric_table_over_distance():
    cfg = tiny_config(dict(kind="attenuated", attenuated=dict(form="abs_offset")))
    module = make_position(cfg, cfg.num_layers, False)
    n = 11
    pos = jnp.arange(n)
    variables = flax.linen.unbox(module.init(jax.random.PRNGKey(0), pos, pos))
    table = np.asarray(jax.random.normal(jax.random.PRNGKey(1), variables["params"]["table"].shape))
    assert table.shape == (cfg.num_layers, cfg.num_heads, cfg.max_length)
    bias = module.apply({"params": {"table": jnp.asarray(table)}}, pos, pos)
    dense = np.stack([position_logits(bias.for_layer(l), pos, pos) for l in range(cfg.num_layers)])
    want = np.zeros(dense.shape)
    for layer in range(cfg.num_layers):
        for h in range(cfg.num_heads):
            for i in range(n):
                for j in range(n):
                    want[layer, h, i, j] = table[layer, h, abs(j - i)]
    np.testing.assert_array_equal(dense, want)
    np.testing.assert_array_equal(dense, np.swapaxes(dense, -1, -2))


def attenuated_reference(n, w, s, causal=False):
    """Chen et al. eq. 8 for one piece of n tokens, in numpy: delta[i] = softmax over the piece's keys j (those
    at or before i when causal) of alpha_ij = -s*w*(j-i)^2 (j >= i), -w*(j-i)^2 (j < i); 0 at the other keys."""
    k = np.arange(n)[None, :] - np.arange(n)[:, None]
    alpha = np.where(k >= 0, -s * w * k**2, -w * k**2).astype(np.float64)
    allowed = k <= 0 if causal else np.ones((n, n), bool)
    weights = np.where(allowed, np.exp(alpha), 0.0)
    return weights / weights.sum(-1, keepdims=True), allowed


@pytest.mark.parametrize("causal", [False, True])
def test_fixed_attenuated_encoding_is_normalised_over_its_own_piece(causal):
    """Padding and a packed neighbour leave a piece's encoding, attention and outputs as they are alone."""
    from jaxpos.models import BertEncoder

    w, s, n = 0.02, 0.5, 5  # a wide kernel: keys outside the piece would take a visible share of each row
    piece = np.asarray([7, 3, 9, 4, 12], np.int32)
    neighbour = np.asarray([5, 8, 2, 11], np.int32)
    layouts = {  # name: (ids, piece ids, positions within each piece, the piece's columns)
        "alone": (piece, np.ones(n, np.int32), None, slice(0, n)),
        "padded": (np.pad(piece, (0, 7)), np.pad(np.ones(n, np.int32), (0, 7)), None, slice(0, n)),
        "packed": (np.concatenate([neighbour, piece, [0, 0, 0]]), np.asarray([1] * 4 + [2] * n + [0] * 3),
                   np.asarray([0, 1, 2, 3, 0, 1, 2, 3, 4, 0, 0, 0]), slice(4, 4 + n)),
    }
    delta, allowed = attenuated_reference(n, w, s, causal)
    want_weights = np.where(allowed, np.exp(delta), 0.0)  # position only: the logits are delta itself
    want_weights /= want_weights.sum(-1, keepdims=True)
    for position_only in (True, False):
        cfg = tiny_config(dict(kind="attenuated", position_only=position_only, attenuated=dict(w=w, s=s)),
                          causal=causal)
        model = BertEncoder(cfg)
        params = model.init(jax.random.PRNGKey(0), jnp.ones((1, 12), jnp.int32))["params"]
        hidden = {}
        for name, (ids, piece_ids, positions, columns) in layouts.items():
            out, state = model.apply(
                {"params": params}, jnp.asarray(ids)[None], piece_ids=jnp.asarray(piece_ids)[None],
                input_positions=None if positions is None else jnp.asarray(positions)[None],
                mutable=["intermediates"])
            hidden[name] = np.asarray(out)[0, columns]
            if position_only:
                weights = np.asarray(state["intermediates"]["encoder"]["layer_0"]["self_attention"]
                                     ["attention_weights"][0])[0]  # [H, T, S]
                np.testing.assert_allclose(weights[:, columns, columns], np.broadcast_to(want_weights, (4, n, n)),
                                           rtol=1e-5, atol=1e-7, err_msg=name)
        for name in ("padded", "packed"):
            np.testing.assert_allclose(hidden[name], hidden["alone"], rtol=1e-5, atol=1e-5,
                                       err_msg=f"{name}, position_only={position_only}")


def test_content_only_rope_drops_the_rotation():
    """content_only keeps q.k alone: a RoPE model computes what a model with no positional mechanism computes."""
    from jaxpos.models import BertEncoder

    ids = jax.random.randint(jax.random.PRNGKey(0), (2, 10), 1, 61)
    rope = BertEncoder(tiny_config(dict(kind="rope", content_only=True)))
    params = rope.init(jax.random.PRNGKey(1), ids)["params"]  # RoPE has no parameters: the same tree as "none"
    leaves, tree = jax.tree.flatten(params)  # perturbed, so that attention is far from uniform
    keys = jax.random.split(jax.random.PRNGKey(2), len(leaves))
    params = jax.tree.unflatten(tree, [x + 0.3 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
    got = np.asarray(rope.apply({"params": params}, ids))
    want = np.asarray(BertEncoder(tiny_config(dict(kind="none"))).apply({"params": params}, ids))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    rotated = np.asarray(BertEncoder(tiny_config(dict(kind="rope"))).apply({"params": params}, ids))
    assert np.abs(rotated - want).max() > 0.1  # the check has teeth: with positions the outputs differ


@pytest.mark.parametrize("kind", [k for k, m in MECHANISMS.items() if m.no_position_only_term or m.input_only])
def test_position_only_is_refused_where_position_lives_inside_q_dot_k_or_at_the_input(kind):
    with pytest.raises(ValueError, match=f"position_only .*{kind}"):  # by the config, before any model is built
        tiny_config(dict(kind=kind, position_only=True))
