"""`config.decode`: beam search for translation (jaxpos/decoding/translate.py reads it)."""

from __future__ import annotations

import dataclasses

from jaxpos.config.checks import check_count, check_number, typed


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    beam_size: int = 4  # DIET (WMT18): 10; 1 = greedy
    alpha: float = 0.6  # length penalty ((5 + n) / 6) ** alpha
    max_length_a: float = 1.0  # per-example limit: a * source length + b tokens ...
    max_length_b: float = 50.0
    target_width: int = 128  # ... and never more than this (the decoding cache's length)
    batch_size: int = 32

    def __post_init__(self):
        for name in ("beam_size", "target_width", "batch_size"):
            check_count(f"decode.{name}", getattr(self, name), 1)
        for name in ("alpha", "max_length_a", "max_length_b"):
            check_number(f"decode.{name}", getattr(self, name), 0.0)


def decode_config(values) -> DecodeConfig:
    """DecodeConfig from `config.decode` (a ConfigDict or dict; `typed`)."""
    return typed(DecodeConfig, values, "decode")
