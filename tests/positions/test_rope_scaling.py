"""RoPE's length-extension rules and p-RoPE: the inverse frequencies and attention factor of each rule against
transformers' `ROPE_INIT_FUNCTIONS`, the tables the model uses against its `LlamaRotaryEmbedding`, static NTK
against its formula and against `dynamic` at length s·L₀, p-RoPE against a numpy rotation."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.attention.core import apply_rotary
from jaxpos.config import model_config
from jaxpos.positions.rope import RopeOptions
from jaxpos.models import BertEncoder
from jaxpos.positions import make_position
from jaxpos.positions.rope import rope_frequencies, rotary_tables
from tests.helpers import TINY

RTOL = 1e-6  # float32 frequencies relative to the float64 ones (a frequency one pair off is off by 10% or more)


@pytest.fixture(scope="module")
def hf():
    """transformers' rope functions, fed a LlamaConfig (random init only: nothing is downloaded)."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    def config(head_dim, max_positions, rope_type, base, **parameters):
        return transformers.LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                                        max_position_embeddings=max_positions,
                                        rope_parameters=dict(rope_type=rope_type, rope_theta=base, **parameters))

    def frequencies(head_dim, max_positions, rope_type, base, seq_len=None, **parameters):
        cfg = config(head_dim, max_positions, rope_type, base, **parameters)
        inv_freq, factor = ROPE_INIT_FUNCTIONS[rope_type](cfg, "cpu", seq_len=seq_len)
        return inv_freq.numpy().astype(np.float64), factor

    return dict(frequencies=frequencies, config=config, rotary=LlamaRotaryEmbedding)


# (our RopeOptions fields, transformers' rope_type and parameters); L₀ enters where the rule reads it.
RULES = {
    "linear": (dict(scaling="linear", factor=4.0), "linear", dict(factor=4.0)),
    "yarn": (dict(scaling="yarn", factor=4.0), "yarn", dict(factor=4.0)),
    "yarn_betas": (dict(scaling="yarn", factor=8.0, beta_fast=16.0, beta_slow=2.0), "yarn",
                   dict(factor=8.0, beta_fast=16.0, beta_slow=2.0)),
    "llama3": (dict(scaling="llama3", factor=8.0), "llama3", dict(factor=8.0, low_freq_factor=1.0,
                                                                   high_freq_factor=4.0)),
    "llama3_bands": (dict(scaling="llama3", factor=4.0, low_freq_factor=2.0, high_freq_factor=8.0), "llama3",
                     dict(factor=4.0, low_freq_factor=2.0, high_freq_factor=8.0)),
}
SHAPES = [(64, 2048, 10_000.0), (128, 512, 500_000.0), (32, 128, 10_000.0)]  # (D, L₀, base)


@pytest.mark.parametrize("head_dim, original, base", SHAPES, ids=[f"D{d}_L{n}" for d, n, _ in SHAPES])
@pytest.mark.parametrize("rule", list(RULES))
def test_each_static_rule_matches_transformers(hf, rule, head_dim, original, base):
    ours, rope_type, theirs = RULES[rule]
    rope = RopeOptions(base=base, **ours)
    if rope_type in ("yarn", "llama3"):  # they read L₀ here; the model's own length is the stretched one
        theirs = dict(theirs, original_max_position_embeddings=original)
    want, want_factor = hf["frequencies"](head_dim, int(original * rope.factor), rope_type, base, **theirs)
    got, factor = rope_frequencies(rope, head_dim, original, original)
    np.testing.assert_allclose(got, want, rtol=RTOL)
    assert factor == pytest.approx(want_factor, rel=1e-12)
    plain, _ = rope_frequencies(RopeOptions(base=base), head_dim, original, original)
    assert not np.allclose(got, plain)  # every rule moves some frequency at these shapes
    if rope_type == "yarn":
        assert factor == pytest.approx(0.1 * math.log(rope.factor) + 1)


@pytest.mark.parametrize("length", [1024, 2048, 3000, 8192])
def test_dynamic_matches_transformers_at_the_pass_length(hf, length):
    """Below L₀ = 2048 the frequencies are RoPE's; above it the NTK base at that length."""
    head_dim, original, base, factor = 64, 2048, 10_000.0, 4.0
    want, _ = hf["frequencies"](head_dim, original, "dynamic", base, seq_len=length, factor=factor)
    got, attention = rope_frequencies(RopeOptions(base=base, scaling="dynamic", factor=factor), head_dim, original,
                                      length)
    np.testing.assert_allclose(got, want, rtol=RTOL)
    assert attention == 1.0
    plain, _ = rope_frequencies(RopeOptions(base=base), head_dim, original, length)
    assert np.allclose(got, plain) == (length <= original)


