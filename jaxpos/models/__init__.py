"""Models: a BERT-style encoder with an MLM head, and a Transformer encoder-decoder."""

from jaxpos.models.bert import BertEncoder, BertForMaskedLM
from jaxpos.models.encdec import DECODER_START_ID, EncoderDecoder, shift_right

__all__ = ["BertEncoder", "BertForMaskedLM", "DECODER_START_ID", "EncoderDecoder", "shift_right"]
