"""`jaxpos mechanisms`: a forward and backward pass of every positional mechanism on a small random BERT, as a
table of parameters, losses, gradient norms, order sensitivity and times (a check that an installation works and
that each mechanism is wired in)."""

from __future__ import annotations

import time

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxpos.config import model_config
from jaxpos.positions import MECHANISMS, mechanism
from jaxpos.models import BertForMaskedLM, position_params

# Full float32 matmuls wherever it runs: TF32 on a GPU would add noise of the size of the order column's smallest
# values (a random model at initialisation barely uses its attention).
PRECISION = "highest"


def shuffled_positions(seq_len: int) -> jax.Array:
    """A fixed random permutation of `seq_len` positions; not a reversal, which keeps every distance |j − i| and so
    leaves ALiBi, KERPLE and the other symmetric biases blind to it."""
    return jax.random.permutation(jax.random.PRNGKey(2), seq_len)


def order_sensitivity(logits: jax.Array, shuffled_logits: jax.Array, order: jax.Array) -> float:
    """‖f(x[:, order]) − f(x)[:, order]‖ / ‖f(x)‖ from the logits [B, T, V] of rows `x` and of the same rows with
    their tokens in `order`: 0 up to float error for a model blind to positions (a bag of words, whose outputs
    move with their tokens), above it wherever positions act."""
    moved = logits[:, order]
    return float(jnp.linalg.norm(shuffled_logits - moved) / jnp.linalg.norm(logits))


FLOAT_ERROR = 1e-6  # the order measure of a model blind to positions, at these sizes (bag of words: about 2e-7)


def starts_blind(params) -> bool:
    """Whether a model's positional mechanism has parameters and all of them are zero (then it starts blind to
    order, as CoPE does)."""
    try:
        positional = jax.tree.leaves(position_params(params))
    except KeyError:  # a mechanism without parameters (RoPE, ALiBi, sinusoidal, none)
        return False
    return bool(positional) and not any(bool(jnp.any(x)) for x in positional)


def mechanisms_table(seq_len: int = 64, batch: int = 4, kinds: list[str] | None = None) -> str:
    """The table, one row per registered mechanism: rows of `seq_len` random tokens, `batch` of them; its `order`
    column is `order_sensitivity` of the logits when each row's tokens are shuffled by `shuffled_positions`, marked
    * where the mechanism's positional parameters all start at zero and leave it blind to order (FLOAT_ERROR). `kinds`: those
    alone (default: every registered mechanism)."""
    for kind in kinds or ():
        mechanism(kind)  # an unknown kind: one line naming the registered ones
    rows = [f"{'mechanism':<12} {'params':>9} {'loss':>8} {'grad norm':>10} {'order':>8} {'compile s':>9} "
            f"{'step ms':>8}"]
    order = shuffled_positions(seq_len)
    zero_start = []  # mechanisms whose positional parameters are all zero at initialisation
    for kind in kinds or list(MECHANISMS):
        cfg = model_config(dict(vocab_size=512, d_model=64, num_layers=2, num_heads=4, mlp_dim=128,
                                max_length=seq_len, position=dict(kind=kind)))
        model = BertForMaskedLM(cfg)
        ids = jax.random.randint(jax.random.PRNGKey(0), (batch, seq_len), 1, cfg.vocab_size)
        params = nn.unbox(model.init(jax.random.PRNGKey(1), ids)["params"])

        def loss(p, x):
            logits = model.apply({"params": p}, x)
            logp = jax.nn.log_softmax(logits)
            return -jnp.mean(jnp.take_along_axis(logp, x[..., None], -1)), logits

        step = jax.jit(jax.value_and_grad(loss, has_aux=True))
        with jax.default_matmul_precision(PRECISION):
            start = time.perf_counter()
            (value, logits), grads = jax.block_until_ready(step(params, ids))
            compiled = time.perf_counter() - start
            start = time.perf_counter()
            for _ in range(5):
                jax.block_until_ready(step(params, ids))
            ms = (time.perf_counter() - start) / 5 * 1e3
            (_, shuffled), _ = step(params, ids[:, order])  # the same shapes: no second compilation
        count = sum(x.size for x in jax.tree.leaves(params))
        norm = float(jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree.leaves(grads))))
        moved = order_sensitivity(logits, shuffled, order)
        # zero parameters leave CoPE blind, not PoPE (its zero phase offsets still turn with j - i)
        starts_at_zero = starts_blind(params) and moved < FLOAT_ERROR
        if starts_at_zero:
            zero_start.append(kind)
        mark = "*" if starts_at_zero else " "
        rows.append(f"{kind:<12} {count:>9} {float(value):>8.4f} {norm:>10.4f} {moved:>7.1e}{mark} {compiled:>9.2f} "
                    f"{ms:>8.2f}")
    if zero_start:
        rows.append(f"* {', '.join(zero_start)}: its positional parameters start at zero (as its authors' code), "
                    "so at initialisation it is blind to order; it acts once training moves them")
    return "\n".join(rows)
