"""Positional mechanisms: one family behind `model.position.kind`.

Each mechanism is a few pure functions plus a thin Flax module owning its parameters for a whole stack; its record
in the registry (`jaxpos.config.mechanisms.MECHANISMS`) names the module, and `make_position` builds it.
"""

from __future__ import annotations

import importlib

from jaxpos.config import MECHANISMS, ModelConfig
from jaxpos.positions.base import LengthError, PositionMechanism
from jaxpos.positions.diet import SegmentAttention


def mechanism_class(kind: str) -> type[PositionMechanism]:
    """The module class that the registry names for `kind` ("package.module:Class"), imported on first use."""
    module, _, name = MECHANISMS[kind].module.partition(":")
    return getattr(importlib.import_module(module), name)


def make_position(cfg: ModelConfig, num_layers: int, causal: bool, name: str = "position",
                  min_span: int = 0) -> PositionMechanism:
    """The mechanism module named by cfg.position.kind, owning parameters for `num_layers` layers; offset tables
    cover at least `min_span` positions (`PositionMechanism.min_span`)."""
    return mechanism_class(cfg.position.kind)(cfg=cfg, num_layers=num_layers, causal=causal, min_span=min_span,
                                              name=name)


__all__ = ["MECHANISMS", "LengthError", "PositionMechanism", "SegmentAttention", "make_position", "mechanism_class"]
