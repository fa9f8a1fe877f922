"""Optimisers and learning-rate schedules from the `train` config block."""

from __future__ import annotations

import jax
import optax


def learning_rate_schedule(tcfg) -> optax.Schedule:
    """Linear warmup to `learning_rate`, then `linear` decay to 0, `inverse_sqrt` (Vaswani) or `constant`."""
    peak, steps = tcfg.learning_rate, tcfg.num_steps
    warmup = max(1, int(round(tcfg.warmup_fraction * steps))) if tcfg.warmup_steps is None else tcfg.warmup_steps
    warmup = max(1, warmup)
    ramp = optax.linear_schedule(0.0, peak, warmup)
    if tcfg.schedule == "linear":
        decay = optax.linear_schedule(peak, 0.0, max(1, steps - warmup))
    elif tcfg.schedule == "inverse_sqrt":
        decay = lambda count: peak * (warmup / (warmup + count)) ** 0.5  # noqa: E731
    elif tcfg.schedule == "constant":
        decay = optax.constant_schedule(peak)
    else:
        raise ValueError(f"unknown schedule {tcfg.schedule!r}; choose linear, inverse_sqrt or constant")
    return optax.join_schedules([ramp, decay], [warmup])


def _decay_mask(params):
    """Weight decay on matrices only: no decay on biases, LayerNorm parameters or 1-D tables."""
    return jax.tree.map(lambda p: p.ndim > 1, params)


def make_optimizer(tcfg) -> optax.GradientTransformation:
    """AdamW (default) or LAMB for large batches, with global-norm clipping."""
    schedule = learning_rate_schedule(tcfg)
    if tcfg.optimizer == "adamw":
        opt = optax.adamw(schedule, b1=tcfg.b1, b2=tcfg.b2, eps=tcfg.eps, weight_decay=tcfg.weight_decay,
                          mask=_decay_mask)
    elif tcfg.optimizer == "lamb":
        opt = optax.lamb(schedule, b1=tcfg.b1, b2=tcfg.b2, eps=tcfg.eps, weight_decay=tcfg.weight_decay,
                         mask=_decay_mask)
    elif tcfg.optimizer == "adam":
        opt = optax.adam(schedule, b1=tcfg.b1, b2=tcfg.b2, eps=tcfg.eps)
    else:
        raise ValueError(f"unknown optimizer {tcfg.optimizer!r}; choose adamw, lamb or adam")
    if tcfg.clip_norm:
        opt = optax.chain(optax.clip_by_global_norm(tcfg.clip_norm), opt)
    return opt
