"""The tokenizers that fine-tuning encodes with: jaxpos's SentencePiece models and local Hugging Face folders
(tokenizer.json, vocab.txt or spiece.model), each behind a `TokenizerAdapter`."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable, Protocol

from jaxpos.data.hf_tokenizer import USUAL_NAMES, require_folder_tokenizer
from jaxpos.data.tokenizer import CLS_ID, MLM_SPECIAL_TOKENS, PAD_ID, SEP_ID, load_tokenizer


class PairTokenizer(Protocol):
    """What `encode_examples` needs: text -> ids (no special tokens), and the ids of [CLS], [SEP], [PAD]."""

    cls_id: int
    sep_id: int
    pad_id: int

    def encode(self, text: str) -> list[int]: ...


@dataclasses.dataclass(frozen=True)
class TokenizerAdapter:
    """A `PairTokenizer` over a tokenize function; `encode_batch` (optional) encodes many texts at once."""

    encode: Callable[[str], list[int]]
    cls_id: int
    sep_id: int
    pad_id: int
    vocab_size: int
    source: str  # the file it came from
    encode_batch: Callable[[list[str]], list[list[int]]] | None = None


def jaxpos_tokenizer(tokenizer) -> TokenizerAdapter:
    """jaxpos's SentencePiece tokenizer (a `Tokenizer` or the path of its .model) with the MLM special tokens
    [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4."""
    if isinstance(tokenizer, str):
        tokenizer = load_tokenizer(tokenizer, MLM_SPECIAL_TOKENS)  # checks the special ids
    if tuple(tokenizer.special_tokens) != MLM_SPECIAL_TOKENS:
        raise ValueError(f"{tokenizer.path} has special tokens {tokenizer.special_tokens}; fine-tuning needs the "
                         f"masked-LM ones {MLM_SPECIAL_TOKENS}")
    return TokenizerAdapter(tokenizer.encode, CLS_ID, SEP_ID, PAD_ID, tokenizer.vocab_size, tokenizer.path,
                            tokenizer.encode_batch)


def hf_tokenizer(folder: str) -> TokenizerAdapter:
    """The tokenizer of a local Hugging Face folder (`jaxpos.data.hf_tokenizer`: tokenizer.json, vocab.txt or
    spiece.model), which needs [CLS], [SEP] and [PAD] (or their RoBERTa names) to frame pairs."""
    model_type = "bert"
    if os.path.isfile(os.path.join(folder, "config.json")):
        with open(os.path.join(folder, "config.json")) as f:
            model_type = json.load(f).get("model_type", "bert")
    tokenizer = require_folder_tokenizer(folder, model_type)
    missing = [role for role in ("cls", "sep", "pad") if getattr(tokenizer, f"{role}_id") is None]
    if missing:
        raise ValueError(f"{tokenizer.source} has no {', '.join(USUAL_NAMES[role][0] for role in missing)} (nor "
                         "RoBERTa's names of them) to frame the pairs of a fine-tuning task")
    return TokenizerAdapter(tokenizer.encode, tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id,
                            tokenizer.vocab_size, tokenizer.source, tokenizer.encode_batch)
