"""Models: a BERT-style encoder with an MLM head or a classification head, and a Transformer encoder-decoder."""

from jaxpos.models.bert import BertEncoder, BertForMaskedLM, position_params
from jaxpos.models.classifier import BertForSequenceClassification
from jaxpos.models.encdec import DECODER_START_ID, EncoderDecoder, shift_right

__all__ = ["BertEncoder", "BertForMaskedLM", "BertForSequenceClassification", "DECODER_START_ID", "EncoderDecoder",
           "position_params", "shift_right"]
