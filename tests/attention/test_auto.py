"""attention_impl="auto": the choice follows the step times recorded in bench/RESULTS.md, takes only paths that can
run the call, and on the CPU gives the XLA reference's numbers."""

import logging
import os
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.attention import auto, core
from jaxpos.attention.registry import Call
from jaxpos.attention.bias import PositionalBias
from jaxpos.config.model import ModelConfig
from jaxpos.training.validate import check_training
from tests.helpers import bias_terms

RESULTS = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "RESULTS.md")
FORM_OF = {"none": "none", "tisa": "table", "diet_abs": "factors"}  # the measured representative of each form


def recorded_step_ms() -> dict:
    """{(form, dropout): {path: fastest step ms}} from RESULTS.md's per-path table (the lowest over its calls)."""
    row = re.compile(r"^\| [A-Z] \| (\w+) \| (\w+)@([\d.]+) \| [\d.]+ \| ([\d.]+) \|")
    table: dict = {}
    with open(RESULTS) as f:
        for line in f:
            match = row.match(line)
            if match and match[1] in FORM_OF:
                key = (FORM_OF[match[1]], float(match[3]) > 0)
                paths = table.setdefault(key, {})
                paths[match[2]] = min(paths.get(match[2], np.inf), float(match[4]))
    return table


# a kind of term of each measured form
FORM_TERMS = {"none": frozenset(), "table": frozenset({"table"}), "factors": frozenset({"factors"}),
              "other": frozenset({"dense"})}


def choose(*, platform: str, hopper: bool = True, low_precision: bool = True, form: str = "table",
           dropout: bool = False, cudnn_can: bool = True, kernel_can: bool = True) -> tuple[str, str]:
    """`auto.choose_for` on facts given one by one: a call of the form's terms; `cudnn_can` / `kernel_can` False
    rule those paths out (e.g. Shaw's vectors, per-example positions)."""
    call = Call(platform=platform, gpu_capability="9.0" if hopper else "8.0" if platform == "gpu" else "",
                low_precision=low_precision, terms=FORM_TERMS[form], dropout=dropout)
    exclude = frozenset(({"cudnn"} if not cudnn_can else set()) | ({"pallas", "mosaic_gpu"} if not kernel_can
                                                                   else set()))
    return auto.choose_for(call, exclude)


def test_the_choice_table_is_the_recorded_measurement():
    assert auto.step_ms() == recorded_step_ms()


@pytest.mark.parametrize("form,dropout", sorted(recorded_step_ms()))
def test_a_hopper_gpu_takes_the_fastest_path_unless_within_the_margin(form, dropout):
    measured = recorded_step_ms()[(form, dropout)]
    best = min(measured, key=measured.get)
    # a path ahead of the fastest in the preference order keeps the call if it is within 5% of it
    expected = next(p for p in ("cudnn", "xla", best) if measured.get(p, np.inf) <= 1.05 * measured[best])
    impl, why = choose(platform="gpu", hopper=True, low_precision=True, form=form, dropout=dropout,
                            cudnn_can=True, kernel_can=True)
    assert impl == expected and f"{measured[impl]:g} ms" in why


def test_what_the_h200_table_says():
    """The measured table's verdicts, spelled out: cuDNN keeps calls where the Hopper kernels win by less than the
    margin (no bias 3.7%, a Toeplitz table 2.6%); the kernels take folded factors (11%) and every call with
    attention dropout (16-32% faster than the XLA reference)."""
    chosen = {key: choose(platform="gpu", hopper=True, low_precision=True, form=key[0], dropout=key[1],
                               cudnn_can=True, kernel_can=True)[0] for key in auto.step_ms()}
    assert chosen == {("none", False): "cudnn", ("table", False): "cudnn", ("factors", False): "mosaic_gpu",
                      ("none", True): "mosaic_gpu", ("table", True): "mosaic_gpu", ("factors", True): "mosaic_gpu"}


@pytest.mark.parametrize("facts,expected", [
    (dict(platform="cpu"), "xla"),
    (dict(platform="tpu"), "xla"),
    (dict(low_precision=False), "xla"),  # float32: neither cuDNN nor the kernels
    (dict(hopper=False, dropout=True), "xla"),  # an older GPU: no Hopper kernels, cuDNN has no dropout
    (dict(hopper=False, form="factors"), "cudnn"),
    (dict(kernel_can=False, form="factors"), "cudnn"),  # e.g. per-example positions
    (dict(form="other"), "cudnn"),  # a dense bias materialised, unmeasured: cuDNN beat xla wherever measured
    (dict(form="other", cudnn_can=False), "xla"),  # Shaw's vectors
])
def test_only_paths_that_can_run_the_call(facts, expected):
    call = dict(platform="gpu", hopper=True, low_precision=True, form="table", dropout=False, cudnn_can=True,
                kernel_can=True)
    assert choose(**{**call, **facts})[0] == expected


