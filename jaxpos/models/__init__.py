"""Models: a BERT-style encoder with an MLM head, and a Transformer encoder-decoder."""

from jaxpos.models.bert import BertEncoder, BertForMaskedLM
from jaxpos.models.encdec import EncoderDecoder, shift_right

__all__ = ["BertEncoder", "BertForMaskedLM", "EncoderDecoder", "shift_right"]
