"""The wave's mechanisms and attention options against numpy written in the test: FoX's forget gates (a brute-force
loop over the tokens between key and query, both directions, packed rows), Scalable-Softmax (the keys each query
attends counted one by one), PoPE (the paper's equations 3-6 in their cosine form, where jaxpos computes the
real dot product of equations 7-10), RoPE and ALiBi on the first h heads, a sink logit, the output gate and
Llama 4's temperature with a NoPE plan, each through jaxpos's whole attention layer."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.positions.fox import forget_decay
from jaxpos.attention.layer import MultiHeadAttention
from jaxpos.attention.mask import AttentionMask
from jaxpos.models import BertForMaskedLM
from jaxpos.models.layers import layer_bias, stack_bias
from jaxpos.positions import make_position
from jaxpos.positions.alibi import alibi_slopes
from tests.helpers import tiny_config

B, T, HEADS, D = 2, 8, 4, 8
PACKED = np.asarray([[1, 1, 1, 2, 2, 2, 2, 0], [1, 1, 1, 1, 1, 1, 0, 0]])  # two pieces, then padding


def random_tree(tree, seed, scale=0.5):
    leaves, structure = jax.tree.flatten(tree)
    rng = np.random.default_rng(seed)
    return jax.tree.unflatten(structure, [jnp.asarray(rng.normal(size=x.shape) * scale, jnp.float32)
                                          for x in leaves])


def layer_run(cfg, x, pieces=PACKED, position_params=None, layer=0, seed=0):
    """jaxpos's attention layer `layer` with random weights on x [B, T, d]: its output, its weights (numpy) and the
    mechanism's parameters (random where not given)."""
    plan = cfg.plan[layer]
    pos = jnp.arange(T)
    mechanism = make_position(cfg, cfg.num_layers, cfg.causal)
    variables = mechanism.init(jax.random.PRNGKey(0), pos, pos)
    if position_params is None:
        position_params = random_tree(nn.unbox(variables.get("params", {})), seed + 100)
    bias = mechanism.apply({"params": position_params}, pos, pos)
    bias = layer_bias(stack_bias(bias, pos, pos, randomized=False), layer, plan)
    mask = AttentionMask.within_pieces(jnp.asarray(pieces), causal=cfg.causal, window=plan.window)
    attention = MultiHeadAttention(cfg, nope=not plan.positions)
    kwargs = dict(bias=bias, q_pos=pos, k_pos=pos, mask=mask)
    weights = random_tree(nn.unbox(attention.init(jax.random.PRNGKey(1), x, x, **kwargs)["params"]), seed)
    out = attention.apply({"params": weights}, jnp.asarray(x), jnp.asarray(x), **kwargs)
    as_numpy = lambda tree: jax.tree.map(lambda a: np.asarray(a, np.float64), tree)  # noqa: E731
    return np.asarray(out), as_numpy(weights), as_numpy(position_params)


