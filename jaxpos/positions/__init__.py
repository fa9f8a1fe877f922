"""Positional mechanisms: one family behind `model.position.kind`.

Each mechanism is a few pure functions plus a thin Flax module owning its parameters for a whole stack;
`make_position` maps the config switch to the module.
"""

from __future__ import annotations

from jaxpos.config import ModelConfig
from jaxpos.positions.absolute import AbsolutePosition, SinusoidalPosition
from jaxpos.positions.alibi import AlibiPosition
from jaxpos.positions.attenuated import AttenuatedPosition
from jaxpos.positions.base import LengthError, PositionMechanism
from jaxpos.positions.diet import DietAbsPosition, DietRelPosition, SegmentAttention
from jaxpos.positions.rope import RopePosition
from jaxpos.positions.shaw import ShawPosition
from jaxpos.positions.t5 import T5Position
from jaxpos.positions.tisa import TisaPosition
from jaxpos.positions.tupe import TupePosition

MECHANISMS: dict[str, type[PositionMechanism]] = {
    "none": PositionMechanism,
    "absolute": AbsolutePosition,
    "sinusoidal": SinusoidalPosition,
    "tisa": TisaPosition,
    "diet_rel": DietRelPosition,
    "diet_abs": DietAbsPosition,
    "t5": T5Position,
    "shaw": ShawPosition,
    "tupe": TupePosition,
    "rope": RopePosition,
    "alibi": AlibiPosition,
    "attenuated": AttenuatedPosition,
}

# Mechanisms whose only positional signal is added to the token embeddings (no logit term to switch off).
INPUT_ONLY = ("none", "absolute", "sinusoidal")
# Mechanisms whose positional signal acts through the query's content, so no position-only term exists, and why.
NO_POSITION_ONLY_TERM = {
    "rope": "RoPE rotates q and k, so positions act only through the content term q.k",
    "shaw": "Shaw's relative term q.r^K is a product with the query's content",
}


def make_position(cfg: ModelConfig, num_layers: int, causal: bool, name: str = "position",
                  min_span: int = 0) -> PositionMechanism:
    """The mechanism module named by cfg.position.kind, owning parameters for `num_layers` layers; offset tables
    cover at least `min_span` positions (`PositionMechanism.min_span`)."""
    kind = cfg.position.kind
    if kind not in MECHANISMS:
        raise ValueError(f"unknown position mechanism {kind!r}; choose one of {', '.join(MECHANISMS)}")
    return MECHANISMS[kind](cfg=cfg, num_layers=num_layers, causal=causal, min_span=min_span, name=name)


__all__ = ["MECHANISMS", "INPUT_ONLY", "NO_POSITION_ONLY_TERM", "LengthError", "PositionMechanism",
           "SegmentAttention", "make_position"]
