"""The unit of fine-tuning data, one labelled sentence or sentence pair: made by the readers of
jaxpos/data/classification/ and by the offline task builders (word_order.py, paraphrase.py), which the readers
call."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Example:
    text_a: str
    text_b: str | None
    label: float  # class index as a float, or the regression score; NaN = unlabelled
