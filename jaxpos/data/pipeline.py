"""The masked-LM input pipeline: corpus -> sentences -> SentencePiece -> packed rows -> masked batches.

Data order and masking are pure functions of (seed, step), so a resumed run sees exactly the batches it would
have seen, on any number of hosts:

    epoch, j = divmod(step, batches_per_epoch)        batches_per_epoch = num_examples // global_batch
    order    = default_rng([seed, 2, epoch]).permutation(num_examples)
    batch    = order[j·B : (j+1)·B]                   host h of P gets rows [h·B/P, (h+1)·B/P) of it
    masking of example i in epoch e: hash_uniform(seed, 0, e, i, position, draw)  (held-out: (seed, 1, 0, i, ...))

Each epoch drops the num_examples mod B examples its permutation puts last (a different few every epoch).
The iterator's state is the step plus what it was computed for (`MLMTrainIterator.get_state`).
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Iterator

import ml_collections
import numpy as np

from jaxpos.data.corpus import DataStats, load_documents
from jaxpos.data.order import ShuffledBatches, host_slice
from jaxpos.data.mlm import PackedExamples, mask_batch, pack_documents, split_sentences, unigram_entropy
from jaxpos.data.tokenizer import MLM_SPECIAL_TOKENS, Tokenizer, load_or_train_tokenizer

_TRAIN_MASKS, _EVAL_MASKS, _ORDER = 0, 1, 2  # independent RNG streams


def default_data_config() -> ml_collections.ConfigDict:
    """`config.data` for masked-LM pretraining (the global batch size is `config.train.batch_size`)."""
    return ml_collections.ConfigDict(dict(
        source="embedded",  # embedded (CPython's documentation, no download) | text (local files) | tfds
        paths=[],  # source=text: files or globs (a comma-separated string works too); each must match a file
        doc_separator="blank_line",  # source=text: a document per blank-line-separated block | per file
        newline_ends_sentence=False,  # single line breaks end sentences (Wikipedia, one-sentence-per-line
        # files); False treats them as wrapping, and only blank lines and . ! ? end sentences
        tfds_name="wikipedia/20230601.en",  # source=tfds: dataset (prepared as array_record in data_dir)
        tfds_split="train",  # source=tfds: the split to train on; TFDS slicing such as "train[1%:]" works
        tfds_eval_split="",  # source=tfds: held-out split, e.g. "train[:1%]"; "" holds out eval_fraction
        text_field="text",  # source=tfds: the feature holding the text (wikipedia, c4: "text")
        data_dir="",  # source=tfds: TFDS data_dir ("" = TFDS's default, ~/tensorflow_datasets)
        max_documents=0,  # read at most this many documents of the source (0 = all); packing is in memory
        eval_fraction=0.05,  # share of documents held out (every 1/eval_fraction-th), unless tfds_eval_split
        seq_len=128,  # tokens per packed row, [CLS], [SEP]s and padding included
        vocab_size=8000,  # SentencePiece pieces, the 5 special tokens included (an upper bound: small corpora
        # give fewer; the model's vocabulary follows the tokenizer)
        tokenizer_path="",  # an existing .model ([PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4); "" trains one
        # and caches it as WORKDIR/spm_mlm.model (reused on resume)
        tokenizer_model_type="unigram",  # SentencePiece algorithm: unigram | bpe
        tokenizer_max_sentences=300_000,  # train the tokenizer on at most this many sampled sentences
        mask_prob=0.15,  # BERT: this share of the non-special tokens is predicted; of those 80% [MASK],
        # 10% a random token, 10% unchanged
        seed=0,  # data order, masking, and the tokenizer's sentence sample
    ))


def build_examples(documents: list[str], tokenizer: Tokenizer, seq_len: int, stats: DataStats,
                   newline_ends_sentence: bool = False) -> PackedExamples:
    """Splits documents into sentences, tokenizes them and packs them into [N, seq_len] rows."""
    sentences = [split_sentences(d, newline_ends_sentence) for d in documents]
    encoded = iter(tokenizer.encode_batch([s for doc in sentences for s in doc]))
    by_document = []
    for document in sentences:
        ids = [next(encoded) for _ in document]
        stats.skipped_empty += sum(not s for s in ids)  # e.g. a sentence of characters the vocabulary drops
        by_document.append([s for s in ids if s])
    stats.sentences += sum(len(d) for d in by_document)
    stats.tokens += sum(len(s) for d in by_document for s in d)
    return pack_documents(by_document, seq_len, stats)


def masked_batch(examples: PackedExamples, indices: np.ndarray, key: tuple[int, ...], vocab_size: int,
                 mask_prob: float) -> dict[str, np.ndarray]:
    """The batch of example rows `indices` [B], masked as a function of (key, example index). All [B, T]."""
    targets = examples.tokens[indices]
    input_ids, mask_weights = mask_batch(targets, indices, key, vocab_size=vocab_size, mask_prob=mask_prob)
    return dict(input_ids=input_ids, targets=targets, mask_weights=mask_weights,
                segment_ids=examples.segment_ids[indices],
                token_types=np.zeros_like(targets))  # one sentence "A" per row: no next-sentence task


class MLMTrainIterator(ShuffledBatches):
    """Endless training batches: this host's slice of every global batch, as a dict of numpy arrays
    input_ids, targets, segment_ids, token_types int32 and mask_weights float32, all [batch_size / hosts, T].
    Batch k is a pure function of (seed, k) (see jaxpos/data/order.py); masks are drawn per epoch."""

    def __init__(self, examples: PackedExamples, tokenizer: Tokenizer, batch_size: int, *, seed: int = 0,
                 mask_prob: float = 0.15, process_index: int | None = None, process_count: int | None = None):
        if len(examples) < batch_size:
            raise ValueError(f"the corpus packs into {len(examples)} examples of {examples.seq_len} tokens, fewer "
                             f"than one global batch of {batch_size}: add data, or lower the batch size or "
                             "data.seq_len")
        super().__init__(len(examples), batch_size, seed=seed, order_stream=_ORDER,
                         fingerprint=zlib.crc32(examples.tokens.tobytes()),  # a corpus changed under a run
                         process_index=process_index, process_count=process_count)
        self.examples, self.mask_prob, self.vocab_size = examples, mask_prob, tokenizer.vocab_size

    def batch_at(self, step: int) -> dict[str, np.ndarray]:
        """This host's slice of global batch `step`."""
        epoch = step // self.batches_per_epoch
        return masked_batch(self.examples, self.host_indices(step), (self.seed, _TRAIN_MASKS, epoch),
                            self.vocab_size, self.mask_prob)


