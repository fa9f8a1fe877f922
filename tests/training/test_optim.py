"""Weight decay follows each parameter's role, never its shape or the stack's layout: the weights of linear maps and
embeddings are decayed, biases and LayerNorm parameters are not, and every mechanism's positional parameters (and
per-head segment attention) follow one switch, train.decay_positional."""


import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.core import meta

from jaxpos.positions import MECHANISMS
from jaxpos.config.run import TrainConfig
from jaxpos.models import BertForMaskedLM
from jaxpos.models.layout import to_scanned, to_unscanned
from jaxpos.training.optim import decay_mask, decays, learning_rate_schedule, make_optimizer, parameter_name
from tests.helpers import VARIANTS, tiny_config

# Each mechanism's own parameters (the module named "position"), written out by hand.
POSITIONAL = {"none": [], "absolute": ["embedding"], "sinusoidal": [], "tisa": ["a", "b", "c"],
              "diet_rel": ["table"], "diet_abs": ["p_k", "p_q"], "t5": ["embedding"], "shaw": ["rel_keys", "rel_values"],
              "tupe": ["cls_theta", "embedding", "u_k", "u_q"], "rope": [], "alibi": [], "attenuated": [],
              "kerple": ["r1", "r2"], "fire": ["b1", "c", "threshold", "w1", "w2"],
              "cope": ["embedding"], "deberta": ["embedding", "norm/bias", "norm/scale"], "fox": ["b", "w"],
              "pope": ["delta"]}
# The rest of a 2-layer model, by hand: what is decayed (per layer, then once) and what is not.
LAYER_DECAYED = ["mlp/wi/kernel", "mlp/wo/kernel", "self_attention/key/kernel", "self_attention/out/kernel",
                 "self_attention/query/kernel", "self_attention/value/kernel"]
LAYER_KEPT = ["mlp/wi/bias", "mlp/wo/bias", "mlp_norm/bias", "mlp_norm/scale", "self_attention/key/bias",
              "self_attention/out/bias", "self_attention/query/bias", "self_attention/value/bias",
              "self_attention_norm/bias", "self_attention_norm/scale"]
MODEL_DECAYED = ["bert/token_embed/embedding", "bert/type_embed/embedding", "head_dense/kernel"]
MODEL_KEPT = ["bert/encoder/embed_norm/bias", "bert/encoder/embed_norm/scale", "head_dense/bias", "head_norm/bias",
              "head_norm/scale", "output_bias"]


def params_of(cfg):
    ids = jnp.ones((2, 8), jnp.int32)
    return jax.eval_shape(lambda: BertForMaskedLM(cfg).init(jax.random.PRNGKey(0), ids)["params"])


def decayed_names(params, decay_positional: bool) -> dict[str, bool]:
    mask = decay_mask(decay_positional)(params)
    return {parameter_name(path): flag for path, flag in jax.tree_util.tree_leaves_with_path(mask)}


@pytest.mark.parametrize("kind", list(MECHANISMS))
@pytest.mark.parametrize("decay_positional", [True, False])
def test_every_mechanisms_parameters_and_their_decay(kind, decay_positional):
    got = decayed_names(params_of(tiny_config(dict(kind=kind))), decay_positional)
    want = {f"bert/encoder/position/{name}": decay_positional for name in POSITIONAL[kind]}
    for layer in ("layer_0", "layer_1"):
        want.update({f"bert/encoder/{layer}/{name}": True for name in LAYER_DECAYED})
        want.update({f"bert/encoder/{layer}/{name}": False for name in LAYER_KEPT})
    want.update({name: True for name in MODEL_DECAYED})
    want.update({name: False for name in MODEL_KEPT})
    assert got == want


def test_segment_attention_follows_the_positional_switch():
    params = params_of(tiny_config(dict(kind="diet_rel", segment="per_head")))
    for switch in (True, False):
        assert decayed_names(params, switch)["bert/encoder/segments/table"] is switch


def test_the_attention_options_parameters_and_their_decay():
    """QK-norm's scales, the sink logits and Scalable-Softmax's s are kept (as norm scales and biases are); the
    output gate's projection is decayed and its bias kept, whatever train.decay_positional says."""
    cfg = tiny_config(dict(kind="rope"), qk_norm=True, output_gate=True, attention_sinks=True,
                      length_scaled_logits=True)
    for switch in (True, False):
        got = decayed_names(params_of(cfg), switch)
        layer = {name.split("layer_0/self_attention/")[1]: flag for name, flag in got.items()
                 if "layer_0/self_attention/" in name}
        assert layer == {"query/kernel": True, "key/kernel": True, "value/kernel": True, "out/kernel": True,
                         "gate/kernel": True, "query/bias": False, "key/bias": False, "value/bias": False,
                         "out/bias": False, "gate/bias": False, "q_norm": False, "k_norm": False, "sinks": False,
                         "length_scale": False}


def test_a_parameter_without_a_role_is_refused():
    assert decays("classifier/kernel", False) and not decays("encoder/layer_0/mlp_norm/scale", True)
    with pytest.raises(ValueError, match="no weight-decay rule for parameter bert/encoder/gate"):
        decays("bert/encoder/gate", True)


