"""Where attention sinks: how much of each layer's and head's attention goes to the first token of a row, to its
[SEP] tokens, and to the single most-attended key, over held-out rows.

An attention sink is a key that draws attention whatever the query (the first token in most trained Transformers,
Xiao et al. 2024; gated attention removes it, Qiu et al. 2025). Per layer and head, over the real (not padded)
queries of every row: `first` is the mean weight on the row's first key; `sep` the mean total weight on its [SEP]
keys; `top` the mean weight on the key that draws the most attention in that row (averaged over queries), the sink
wherever it sits; `learned` the weight a learned sink logit (`model.attention_sinks`) takes, one minus the row's
total weight on its keys (0 without one); `uniform` is what a query spreading its attention evenly gives every key,
the mean of 1/n over the queries (n: the keys it attends), the floor the others read against.
"""

from __future__ import annotations

import numpy as np

SINK_MEASURES = ("first", "sep", "top", "learned", "uniform")


def attention_sinks(weights: np.ndarray, valid: np.ndarray, token_ids: np.ndarray | None = None,
                    sep_id: int | None = None) -> dict[str, np.ndarray]:
    """{measure: [L, H]} of attention weights [L, B, H, T, S] (self-attention, S = T) of rows whose real tokens are
    `valid` [B, T] (bool); `token_ids` [B, T] and `sep_id` find the [SEP] keys (None: `sep` is NaN). Queries that
    are padding are left out; padded keys get no weight to begin with."""
    weights = np.asarray(weights, np.float64)
    valid = np.asarray(valid, bool)
    queries = valid[None, :, None, :]  # [1, B, 1, T]
    count = queries.sum(axis=(1, 3))  # real queries per layer and head: [1, 1]

    def mean_over_queries(per_query):  # [L, B, H, T] -> [L, H]
        return np.where(queries, per_query, 0.0).sum(axis=(1, 3)) / count

    first = mean_over_queries(weights[..., 0])
    # [L, B, H, S]: each key's mean weight over the row's real queries
    column = np.where(queries[..., None], weights, 0.0).sum(axis=3) / np.maximum(valid.sum(axis=1), 1)[None, :, None, None]
    top_key = column.argmax(axis=-1)  # [L, B, H]
    top = mean_over_queries(np.take_along_axis(weights, top_key[..., None, None].repeat(weights.shape[3], 3),
                                               axis=-1)[..., 0])
    if token_ids is not None and sep_id is not None:
        is_sep = (np.asarray(token_ids) == sep_id) & valid  # [B, S]
        sep = mean_over_queries((weights * is_sep[None, :, None, None, :]).sum(axis=-1))
    else:
        sep = np.full(first.shape, np.nan)
    learned = mean_over_queries(np.clip(1.0 - weights.sum(axis=-1), 0.0, 1.0))
    keys = (weights > 0).sum(axis=-1)  # [L, B, H, T]: the keys each query attends
    uniform = mean_over_queries(1.0 / np.maximum(keys, 1))
    return dict(first=first, sep=sep, top=top, learned=learned, uniform=uniform)


def combine_sinks(batches: list[tuple[dict[str, np.ndarray], int]]) -> dict[str, np.ndarray]:
    """The measures of several batches, each (measures, its number of real queries), as one mean over queries."""
    total = sum(count for _, count in batches)
    return {name: sum(m[name] * count for m, count in batches) / total for name in batches[0][0]}


def sinks_summary(measures: dict[str, np.ndarray]) -> dict[str, float]:
    """The mean over layers and heads of each measure (NaN where it was not measured)."""
    return {name: float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")
            for name, values in measures.items()}


def sinks_table(measures: dict[str, np.ndarray]) -> str:
    """A markdown table, a row per layer and head: the weight on the first token, on [SEP], on the top key, and the
    uniform floor."""
    first = measures["first"]
    lines = ["| layer | head | first token | [SEP] | most-attended key | learned sink | uniform |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for layer in range(first.shape[0]):
        for head in range(first.shape[1]):
            cells = [f"{measures[m][layer, head]:.3f}" if np.isfinite(measures[m][layer, head]) else "–"
                     for m in SINK_MEASURES]
            lines.append(f"| {layer + 1} | {head} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
