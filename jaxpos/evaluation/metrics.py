"""GLUE metrics in plain numpy, each checked against scikit-learn / scipy in tests/evaluation/test_metrics.py.

    accuracy                share of predictions equal to the label
    f1                      binary F1 of the positive class 1 (MRPC, QQP): 2·tp / (2·tp + fp + fn)
    matthews                Matthews correlation (CoLA), the multi-class form of scikit-learn
    pearson, spearman       correlations of scores with labels (STS-B); spearman = pearson of average ranks
    accuracy_f1_mean        (accuracy + f1) / 2, GLUE's combined MRPC/QQP score
    pearson_spearman_mean   (pearson + spearman) / 2, GLUE's combined STS-B score
    wilson_interval         the Wilson score interval of a proportion (an accuracy on n examples)

Undefined cases score 0.0 rather than NaN, so that "the maximum over checkpoints" stays well defined: F1 with
no positive label and no positive prediction (scikit-learn's zero_division default also gives 0.0), the
Matthews correlation when either side is constant (as scikit-learn), and Pearson/Spearman when either side is
constant (scipy returns NaN there with a ConstantInputWarning). NaN predictions (a diverged regression) give NaN.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np


def accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(predictions == labels))


def wilson_interval(successes: float, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson score interval (95% by default) of a proportion `successes` / n; `successes` may be fractional
    (ties counted half)."""
    if n <= 0:
        raise ValueError(f"a proportion of {n} trials has no interval")
    p, z2 = successes / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * np.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return float(max(0.0, centre - half)), float(min(1.0, centre + half))


def _binary(values: np.ndarray, what: str) -> np.ndarray:
    if not np.all((values == 0) | (values == 1)):
        raise ValueError(f"f1 is binary (positive class 1): the {what} hold {sorted(set(np.unique(values)))[:5]}")
    return values == 1


def f1(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Binary F1 of class 1."""
    p, t = _binary(predictions, "predictions"), _binary(labels, "labels")
    tp, fp, fn = np.sum(p & t), np.sum(p & ~t), np.sum(~p & t)
    denominator = 2 * tp + fp + fn
    return float(2 * tp / denominator) if denominator else 0.0


def matthews(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Matthews correlation over any number of classes, from the confusion matrix C (rows true, columns predicted):
    (c·n − t·p) / sqrt((n² − p·p)(n² − t·t)) with c = trace C, t and p its row and column sums."""
    classes, inverse = np.unique(np.concatenate([labels, predictions]), return_inverse=True)
    true, predicted = inverse[:len(labels)], inverse[len(labels):]
    confusion = np.zeros((len(classes), len(classes)), np.float64)
    np.add.at(confusion, (true, predicted), 1.0)
    t, p = confusion.sum(axis=1), confusion.sum(axis=0)
    n, correct = confusion.sum(), np.trace(confusion)
    cov_tp, cov_pp, cov_tt = correct * n - t @ p, n * n - p @ p, n * n - t @ t
    return float(cov_tp / np.sqrt(cov_tt * cov_pp)) if cov_tt * cov_pp else 0.0


def pearson(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Pearson correlation; 0.0 when either side is constant."""
    x = predictions.astype(np.float64) - np.mean(predictions, dtype=np.float64)
    y = labels.astype(np.float64) - np.mean(labels, dtype=np.float64)
    norm = np.sqrt(np.sum(x * x) * np.sum(y * y))
    if np.isnan(norm):
        return float("nan")
    return float(np.clip(np.sum(x * y) / norm, -1.0, 1.0)) if norm else 0.0


def average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n [n] of `values` [n], ties sharing the mean of their ranks (scipy's rankdata 'average')."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])  # first sorted index of each tie group
    ends = np.r_[starts[1:], len(values)]
    group = np.cumsum(np.r_[True, ordered[1:] != ordered[:-1]]) - 1
    ranks = np.empty(len(values), np.float64)
    ranks[order] = ((starts + ends - 1) / 2.0 + 1.0)[group]
    return ranks


def spearman(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Spearman's rank correlation (Pearson of average ranks); 0.0 when either side is constant."""
    if np.any(np.isnan(predictions)):
        return float("nan")
    return pearson(average_ranks(predictions), average_ranks(labels))


METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "accuracy": accuracy,
    "f1": f1,
    "matthews": matthews,
    "pearson": pearson,
    "spearman": spearman,
    "accuracy_f1_mean": lambda p, t: (accuracy(p, t) + f1(p, t)) / 2,
    "pearson_spearman_mean": lambda p, t: (pearson(p, t) + spearman(p, t)) / 2,
}


def compute_metrics(names: Sequence[str], predictions, labels) -> dict[str, float]:
    """{name: score} of `predictions` [N] (class ids, or scores for regression) against `labels` [N].

    Raises ValueError for an unknown name, different lengths, no examples, or NaN labels (an unlabelled split).
    """
    unknown = [name for name in names if name not in METRICS]
    if unknown:
        raise ValueError(f"unknown metric(s) {unknown}; choose from {', '.join(METRICS)}")
    predictions, labels = np.ravel(np.asarray(predictions)), np.ravel(np.asarray(labels))
    if predictions.shape != labels.shape:
        raise ValueError(f"{predictions.size} predictions for {labels.size} labels")
    if not labels.size:
        raise ValueError("no examples to score")
    if np.issubdtype(labels.dtype, np.floating) and np.any(np.isnan(labels)):
        raise ValueError(f"{int(np.sum(np.isnan(labels)))} labels are NaN: an unlabelled split (a GLUE test set) "
                         "cannot be scored")
    return {name: float(METRICS[name](predictions, labels)) for name in names}
