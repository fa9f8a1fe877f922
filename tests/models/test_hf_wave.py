"""The 2025-26 wave's attention layers against transformers' own (peer reference, eager attention, float32).

Tiny random attention layers of Cohere2, SmolLM3, Llama 4, gpt-oss, Qwen3-Next and Gemma 3, with their weights
copied into jaxpos's MultiHeadAttention, each layer of a model reading its slice of the plan (window, NoPE), on
two paths: jaxpos's causal path against transformers' layer under the mask its model builds (causal, and
`kv > q - W` in a sliding layer of window W) with a padded row; and bidirectionally (jaxpos's window,
|j - i| <= W/2) against a numpy transcription of the same layer's formula. A causal sliding window of W keys (the
query's own included) is jaxpos's `window` 2(W - 1). Grouped keys are not positional: every model here has as
many key heads as query heads."""

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxpos.attention.layer import MultiHeadAttention  # noqa: E402
from jaxpos.attention.mask import AttentionMask  # noqa: E402
from jaxpos.models.layers import layer_bias, stack_bias  # noqa: E402
from jaxpos.positions import make_position  # noqa: E402
from tests.helpers import tiny_config  # noqa: E402

B, T, HEADS = 2, 8, 4
PIECES = np.ones((B, T), np.int32)
PIECES[1, 6:] = 0  # the second row's last two tokens are padding
TOLERANCE = 1e-5  # float32 on both sides, relative to the largest output entry (at least 1): measured 7e-8 to 4e-7


def hf_attention(module, config, layer: int, std: float = 0.2):
    """transformers' attention layer `layer` of `config` (eager), every parameter drawn N(0, std²)."""
    config._attn_implementation = "eager"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        attention = module(config, layer_idx=layer).eval()
    generator = torch.Generator().manual_seed(layer + 1)
    with torch.no_grad():
        for parameter in attention.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * std)
    return attention


def numpy_params(attention) -> dict:
    return {name: p.detach().numpy().astype(np.float64) for name, p in attention.named_parameters()}


def hf_allowed(window: int | None) -> np.ndarray:
    """[B, 1, T, T] bool: the mask transformers' models build for a causal layer (a sliding one: kv > q - W)."""
    q, kv = np.arange(T)[:, None], np.arange(T)[None, :]
    allowed = (kv <= q) & (kv > q - window if window else True)
    return allowed[None, None] & PIECES.astype(bool)[:, None, None, :]


def jaxpos_allowed(window: int | None) -> np.ndarray:
    """[B, 1, T, T] bool: jaxpos's bidirectional mask, |j - i| <= window // 2 within a window, padding masked."""
    offsets = np.arange(T)[None, :] - np.arange(T)[:, None]
    allowed = np.abs(offsets) <= window // 2 if window else np.ones((T, T), bool)
    return allowed[None, None] & PIECES.astype(bool)[:, None, None, :]


def run_hf(attention, x, position_embeddings, allowed) -> np.ndarray:
    additive = torch.from_numpy(np.where(allowed, 0.0, np.finfo(np.float32).min).astype(np.float32))
    with torch.no_grad():
        out, _ = attention(hidden_states=torch.from_numpy(x), position_embeddings=position_embeddings,
                           attention_mask=additive)
    return out.numpy()


def kernel(weight, heads, head_dim, channels=None):
    """A torch Linear weight [H*D, d] as jaxpos's query/key/value kernel [d, H, D] (channels: a permutation of D)."""
    w = weight.reshape(heads, head_dim, -1).transpose(2, 0, 1)
    return w if channels is None else w[..., channels]