def eval_batches(examples: PackedExamples, tokenizer: Tokenizer, batch_size: int, max_batches: int = 0,
                 seed: int = 0, mask_prob: float = 0.15, process_index: int | None = None,
                 process_count: int | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Held-out batches in order, with the same masking every time; finite: ceil(N / batch_size) batches, or
    `max_batches` if smaller (0 = all). The last batch is filled up with copies of example 0 whose mask_weights
    are 0, so every batch has the full shape (like the training batches, this host's slice of it)."""
    start, rows = host_slice(batch_size, process_index, process_count)
    num_batches = -(-len(examples) // batch_size)
    for b in range(min(num_batches, max_batches) if max_batches else num_batches):
        indices = np.arange(b * batch_size, (b + 1) * batch_size)[start:start + rows]
        real = indices < len(examples)
        batch = masked_batch(examples, np.where(real, indices, 0), (seed, _EVAL_MASKS, 0),
                             tokenizer.vocab_size, mask_prob)
        batch["mask_weights"] *= real[:, None]
        yield batch


@dataclasses.dataclass
class MLMData:
    """Everything `build_mlm_data` made: the tokenizer, the training iterator, the held-out rows, counters."""

    tokenizer: Tokenizer
    train: MLMTrainIterator
    eval_examples: PackedExamples
    stats: DataStats  # train split, plus the source-level counters
    eval_stats: DataStats
    unigram_entropy: float  # nats/token of the training targets' unigram distribution
    tokenizer_trained: bool  # False when a cached or configured model was loaded

    def summary(self) -> str:
        return f"train: {self.stats.summary()}\neval: {self.eval_stats.summary()}\ntokenizer: {self.tokenizer}"


def build_mlm_data(config: ml_collections.ConfigDict, batch_size: int, workdir: str, *,
                   process_index: int | None = None, process_count: int | None = None) -> MLMData:
    """Reads the configured corpus, trains (or loads) the tokenizer, packs both splits; `batch_size` is global.

    Raises ValueError for an empty corpus, an empty held-out split, or fewer packed examples than one batch.
    """
    stats, eval_stats = DataStats(), DataStats()
    train_documents, eval_documents = load_documents(config, stats, eval_stats)
    if not eval_documents:
        raise ValueError(f"the held-out split is empty ({len(train_documents)} training documents, "
                         f"data.eval_fraction={config.eval_fraction}); raise data.eval_fraction or add documents")
    training_sentences = (s for d in train_documents for s in split_sentences(d, config.newline_ends_sentence))
    tokenizer, trained = load_or_train_tokenizer(
        workdir, training_sentences, config.vocab_size, model_path=config.tokenizer_path or None,
        special_tokens=MLM_SPECIAL_TOKENS, model_type=config.tokenizer_model_type,
        max_sentences=config.tokenizer_max_sentences, seed=config.seed)
    train = build_examples(train_documents, tokenizer, config.seq_len, stats, config.newline_ends_sentence)
    held_out = build_examples(eval_documents, tokenizer, config.seq_len, eval_stats, config.newline_ends_sentence)
    iterator = MLMTrainIterator(train, tokenizer, batch_size, seed=config.seed, mask_prob=config.mask_prob,
                                process_index=process_index, process_count=process_count)
    return MLMData(tokenizer, iterator, held_out, stats, eval_stats, unigram_entropy(train.tokens), trained)
