"""Optimisers and learning-rate schedules from the `train` config block."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxpos.config.run import SCHEDULES
from jaxpos.models.layout import GROUPS, LAYER, SCANNED


def learning_rate_schedule(tcfg) -> optax.Schedule:
    """Linear warmup to `learning_rate`, then `linear` decay to 0, `inverse_sqrt` (Vaswani), `constant`, or `wsd`
    (warmup-stable-decay: constant, then linear decay to 0 over the last `decay_fraction` of `num_steps`)."""
    peak, steps = tcfg.learning_rate, tcfg.num_steps
    warmup = max(1, int(round(tcfg.warmup_fraction * steps))) if tcfg.warmup_steps is None else tcfg.warmup_steps
    warmup = max(1, warmup)
    ramp = optax.linear_schedule(0.0, peak, warmup)
    if tcfg.schedule == "wsd":
        # the decay starts at the warmup's end at the latest, so a long decay shortens the plateau, not the ramp
        decay_start = max(warmup, steps - int(round(tcfg.decay_fraction * steps)))
        return optax.join_schedules([ramp, optax.constant_schedule(peak),
                                     optax.linear_schedule(peak, 0.0, max(1, steps - decay_start))],
                                    [warmup, decay_start])
    if tcfg.schedule == "linear":
        decay = optax.linear_schedule(peak, 0.0, max(1, steps - warmup))
    elif tcfg.schedule == "inverse_sqrt":
        decay = lambda count: peak * (warmup / (warmup + count)) ** 0.5  # noqa: E731
    elif tcfg.schedule == "constant":
        decay = optax.constant_schedule(peak)
    else:
        raise ValueError(f"unknown schedule {tcfg.schedule!r}; choose {', '.join(SCHEDULES)}")
    return optax.join_schedules([ramp, decay], [warmup])


# Weight decay by role, whatever a parameter's shape or whether the layers are scanned: the weights of linear maps
# and embeddings are decayed, biases and LayerNorm parameters are not (BERT's rule), and the parameters of the
# positional mechanism and of per-head segment attention follow `train.decay_positional`, the same for every mechanism.
# The attention layer's own per-head scalars and QK-norm's scales are kept as biases and norm scales are.
DECAYED = ("kernel", "embedding")
NOT_DECAYED = ("bias", "scale", "output_bias", "q_norm", "k_norm", "sinks", "length_scale")
POSITIONAL_MODULES = ("position", "segments")


def parameter_name(path) -> str:
    """"a/b/c" from a pytree path of dict keys (a boxed parameter's `.value` left out)."""
    return "/".join(str(key.key) for key in path if isinstance(key, jax.tree_util.DictKey))


def decays(name: str, decay_positional: bool) -> bool:
    """Whether weight decay applies to the parameter at `name` ("bert/encoder/layer_0/mlp/wi/kernel")."""
    parts = name.split("/")
    if any(part in POSITIONAL_MODULES for part in parts[:-1]):
        return decay_positional
    if parts[-1] in DECAYED:
        return True
    if parts[-1] in NOT_DECAYED:
        return False
    raise ValueError(f"no weight-decay rule for parameter {name}: name it {' or '.join(DECAYED + NOT_DECAYED)}, or "
                     f"place it in a module named {' or '.join(POSITIONAL_MODULES)}")


def decay_mask(decay_positional: bool):
    """The `mask` of AdamW and LAMB: a tree of bools over the parameters (boxed or not), `decays` of each."""
    def mask(params):
        return jax.tree_util.tree_map_with_path(lambda path, _: decays(parameter_name(path), decay_positional),
                                                params)
    return mask


def stacked_layers(path) -> bool:
    """Whether the parameter at `path` is a scanned stack's (a leading layer axis: `layers/layer/...` or
    `groups/layer_k/...`)."""
    keys = [key.key for key in path if isinstance(key, jax.tree_util.DictKey)]
    return any((a, b) == (SCANNED, LAYER) or (a == GROUPS and str(b).startswith("layer_"))
               for a, b in zip(keys, keys[1:]))


def scale_by_layer_trust_ratio() -> optax.GradientTransformation:
    """LAMB's trust ratio ||param|| / ||update||, per layer: a scanned stack's leaves take one ratio for each slice
    of their leading layer axis, so the step is the unscanned stack's."""
    def ratio(path, update, param):
        axes = tuple(range(1, param.ndim)) if stacked_layers(path) else None
        param_norm = jnp.sqrt(jnp.sum(jnp.square(param), axis=axes, keepdims=True))
        update_norm = jnp.sqrt(jnp.sum(jnp.square(update), axis=axes, keepdims=True))
        either_zero = (param_norm == 0.0) | (update_norm == 0.0)
        return update * jnp.where(either_zero, 1.0, param_norm / jnp.where(either_zero, 1.0, update_norm))

    def update_fn(updates, state, params):
        return jax.tree_util.tree_map_with_path(ratio, updates, params), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def make_optimizer(tcfg) -> optax.GradientTransformation:
    """AdamW (default) or LAMB for large batches, with global-norm clipping; weight decay by role (`decays`)."""
    schedule = learning_rate_schedule(tcfg)
    mask = decay_mask(tcfg.decay_positional)
    if tcfg.optimizer == "adamw":
        opt = optax.adamw(schedule, b1=tcfg.b1, b2=tcfg.b2, eps=tcfg.eps, weight_decay=tcfg.weight_decay,
                          mask=mask)
    elif tcfg.optimizer == "lamb":  # optax.lamb with its trust ratio taken per layer of a scanned stack
        opt = optax.chain(optax.scale_by_adam(b1=tcfg.b1, b2=tcfg.b2, eps=tcfg.eps),
                          optax.add_decayed_weights(tcfg.weight_decay, mask), scale_by_layer_trust_ratio(),
                          optax.scale_by_learning_rate(schedule))
    elif tcfg.optimizer == "adam":
        opt = optax.adam(schedule, b1=tcfg.b1, b2=tcfg.b2, eps=tcfg.eps)
    else:
        raise ValueError(f"unknown optimizer {tcfg.optimizer!r}; choose adamw, lamb or adam")
    if tcfg.clip_norm:
        opt = optax.chain(optax.clip_by_global_norm(tcfg.clip_norm), opt)
    return opt