@pytest.mark.parametrize("head_dim, factor", [(64, 4.0), (128, 2.5), (16, 8.0)])
def test_static_ntk_is_its_formula_and_dynamic_at_s_times_the_original_length(hf, head_dim, factor):
    base, original = 10_000.0, 512
    formula = (base * factor ** (head_dim / (head_dim - 2))) ** (-np.arange(0, head_dim, 2) / head_dim)
    got, attention = rope_frequencies(RopeOptions(base=base, scaling="ntk", factor=factor), head_dim, original,
                                      original)
    np.testing.assert_allclose(got, formula, rtol=1e-12)
    assert attention == 1.0
    # dynamic with factor 1 at length s·L₀: base · (s·L₀/L₀ − 0)^(D/(D−2))
    want, _ = hf["frequencies"](head_dim, original, "dynamic", base, seq_len=int(factor * original), factor=1.0)
    np.testing.assert_allclose(got, want, rtol=RTOL)
    # the highest frequency stays 1, the lowest is divided by s
    assert got[0] == 1.0 and got[-1] == pytest.approx(base ** (-(head_dim - 2) / head_dim) / factor, rel=1e-12)


def position_tables(position: dict, length: int, **model):
    """The cos, sin [T, D/2] that a model of `position` (TINY otherwise) rotates a row of `length` tokens by."""
    cfg = model_config(dict(TINY, position=position, **model))
    module = make_position(cfg, cfg.num_layers, False)
    pos = jnp.arange(length)
    bias = module.apply(module.init(jax.random.PRNGKey(0), pos, pos), pos, pos)
    rotary = bias.term("rotary")
    np.testing.assert_array_equal(rotary.cos_q, rotary.cos_k)  # one set of frequencies for q and k
    return np.asarray(rotary.cos_q[0], np.float64), np.asarray(rotary.sin_q[0], np.float64)


@pytest.mark.parametrize("rope_type, parameters, length", [
    ("yarn", dict(factor=4.0), 96), ("llama3", dict(factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0), 96),
    ("linear", dict(factor=2.0), 64), ("dynamic", dict(factor=4.0), 80), ("dynamic", dict(factor=4.0), 20)])
