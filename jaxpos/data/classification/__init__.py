"""Sentence(-pair) classification and regression data for fine-tuning: GLUE, SNLI and the offline tasks.

  tasks        `TaskSpec` of each task (labels, metrics, splits), `ExampleStats` of a split's loading
  glue_files   a local GLUE folder in the official layout (data.source='glue_dir'): its TSV files and reader
  tfds         TFDS glue/<task> or snli prepared as array_record, read without TensorFlow (data.source='tfds')
  loading      `load_examples`: the examples of a split from the reader that data.source picks ('offline' too);
               `order_minimal_pairs`: the word-order task's swapped sides, for zero-shot scoring;
               `keep_same_pieces`: its couples' test that a tokenizer encodes both members to the same pieces
  tokenizers   `TokenizerAdapter` over jaxpos's SentencePiece models and Hugging Face BERT/ALBERT folders
  encoding     `encode_examples`: [CLS] a [SEP] (b [SEP]) rows, BERT's longest-first truncation; `same_pieces`:
               whether two examples give a model without positions the same input
  batches      `ClassificationTrainIterator` (resumable training batches) and `eval_batches`
`Example` (jaxpos/data/examples.py), what the readers return, is re-exported here.
"""

from jaxpos.data.classification.batches import ClassificationTrainIterator, eval_batches
from jaxpos.data.classification.encoding import (EncodedExamples, encode_examples, same_pieces,
                                                 truncate_longest_first)
from jaxpos.data.classification.glue_files import glue_dir_examples, read_glue_tsv
from jaxpos.data.classification.loading import keep_same_pieces, load_examples, offline_examples, order_minimal_pairs
from jaxpos.data.classification.tasks import TASKS, ExampleStats, TaskSpec, task_spec
from jaxpos.data.classification.tfds import tfds_examples, tfds_name_of
from jaxpos.data.classification.tokenizers import PairTokenizer, TokenizerAdapter, hf_tokenizer, jaxpos_tokenizer
from jaxpos.data.examples import Example

__all__ = [
    "TASKS", "ClassificationTrainIterator", "EncodedExamples", "Example", "ExampleStats", "PairTokenizer",
    "TaskSpec", "TokenizerAdapter", "encode_examples", "eval_batches", "glue_dir_examples", "hf_tokenizer",
    "jaxpos_tokenizer", "keep_same_pieces", "load_examples", "offline_examples", "order_minimal_pairs",
    "read_glue_tsv", "same_pieces", "task_spec", "tfds_examples", "tfds_name_of", "truncate_longest_first",
]