def jaxpos_weights(p, heads, head_dim, channels=None, gated_query=False, norm_scale=None, q_factor=1.0) -> dict:
    """jaxpos's MultiHeadAttention parameters from transformers' (numpy) ones. channels: the permutation that
    takes an interleaved RoPE layout (pairs 2c, 2c + 1) to jaxpos's halves (pairs c, c + D/2); gated_query:
    Qwen3-Next's q_proj, [query | gate] per head; norm_scale: the QK-norm scale from the weight w ((1 + w) where
    transformers scales by it); q_factor: a factor folded into the query norm's scale (another logit scale)."""
    wq, bq = p["q_proj.weight"], p.get("q_proj.bias")
    weights = {}
    if gated_query:
        wq = wq.reshape(heads, 2, head_dim, -1)
        weights["gate"] = {"kernel": kernel(wq[:, 1].reshape(heads * head_dim, -1), heads, head_dim)}
        wq = wq[:, 0].reshape(heads * head_dim, -1)
    weights["query"] = {"kernel": kernel(wq, heads, head_dim, channels)}
    weights["key"] = {"kernel": kernel(p["k_proj.weight"], heads, head_dim, channels)}
    weights["value"] = {"kernel": kernel(p["v_proj.weight"], heads, head_dim)}
    weights["out"] = {"kernel": p["o_proj.weight"].T.reshape(heads, head_dim, -1)}
    if bq is not None:
        for name, torch_name in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
            b = p[f"{torch_name}.bias"].reshape(heads, head_dim)
            weights[name]["bias"] = b if name == "value" or channels is None else b[:, channels]
        weights["out"]["bias"] = p["o_proj.bias"]
    if norm_scale is not None:
        weights["q_norm"] = norm_scale(p["q_norm.weight"]) * q_factor
        weights["k_norm"] = norm_scale(p["k_norm.weight"])
    if "sinks" in p:
        weights["sinks"] = p["sinks"]
    return jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), weights)


def run_jaxpos(cfg, layer: int, weights: dict, x) -> np.ndarray:
    """Layer `layer` of cfg's plan: its slice of the mechanism's bias (none in a NoPE layer), its window, the
    causal or bidirectional mask, on x [B, T, d] with the padded row."""
    plan = cfg.plan[layer]
    pos = jnp.arange(T)
    bias, _ = make_position(cfg, cfg.num_layers, cfg.causal).init_with_output(jax.random.PRNGKey(0), pos, pos)
    bias = layer_bias(stack_bias(bias, pos, pos, randomized=False), layer, plan)
    mask = AttentionMask.within_pieces(jnp.asarray(PIECES), causal=cfg.causal, window=plan.window)
    attention = MultiHeadAttention(cfg, nope=not plan.positions)
    kwargs = dict(bias=bias, q_pos=pos, k_pos=pos, mask=mask)
    shapes = jax.eval_shape(lambda: nn.unbox(attention.init(jax.random.PRNGKey(0), x, x, **kwargs)["params"]))
    assert jax.tree.structure(shapes) == jax.tree.structure(weights), "every jaxpos parameter has a source"
    return np.asarray(attention.apply({"params": weights}, jnp.asarray(x), jnp.asarray(x), **kwargs))


# --- numpy transcriptions ---------------------------------------------------------------------------------------

def inverse_frequencies(theta, dim):
    return 1.0 / theta ** (np.arange(0, dim, 2) / dim)


def rope_halves(x, theta):
    """Llama's layout: channel pairs (c, c + D/2) turned by position · θ_c. x [B, H, T, D]."""
    angles = np.arange(T)[:, None] * inverse_frequencies(theta, x.shape[-1])
    cos, sin = np.tile(np.cos(angles), 2), np.tile(np.sin(angles), 2)
    half = x.shape[-1] // 2
    return x * cos + np.concatenate([-x[..., half:], x[..., :half]], -1) * sin


def rope_interleaved(x, theta):
    """GPT-J's layout (Cohere2, Llama 4): channel pairs (2c, 2c + 1) turned by position · θ_c."""
    angles = np.arange(T)[:, None] * inverse_frequencies(theta, x.shape[-1])
    cos, sin = np.cos(angles), np.sin(angles)
    out = np.empty_like(x)
    out[..., 0::2] = x[..., 0::2] * cos - x[..., 1::2] * sin
    out[..., 1::2] = x[..., 1::2] * cos + x[..., 0::2] * sin
    return out


