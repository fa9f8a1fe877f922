"""Attention: the compact positional bias, the one mask type, the implementations, the layer."""

from jaxpos.attention.bias import PositionalBias, position_logits
from jaxpos.attention.core import attend, fold_factors
from jaxpos.attention.mask import AttentionMask

__all__ = ["PositionalBias", "position_logits", "attend", "fold_factors", "AttentionMask"]