def test_the_models_tables_are_transformers_rotary_embedding(hf, rope_type, parameters, length):
    """What the model rotates by: cos, sin of its pass at `length` tokens, the attention factor in both."""
    head_dim, original = 32, 24
    cos, sin = position_tables(dict(kind="rope", rope=dict(scaling=rope_type, **parameters)), length,
                               d_model=4 * head_dim, max_length=original)
    torch = pytest.importorskip("torch")
    extra = dict(original_max_position_embeddings=original) if rope_type in ("yarn", "llama3") else {}
    cfg = hf["config"](head_dim, original * (4 if extra else 1), rope_type, 10_000.0, **parameters, **extra)
    want_cos, want_sin = hf["rotary"](cfg)(torch.zeros(1, dtype=torch.float32), torch.arange(length)[None])
    want_cos, want_sin = (t[0, :, :head_dim // 2].numpy().astype(np.float64) for t in (want_cos, want_sin))
    # float32 angles up to 95 rad: an ulp of a float32 frequency times the position is ~1e-5 (found: 7.6e-6); a
    # frequency one rule off moves cos by 1e-2 or more
    np.testing.assert_allclose(cos, want_cos, atol=2e-5)
    np.testing.assert_allclose(sin, want_sin, atol=2e-5)
    if rope_type == "yarn":
        m = 0.1 * math.log(4.0) + 1
        np.testing.assert_allclose(cos ** 2 + sin ** 2, m ** 2, rtol=1e-6)


def test_yarn_scales_the_logits_by_the_square_of_its_attention_factor_and_keeps_them_relative():
    """q·k after rotation by YaRN's tables (p-RoPE too) is m² times q·k after rotation by the same angles without
    m, and depends on the offset j − i only."""
    rng = np.random.default_rng(0)
    q, k = (jnp.asarray(rng.normal(size=(1, 12, 2, 16)), jnp.float32) for _ in range(2))
    theta, m = rope_frequencies(RopeOptions(scaling="yarn", factor=8.0, fraction=0.5), 16, 6, 12)

    def logits(positions, factor):
        tables = rotary_tables(jnp.asarray(positions), theta, factor)
        return np.asarray(jnp.einsum("bthd,bshd->bhts", apply_rotary(q, *tables), apply_rotary(k, *tables)))

    scaled = logits(np.arange(12), m)
    np.testing.assert_allclose(scaled, (0.1 * math.log(8.0) + 1) ** 2 * logits(np.arange(12), 1.0), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(logits(np.arange(12) + 7, m), scaled, rtol=1e-4, atol=1e-4)


def numpy_p_rope(x: np.ndarray, positions: np.ndarray, fraction: float, base: float) -> np.ndarray:
    """p-RoPE by its definition: pair k = (x[k], x[k + D/2]) turns by position · base^(−2k/D), a complex product,
    for the ⌊fraction·D/2⌋ pairs of highest frequency (k smallest); the other pairs are copied."""
    head_dim = x.shape[-1]
    half, rotated = head_dim // 2, int(fraction * head_dim // 2)
    out = x.astype(np.float64).copy()
    for k in range(rotated):
        angle = positions * base ** (-2 * k / head_dim)
        z = (x[..., k] + 1j * x[..., k + half]) * np.exp(1j * angle)[None, :, None]
        out[..., k], out[..., k + half] = z.real, z.imag
    return out


@pytest.mark.parametrize("fraction, head_dim", [(0.5, 16), (0.25, 32), (0.75, 8), (0.3, 20)])
def test_p_rope_rotates_the_highest_frequencies_and_copies_the_rest(fraction, head_dim):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 10, 4, head_dim)).astype(np.float32)
    positions = np.arange(3, 13)  # packed rows read the tables at other positions than 0..T-1
    cos, sin = position_tables(dict(kind="rope", rope=dict(fraction=fraction)), 16, d_model=4 * head_dim)
    got = np.asarray(apply_rotary(jnp.asarray(x), jnp.asarray(cos[positions], jnp.float32),
                                  jnp.asarray(sin[positions], jnp.float32)))
    np.testing.assert_allclose(got, numpy_p_rope(x, positions, fraction, 10_000.0), atol=2e-5)
    rotated = int(fraction * head_dim // 2)
    kept = np.r_[rotated:head_dim // 2, head_dim // 2 + rotated:head_dim]  # the lowest frequencies' pairs
    np.testing.assert_array_equal(got[..., kept], x[..., kept])
    assert not np.allclose(got[..., :rotated], x[..., :rotated])


def test_p_rope_is_transformers_proportional_rope(hf):
    for fraction, head_dim in [(0.5, 64), (0.25, 256), (0.3, 20)]:
        want, factor = hf["frequencies"](head_dim, 512, "proportional", 10_000.0, partial_rotary_factor=fraction)
        got, attention = rope_frequencies(RopeOptions(fraction=fraction), head_dim, 512, 512)
        np.testing.assert_allclose(got, want, rtol=RTOL)
        assert (got == 0).sum() == head_dim // 2 - int(fraction * head_dim // 2) and attention == factor == 1.0


def test_p_rope_and_yarn_change_what_a_model_computes():
    """The rule reaches the model's attention: an encoder's output under it differs from plain RoPE's with the
    same parameters (none is added; weights large enough for attention to be far from uniform)."""
    ids = jax.random.randint(jax.random.PRNGKey(0), (1, 12), 1, 61)
    outs = {}
    for name, rope in [("plain", {}), ("yarn", dict(scaling="yarn", factor=4.0, original_max_length=6)),
                       ("p_rope", dict(fraction=0.5))]:
        model = BertEncoder(model_config(dict(TINY, init_std=0.5, position=dict(kind="rope", rope=rope))))
        params = outs.get("params") or model.init(jax.random.PRNGKey(1), ids)["params"]
        outs.setdefault("params", params)
        outs[name] = np.asarray(model.apply({"params": params}, ids))
    assert all(np.isfinite(outs[n]).all() for n in ("yarn", "p_rope"))
    assert np.abs(outs["yarn"] - outs["plain"]).max() > 0.05
    assert np.abs(outs["p_rope"] - outs["plain"]).max() > 0.05
