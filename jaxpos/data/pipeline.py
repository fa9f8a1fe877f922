"""The masked-LM input pipeline: corpus -> sentences -> SentencePiece -> packed rows -> masked batches.

Data order and masking are pure functions of (seed, step), so a resumed run sees exactly the batches it would
have seen, on any number of hosts (the streams are named in jaxpos/config/rng.py):

    epoch, j = divmod(step, batches_per_epoch)        batches_per_epoch = num_examples // global_batch
    order    = default_rng([seed, MLM_ROW_ORDER, epoch]).permutation(num_examples)
    batch    = order[j·B : (j+1)·B]                   host h of P gets rows [h·B/P, (h+1)·B/P) of it
    masking of example i in epoch e: hash_uniform(seed, MLM_TRAIN_MASKS, e, i, position, draw)
             (held-out: hash_uniform(seed, MLM_EVAL_MASKS, 0, i, position, draw); the held-out stream a length
             evaluation cuts: hash_uniform(seed, MLM_LENGTH_MASKS, 0, 0, token, draw), the same at every length)

Each epoch drops the num_examples mod B examples its permutation puts last (a different few every epoch);
data.shuffle=False visits the rows in packing order instead. The iterator's state is the step plus what it was
computed for (`MLMTrainIterator.get_state`).

With data.streaming=True the corpus is read shard by shard instead, each process its own shards
(jaxpos/data/stream.py); where both paths apply (one process, one shard within one shuffle window) they give
the same batches.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from typing import Iterable, Iterator

import numpy as np

from jaxpos.config.rng import MLM_EVAL_MASKS, MLM_LENGTH_MASKS, MLM_ROW_ORDER, MLM_TRAIN_MASKS
from jaxpos.config.run import MLMDataConfig, tokenizer_algorithm
from jaxpos.data.corpus import DataStats, load_documents
from jaxpos.data.order import ShuffledBatches, padded_batches
from jaxpos.data.mlm import (PackedExamples, encode_documents, mask_batch, masked_rows, mlm_batch, pack_documents,
                             split_sentences, unigram_entropy)
from jaxpos.data.stream import (ShardReader, StreamingMLMIterator, held_out_examples, host_process, list_shards,
                                process_shards)
from jaxpos.data.tokenizer import (MLM_SPECIAL_TOKENS, SpecialIds, Tokenizer, load_or_train_tokenizer,
                                   tokenizer_prefix, tokenizer_settings, train_tokenizer_file)


def build_examples(documents: list[str], tokenizer: Tokenizer, seq_len: int, stats: DataStats,
                   newline_ends_sentence: bool = False) -> PackedExamples:
    """Splits documents into sentences, tokenizes them and packs them into [N, seq_len] rows."""
    return pack_documents(encode_documents(documents, tokenizer, stats, newline_ends_sentence), seq_len, stats)


def masked_batch(examples: PackedExamples, indices: np.ndarray, key: tuple[int, ...], vocab_size: int,
                 mask_prob: float) -> dict[str, np.ndarray]:
    """The batch of example rows `indices` [B], masked as a function of (key, example index). All [B, T]."""
    return masked_rows(examples.tokens[indices], examples.piece_ids[indices], indices, key, vocab_size,
                       mask_prob)


class MLMTrainIterator(ShuffledBatches):
    """Endless training batches: this host's slice of every global batch, as a dict of numpy arrays
    input_ids, targets, piece_ids, positions (within each packed piece), token_types int32 and mask_weights
    float32, all [batch_size / hosts, T].
    Batch k is a pure function of (seed, k) (see jaxpos/data/order.py); masks are drawn per epoch."""

    def __init__(self, examples: PackedExamples, tokenizer: Tokenizer, batch_size: int, *, seed: int = 0,
                 mask_prob: float = 0.15, shuffle: bool = True, process_index: int | None = None,
                 process_count: int | None = None):
        if len(examples) < batch_size:
            raise ValueError(f"the corpus packs into {len(examples)} examples of {examples.seq_len} tokens, fewer "
                             f"than one global batch of {batch_size}: add data, or lower the batch size or "
                             "data.seq_len")
        fingerprint = zlib.crc32(examples.tokens.tobytes())  # a corpus changed under a run
        super().__init__(len(examples), batch_size, seed=seed, order_stream=MLM_ROW_ORDER,
                         fingerprint=fingerprint if shuffle else zlib.crc32(b"unshuffled", fingerprint),
                         process_index=process_index, process_count=process_count)
        self.examples, self.mask_prob, self.vocab_size = examples, mask_prob, tokenizer.vocab_size
        self.shuffle = shuffle

    def order(self, epoch: int) -> np.ndarray:
        """The row order of `epoch` [num_rows]: a permutation, or packing order without data.shuffle."""
        return super().order(epoch) if self.shuffle else np.arange(self.num_rows)

    def batch_at(self, step: int) -> dict[str, np.ndarray]:
        """This host's slice of global batch `step`."""
        epoch = step // self.batches_per_epoch
        return masked_batch(self.examples, self.host_indices(step), (self.seed, MLM_TRAIN_MASKS, epoch),
                            self.vocab_size, self.mask_prob)


