"""Attention: the compact positional bias, the one masking helper, the implementations, the layer."""

from jaxpos.attention.bias import PositionalBias, position_logits
from jaxpos.attention.core import attend, fold_factors
from jaxpos.attention.masks import attention_mask

__all__ = ["PositionalBias", "position_logits", "attend", "fold_factors", "attention_mask"]
