"""CoPE against a brute-force loop over queries i, keys j and counted keys t: causal (the paper) and bidirectional
(jaxpos's extension), with padding and packed pieces, clamped counts and both scalings; only the XLA path takes it."""

import math
from collections import Counter

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.attention.auto import choose_for
from jaxpos.attention.core import attend, pre_softmax_logits
from jaxpos.attention.mask import AttentionMask
from jaxpos.attention.registry import IMPLEMENTATIONS
from jaxpos.training.validate import check_model_attention as check_attention, model_facts as model_call
from jaxpos.positions import make_position
from tests.helpers import tiny_config

BATCH, LENGTH, HEADS, D = 2, 10, 2, 8
# Padding between a piece's tokens as well as after them, and pieces packed as jaxpos packs them (contiguous) and
# interleaved: with contiguous pieces and trailing padding no masked key lies between a query and its keys.
PADDED = np.array([[1] * 7 + [0] * 3, [1, 1, 0, 1, 1, 1, 0, 1, 0, 0]])
PACKED = np.array([[1, 1, 1, 2, 2, 2, 2, 3, 3, 0], [1, 1, 2, 2, 1, 1, 3, 3, 2, 0]])


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def brute_force_logits(q, k, e, allowed, divide):
    """Logits [B, H, T, S] from q [B, T, H, D], k [B, S, H, D], the position embeddings e [R, D, P] (R = 1: causal;
    2: keys after the query read e[1]) and allowed [B, T, S] (the keys each query attends to), one entry at a time."""
    batch, length, heads, dim = q.shape
    npos = e.shape[-1]
    out = np.zeros((batch, heads, length, k.shape[1]))
    for b in range(batch):
        for h in range(heads):
            for i in range(length):
                qi = q[b, i, h]
                for j in range(k.shape[1]):
                    if not allowed[b, i, j]:  # never attended: left at 0
                        continue
                    counted = range(j, i + 1) if j <= i else range(i, j + 1)  # from the key to the query
                    p = sum(sigmoid(qi @ k[b, t, h] / math.sqrt(dim)) for t in counted if allowed[b, i, t])
                    p = min(p, npos - 1)
                    table = e[0] if j <= i else e[1]
                    low, high = math.floor(p), math.ceil(p)
                    position = (qi @ table[:, high]) * (p - low) + (qi @ table[:, low]) * (1 - (p - low))
                    content = qi @ k[b, j, h]
                    out[b, h, i, j] = (content + position) / math.sqrt(dim) if divide else \
                        content / math.sqrt(dim) + position
    return out


def allowed_keys(piece_ids, causal):
    """[B, T, S] bool: same non-padding piece, and with `causal` not after the query (None: every key)."""
    ids = np.ones((BATCH, LENGTH), int) if piece_ids is None else piece_ids
    allowed = (ids[:, None, :] != 0) & (ids[:, :, None] == ids[:, None, :])
    if causal:
        allowed &= np.tril(np.ones((LENGTH, LENGTH), bool))[None]
    return allowed


CASES = {  # name: (causal, piece ids, cope options)
    "causal": (True, None, {}),
    "bidirectional": (False, None, {}),
    "causal_padded": (True, PADDED, {}),
    "bidirectional_padded": (False, PADDED, {}),
    "causal_packed": (True, PACKED, {}),
    "bidirectional_packed": (False, PACKED, {}),
    "causal_packed_clamped_undivided": (True, PACKED, dict(max_position=3, divide=False)),
    "bidirectional_packed_clamped_undivided": (False, PACKED, dict(max_position=3, divide=False)),
}


def cope_inputs(causal, options, seed=0):
    """(cfg, one layer's bias, q, k, v, the raw table e [R, D, P] as float64)."""
    cfg = tiny_config(dict(kind="cope", cope=options), d_model=HEADS * D, num_heads=HEADS, num_layers=1)
    module = make_position(cfg, 1, causal)
    pos = jnp.arange(LENGTH)
    params = flax.linen.unbox(module.init(jax.random.PRNGKey(0), pos, pos))
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    shape = params["params"]["embedding"].shape
    params = {"params": {"embedding": jax.random.normal(keys[0], shape)}}  # zero at init: a table that varies
    bias = module.apply(params, pos, pos).for_layer(0)
    q, k, v = (1.5 * jax.random.normal(key, (BATCH, LENGTH, HEADS, D)) for key in keys[1:])
    directions = 1 if causal else 2
    table = np.asarray(params["params"]["embedding"][0], np.float64)  # [D, R * P]
    e = np.stack(np.split(table, directions, axis=-1))  # [R, D, P]
    return cfg, bias, q, k, v, e