@pytest.mark.parametrize("name,position", [v for v in VARIANTS if v[0] in ("tisa", "kerple", "fire", "t5")],
                         ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("optimizer", ["adamw", "lamb"])
def test_scanned_layers_take_the_same_optimizer_step(name, position, optimizer):
    """Two AdamW (LAMB) steps from the same parameters and gradients give the same parameters scanned or not
    (scanning stacks each layer's biases and LayerNorm scales into 2-D arrays; that must not decay them)."""
    cfg = tiny_config(position, num_layers=3)
    params = meta.unbox(BertForMaskedLM(cfg).init(jax.random.PRNGKey(0), jnp.ones((2, 8), jnp.int32))["params"])
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(1), 2 * len(leaves))
    grads = [jax.tree.unflatten(tree, [jax.random.normal(k, x.shape) for k, x in zip(keys[i::2], leaves)])
             for i in range(2)]
    tx = make_optimizer(TrainConfig(optimizer=optimizer, learning_rate=1e-2, warmup_steps=1, weight_decay=0.5,
                                    num_steps=10))

    def two_steps(params, grads):
        state = tx.init(params)
        for g in grads:
            updates, state = tx.update(g, state, params)
            params = optax.apply_updates(params, updates)
        return params

    unscanned = two_steps(params, grads)
    scanned = to_unscanned(two_steps(to_scanned(params), [to_scanned(g) for g in grads]))
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(scanned)[0], jax.tree.leaves(unscanned)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7,
                                   err_msg=jax.tree_util.keystr(path))


def test_positional_decay_switch_reaches_the_optimizer():
    """With weight decay and zero gradients, an AdamW step moves exactly the decayed parameters, by lr * wd * p."""
    cfg = tiny_config(dict(kind="kerple"))
    params = meta.unbox(BertForMaskedLM(cfg).init(jax.random.PRNGKey(0), jnp.ones((2, 8), jnp.int32))["params"])
    zeros = jax.tree.map(jnp.zeros_like, params)
    for switch in (True, False):
        tcfg = TrainConfig(learning_rate=0.1, warmup_steps=1, weight_decay=0.5, num_steps=10,
                           decay_positional=switch, clip_norm=0.0)
        tx = make_optimizer(tcfg)
        updates, _ = tx.update(zeros, tx.init(params), params)
        lr = float(optax.linear_schedule(0.0, 0.1, 1)(0))  # the schedule's first value (warmup from 0)
        for path, update in jax.tree_util.tree_leaves_with_path(updates):
            name = parameter_name(path)
            value = params
            for key in name.split("/"):
                value = value[key]
            decayed = name.startswith("bert/encoder/position/") and switch or name.endswith(("kernel", "embedding"))
            want = -lr * 0.5 * np.asarray(value) if decayed else np.zeros_like(value)
            np.testing.assert_allclose(np.asarray(update), want, rtol=1e-6, atol=1e-12, err_msg=name)


def test_lamb_is_optax_lamb_on_unscanned_parameters():
    """The per-layer trust ratio changes nothing where no stack is scanned: three steps equal optax.lamb's."""
    cfg = tiny_config(dict(kind="t5"))
    params = meta.unbox(BertForMaskedLM(cfg).init(jax.random.PRNGKey(0), jnp.ones((2, 8), jnp.int32))["params"])
    tcfg = TrainConfig(optimizer="lamb", learning_rate=1e-2, warmup_steps=1, weight_decay=0.1, num_steps=10,
                       clip_norm=0.0)
    ours = make_optimizer(tcfg)
    reference = optax.lamb(learning_rate_schedule(tcfg), b1=tcfg.b1, b2=tcfg.b2, eps=tcfg.eps,
                           weight_decay=0.1, mask=decay_mask(True))
    states = [tx.init(params) for tx in (ours, reference)]
    results = [params, params]
    for step in range(3):
        grads = jax.tree.map(lambda x, k=jax.random.PRNGKey(step): jax.random.normal(k, x.shape), params)
        for i, tx in enumerate((ours, reference)):
            updates, states[i] = tx.update(grads, states[i], results[i])
            results[i] = optax.apply_updates(results[i], updates)
    for x, y in zip(jax.tree.leaves(results[0]), jax.tree.leaves(results[1])):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("decay_fraction, want", [
    # 100 steps, 10 of warmup to 1.0, the last 20 decaying linearly to 0 (by hand: 1 - (step - 80) / 20)
    (0.2, {0: 0.0, 5: 0.5, 10: 1.0, 45: 1.0, 80: 1.0, 85: 0.75, 90: 0.5, 99: 0.05, 100: 0.0}),
    # a decay longer than the steps after warmup starts at the warmup's end
    (0.95, {0: 0.0, 5: 0.5, 10: 1.0, 55: 0.5, 100: 0.0}),
])
def test_warmup_stable_decay_schedule_by_hand(decay_fraction, want):
    tcfg = TrainConfig(learning_rate=1.0, num_steps=100, warmup_steps=10, schedule="wsd",
                       decay_fraction=decay_fraction)
    schedule = learning_rate_schedule(tcfg)
    got = {step: float(schedule(step)) for step in want}
    assert got == pytest.approx(want, abs=1e-6)


def test_unknown_schedule_and_decay_fraction_are_refused():
    with pytest.raises(ValueError, match="train.schedule='cosine'; choose linear, inverse_sqrt, constant, wsd"):
        TrainConfig(schedule="cosine").check()
    with pytest.raises(ValueError, match=r"train.decay_fraction=1.5 must be in \[0, 1\]"):
        TrainConfig(schedule="wsd", decay_fraction=1.5).check()
