"""The attention implementations' records: every implementation computes what its record claims as a numpy
softmax attention written here does (on the calls this host can run), `auto` and the fallbacks only pick records
that can take a call, and a configuration naming one that cannot run its model is refused in one line."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.attention.bias import PositionalBias
from jaxpos.attention import core
from jaxpos.attention.auto import choose_for
from jaxpos.attention.core import attend, call_facts, resolve
from jaxpos.attention.mask import AttentionMask
from jaxpos.attention.registry import AUTO, IMPLEMENTATIONS, Call, can_take, lacks
from jaxpos.training.validate import check_model_attention as check_attention, model_facts as model_call
from tests.attention.test_dropout import lowbias32
from tests.helpers import bias_terms, tiny_config

BATCH, LENGTH, HEADS, D, RANK = 2, 16, 2, 8, 3
DROPOUT_RNG = jax.random.PRNGKey(7)


def random(shape, seed, dtype=jnp.float32):
    return jax.random.normal(jax.random.PRNGKey(seed), shape).astype(dtype)


def bias_of(form: str) -> PositionalBias:
    """One layer's positional terms of each form."""
    if form == "table":
        return bias_terms(table=random((HEADS, 2 * LENGTH - 1), 3))
    if form == "factors":
        return bias_terms(factors=(random((HEADS, LENGTH, RANK), 4), random((HEADS, LENGTH, RANK), 5)))
    if form == "other":
        return bias_terms(dense=random((HEADS, LENGTH, LENGTH), 6))
    return PositionalBias()


def numpy_attention(q, k, v, bias: PositionalBias, piece_ids, dropout_rate: float) -> np.ndarray:
    """Softmax attention in float64 numpy, every term written out: q.k/sqrt(D) plus the bias expanded by hand
    (table[h, j - i + T - 1], P_Q P_K^T, or the dense matrix), keys of the query's own piece only, and the dropout
    mask from its definition (uint32 lowbias32 over the row index and key index, `dropout`'s docstring).
    -> out [B, T, H, D]."""
    q, k, v = (np.asarray(jnp.asarray(x, jnp.float32), np.float64) for x in (q, k, v))
    logits = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(D)
    i, j = np.arange(LENGTH)[:, None], np.arange(LENGTH)[None, :]
    terms = {t.kind: t for t in bias.terms}
    if "table" in terms:
        logits = logits + np.asarray(terms["table"].table, np.float64)[:, j - i + LENGTH - 1]  # offsets -15..15
    if "factors" in terms:
        p_q, p_k = (np.asarray(x, np.float64) for x in (terms["factors"].p_q, terms["factors"].p_k))
        logits = logits + np.einsum("htr,hsr->hts", p_q, p_k)
    if "dense" in terms:
        logits = logits + np.asarray(terms["dense"].matrix, np.float64)
    ids = np.asarray(piece_ids)
    visible = (ids[:, None, :, None] == ids[:, None, None, :]) & (ids[:, None, None, :] != 0)
    logits = np.where(visible, logits, -1e30)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    if dropout_rate:
        seed = np.uint32(np.asarray(jax.random.bits(DROPOUT_RNG, (), jnp.uint32)))  # the call's seed, from its key
        rows = np.arange(BATCH * HEADS * LENGTH, dtype=np.uint32).reshape(BATCH, HEADS, LENGTH)
        with np.errstate(over="ignore"):
            bits = lowbias32(lowbias32(rows ^ lowbias32(seed))[..., None]
                             + np.arange(LENGTH, dtype=np.uint32) * np.uint32(0x9E3779B9))
        keep = (bits >> np.uint32(8)) >= round(dropout_rate * 2**24)
        weights = np.where(keep, weights / (1.0 - dropout_rate), 0.0)
    return np.einsum("bhts,bshd->bthd", weights, v)


FORM_TERMS = {"none": frozenset(), "table": frozenset({"table"}), "factors": frozenset({"factors"}),
              "other": frozenset({"dense"})}  # a kind of term of each measured form


