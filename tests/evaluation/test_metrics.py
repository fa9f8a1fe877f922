"""GLUE metrics against scikit-learn and scipy on random inputs, and the undefined cases."""

import warnings

import numpy as np
import pytest

sklearn_metrics = pytest.importorskip("sklearn.metrics")
stats = pytest.importorskip("scipy.stats")

from jaxpos.evaluation.metrics import average_ranks, compute_metrics, wilson_interval  # noqa: E402

TOL = 1e-10


@pytest.mark.parametrize("trial", range(5))
def test_classification_metrics_match_sklearn(trial):
    rng = np.random.default_rng(trial)
    n = int(rng.integers(5, 400))
    labels = rng.integers(0, 2, n).astype(np.float32)  # the loaders' float labels
    predictions = np.where(rng.random(n) < 0.7, labels, 1 - labels).astype(np.int64)
    got = compute_metrics(("accuracy", "f1", "matthews", "accuracy_f1_mean"), predictions, labels)
    acc = sklearn_metrics.accuracy_score(labels, predictions)
    f1 = sklearn_metrics.f1_score(labels, predictions)
    assert abs(got["accuracy"] - acc) < TOL and abs(got["f1"] - f1) < TOL
    assert abs(got["matthews"] - sklearn_metrics.matthews_corrcoef(labels, predictions)) < TOL
    assert abs(got["accuracy_f1_mean"] - (acc + f1) / 2) < TOL
    three = rng.integers(0, 3, n)  # MNLI-like: the multi-class Matthews correlation and accuracy
    guess = np.where(rng.random(n) < 0.5, three, rng.integers(0, 3, n))
    got = compute_metrics(("matthews", "accuracy"), guess, three)
    assert abs(got["matthews"] - sklearn_metrics.matthews_corrcoef(three, guess)) < TOL
    assert abs(got["accuracy"] - sklearn_metrics.accuracy_score(three, guess)) < TOL


@pytest.mark.parametrize("trial", range(5))
def test_correlations_match_scipy(trial):
    rng = np.random.default_rng(100 + trial)
    n = int(rng.integers(3, 500))
    labels = np.round(rng.uniform(0, 5, n), 1)  # STS-B scores with many ties
    scores = (labels + rng.normal(0, 1.5, n)).astype(np.float32)
    if trial % 2:
        scores = np.round(scores)  # ties on the prediction side too
    got = compute_metrics(("pearson", "spearman", "pearson_spearman_mean"), scores, labels)
    pearson = stats.pearsonr(scores.astype(np.float64), labels)[0]
    spearman = stats.spearmanr(scores, labels)[0]
    assert abs(got["pearson"] - pearson) < TOL and abs(got["spearman"] - spearman) < TOL
    assert abs(got["pearson_spearman_mean"] - (pearson + spearman) / 2) < TOL
    np.testing.assert_array_equal(average_ranks(scores), stats.rankdata(scores))


def test_undefined_cases_score_zero():
    labels = np.array([0, 1, 1, 0, 1.0])
    constant = np.ones(5, np.int64)
    # Matthews with constant predictions: 0, as scikit-learn
    assert compute_metrics(["matthews"], constant, labels)["matthews"] == 0.0
    assert sklearn_metrics.matthews_corrcoef(labels, constant) == 0.0
    # F1 without positive labels or predictions: 0, as scikit-learn's zero_division default
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert sklearn_metrics.f1_score(np.zeros(4), np.zeros(4)) == 0.0
    assert compute_metrics(["f1"], np.zeros(4), np.zeros(4))["f1"] == 0.0
    # Pearson/Spearman with a constant side: scipy gives NaN (with a warning); jaxpos gives 0.0 so that the
    # maximum over checkpoints stays defined
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert np.isnan(stats.pearsonr(np.full(5, 2.5), labels)[0])
    got = compute_metrics(["pearson", "spearman"], np.full(5, 2.5), labels)
    assert got == {"pearson": 0.0, "spearman": 0.0}
    # perfect and reversed orderings
    x = np.arange(6.0)
    assert compute_metrics(["pearson", "spearman"], x, 2 * x + 1) == {"pearson": 1.0, "spearman": 1.0}
    assert compute_metrics(["spearman"], -x ** 3, x)["spearman"] == -1.0
    # a diverged regression stays visible
    assert np.isnan(compute_metrics(["pearson"], np.array([np.nan, 1, 2]), np.array([1.0, 2, 3]))["pearson"])


def test_errors():
    with pytest.raises(ValueError, match=r"unknown metric\(s\) \['bleu'\]"):
        compute_metrics(["bleu"], [0], [0])
    with pytest.raises(ValueError, match="3 predictions for 2 labels"):
        compute_metrics(["accuracy"], [0, 1, 1], [0, 1])
    with pytest.raises(ValueError, match="no examples"):
        compute_metrics(["accuracy"], [], [])
    with pytest.raises(ValueError, match="2 labels are NaN: an unlabelled split"):
        compute_metrics(["accuracy"], [0, 1, 1], [np.nan, 1, np.nan])
    with pytest.raises(ValueError, match="f1 is binary"):
        compute_metrics(["f1"], [0, 2], [0, 1])


@pytest.mark.parametrize("k,n", [(0, 10), (3, 10), (705, 1000), (1000, 1000), (1, 1)])
def test_wilson_interval_matches_scipy(k, n):
    expected = stats.binomtest(k, n).proportion_ci(0.95, method="wilson")
    assert np.allclose(wilson_interval(k, n), (expected.low, expected.high), atol=1e-12)


def test_wilson_interval_of_half_counts_lies_between_its_neighbours_and_widens_with_z():
    below, half, above = wilson_interval(40, 100), wilson_interval(40.5, 100), wilson_interval(41, 100)
    assert below[0] < half[0] < above[0] and below[1] < half[1] < above[1]
    wider = wilson_interval(40.5, 100, z=2.64)
    assert wider[0] < half[0] and wider[1] > half[1]


def test_wilson_interval_refuses_no_trials():
    with pytest.raises(ValueError, match="0 trials"):
        wilson_interval(0, 0)
