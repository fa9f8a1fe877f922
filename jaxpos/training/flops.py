"""Model FLOPs of a training step, and the accelerators' peak rates, for the throughput the loop logs: model TFLOP/s
per device and model FLOPs utilisation (MFU), as levanter and MaxText log them.

Model FLOPs count the matrix products a step needs (multiply-adds as 2 FLOPs), forward and backward (3 x forward),
whatever the implementation does besides (rematerialisation, padding, the optimiser): the usual convention, so
that MFU compares implementations. Positional terms (tables, factors, rotations) are negligible beside them and
left out.
"""

from __future__ import annotations

import jax

from jaxpos.attention.registry import LOW_PRECISION

# bf16 dense matrix-product peak, TFLOP/s per device, by device kind (a substring of jax's `device_kind`; the
# first that matches). From the vendors' data sheets (dense, not sparse).
PEAK_BF16_TFLOPS = (
    ("H100 PCIe", 756.0),
    ("H100", 989.0),
    ("H200", 989.0),
    ("GH200", 989.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
    ("TPU v6 lite", 918.0),
    ("TPU v6e", 918.0),
    ("TPU v5 lite", 197.0),
    ("TPU v5e", 197.0),
    ("TPU v5p", 459.0),
    ("TPU v5", 459.0),
    ("TPU v4", 275.0),
)


def peak_tflops(device_kind: str, dtype: str) -> float | None:
    """The peak TFLOP/s of one device of `device_kind` for products in `dtype`; None where unknown (CPUs, other
    accelerators, float32)."""
    if dtype not in LOW_PRECISION:
        return None
    return next((tflops for kind, tflops in PEAK_BF16_TFLOPS if kind in device_kind), None)


def layer_flops(d_model: int, mlp_dim: int, queries: int, keys: int, kv_tokens: int | None = None,
                gated: bool = False) -> float:
    """Forward FLOPs of one attention + MLP layer over `queries` query tokens attending to `keys` keys each: the
    q, k, v and output projections (k, v over `kv_tokens`, default the queries), q.k and the weighted values, the
    MLP (`gated`: its input projection to 2 x mlp_dim, GeGLU and SwiGLU)."""
    kv_tokens = queries if kv_tokens is None else kv_tokens
    projections = 2 * d_model * d_model * (2 * queries + 2 * kv_tokens)
    attention = 2 * 2 * queries * keys * d_model
    mlp = 2 * (3 if gated else 2) * queries * d_model * mlp_dim
    return projections + attention + mlp


def encoder_flops(cfg, batch_size: int, seq_len: int) -> float:
    """Forward FLOPs of an encoder stack over `batch_size` rows of `seq_len` tokens: a local layer's queries
    attend to the local_window // 2 keys on either side and their own (fewer at the rows' ends, not counted)."""
    total = 0.0
    for layer in range(cfg.num_layers):
        keys = min(seq_len, cfg.local_window // 2 * 2 + 1) if cfg.is_local(layer) else seq_len
        total += layer_flops(cfg.d_model, cfg.mlp_dim, batch_size * seq_len, keys, gated=cfg.mlp != "plain")
    return total


def mlm_step_flops(cfg, batch_size: int, seq_len: int, predicted: int) -> float:
    """Model FLOPs of a masked-LM training step: `batch_size` rows of `seq_len` tokens through the encoder, the head
    (a dense layer and the vocabulary product) at `predicted` positions a row."""
    encoder = encoder_flops(cfg, batch_size, seq_len)
    head = 2 * batch_size * predicted * (cfg.d_model * cfg.embed_width + cfg.embed_width * cfg.vocab_size)
    return 3.0 * (encoder + head)


def translation_step_flops(cfg, batch_size: int, source_len: int, target_len: int) -> float:
    """Model FLOPs of an encoder-decoder training step: the encoder over the sources, the decoder's self-attention,
    cross-attention and MLP over the targets, the output product at every target position."""
    sources, targets = batch_size * source_len, batch_size * target_len
    encoder = encoder_flops(cfg, batch_size, source_len)
    self_attention = layer_flops(cfg.d_model, 0, targets, target_len)
    cross_attention = layer_flops(cfg.d_model, cfg.mlp_dim, targets, source_len, kv_tokens=sources,
                                  gated=cfg.mlp != "plain")
    decoder = cfg.num_decoder_layers * (self_attention + cross_attention)
    output = 2 * targets * cfg.d_model * cfg.vocab_size
    return 3.0 * (encoder + decoder + output)


def classification_step_flops(cfg, batch_size: int, seq_len: int, num_labels: int) -> float:
    """Model FLOPs of a fine-tuning step: the encoder, the pooler and the classifier on one pooled vector a row."""
    encoder = encoder_flops(cfg, batch_size, seq_len)
    head = 2 * batch_size * (cfg.d_model * cfg.d_model + cfg.d_model * num_labels)
    return 3.0 * (encoder + head)


def throughput(step_flops: float | None, step_time_s: float, devices: int | None = None,
               device_kind: str | None = None, dtype: str = "float32") -> dict:
    """{"tflops_per_device", "mfu"} of a step of `step_flops` model FLOPs taking `step_time_s` on `devices`
    (default: all) of `device_kind` (default: the first device's) computing in `dtype`; "mfu" only where the
    device's peak is known, nothing without a FLOP count."""
    if not step_flops or step_time_s <= 0:
        return {}
    devices = devices or jax.device_count()
    device_kind = device_kind or jax.devices()[0].device_kind
    out = {"tflops_per_device": step_flops / step_time_s / devices / 1e12}
    peak = peak_tflops(device_kind, dtype)
    if peak:
        out["mfu"] = out["tflops_per_device"] / peak
    return out
