"""The registry of mechanisms against what it describes: the README's table, the modules it names, the bias each
module hands to attention, and the tests' variants."""

import importlib
import os
import pkgutil
import re

import flax
import jax
import jax.numpy as jnp
import pytest

import jaxpos.positions
from jaxpos.attention.core import call_facts
from jaxpos.attention.registry import IMPLEMENTATIONS, lacks
from jaxpos.models.layers import attention_terms
from jaxpos.positions import MECHANISMS, PositionMechanism, make_position, mechanism_class
from jaxpos.positions.registry import trait_text
from tests.helpers import KIND_OPTIONS, KIND_VARIANTS, VARIANTS, tiny_config

README = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "README.md")
TABLE_HEADER = "| `model.position.kind` | mechanism | inductive | options |"


def readme_mechanisms() -> list[list[str]]:
    """The rows of the README's mechanism table as [kind, mechanism, inductive, options] cells, unescaped."""
    with open(README, encoding="utf-8") as f:
        lines = f.read().splitlines()
    rows = []
    for line in lines[lines.index(TABLE_HEADER) + 2:]:  # past the header and its separator
        if not line.startswith("|"):
            break
        cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]  # a pipe escaped as \| stays inside its cell
        rows.append([cell.strip().replace("\\|", "|") for cell in cells])
    return rows


def test_the_readme_table_lists_every_registered_mechanism_with_its_traits():
    rows = readme_mechanisms()
    assert [row[0].strip("`") for row in rows] == list(MECHANISMS)
    for kind, description, inductive, _ in rows:
        mechanism = MECHANISMS[kind.strip("`")]
        assert description == mechanism.description, kind
        assert inductive.replace("`", "") == trait_text(mechanism.inductive), kind


def test_every_module_class_is_registered_once():
    for module in pkgutil.iter_modules(jaxpos.positions.__path__):
        importlib.import_module(f"jaxpos.positions.{module.name}")
    defined, pending = {PositionMechanism}, [PositionMechanism]
    while pending:
        subclasses = pending.pop().__subclasses__()
        defined.update(subclasses)
        pending.extend(subclasses)
    registered = [mechanism_class(kind) for kind in MECHANISMS]
    assert len(set(registered)) == len(registered)
    assert set(registered) == {c for c in defined if c.__module__.startswith("jaxpos.positions.")} - {PositionMechanism}


def test_the_variants_cover_every_registered_kind():
    """Every kind builds a model and runs forward and backward in the tests over VARIANTS."""
    assert set(KIND_OPTIONS) | set(KIND_VARIANTS) <= set(MECHANISMS)
    assert {position["kind"] for _, position in VARIANTS} == set(MECHANISMS)


KERNEL_CASES = VARIANTS + [("diet_abs_linformer", dict(kind="diet_abs", diet_abs=dict(linformer_k=4)))]


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("name,position", KERNEL_CASES, ids=[case[0] for case in KERNEL_CASES])
def test_the_terms_a_module_returns_are_its_records_and_the_checks_facts(name, position, causal):
    """What reaches attention is the module's bias: no term for an input-only mechanism, and the kinds the run's
    check reads (`attention_terms`, traced without parameters) are the kinds the module returns; the kernels take a
    layer's call exactly when they declare every kind of its terms."""
    cfg = tiny_config(position, causal=causal) if not name.endswith("linformer") or not causal else None
    if cfg is None:
        pytest.skip("Linformer is refused in a causal stack")
    mechanism = MECHANISMS[position["kind"]]
    module = make_position(cfg, cfg.num_layers, causal)
    pos = jnp.arange(9)
    bias = module.apply(flax.linen.unbox(module.init(jax.random.PRNGKey(0), pos, pos)), pos, pos)
    assert (not bias.terms) == mechanism.input_only, "input_only: no term reaches attention"
    kinds = bias.kinds | ({"segment"} if cfg.position.segment == "per_head" else set())
    assert attention_terms(cfg) == kinds
    layer = bias.for_layer(0)
    q = jnp.zeros((1, 9, cfg.num_heads, cfg.head_dim))
    blocker = lacks(IMPLEMENTATIONS["pallas"], call_facts(q, q, layer, pos, pos, None, True, True))
    assert (blocker is None) == (layer.kinds <= IMPLEMENTATIONS["pallas"].terms), blocker