def allowed(pieces, causal, window=None):
    """[B, T, S] bool, written out: same piece, not padding, not after the query when causal, within the window."""
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    ok = (pieces[:, :, None] == pieces[:, None, :]) & (pieces[:, None, :] != 0)
    ok = ok & ((j <= i) if causal else True)
    return ok & ((np.abs(j - i) <= window // 2) if window else True)


def projections(x, w):
    x = x.astype(np.float64)
    return [np.einsum("btd,dhk->bthk", x, w[name]["kernel"]) + w[name].get("bias", 0.0)
            for name in ("query", "key", "value")]


def finish(logits, v, w, ok, sinks=None, gate=None):
    """Softmax over the allowed keys (with a sink logit per head in the denominator), values, the output gate and
    the output projection. logits [B, H, T, S]."""
    logits = np.where(ok[:, None], logits, -np.inf)
    top = logits.max(-1, keepdims=True)
    weights = np.exp(logits - top)
    denominator = weights.sum(-1, keepdims=True)
    if sinks is not None:
        denominator = denominator + np.exp(sinks[None, :, None, None] - top)
    out = np.einsum("bhts,bshk->bthk", weights / denominator, v)
    if gate is not None:
        out = out / (1.0 + np.exp(-gate))
    return np.einsum("bthk,hkd->btd", out, w["out"]["kernel"]) + w["out"].get("bias", 0.0)


def assert_valid_rows_close(got, want, pieces=PACKED, tolerance=2e-5):
    rows = pieces != 0
    np.testing.assert_allclose(got[rows], want[rows], rtol=tolerance, atol=tolerance)


def log_sigmoid(z):
    return -np.logaddexp(0.0, -z)


# --- FoX --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_fox_forget_gates_against_a_loop_over_the_tokens_between(causal):
    """D_ij = Σ_{l=j+1..i} log σ(w·x_l + b) for keys up to the query; an encoder's keys after it take the second
    gate, Σ_{l=i..j-1} log σ(w'·x_l + b'); packed rows keep each piece's decay to itself."""
    cfg = tiny_config(dict(kind="fox"), causal=causal)
    x = np.random.default_rng(0).normal(size=(B, T, cfg.d_model)).astype(np.float32)
    got, w, fox = layer_run(cfg, x)
    assert fox["w"].shape == (2, cfg.d_model, HEADS, 1 if causal else 2)
    gates = log_sigmoid(np.einsum("btd,dhr->bthr", x.astype(np.float64), fox["w"][0]) + fox["b"][0])
    q, k, v = projections(x, w)
    logits = np.einsum("bthk,bshk->bhts", q, k) / math.sqrt(D)
    for b in range(B):
        for h in range(HEADS):
            for i in range(T):
                for j in range(T):
                    if j <= i:
                        logits[b, h, i, j] += sum(gates[b, l, h, 0] for l in range(j + 1, i + 1))
                    else:
                        logits[b, h, i, j] += sum(gates[b, l, h, 1] for l in range(i, j)) if not causal else 0.0
    assert_valid_rows_close(got, finish(logits, v, w, allowed(PACKED, causal)))


def test_fox_decay_of_a_constant_gate_is_alibi():
    """A constant gate f gives D_ij = (i - j) log f before the query, and (j - i) log f' after it."""
    gates = jnp.broadcast_to(jnp.log(jnp.asarray([0.9, 0.5])), (1, 6, 1, 2))
    decay = np.asarray(forget_decay(gates))[0, 0]
    i, j = np.arange(6)[:, None], np.arange(6)[None, :]
    want = np.where(j <= i, (i - j) * math.log(0.9), (j - i) * math.log(0.5))
    np.testing.assert_allclose(decay, want, rtol=1e-5, atol=1e-6)


# --- Scalable-Softmax -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (False, 4)],
                         ids=["bidirectional", "causal", "windowed"])
def test_length_scaled_logits_multiply_by_s_log_of_the_keys_attended(causal, window):
    """Scalable-Softmax: the whole logit (content and ALiBi's bias) times s_h log n_i, n_i counted key by key (its
    piece, up to itself when causal, within its window)."""
    plan = [dict(window=window)] * 2 if window else []
    cfg = tiny_config(dict(kind="alibi"), causal=causal, length_scaled_logits=True, layers=plan)
    x = np.random.default_rng(1).normal(size=(B, T, cfg.d_model)).astype(np.float32)
    got, w, _ = layer_run(cfg, x, seed=1)
    ok = allowed(PACKED, causal, window)
    q, k, v = projections(x, w)
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    slopes = alibi_slopes(HEADS).astype(np.float64)
    logits = np.einsum("bthk,bshk->bhts", q, k) / math.sqrt(D) - slopes[:, None, None] * np.abs(j - i)
    for b in range(B):
        for t in range(T):
            keys = sum(bool(ok[b, t, s]) for s in range(T))
            logits[b, :, t] *= w["length_scale"][:, None] * math.log(max(keys, 1))
    assert_valid_rows_close(got, finish(logits, v, w, ok))


def test_length_scale_starts_at_one_over_log_of_the_training_length():
    cfg = tiny_config(dict(kind="none"), length_scaled_logits=True)
    params = BertForMaskedLM(cfg).init(jax.random.PRNGKey(0), jnp.ones((1, 4), jnp.int32))["params"]
    s = nn.unbox(params)["bert"]["encoder"]["layer_0"]["self_attention"]["length_scale"]
    np.testing.assert_allclose(s, np.full(HEADS, 1 / math.log(cfg.max_length)), rtol=1e-6)


# --- PoPE -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_pope_against_the_papers_cosine_form(causal):
    """Eq. 3: μ = softplus of each channel of q and k; eq. 4: phases tθ_c and sθ_c, θ_c = base^(-(c-1)/d), c = 1..d
    (the paper's exponent printed without its minus sign); eq. 6: a_ts = Σ_c μ_q μ_k cos((s - t)θ_c + δ_c), δ
    clamped to [-2π, 0] (the offsets below reach outside it), scaled by 1/sqrt(d) as the content logit is.
    jaxpos computes eq. 10's real dot product of (μ cos φ, μ sin φ); this is eq. 6 summed directly."""
    cfg = tiny_config(dict(kind="pope", pope=dict(base=100.0)), causal=causal)
    x = np.random.default_rng(2).normal(size=(B, T, cfg.d_model)).astype(np.float32)
    delta = np.random.default_rng(3).uniform(-8.0, 2.0, size=(2, HEADS, D))  # beyond both ends of the clamp
    got, w, _ = layer_run(cfg, x, position_params={"delta": jnp.asarray(delta, jnp.float32)}, seed=2)
    q, k, v = projections(x, w)
    mu_q, mu_k = np.logaddexp(0.0, q), np.logaddexp(0.0, k)  # eq. 3
    theta = 100.0 ** (-np.arange(D) / D)  # eq. 4, c = 1..d as 0..d-1
    d = np.clip(delta[0], -2 * np.pi, 0.0)  # eq. 6's clamp
    logits = np.zeros((B, HEADS, T, T))
    for t in range(T):
        for s in range(T):
            angle = (s - t) * theta[None, :] + d  # [H, D]
            logits[:, :, t, s] = np.sum(mu_q[:, t] * mu_k[:, s] * np.cos(angle)[None], axis=-1) / math.sqrt(D)
    assert_valid_rows_close(got, finish(logits, v, w, allowed(PACKED, causal)))


# --- a subset of heads ------------------------------------------------------------------------------------------

def test_rope_on_the_first_heads_leaves_the_others_unrotated():
    cfg = tiny_config(dict(kind="rope", rope=dict(heads=3)))
    x = np.random.default_rng(4).normal(size=(B, T, cfg.d_model)).astype(np.float32)
    got, w, _ = layer_run(cfg, x, seed=4)
    q, k, v = projections(x, w)
    angles = np.arange(T)[:, None] * 10_000.0 ** (-np.arange(0, D, 2) / D)  # [T, D/2]
    cos, sin = np.cos(angles)[None, :, None], np.sin(angles)[None, :, None]

    def rotate(a):
        turned = np.concatenate([a[..., :D // 2] * cos - a[..., D // 2:] * sin,
                                 a[..., D // 2:] * cos + a[..., :D // 2] * sin], -1)
        return np.concatenate([turned[:, :, :3], a[:, :, 3:]], axis=2)

    logits = np.einsum("bthk,bshk->bhts", rotate(q), rotate(k)) / math.sqrt(D)
    assert_valid_rows_close(got, finish(logits, v, w, allowed(PACKED, False)))


def test_alibi_on_the_first_heads_takes_the_slopes_of_a_model_of_that_many_heads():
    cfg = tiny_config(dict(kind="alibi", alibi=dict(heads=2)))
    pos = jnp.arange(5)
    table = np.asarray(make_position(cfg, 2, False).apply({}, pos, pos).terms[0].table)[0]  # [H, 2*5 - 1]
    offsets = np.arange(-4, 5)
    want = np.stack([-2.0 ** -4 * np.abs(offsets), -2.0 ** -8 * np.abs(offsets), 0 * offsets, 0 * offsets])
    np.testing.assert_allclose(table, want, rtol=1e-6, atol=0)


# --- sinks, the output gate, the NoPE temperature ---------------------------------------------------------------

def test_sinks_and_the_output_gate_with_llama4s_temperature_in_a_nope_layer():
    """Every attention option at once in the NoPE layer of a causal plan: QK-norm (RMSNorm over each head's D,
    learned scale), the temperature log(⌊(i + 1)/floor⌋ + 1)·scale + 1 on the queries, a sink logit per head,
    σ(x W_g) on each head's output."""
    cfg = tiny_config(dict(kind="rope"), causal=True, nope_every=2, nope_temperature=0.3, nope_temperature_floor=3,
                      attention_sinks=True, output_gate=True, qk_norm=True)
    x = np.random.default_rng(5).normal(size=(B, T, cfg.d_model)).astype(np.float32)
    got, w, _ = layer_run(cfg, x, layer=1, seed=5)
    q, k, v = projections(x, w)

    def rms(a, scale):
        return a / np.sqrt(np.mean(a * a, -1, keepdims=True) + cfg.layer_norm_eps) * scale

    q, k = rms(q, w["q_norm"]), rms(k, w["k_norm"])
    q = q * (np.log1p(np.floor((np.arange(T) + 1.0) / 3)) * 0.3 + 1.0)[None, :, None, None]
    logits = np.einsum("bthk,bshk->bhts", q, k) / math.sqrt(D)
    gate = np.einsum("btd,dhk->bthk", x.astype(np.float64), w["gate"]["kernel"]) + w["gate"]["bias"]
    assert_valid_rows_close(got, finish(logits, v, w, allowed(PACKED, True), sinks=w["sinks"], gate=gate))


def test_nope_temperature_needs_a_nope_layer():
    with pytest.raises(ValueError, match="model.nope_temperature scales the queries of NoPE layers"):
        tiny_config(dict(kind="rope"), nope_temperature=0.1)
