"""Positional mechanisms: one family behind `model.position.kind`, a module each.

A mechanism's module declares its options block (`jaxpos.config.position.MechanismOptions`) with their checks, its
Flax module (a `PositionMechanism` returning its attention terms, computed once per forward pass for a whole
stack) and its record (`jaxpos.positions.registry.Mechanism`), and registers it. Importing this package registers
jaxpos's own; a researcher's module registers the same way, from its own package (docs/extending.md).
"""

from __future__ import annotations

from jaxpos.config.model import ModelConfig
from jaxpos.positions.registry import (ENTRY_POINTS, MECHANISMS, Mechanism, When, import_mechanisms, mechanism,
                                       register, token_embedding_scale)
from jaxpos.positions.base import LengthError, PositionMechanism
# jaxpos's own mechanisms, in the order of the README's table (importing a module registers it)
from jaxpos.positions import (bag_of_words, absolute, tisa, diet, t5, shaw, tupe, rope, alibi, attenuated,  # noqa: F401
                              kerple, fire, cope, deberta, fox, pope)
from jaxpos.positions.diet import SegmentAttention


def mechanism_class(kind: str) -> type[PositionMechanism]:
    """The module class the registry holds for `kind`."""
    return mechanism(kind).module


def make_position(cfg: ModelConfig, num_layers: int, causal: bool, name: str = "position",
                  min_span: int = 0) -> PositionMechanism:
    """The mechanism module named by cfg.position.kind, owning parameters for `num_layers` layers; offset tables
    cover at least `min_span` positions (`PositionMechanism.min_span`)."""
    return mechanism_class(cfg.position.kind)(cfg=cfg, num_layers=num_layers, causal=causal, min_span=min_span,
                                              name=name)


__all__ = ["ENTRY_POINTS", "LengthError", "MECHANISMS", "Mechanism", "PositionMechanism", "SegmentAttention", "When",
           "import_mechanisms", "make_position", "mechanism", "mechanism_class", "register",
           "token_embedding_scale"]
