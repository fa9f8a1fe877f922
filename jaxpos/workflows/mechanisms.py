"""`jaxpos mechanisms`: a forward and backward pass of every positional mechanism on a small random BERT, as a
table of parameters, losses, gradient norms and times (a check that an installation works)."""

from __future__ import annotations

import time

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxpos.config import MECHANISMS, model_config
from jaxpos.models import BertForMaskedLM


def mechanisms_table(seq_len: int = 64, batch: int = 4) -> str:
    """The table, one row per registered mechanism: rows of `seq_len` random tokens, `batch` of them."""
    rows = [f"{'mechanism':<12} {'params':>9} {'loss':>8} {'grad norm':>10} {'compile s':>9} {'step ms':>8}"]
    for kind in MECHANISMS:
        cfg = model_config(dict(vocab_size=512, d_model=64, num_layers=2, num_heads=4, mlp_dim=128,
                                max_length=seq_len, position=dict(kind=kind)))
        model = BertForMaskedLM(cfg)
        ids = jax.random.randint(jax.random.PRNGKey(0), (batch, seq_len), 1, cfg.vocab_size)
        params = nn.unbox(model.init(jax.random.PRNGKey(1), ids)["params"])

        def loss(p):
            logp = jax.nn.log_softmax(model.apply({"params": p}, ids))
            return -jnp.mean(jnp.take_along_axis(logp, ids[..., None], -1))

        step = jax.jit(jax.value_and_grad(loss))
        start = time.perf_counter()
        value, grads = jax.block_until_ready(step(params))
        compiled = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(5):
            jax.block_until_ready(step(params))
        ms = (time.perf_counter() - start) / 5 * 1e3
        count = sum(x.size for x in jax.tree.leaves(params))
        norm = float(jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree.leaves(grads))))
        rows.append(f"{kind:<12} {count:>9} {float(value):>8.4f} {norm:>10.4f} {compiled:>9.2f} {ms:>8.2f}")
    return "\n".join(rows)
