"""No positions at all (`none`): a bag of words, the baseline every learning curve is judged against."""

from __future__ import annotations

from jaxpos.positions.base import PositionMechanism
from jaxpos.positions.registry import Mechanism, register


class BagOfWords(PositionMechanism):
    """Adds nothing at the input and no term to attention."""


MECHANISM = register(Mechanism(
    "none", BagOfWords, "none (bag of words)", "bag of words", inductive=True, learned=False, input_only=True,
    reference="the baseline", no_randomized_positions="a bag of words reads no positions"))