def numpy_layer(x, p, heads, allowed, *, rope=None, norm_plus_one=False, eps=1e-6, scale=None, sinks=False,
                gated=False, temperature=None):
    """One attention layer from transformers' weights p, written out: projections, QK-norm (RMSNorm with scale
    1 + w), RoPE (theta, layout), Llama 4's temperature (floor, scale), logits scaled, masked by `allowed`
    [B, 1, T, S], softmax with a sink logit per head, the output gate σ(gate) and the output projection."""
    def linear(name, v):
        return v @ p[f"{name}.weight"].T + p.get(f"{name}.bias", 0.0)

    x = x.astype(np.float64)
    q = linear("q_proj", x).reshape(B, T, heads, -1)
    gate = None
    if gated:
        q, gate = np.split(q, 2, axis=-1)
    k = linear("k_proj", x).reshape(B, T, heads, -1)
    v = linear("v_proj", x).reshape(B, T, heads, -1)
    q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))
    head_dim = q.shape[-1]
    if norm_plus_one:
        def rms(a, w):
            return a / np.sqrt(np.mean(a * a, -1, keepdims=True) + eps) * (1.0 + w)
        q, k = rms(q, p["q_norm.weight"]), rms(k, p["k_norm.weight"])
    if rope is not None:
        theta, layout = rope
        q, k = (rope_halves if layout == "halves" else rope_interleaved)(q, theta), \
            (rope_halves if layout == "halves" else rope_interleaved)(k, theta)
    if temperature is not None:
        floor, attn_scale = temperature
        q = q * (np.log1p(np.floor((np.arange(T) + 1.0) / floor)) * attn_scale + 1.0)[:, None]
    logits = q @ k.transpose(0, 1, 3, 2) * (scale or head_dim ** -0.5)
    logits = np.where(allowed, logits, -np.inf)
    top = logits.max(-1, keepdims=True)
    if sinks:
        top = np.maximum(top, p["sinks"][None, :, None, None])
    weights = np.exp(logits - top)
    denominator = weights.sum(-1, keepdims=True)
    if sinks:
        denominator = denominator + np.exp(p["sinks"][None, :, None, None] - top)
    out = (weights / denominator @ v).transpose(0, 2, 1, 3).reshape(B, T, -1)
    if gated:
        out = out * (1.0 / (1.0 + np.exp(-gate.reshape(B, T, -1))))
    return linear("o_proj", out)


def assert_close(got, want, what):
    valid = PIECES.astype(bool)
    error = float(np.max(np.abs(got[valid] - want[valid])) / max(1.0, np.max(np.abs(want[valid]))))
    assert error < TOLERANCE, f"{what}: max |jaxpos - reference| / max |reference| = {error:.2e}"


def inputs(width, seed=0):
    return np.random.default_rng(seed).normal(size=(B, T, width)).astype(np.float32)


INTERLEAVED_TO_HALVES = lambda head_dim: np.concatenate([np.arange(0, head_dim, 2),  # noqa: E731
                                                          np.arange(1, head_dim, 2)])


# --- the models ---------------------------------------------------------------------------------------------------

def test_cohere2_interleaves_local_rope_layers_with_global_nope_layers():
    """Command R7B / Command A: three sliding-window layers with (interleaved) RoPE, then a global layer without
    positions; the plan written layer by layer gives each layer its window and its positions."""
    from transformers.models.cohere2.modeling_cohere2 import Cohere2Attention, Cohere2RotaryEmbedding

    window = 3
    config = transformers.Cohere2Config(hidden_size=32, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                                        num_hidden_layers=4, intermediate_size=64, vocab_size=100,
                                        sliding_window=window, pad_token_id=None, bos_token_id=None,
                                        eos_token_id=None, rope_parameters={"rope_type": "default",
                                                                            "rope_theta": 10_000.0})
    plan = [dict(window=2 * (window - 1))] * 3 + [dict(positions=False)]
    x, head_dim = inputs(32), 8
    cos_sin = Cohere2RotaryEmbedding(config)(torch.from_numpy(x), torch.arange(T)[None])
    for causal in (True, False):
        cfg = tiny_config(dict(kind="rope"), num_layers=4, causal=causal, use_bias=False, layers=plan)
        for layer in range(4):
            sliding = config.layer_types[layer] == "sliding_attention"
            assert (cfg.plan[layer].window is not None, cfg.plan[layer].positions) == (sliding, sliding)
            attention = hf_attention(Cohere2Attention, config, layer)
            p = numpy_params(attention)
            got = run_jaxpos(cfg, layer, jaxpos_weights(p, HEADS, head_dim, INTERLEAVED_TO_HALVES(head_dim)), x)
            if causal:
                want = run_hf(attention, x, cos_sin, hf_allowed(window if sliding else None))
            else:
                want = numpy_layer(x, p, HEADS, jaxpos_allowed(cfg.plan[layer].window),
                                   rope=(10_000.0, "interleaved") if sliding else None)
            assert_close(got, want, f"cohere2 layer {layer} causal={causal}")


