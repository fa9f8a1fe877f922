"""A plain-JAX BERT-base masked-LM train step (no Flax): the speed a hand-written script reaches.

float32 parameters, bf16 compute, post-LN, cuDNN attention (`jax.nn.dot_product_attention`), logits at every
position through the tied word embeddings, AdamW. Embedding rows are gathered from the float32 tables and cast
(a bf16 scatter-add in the backward would serialise on hot rows such as [MASK]).

    python bench/train_throughput.py --kinds none --peers plain_jax   # measured beside jaxpos
"""

from __future__ import annotations

import contextlib
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

BASE = dict(vocab=30522, d=768, layers=12, heads=12, mlp=3072, max_len=512, types=2)


def _attention_impl():
    return "cudnn" if jax.default_backend() == "gpu" else None


def init_params(rng: np.random.Generator, cfg: dict) -> dict:
    d, f = cfg["d"], cfg["mlp"]

    def normal(*shape):
        return jnp.asarray(rng.normal(0.0, 0.02, shape), jnp.float32)

    def layer():
        return dict(qkv=normal(d, 3 * d), qkv_b=jnp.zeros(3 * d), out=normal(d, d), out_b=jnp.zeros(d),
                    ln1_g=jnp.ones(d), ln1_b=jnp.zeros(d), wi=normal(d, f), wi_b=jnp.zeros(f), wo=normal(f, d),
                    wo_b=jnp.zeros(d), ln2_g=jnp.ones(d), ln2_b=jnp.zeros(d))

    return dict(word=normal(cfg["vocab"], d), pos=normal(cfg["max_len"], d), type=normal(cfg["types"], d),
                emb_ln_g=jnp.ones(d), emb_ln_b=jnp.zeros(d), layers=[layer() for _ in range(cfg["layers"])],
                head=normal(d, d), head_b=jnp.zeros(d), head_ln_g=jnp.ones(d), head_ln_b=jnp.zeros(d),
                out_b=jnp.zeros(cfg["vocab"]))


def layer_norm(x, g, b, eps=1e-12):
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = jnp.square(x32 - mean).mean(-1, keepdims=True)
    return ((x32 - mean) * jax.lax.rsqrt(var + eps) * g + b).astype(x.dtype)


def loss_fn(params, batch, cfg, dtype=jnp.bfloat16):
    """Mean masked-LM cross-entropy of a batch of [B, T] arrays."""
    ids, types, targets, weights = batch["input_ids"], batch["token_types"], batch["targets"], batch["mask_weights"]
    b, t = ids.shape
    h, dh = cfg["heads"], cfg["d"] // cfg["heads"]
    x = jnp.take(params["word"], ids, axis=0) + params["pos"][:t] + jnp.take(params["type"], types, axis=0)
    x = layer_norm(x.astype(dtype), params["emb_ln_g"], params["emb_ln_b"])
    for p in params["layers"]:
        c = lambda name: p[name].astype(dtype)  # noqa: E731
        qkv = (x @ c("qkv") + c("qkv_b")).reshape(b, t, 3, h, dh)
        att = jax.nn.dot_product_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], implementation=cfg["attention"])
        x = layer_norm(x + att.reshape(b, t, -1) @ c("out") + c("out_b"), p["ln1_g"], p["ln1_b"])
        y = jax.nn.gelu(x @ c("wi") + c("wi_b"), approximate=False) @ c("wo") + c("wo_b")
        x = layer_norm(x + y, p["ln2_g"], p["ln2_b"])
    y = jax.nn.gelu(x @ params["head"].astype(dtype) + params["head_b"].astype(dtype), approximate=False)
    y = layer_norm(y, params["head_ln_g"], params["head_ln_b"])
    logits = (y @ params["word"].astype(dtype).T).astype(jnp.float32) + params["out_b"]
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return jnp.sum(nll * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def measure(batch_size: int, seq_len: int, steps: int, data: list[dict], size: dict | None = None,
            hold=contextlib.nullcontext, compiled=lambda: None) -> dict:
    """Median step time of the jitted AdamW step on `data` (two batches of numpy arrays, alternated). The step
    compiles first, then `compiled()` is called, and warm-up and timed steps run inside `hold()` (the benchmark's
    turn on the device)."""
    cfg = dict(BASE, max_len=max(512, seq_len), attention=_attention_impl())
    if size:
        cfg.update(d=size["d_model"], layers=size["num_layers"], heads=size["num_heads"], mlp=size["mlp_dim"])
    params = init_params(np.random.default_rng(0), cfg)
    tx = optax.adamw(1e-4, weight_decay=0.01)
    opt_state = tx.init(params)

    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch, cfg)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    batches = [jax.device_put(b) for b in data]
    start = time.perf_counter()
    step = jax.jit(step, donate_argnums=(0, 1)).lower(params, opt_state, batches[0]).compile()
    compile_s = time.perf_counter() - start
    compiled()
    with hold():
        for i in range(3):
            params, opt_state, loss = step(params, opt_state, batches[i % 2])
        jax.block_until_ready(loss)
        times = []
        for i in range(steps):
            start = time.perf_counter()
            params, opt_state, loss = step(params, opt_state, batches[i % 2])
            jax.block_until_ready(loss)
            times.append(time.perf_counter() - start)
    ms = statistics.median(times) * 1e3
    return dict(system="plain JAX", ms=ms, ms_min=min(times) * 1e3, tokens_per_s=batch_size * seq_len / ms * 1e3,
                loss=float(loss), compile_s=compile_s)
