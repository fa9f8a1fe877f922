"""The tokenizers that fine-tuning encodes with: jaxpos's SentencePiece models and local Hugging Face BERT/ALBERT
folders, each behind a `TokenizerAdapter`."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable, Protocol

import sentencepiece as spm

from jaxpos.data.tokenizer import CLS_ID, MLM_SPECIAL_TOKENS, PAD_ID, SEP_ID, load_tokenizer
from jaxpos.data.wordpiece import WordPiece, lower_case_setting, read_vocab


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
    """The tokenizer of a local Hugging Face BERT/ALBERT folder: WordPiece from vocab.txt (ids of [CLS], [SEP],
    [PAD] from it), or ALBERT's spiece.model ([CLS], [SEP], <pad>); lower-casing as tokenizer_config.json says."""
    model_type = "bert"
    if os.path.isfile(os.path.join(folder, "config.json")):
        with open(os.path.join(folder, "config.json")) as f:
            model_type = json.load(f).get("model_type", "bert")
    lower = lower_case_setting(folder, model_type)
    vocab_path, spiece_path = os.path.join(folder, "vocab.txt"), os.path.join(folder, "spiece.model")
    if os.path.isfile(vocab_path):
        vocabulary = read_vocab(vocab_path)
        index = {piece: i for i, piece in enumerate(vocabulary)}
        missing = [t for t in ("[CLS]", "[SEP]", "[PAD]") if t not in index]
        if missing:
            raise ValueError(f"{vocab_path} has no {', '.join(missing)}")
        return TokenizerAdapter(WordPiece(vocabulary, lower), index["[CLS]"], index["[SEP]"], index["[PAD]"],
                                len(vocabulary), vocab_path)
    if os.path.isfile(spiece_path):
        processor = spm.SentencePieceProcessor(model_file=spiece_path)
        ids = {t: processor.piece_to_id(t) for t in ("[CLS]", "[SEP]", "<pad>")}
        missing = [t for t, i in ids.items() if processor.id_to_piece(i) != t]  # unknown pieces map to <unk>
        if missing:
            raise ValueError(f"{spiece_path} has no {', '.join(missing)}")
        encode = (lambda text: processor.encode(text.lower())) if lower else processor.encode
        return TokenizerAdapter(encode, ids["[CLS]"], ids["[SEP]"], ids["<pad>"], processor.get_piece_size(),
                                spiece_path)
    raise FileNotFoundError(f"{folder} has no tokenizer: neither {vocab_path} nor {spiece_path}")