def test_a_term_of_a_kind_no_fast_path_declares_goes_to_the_xla_reference():
    call = Call(platform="gpu", gpu_capability="9.0", low_precision=True, terms=frozenset({"table", "sink_of_mine"}))
    assert auto.choose_for(call)[0] == "xla" and call.form == "other"


def qkv(dtype=jnp.bfloat16, length=16):
    return tuple(jax.random.normal(jax.random.PRNGKey(i), (2, length, 2, 8)).astype(dtype) for i in range(3))


@pytest.mark.parametrize("bias,dtype,dropout,expected", [
    (bias_terms(table=jnp.zeros((2, 31))), jnp.bfloat16, True, "mosaic_gpu"),
    (bias_terms(table=jnp.zeros((2, 31))), jnp.bfloat16, False, "cudnn"),
    (bias_terms(factors=(jnp.zeros((2, 16, 4)), jnp.zeros((2, 16, 4)))), jnp.bfloat16, False, "mosaic_gpu"),
    (PositionalBias(), jnp.bfloat16, False, "cudnn"),
    (PositionalBias(), jnp.float32, True, "xla"),
    (bias_terms(rel_keys=jnp.zeros((5, 8))), jnp.bfloat16, False, "xla"),
    (bias_terms(rel_index=jnp.zeros((1, 31), jnp.int32), rel_projections=(jnp.zeros((4, 2, 8)),) * 2),
     jnp.bfloat16, False, "xla"),
])
def test_attend_reads_the_facts_of_its_call(monkeypatch, bias, dtype, dropout, expected):
    """On a (pretended) Hopper GPU, `attend`'s facts (bias form, dtype, dropout, Shaw terms) reach the choice."""
    monkeypatch.setattr(core.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(core.jax, "devices", lambda: [types.SimpleNamespace(compute_capability="9.0")])
    q, k, _ = qkv(dtype)
    positions = jnp.arange(16)
    impl = core.resolve("auto", core.call_facts(q, k, bias, positions, positions, None, True, True,
                                                jax.random.PRNGKey(0) if dropout else None, 0.1 if dropout else 0.0))
    assert impl == expected


@pytest.mark.parametrize("dropout,expected", [(True, "mosaic_gpu"), (False, "cudnn")])
def test_a_local_layer_is_chosen_by_its_bias_form(monkeypatch, dropout, expected):
    """A windowed call (a local layer) keeps its bias form: on a Hopper GPU the kernels, which skip the blocks
    outside the window, take it with attention dropout as they take a global layer's, and cuDNN without."""
    from jaxpos.attention.mask import AttentionMask

    monkeypatch.setattr(core.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(core.jax, "devices", lambda: [types.SimpleNamespace(compute_capability="9.0")])
    q, k, _ = qkv()
    positions = jnp.arange(16)
    call = core.call_facts(q, k, bias_terms(table=jnp.zeros((2, 31))), positions, positions,
                           AttentionMask(window=8), True, True, jax.random.PRNGKey(0) if dropout else None,
                           0.1 if dropout else 0.0)
    assert call.window and call.form == "table"
    assert core.resolve("auto", call) == expected
    assert {"pallas", "mosaic_gpu"} <= set(core.can_take(call))


def test_on_the_cpu_auto_is_the_xla_reference_and_says_so(caplog):
    q, k, v = qkv(jnp.float32)
    positions = jnp.arange(16)
    bias = bias_terms(table=jax.random.normal(jax.random.PRNGKey(5), (2, 31)))
    caplog.set_level(logging.INFO, logger="jaxpos.attention.core")
    core._NOTED.clear()
    got, weights = core.attend(q, k, v, bias=bias, q_pos=positions, k_pos=positions, implementation="auto")
    want, _ = core.attend(q, k, v, bias=bias, q_pos=positions, k_pos=positions, implementation="xla")
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))  # both the "xla" path, eagerly: the same ops
    assert weights is not None  # the reference path: attention weights for the analyses
    assert "attention_impl='auto' chose 'xla'" in caplog.text


def test_auto_is_the_default_and_trains_with_attention_dropout():
    cfg = ModelConfig(attention_dropout=0.1)
    assert cfg.attention_impl == "auto"
    check_training(cfg)  # no error: auto takes a path with dropout