def test_smollm3_drops_rope_in_every_fourth_layer():
    """SmolLM3's no_rope_layers (every fourth layer NoPE) is jaxpos's model.nope_every=4."""
    from transformers.models.smollm3.modeling_smollm3 import SmolLM3Attention, SmolLM3RotaryEmbedding

    config = transformers.SmolLM3Config(hidden_size=32, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                                        num_hidden_layers=4, intermediate_size=64, vocab_size=100,
                                        pad_token_id=None, bos_token_id=None, eos_token_id=None,
                                        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0})
    x = inputs(32, 1)
    cos_sin = SmolLM3RotaryEmbedding(config)(torch.from_numpy(x), torch.arange(T)[None])
    for causal in (True, False):
        cfg = tiny_config(dict(kind="rope"), num_layers=4, causal=causal, use_bias=False, nope_every=4)
        for layer in range(4):
            assert cfg.plan[layer].positions == bool(config.no_rope_layers[layer])
            attention = hf_attention(SmolLM3Attention, config, layer)
            p = numpy_params(attention)
            got = run_jaxpos(cfg, layer, jaxpos_weights(p, HEADS, 8), x)
            want = run_hf(attention, x, cos_sin, hf_allowed(None)) if causal else numpy_layer(
                x, p, HEADS, jaxpos_allowed(None), rope=(10_000.0, "halves") if cfg.plan[layer].positions else None)
            assert_close(got, want, f"smollm3 layer {layer} causal={causal}")


def test_llama4_scales_the_queries_of_its_nope_layers_by_position():
    """Llama 4: NoPE every fourth layer, whose queries take the temperature log(⌊(i + 1)/floor⌋ + 1)·scale + 1
    (attn_temperature_tuning; floor 2 and scale 0.5 so that 8 positions see it), RoPE layers interleaved."""
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention, Llama4TextRotaryEmbedding

    config = transformers.Llama4TextConfig(
        hidden_size=32, num_attention_heads=HEADS, num_key_value_heads=HEADS, head_dim=8, num_hidden_layers=4,
        intermediate_size=64, intermediate_size_mlp=64, num_local_experts=2, vocab_size=100, pad_token_id=None,
        bos_token_id=None, eos_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
        floor_scale=2, attn_scale=0.5, attn_temperature_tuning=True, use_qk_norm=False)
    x = inputs(32, 2)
    freqs = Llama4TextRotaryEmbedding(config)(torch.from_numpy(x), torch.arange(T)[None])
    for causal in (True, False):
        cfg = tiny_config(dict(kind="rope"), num_layers=4, causal=causal, use_bias=False, nope_every=4,
                          nope_temperature=0.5, nope_temperature_floor=2)
        for layer in (0, 3):
            rope_layer = bool(config.no_rope_layers[layer])
            assert cfg.plan[layer].positions == rope_layer
            attention = hf_attention(Llama4TextAttention, config, layer)
            p = numpy_params(attention)
            got = run_jaxpos(cfg, layer, jaxpos_weights(p, HEADS, 8, INTERLEAVED_TO_HALVES(8)), x)
            want = run_hf(attention, x, freqs, hf_allowed(None)) if causal else numpy_layer(
                x, p, HEADS, jaxpos_allowed(None), rope=(10_000.0, "interleaved") if rope_layer else None,
                temperature=None if rope_layer else (2, 0.5))
            assert_close(got, want, f"llama4 layer {layer} causal={causal}")


def test_gpt_oss_sinks_in_sliding_and_full_layers():
    """gpt-oss: a learned sink logit per head in the softmax's denominator, alternating sliding and full layers,
    attention biases."""
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention, GptOssRotaryEmbedding

    window = 3
    config = transformers.GptOssConfig(
        hidden_size=32, num_attention_heads=HEADS, num_key_value_heads=HEADS, head_dim=8, num_hidden_layers=2,
        intermediate_size=64, num_local_experts=2, num_experts_per_tok=1, vocab_size=100, sliding_window=window,
        pad_token_id=None, bos_token_id=None, eos_token_id=None,
        rope_parameters={"rope_type": "default", "rope_theta": 150_000.0})
    x = inputs(32, 3)
    cos_sin = GptOssRotaryEmbedding(config)(torch.from_numpy(x), torch.arange(T)[None])
    plan = [dict(window=2 * (window - 1)), dict()]
    for causal in (True, False):
        cfg = tiny_config(dict(kind="rope", rope=dict(base=150_000.0)), num_layers=2, causal=causal,
                          attention_sinks=True, layers=plan)
        for layer in range(2):
            sliding = config.layer_types[layer] == "sliding_attention"
            attention = hf_attention(GptOssAttention, config, layer, std=0.5)
            with torch.no_grad():  # sinks that weigh: as large as the logits
                attention.sinks.copy_(torch.tensor([2.0, -1.0, 0.5, 1.5]))
            p = numpy_params(attention)
            got = run_jaxpos(cfg, layer, jaxpos_weights(p, HEADS, 8), x)
            want = run_hf(attention, x, cos_sin, hf_allowed(window if sliding else None)) if causal else \
                numpy_layer(x, p, HEADS, jaxpos_allowed(cfg.plan[layer].window), rope=(150_000.0, "halves"),
                            sinks=True)
            assert_close(got, want, f"gpt-oss layer {layer} causal={causal}")