def eval_batches(examples: PackedExamples, tokenizer: Tokenizer, batch_size: int, max_batches: int = 0,
                 seed: int = 0, mask_prob: float = 0.15, process_index: int | None = None,
                 process_count: int | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Held-out batches in order, with the same masking every time; finite: ceil(N / batch_size) batches, or
    `max_batches` if smaller (0 = all). The last batch is filled up with copies of example 0 whose mask_weights
    are 0, so every batch has the full shape (like the training batches, this host's slice of it)."""
    for rows, real in padded_batches(len(examples), batch_size, max_batches, process_index, process_count):
        batch = masked_batch(examples, rows, (seed, MLM_EVAL_MASKS, 0), tokenizer.vocab_size, mask_prob)
        batch["mask_weights"] *= real[:, None]
        yield batch


@dataclasses.dataclass
class MLMData:
    """Everything `build_mlm_data` made: the tokenizer, the training iterator, the held-out rows, counters."""

    tokenizer: Tokenizer
    train: MLMTrainIterator | StreamingMLMIterator
    eval_examples: PackedExamples
    stats: DataStats  # train split, plus the source-level counters (streaming: what this process read so far)
    eval_stats: DataStats
    unigram_entropy: float  # nats/token of the training targets' unigram distribution (streaming: of the
    # held-out rows, since the training rows are never all in memory)
    tokenizer_trained: bool  # False when a cached or configured model was loaded

    def summary(self) -> str:
        return f"train: {self.stats.summary()}\neval: {self.eval_stats.summary()}\ntokenizer: {self.tokenizer}"


def _sentences(documents: Iterable[str], config) -> Iterator[str]:
    return (s for d in documents for s in split_sentences(d, config.newline_ends_sentence))


def tokenizer_training_sentences(config) -> Iterator[str]:
    """The sentences a run with data config `config` trains its tokenizer on (before `sample_texts`): every
    training sentence in memory; streaming, a bounded read of the shards (`ShardReader.sentences`)."""
    if config.streaming:
        return ShardReader(config, None, DataStats()).sentences(list_shards(config), config.tokenizer_max_sentences)
    train_documents, _ = load_documents(config, DataStats(), DataStats())
    return _sentences(train_documents, config)


def _tokenizer(config, workdir: str, sentences: Iterable[str], process_index, process_count):
    return load_or_train_tokenizer(
        workdir, sentences, config.vocab_size, model_path=config.tokenizer_path or None,
        special_tokens=MLM_SPECIAL_TOKENS, model_type=tokenizer_algorithm(config.tokenizer, config.tokenizer_model_type),
        max_sentences=config.tokenizer_max_sentences, seed=config.seed, library=config.tokenizer,
        process_index=process_index, process_count=process_count)


def _empty_held_out(config, training: str) -> ValueError:
    return ValueError(f"the held-out split is empty ({training}, data.eval_fraction={config.eval_fraction}); raise "
                      "data.eval_fraction or add documents")


def build_mlm_data(config: MLMDataConfig, batch_size: int, workdir: str, *,
                   process_index: int | None = None, process_count: int | None = None,
                   eval_rows: int = 0) -> MLMData:
    """Reads the configured corpus, trains (or loads) the tokenizer, packs both splits; `batch_size` is global.
    With data.streaming, only the held-out rows are packed now (at most `eval_rows`, 0 = all) and the training
    rows are read shard by shard as the iterator runs.

    Raises ValueError for an empty corpus, an empty held-out split, or fewer packed examples than one batch. The
    block's ranges were checked when it was built (`MLMDataConfig`).
    """
    if config.streaming:
        return _build_streaming(config, batch_size, workdir, process_index, process_count, eval_rows)
    stats, eval_stats = DataStats(), DataStats()
    train_documents, eval_documents = load_documents(config, stats, eval_stats)
    if not eval_documents:
        raise _empty_held_out(config, f"{len(train_documents)} training documents")
    tokenizer, trained = _tokenizer(config, workdir, _sentences(train_documents, config), process_index,
                                    process_count)
    train = build_examples(train_documents, tokenizer, config.seq_len, stats, config.newline_ends_sentence)
    held_out = build_examples(eval_documents, tokenizer, config.seq_len, eval_stats, config.newline_ends_sentence)
    iterator = MLMTrainIterator(train, tokenizer, batch_size, seed=config.seed, mask_prob=config.mask_prob,
                                shuffle=config.shuffle, process_index=process_index,
                                process_count=process_count)
    return MLMData(tokenizer, iterator, held_out, stats, eval_stats, unigram_entropy(train.tokens), trained)


def held_out_rows(config: MLMDataConfig, tokenizer: Tokenizer) -> PackedExamples:
    """The held-out rows [N, seq_len] that `build_mlm_data` evaluates on, packed with `tokenizer`, without
    tokenizing the training split (an in-memory source)."""
    if config.streaming:
        raise ValueError("held_out_rows reads an in-memory source; with data.streaming use build_mlm_data")
    stats, eval_stats = DataStats(), DataStats()
    train_documents, eval_documents = load_documents(config, stats, eval_stats)
    if not eval_documents:
        raise _empty_held_out(config, f"{len(train_documents)} training documents")
    return build_examples(eval_documents, tokenizer, config.seq_len, eval_stats, config.newline_ends_sentence)


def held_out_stream(config: MLMDataConfig, tokenizer: Tokenizer, max_tokens: int = 0) -> np.ndarray:
    """The held-out documents of `config` tokenized and joined in order into one stream of token ids [N]
    (consecutive chapters follow each other): the text `contiguous_rows` cuts into rows. Only its first `max_tokens`
    tokens (0 = all)."""
    if config.streaming:
        raise ValueError("held_out_stream reads an in-memory source; data.streaming reads shards as it trains")
    _, eval_documents = load_documents(config, DataStats(), DataStats())
    encoded = encode_documents(eval_documents, tokenizer, DataStats(), config.newline_ends_sentence)
    stream = np.fromiter((t for document in encoded for sentence in document for t in sentence), np.int32)
    return stream[:max_tokens] if max_tokens else stream


def contiguous_row_count(tokens: int, length: int) -> int:
    """How many rows of `length` (`contiguous_rows`: [CLS] span [SEP]) a text of `tokens` tokens fills."""
    return tokens // (length - 2)


def _cut(values: np.ndarray, length: int, first, last) -> np.ndarray:
    """`values` [N] cut into non-overlapping spans of length - 2, each row `first` span `last`
    [contiguous_row_count(N, length), length]; the tail too short for a row is dropped."""
    span = length - 2
    count = contiguous_row_count(len(values), length)
    body = np.asarray(values[:count * span]).reshape(count, span)
    return np.concatenate([np.full((count, 1), first, body.dtype), body, np.full((count, 1), last, body.dtype)], 1)


def contiguous_rows(stream: np.ndarray, length: int, specials: SpecialIds = SpecialIds()) -> PackedExamples:
    """Rows of `length` tokens in which the whole row is one span of text, for evaluating a model at a length
    other than its training length: `stream` (`held_out_stream`) cut into non-overlapping spans of length - 2
    tokens, each row [CLS] span [SEP] as a single piece (no padding, nothing attends only within a packed
    sentence); the tail too short for a row is dropped ([CLS] and [SEP]: `specials`'). Returns PackedExamples
    [N, length]; raises ValueError when not one row fits."""
    if length < 3:
        raise ValueError(f"length {length}: a row needs room for [CLS], one token and [SEP]")
    if len(stream) < length - 2:
        raise ValueError(f"the held-out text has {len(stream)} tokens: not one row of {length}")
    tokens = _cut(np.asarray(stream, np.int32), length, specials.cls, specials.sep)
    return PackedExamples(tokens, np.ones_like(tokens))


def masked_stream(stream: np.ndarray, seed: int, vocab_size: int, mask_prob: float,
                  specials: SpecialIds = SpecialIds()) -> tuple[np.ndarray, np.ndarray]:
    """BERT masking of the held-out `stream` [N] as one sequence (`mask_batch`: round(mask_prob·n) of its n
    candidate tokens), a function of (seed, token position): (input_ids [N] int32, mask_weights [N] float32).
    Cut at any length (`contiguous_batches`), the rows predict the same tokens under the same corruption, so losses
    at two lengths differ by the context alone. `specials`: the vocabulary's mask token and reserved ids."""
    input_ids, weights = mask_batch(np.asarray(stream)[None], np.zeros(1, np.int64), (seed, MLM_LENGTH_MASKS, 0),
                                    vocab_size=vocab_size, mask_prob=mask_prob, mask_id=specials.mask,
                                    reserved=specials.reserved)
    return input_ids[0], weights[0]


def contiguous_batches(stream: np.ndarray, input_ids: np.ndarray, mask_weights: np.ndarray, length: int,
                       batch_size: int, specials: SpecialIds = SpecialIds()) -> Iterator[dict[str, np.ndarray]]:
    """The rows of `contiguous_rows(stream, length)` with the stream's own masking (`masked_stream`: input_ids,
    mask_weights [N]), in batches as `eval_batches` yields them (all [batch_size, length]; the last filled up with
    row 0, which scores nothing)."""
    rows = contiguous_rows(stream, length, specials)
    inputs = _cut(np.asarray(input_ids, np.int32), length, specials.cls, specials.sep)
    weights = _cut(np.asarray(mask_weights, np.float32), length, 0.0, 0.0)
    for index, real in padded_batches(len(rows), batch_size):
        yield mlm_batch(inputs[index], rows.tokens[index], weights[index] * real[:, None], rows.piece_ids[index])


def _build_streaming(config, batch_size: int, workdir: str, process_index, process_count,
                     eval_rows: int) -> MLMData:
    shards = list_shards(config)
    index, count = host_process(process_index, process_count)
    process_shards(shards, index, count)  # too few shards: say so before a tokenizer is trained
    sentences = ShardReader(config, None, DataStats()).sentences(shards, config.tokenizer_max_sentences)
    tokenizer, trained = _tokenizer(config, workdir, sentences, index, count)
    stats, eval_stats = DataStats(), DataStats()
    # What the stream position depends on besides the shards: a changed setting or vocabulary is refused on resume.
    reading = {k: getattr(config, k) for k in ("source", "doc_separator", "newline_ends_sentence", "eval_fraction",
                                      "tfds_name", "tfds_eval_split", "text_field", "mask_prob")}
    fingerprint = zlib.crc32(tokenizer.model_bytes(),
                             zlib.crc32(json.dumps(reading, sort_keys=True).encode()))
    iterator = StreamingMLMIterator(
        shards, ShardReader(config, tokenizer, stats), config.seq_len, batch_size, vocab_size=tokenizer.vocab_size,
        seed=config.seed, mask_prob=config.mask_prob, shuffle=config.shuffle, window=config.shuffle_window,
        fingerprint=fingerprint, process_index=index, process_count=count)
    held_out = held_out_examples(config, shards, tokenizer, eval_stats, config.seq_len, eval_rows)
    if not len(held_out):
        raise _empty_held_out(config, f"{len(shards)} shard(s)")
    return MLMData(tokenizer, iterator, held_out, stats, eval_stats, unigram_entropy(held_out.tokens), trained)


def train_tokenizer(config, out: str) -> Tokenizer:
    """`jaxpos tokenizer`: trains the tokenizer that a run with data config `config` would train (same sentences,
    settings and model) and writes OUT.model and OUT.vocab (data.tokenizer=tokenizers: OUT.tokenizer.json), then
    OUT.json (`out` may end in the model's suffix; local or URL)."""
    sample, settings = tokenizer_settings(
        tokenizer_training_sentences(config), config.vocab_size, special_tokens=MLM_SPECIAL_TOKENS,
        model_type=tokenizer_algorithm(config.tokenizer, config.tokenizer_model_type),
        max_sentences=config.tokenizer_max_sentences, seed=config.seed, library=config.tokenizer)
    return train_tokenizer_file(sample, settings, tokenizer_prefix(out))