@pytest.mark.parametrize("name", list(CASES))
def test_cope_matches_a_brute_force_loop(name):
    causal, piece_ids, options = CASES[name]
    cfg, bias, q, k, v, e = cope_inputs(causal, options)
    assert e.shape == (1 if causal else 2, D, cfg.position.cope.positions(cfg.max_length))
    pos = jnp.arange(LENGTH)
    mask = AttentionMask.within_pieces(None if piece_ids is None else jnp.asarray(piece_ids), causal=causal)
    allowed = allowed_keys(piece_ids, causal)
    want = brute_force_logits(*(np.asarray(x, np.float64) for x in (q, k)), e, allowed,
                              divide=cfg.position.cope.divide)
    if options.get("max_position"):  # the clamp is reached, so the case tests it
        assert np.asarray(causal_counts(q, k, allowed)).max() > options["max_position"] - 1
    dense = mask.dense(pos, pos)
    got = pre_softmax_logits(q, k, bias, q_pos=pos, k_pos=pos, mask=dense)
    kept = np.broadcast_to(allowed[:, None], want.shape)
    np.testing.assert_allclose(np.asarray(got)[kept], want[kept], rtol=1e-5, atol=1e-5)
    # The attention path itself: its weights and outputs over the attended keys (padding queries attend nowhere).
    out, weights = attend(q, k, v, bias=bias, q_pos=pos, k_pos=pos, mask=mask, implementation="xla")
    shifted = np.where(kept, want - want.max(-1, keepdims=True), -np.inf)
    total = np.exp(shifted).sum(-1, keepdims=True)
    softmax = np.exp(shifted) / np.where(total > 0, total, 1.0)
    real = allowed.any(-1)  # [B, T] queries that attend to something
    np.testing.assert_allclose(np.asarray(weights).transpose(0, 2, 1, 3)[real],
                               softmax.transpose(0, 2, 1, 3)[real], rtol=1e-5, atol=1e-6)
    want_out = np.einsum("bhts,bshd->bthd", softmax, np.asarray(v, np.float64))
    np.testing.assert_allclose(np.asarray(out)[real], want_out[real], rtol=1e-5, atol=1e-5)


def causal_counts(q, k, allowed):
    """The largest unclamped count of the causal direction, Σ_{t=j..i} σ(q_i·k_t/√D) over allowed t (numpy)."""
    logits = np.einsum("bthd,bshd->bhts", np.asarray(q, np.float64), np.asarray(k, np.float64)) / math.sqrt(D)
    gates = np.where(allowed[:, None], 1 / (1 + np.exp(-logits)), 0.0) * np.tril(np.ones((LENGTH, LENGTH)))
    return np.flip(np.cumsum(np.flip(gates, -1), -1), -1)


def test_the_two_directions_read_their_own_tables():
    """Bidirectional: a key after the query reads e[1]; zeroing e[1] changes only those logits."""
    _, bias, q, k, _, _ = cope_inputs(False, {})
    pos = jnp.arange(LENGTH)
    full = np.asarray(pre_softmax_logits(q, k, bias, q_pos=pos, k_pos=pos))
    left = np.asarray(pre_softmax_logits(q, k, bias.with_terms([bias.term("contextual").replace(table=bias.term("contextual").table.at[1].set(0))]), q_pos=pos,
                                         k_pos=pos))
    after = np.triu(np.ones((LENGTH, LENGTH), bool), 1)
    np.testing.assert_allclose(full[..., ~after], left[..., ~after], rtol=0, atol=1e-6)
    assert np.abs(full[..., after] - left[..., after]).min() > 0


def test_only_the_xla_path_computes_cope():
    """Every other implementation is refused in one line, on a Hopper GPU in bf16 where they all run; auto picks
    xla."""
    hopper = dict(platform="gpu", gpu_capability="9.0", cpu_mesh_devices=1)
    for name in IMPLEMENTATIONS:
        cfg = tiny_config(dict(kind="cope"), attention_impl=name, dtype="bfloat16")
        if name == "xla":
            check_attention(cfg, training=False, **hopper)
            continue
        with pytest.raises(ValueError, match=rf"^attention_impl='{name}' cannot compute this model's attention here: "
                                             r"it lacks CoPE's contextual positions \(counts of gates over the "
                                             r"logits\); use attention_impl='xla' \(or 'auto'\)$"):
            check_attention(cfg, training=False, **hopper)
    for training in (False, True):
        assert choose_for(model_call(tiny_config(dict(kind="cope"), dtype="bfloat16"), training=training,
                                     **hopper))[0] == "xla"


def test_cross_attention_positions_are_refused():
    with pytest.raises(ValueError, match="cope counts the keys .* set model.cross_attention_position=False"):
        tiny_config(dict(kind="cope"), num_decoder_layers=1, cross_attention_position=True)
    for bad in (1, -1, 2.5):
        with pytest.raises(ValueError, match="position.cope.max_position"):
            tiny_config(dict(kind="cope", cope=dict(max_position=bad)))


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_the_backward_pass_keeps_one_more_float32_logit_tensor(causal):
    """Gates, counts and reads are recomputed in the backward pass: of [B, H, T, S] tensors the attention layer keeps
    only CoPE's gate logits beyond what it keeps without positions."""
    _, bias, q, k, v, _ = cope_inputs(causal, {})
    pos = jnp.arange(LENGTH)
    mask = AttentionMask.within_pieces(jnp.asarray(PADDED), causal=causal)

    def kept(bias):
        def loss(q, k, v):
            return jnp.sum(attend(q, k, v, bias=bias, q_pos=pos, k_pos=pos, mask=mask, implementation="xla")[0])

        vjp = jax.eval_shape(lambda *x: jax.vjp(loss, *x)[1], q, k, v)
        return Counter(str(x.dtype) for x in jax.tree.leaves(vjp) if x.shape == (BATCH, HEADS, LENGTH, LENGTH))

    assert kept(bias) == kept(bias.with_terms([])) + Counter(["float32"])