def test_qwen3_next_gates_each_heads_output_after_qk_norm():
    """Qwen3-Next's full-attention layer: q_proj gives each head's query and gate, QK-norm (RMSNorm, scale 1 + w),
    RoPE, attention, the output times σ(gate) before o_proj (partial_rotary_factor 1: jaxpos's p-RoPE keeps the
    highest frequencies of the whole head, not a narrower head's)."""
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextAttention, Qwen3NextRotaryEmbedding

    config = transformers.Qwen3NextConfig(
        hidden_size=64, num_attention_heads=HEADS, num_key_value_heads=HEADS, head_dim=16, num_hidden_layers=4,
        intermediate_size=64, vocab_size=100, num_experts=2, num_experts_per_tok=1, pad_token_id=None,
        bos_token_id=None, eos_token_id=None,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 1.0})
    assert config.layer_types[3] == "full_attention"
    x = inputs(64, 4)
    cos_sin = Qwen3NextRotaryEmbedding(config)(torch.from_numpy(x), torch.arange(T)[None])
    attention = hf_attention(Qwen3NextAttention, config, 3)
    p = numpy_params(attention)
    weights = jaxpos_weights(p, HEADS, 16, gated_query=True, norm_scale=lambda w: 1.0 + w)
    for causal in (True, False):
        cfg = tiny_config(dict(kind="rope"), d_model=64, num_layers=1, causal=causal, use_bias=False, qk_norm=True,
                          output_gate=True, layer_norm_eps=1e-6)
        got = run_jaxpos(cfg, 0, weights, x)
        want = run_hf(attention, x, cos_sin, hf_allowed(None)) if causal else numpy_layer(
            x, p, HEADS, jaxpos_allowed(None), rope=(10_000.0, "halves"), norm_plus_one=True, gated=True)
        assert_close(got, want, f"qwen3-next causal={causal}")


def test_gemma3_qk_norm_and_a_base_for_each_kind_of_layer():
    """Gemma 3: QK-norm (scale 1 + w), five sliding layers at base 10,000 then a global one at 1,000,000 (jaxpos's
    rope.local_base beside rope.base), logits scaled by query_pre_attn_scalar^-1/2 (16, not the head's 8: folded
    into the query norm's scale as sqrt(8 / 16))."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3Attention, Gemma3RotaryEmbedding

    window, scalar = 3, 16
    config = transformers.Gemma3TextConfig(
        hidden_size=32, num_attention_heads=HEADS, num_key_value_heads=HEADS, head_dim=8, num_hidden_layers=6,
        intermediate_size=64, vocab_size=100, sliding_window=window, query_pre_attn_scalar=scalar,
        pad_token_id=None, bos_token_id=None, eos_token_id=None, rope_theta=1_000_000.0,
        rope_local_base_freq=10_000.0)
    x = inputs(32, 5)
    rotary = Gemma3RotaryEmbedding(config)
    plan = [dict(window=2 * (window - 1))] * 5 + [dict()]
    for causal in (True, False):
        cfg = tiny_config(dict(kind="rope", rope=dict(base=1_000_000.0, local_base=10_000.0)), num_layers=6,
                          causal=causal, use_bias=False, qk_norm=True, layer_norm_eps=1e-6, layers=plan)
        for layer in (0, 5):
            kind = config.layer_types[layer]
            theta = config.rope_parameters[kind]["rope_theta"]
            attention = hf_attention(Gemma3Attention, config, layer)
            p = numpy_params(attention)
            weights = jaxpos_weights(p, HEADS, 8, norm_scale=lambda w: 1.0 + w, q_factor=(8 / scalar) ** 0.5)
            got = run_jaxpos(cfg, layer, weights, x)
            want = run_hf(attention, x, rotary(torch.from_numpy(x), torch.arange(T)[None], kind),
                          hf_allowed(window if kind == "sliding_attention" else None)) if causal else numpy_layer(
                x, p, HEADS, jaxpos_allowed(cfg.plan[layer].window), rope=(theta, "halves"), norm_plus_one=True,
                scale=scalar ** -0.5)
            assert_close(got, want, f"gemma3 layer {layer} ({kind}, base {theta:g}) causal={causal}")
