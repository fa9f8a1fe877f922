"""Records of TFDS datasets prepared as array_record, read without TensorFlow and without a download: the one
reader of every TFDS source (masked-LM documents, translation pairs, GLUE and SNLI examples)."""

from __future__ import annotations

from typing import Any, Callable, Iterable


def tfds_records(name: str, split: str, data_dir: str | None, convert: Callable[[dict], Any], *, start: int = 0,
                 stop: int | None = None, limit: int = 0, read_threads: int = 8) -> Iterable:
    """convert(record) for the records [start, stop) of split `split` of a prepared TFDS dataset (at most
    `limit` of them, 0 = all), in index order: `tfds.data_source` gives random access to the records, grain reads
    them on `read_threads` threads. The dataset is opened now (errors raise here); records are read as iterated."""
    import grain  # lazy: grain and TFDS cost ~1 s at import; only data.source=tfds reads them
    import tensorflow_datasets as tfds  # lazy: as grain

    dataset = grain.MapDataset.source(tfds.data_source(name, split=split, data_dir=data_dir or None,
                                                       download=False))[start:stop]
    if limit:
        dataset = dataset[:limit]
    return dataset.map(convert).to_iter_dataset(grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=256))


def record_value(value):
    """A record's feature as a Python value: 0-d numpy arrays unwrapped, bytes decoded as UTF-8."""
    if hasattr(value, "item") and not isinstance(value, (bytes, str)):  # a 0-d numpy array
        value = value.item()
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value
