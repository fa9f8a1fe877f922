"""Translating with a trained encoder-decoder: batched, jitted beam search over the decoding cache, text in and
text out, and SacreBLEU on a held-out set.

Sources are padded to a fixed width (`source_width`) and batches to a fixed size, so one compiled program serves
every batch. Each example may produce at most min(ceil(a * source_length + b), target_width) tokens, EOS
included (Vaswani et al.: a = 1, b = 50).
"""

from __future__ import annotations

import functools
from typing import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxpos.config import ModelConfig
from jaxpos.config.decode import DecodeConfig
from jaxpos.data.translation import EOS_ID, PAD_ID, EvalSet, detokenize
from jaxpos.decoding.beam_search import beam_search, max_decode_lengths, tile_beams
from jaxpos.decoding.bleu import BleuResult, corpus_bleu
from jaxpos.models import DECODER_START_ID, EncoderDecoder
from jaxpos.progress import progress as show_progress


@functools.lru_cache(maxsize=8)
def _compiled_decoder(cfg: ModelConfig, dcfg: DecodeConfig):
    """The jitted `_decode_batch` of one model and decoding setting, shared by every Translator of them (a dev
    BLEU every N training steps compiles once)."""
    return jax.jit(functools.partial(_decode_batch, cfg=cfg, dcfg=dcfg))


def _decode_batch(params, inputs, *, cfg: ModelConfig, dcfg: DecodeConfig):
    """inputs [B, S] (0-padded, EOS-terminated) -> (sequences [B, K, W], scores [B, K]), best first."""
    batch, beams, width = inputs.shape[0], dcfg.beam_size, dcfg.target_width
    model, stepper = EncoderDecoder(cfg), EncoderDecoder(cfg, decode=True)
    encoded = model.apply({"params": params}, inputs, method="encode")
    # the cache's shapes come from a full-width init; XLA drops the unused parameter initialisers
    cache = stepper.init(jax.random.PRNGKey(0), inputs, jnp.zeros((batch, width), jnp.int32))["cache"]
    encoded_beams, inputs_beams = tile_beams(encoded, beams), tile_beams(inputs, beams)

    def tokens_to_logits(ids, cache):
        logits, mutated = stepper.apply({"params": params, "cache": cache}, encoded_beams, inputs_beams, ids,
                                        method="decode_logits", mutable=["cache"])
        return logits, mutated["cache"]

    limits = max_decode_lengths(jnp.sum(inputs != PAD_ID, axis=1), width, dcfg.max_length_a, dcfg.max_length_b)
    # the step counter and the position table of the cache are shared by all beams
    batched = lambda path, leaf: leaf.ndim >= 1 and "positions" not in jax.tree_util.keystr(path)  # noqa: E731
    return beam_search(tokens_to_logits, cache, batch, beams, dcfg.alpha, EOS_ID, limits, bos_id=DECODER_START_ID,
                       decode_width=width, is_batched=batched)


class Translator:
    """Beam-search translation with a trained `EncoderDecoder`.

    `translate_ids(inputs [N, S])` -> best sequences [N, W]; `translate(sentences)` -> strings.
    """

    def __init__(self, cfg: ModelConfig, params, tokenizer, dcfg: DecodeConfig, source_width: int):
        if dcfg.beam_size < 1:
            raise ValueError(f"decode.beam_size={dcfg.beam_size}; need at least 1")
        self.cfg, self.params, self.tokenizer, self.dcfg = cfg, params, tokenizer, dcfg
        self.source_width = source_width
        self._decode = _compiled_decoder(cfg, dcfg)

    def encode_sources(self, sentences: Sequence[str]) -> tuple[np.ndarray, int]:
        """([N, source_width] ids ending in EOS, how many sources were longer than the width and cut, EOS
        kept)."""
        inputs = np.zeros((len(sentences), self.source_width), np.int32)
        cut = 0
        for i, ids in enumerate(self.tokenizer.encode_batch(list(sentences))):
            cut += len(ids) + 1 > self.source_width
            ids = ids[:self.source_width - 1] + [EOS_ID]
            inputs[i, :len(ids)] = ids
        return inputs, cut

    def translate_ids(self, inputs: np.ndarray, progress: bool = False, with_scores: bool = False):
        """Best hypothesis per source row: inputs [N, S] -> [N, W] int32 (0 after EOS), and with `with_scores`
        its length-normalised log-probability [N]."""
        size = self.dcfg.batch_size
        out = np.zeros((len(inputs), self.dcfg.target_width), np.int32)
        scores = np.zeros(len(inputs), np.float32)
        starts = range(0, len(inputs), size)
        if progress:
            starts = show_progress(starts, desc="decoding", unit="batch", leave=False)
        for start in starts:
            chunk = inputs[start:start + size]
            padded = np.zeros((size, inputs.shape[1]), np.int32)
            padded[:len(chunk)] = chunk
            padded[len(chunk):, 0] = EOS_ID  # filler rows: empty sources
            sequences, best = self._decode(self.params, jnp.asarray(padded))
            out[start:start + len(chunk)] = np.asarray(sequences[:len(chunk), 0])
            scores[start:start + len(chunk)] = np.asarray(best[:len(chunk), 0])
        return (out, scores) if with_scores else out

    def translate(self, sentences: Sequence[str], progress: bool = False) -> tuple[list[str], int]:
        """(detokenized translations of `sentences`, how many were cut to the source width); an empty or
        whitespace-only line translates to ""."""
        sentences = list(sentences)
        keep = [i for i, s in enumerate(sentences) if s.strip()]
        outputs, cut = [""] * len(sentences), 0
        if keep:
            inputs, cut = self.encode_sources([sentences[i] for i in keep])
            for i, row in zip(keep, self.translate_ids(inputs, progress)):
                outputs[i] = detokenize(self.tokenizer, row)
        return outputs, cut

    def evaluate(self, eval_set: EvalSet, max_sentences: int = 0, progress: bool = False
                 ) -> tuple[BleuResult, list[str]]:
        """SacreBLEU of the beam-search translations of an eval set (its first `max_sentences`; 0 = all)."""
        count = len(eval_set) if not max_sentences else min(max_sentences, len(eval_set))
        if count == 0:
            raise ValueError("the evaluation set is empty: nothing to translate")
        hypotheses = [detokenize(self.tokenizer, row) for row in self.translate_ids(eval_set.inputs[:count], progress)]
        return corpus_bleu(hypotheses, eval_set.references[:count]), hypotheses


def read_sentences(lines: Iterable[str]) -> list[str]:
    """Lines of a file or stdin without their line ends (empty lines kept, they translate to "")."""
    return [line.rstrip("\n").rstrip("\r") for line in lines]
