"""Decoding: model-agnostic beam search and greedy decoding, and corpus BLEU (SacreBLEU)."""

from jaxpos.decoding.beam_search import (NEG_INF, beam_search, greedy_decode, length_penalty, max_decode_lengths,
                                         tile_beams)
from jaxpos.decoding.bleu import BleuResult, corpus_bleu

__all__ = ["BleuResult", "NEG_INF", "beam_search", "corpus_bleu", "greedy_decode", "length_penalty",
           "max_decode_lengths", "tile_beams"]
