"""Data: text sources, tokenizers (SentencePiece or Hugging Face tokenizers), masked-LM packing and masking, the resumable MLM iterator."""

from jaxpos.data.corpus import DataStats, embedded_documents, load_documents, split_blocks
from jaxpos.data.mlm import PackedExamples, hash_uniform, mask_batch, pack_documents, split_sentences, unigram_entropy
from jaxpos.data.pipeline import MLMData, MLMTrainIterator, build_examples, build_mlm_data, eval_batches
from jaxpos.data.tokenizer import (CLS_ID, MASK_ID, MLM_SPECIAL_TOKENS, PAD_ID, SEP_ID,
                                   TRANSLATION_SPECIAL_TOKENS, UNK_ID, FastTokenizer, SentencePieceTokenizer,
                                   Tokenizer, load_or_train_tokenizer, load_tokenizer, train_fast_tokenizer,
                                   train_sentencepiece)

__all__ = [
    "CLS_ID", "DataStats", "FastTokenizer", "MASK_ID", "MLMData", "MLMTrainIterator", "MLM_SPECIAL_TOKENS", "PAD_ID",
    "PackedExamples", "SEP_ID", "SentencePieceTokenizer", "TRANSLATION_SPECIAL_TOKENS", "Tokenizer", "UNK_ID", "build_examples",
    "build_mlm_data", "embedded_documents", "eval_batches", "load_documents",
    "hash_uniform", "load_or_train_tokenizer", "load_tokenizer", "mask_batch", "pack_documents", "split_blocks",
    "split_sentences", "train_fast_tokenizer", "train_sentencepiece", "unigram_entropy",
]