# Every claimed (implementation, form, dropout); the Hopper kernels' interpreted runs beyond one case are slow.
CLAIMS = [pytest.param(name, form, dropout, id=f"{name}-{form}-{'dropout' if dropout else 'plain'}",
                       marks=[pytest.mark.slow] if name == "mosaic_gpu" and (form, dropout) != ("table", True) else [])
          for name, impl in IMPLEMENTATIONS.items() for form in FORM_TERMS
          if impl.takes(next(iter(FORM_TERMS[form]), "table")) for dropout in (False, True)
          if impl.dropout or not dropout]


@pytest.mark.parametrize("name,form,dropout", CLAIMS)
def test_every_implementation_computes_what_its_record_claims_as_the_reference_does(name, form, dropout,
                                                                                    monkeypatch):
    monkeypatch.setattr(core, "_NOTED", set())
    impl = IMPLEMENTATIONS[name]
    dtype = jnp.bfloat16 if impl.low_precision_only else jnp.float32
    q, k, v = (random((BATCH, LENGTH, HEADS, D), seed, dtype) for seed in (0, 1, 2))
    pos = jnp.arange(LENGTH)
    piece_ids = jnp.ones((BATCH, LENGTH), jnp.int32).at[1, 10:].set(2).at[0, 13:].set(0)  # pieces and padding
    mask = AttentionMask.within_pieces(piece_ids)
    bias = bias_of(form)
    rng, rate = (DROPOUT_RNG, 0.2) if dropout else (None, 0.0)
    call = call_facts(q, k, bias, pos, pos, mask, True, True, rng, rate)
    missing = lacks(impl, call)
    if missing is not None:  # e.g. cuDNN on a CPU host: the record says why, and no other claim is made of it here
        assert call.platform not in impl.platforms or impl.hopper_only, missing
        pytest.skip(f"{name} cannot run here: {missing}")
    assert resolve(name, call) == name  # no fallback for a call the record takes
    got, _ = attend(q, k, v, bias=bias, q_pos=pos, k_pos=pos, mask=mask, implementation=name, dropout_rng=rng,
                    dropout_rate=rate)
    want = numpy_attention(q, k, v, bias, piece_ids, rate)
    real = np.asarray(piece_ids != 0)
    # float32 against float64: ~1e-6 apart; bf16 inputs and weights: ~1e-2. A wrong offset, scale, mask or dropped
    # weight moves outputs of size ~1 by ~0.1 or more.
    tolerance = 3e-2 if dtype == jnp.bfloat16 else 1e-5
    np.testing.assert_allclose(np.asarray(got, np.float64)[real], want[real], rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("form", ["none", "table", "factors", "other"])
@pytest.mark.parametrize("dropout", [False, True])
def test_auto_and_fallbacks_pick_only_records_that_can_take_the_call(form, dropout, monkeypatch):
    monkeypatch.setattr(core, "_NOTED", set())  # the notes of these pretended calls stay here
    for platform, capability in (("cpu", ""), ("gpu", "9.0"), ("gpu", "8.0"), ("tpu", "")):
        for low_precision in (False, True):
            call = Call(platform=platform, gpu_capability=capability, low_precision=low_precision,
                        terms=FORM_TERMS[form], dropout=dropout)
            assert lacks(IMPLEMENTATIONS[resolve(AUTO, call)], call) is None
            for name in IMPLEMENTATIONS:
                try:
                    chosen = resolve(name, call)
                except ValueError as error:  # no fallback can: the message names what it lacks and who can
                    assert not [f for f in IMPLEMENTATIONS[name].fallbacks if f in can_take(call)]
                    assert lacks(IMPLEMENTATIONS[name], call) in str(error)
                    continue
                assert lacks(IMPLEMENTATIONS[chosen], call) is None
                assert chosen == name or chosen in IMPLEMENTATIONS[name].fallbacks


def test_a_config_naming_an_implementation_that_cannot_run_its_model_is_refused_in_one_line():
    cpu = dict(platform="cpu")
    check_attention(tiny_config(dict(kind="tisa"), attention_impl="pallas"), training=True, **cpu)
    with pytest.raises(ValueError, match=r"^attention_impl='pallas' cannot compute this model's attention here: it "
                                         r"lacks Shaw's relative vectors; use attention_impl='xla' \(or 'auto'\)$"):
        check_attention(tiny_config(dict(kind="shaw", shaw=dict(clip=3)), attention_impl="pallas"), training=False,
                        **cpu)
    for impl in ("pallas", "jax"):
        with pytest.raises(ValueError, match=rf"^attention_impl='{impl}' cannot compute this model's attention here: "
                                             r"it lacks DeBERTa's disentangled relative terms \(c2p, p2c\); use "
                                             r"attention_impl='xla' \(or 'auto'\)$"):
            check_attention(tiny_config(dict(kind="deberta"), attention_impl=impl), training=False, **cpu)
    gpu = dict(platform="gpu", gpu_capability="9.0")
    for impl in ("cudnn", "mosaic_gpu"):
        with pytest.raises(ValueError, match="it lacks DeBERTa's disentangled relative terms"):
            check_attention(tiny_config(dict(kind="deberta"), attention_impl=impl, dtype="bfloat16"),
                            training=False, **gpu)
    assert choose_for(model_call(tiny_config(dict(kind="deberta"), dtype="bfloat16"), training=True, **gpu))[0] \
        == "xla"
    with pytest.raises(ValueError, match="attention_impl='cudnn' cannot compute .* it lacks the cpu backend"):
        check_attention(tiny_config(dict(kind="tisa"), attention_impl="cudnn", dtype="bfloat16"), training=False,
                        **cpu)
    with pytest.raises(ValueError, match="it lacks float32 inputs"):
        check_attention(tiny_config(dict(kind="tisa"), attention_impl="mosaic_gpu"), training=False, **cpu)
    with pytest.raises(ValueError, match="attention dropout needs attention_impl='auto', 'xla', 'pallas' or "
                                         "'mosaic_gpu', not 'jax'"):
        check_attention(tiny_config(dict(kind="tisa"), attention_impl="jax", attention_dropout=0.1), training=True,
                        **cpu)
    # Training facts are the config's: per-head segments reach the kernels as factors; Linformer as "other".
    segments = model_call(tiny_config(dict(kind="none", segment="per_head")), training=True, **cpu)
    linformer = model_call(tiny_config(dict(kind="diet_abs", diet_abs=dict(linformer_k=4))), training=True, **cpu)
    assert segments.form == "factors" and linformer.form == "other" and "kv_projection" in linformer.terms
    # FIRE is a Toeplitz table in an encoder and a dense matrix in a causal stack (a decoder's): the kernels take
    # the first only.
    fire = dict(kind="fire")
    check_attention(tiny_config(fire, attention_impl="pallas"), training=False, **cpu)
    for causal in (dict(causal=True), dict(num_decoder_layers=1)):
        assert model_call(tiny_config(fire, **causal), training=False, **cpu).form == "other"
        with pytest.raises(ValueError, match="attention_impl='pallas' cannot compute this model's attention here"):
            check_attention(tiny_config(fire, attention_impl="pallas", **causal), training=False, **cpu)


def test_cudnn_is_chosen_for_even_lengths_only_but_named_it_takes_any(monkeypatch):
    """cuDNN trains with a bias or mask at even lengths only: `auto` and the fallbacks give it none other, but a
    model that names it decodes with it (one query against a cache: T = 1)."""
    monkeypatch.setattr(core, "_NOTED", set())
    decoding = Call(platform="gpu", gpu_capability="9.0", low_precision=True, terms=FORM_TERMS["table"],
                    cached_causal=True, odd_length=True)
    assert resolve("cudnn", decoding) == "cudnn"
    assert resolve(AUTO, decoding) == "xla" and resolve("pallas", decoding) == "xla"
    training = Call(platform="gpu", gpu_capability="9.0", low_precision=True, terms=FORM_TERMS["table"])
    assert resolve(AUTO, training) == "cudnn" and resolve("pallas", training) == "pallas"
