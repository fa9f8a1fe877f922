"""The reproduction's paired tests against scipy, Holm against a brute-force Holm, the verdicts that must stay
inconclusive, the degenerate and missing-value cases, and the minimum detectable difference against a simulation."""

import math
import itertools

import numpy as np
import pytest

from jaxpos.reproduction import stats as S

scipy_stats = pytest.importorskip("scipy.stats")

# Per-seed scores of two mechanisms (a, b) at 3, 5 and 8 seeds: a small, a medium and a negative difference.
PAIRS = [([0.512, 0.498, 0.530], [0.501, 0.497, 0.515]),
         ([0.61, 0.58, 0.66, 0.63, 0.59], [0.55, 0.57, 0.58, 0.60, 0.52]),
         ([1.2, 0.9, 1.4, 1.1, 1.0, 1.3, 0.8, 1.25], [1.5, 1.1, 1.6, 1.2, 1.4, 1.3, 1.2, 1.35])]


# --- paired_difference against scipy ---------------------------------------------------------------------------------

@pytest.mark.parametrize("a, b", PAIRS)
@pytest.mark.parametrize("alternative", ["two-sided", "greater", "less"])
def test_paired_t_matches_scipy(a, b, alternative):
    result = S.paired_difference(a, b, alternative=alternative)
    reference = scipy_stats.ttest_rel(a, b, alternative=alternative)
    assert result.t == pytest.approx(reference.statistic, rel=1e-12)
    assert result.p == pytest.approx(reference.pvalue, rel=1e-10)
    assert result.n == len(a) and result.df == len(a) - 1 and result.dropped == 0
    d = np.subtract(a, b)
    assert result.mean == pytest.approx(d.mean()) and result.sd == pytest.approx(d.std(ddof=1))
    assert result.se == pytest.approx(scipy_stats.sem(d))
    # The interval is the two-sided 95% one whatever the alternative.
    low, high = scipy_stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=scipy_stats.sem(d))
    assert (result.ci_low, result.ci_high) == pytest.approx((low, high), rel=1e-12)
    assert result.confidence == pytest.approx(0.95)


def test_interval_follows_alpha():
    a, b = PAIRS[1]
    result = S.paired_difference(a, b, alpha=0.01)
    d = np.subtract(a, b)
    low, high = scipy_stats.t.interval(0.99, len(d) - 1, loc=d.mean(), scale=scipy_stats.sem(d))
    assert (result.ci_low, result.ci_high) == pytest.approx((low, high), rel=1e-12)


def test_a_bounded_difference_reports_its_interval_clipped_to_its_range():
    """Two seeds of a share minus 0.5, which lies in [-0.5, 0.5]: scipy's t interval reaches past +-3, so the one
    reported is clipped to the range and says so; the test itself (t, p, detectable difference) is unchanged."""
    a, b = [0.3, -0.2], [0.0, 0.0]
    low, high = scipy_stats.t.interval(0.95, 1, loc=0.05, scale=scipy_stats.sem(np.subtract(a, b)))
    assert low == pytest.approx(0.05 - 12.7062 * 0.25, abs=1e-3) and high > 3  # by hand: t(0.975, 1 df) * se
    free, bounded = S.paired_difference(a, b), S.paired_difference(a, b, bounds=(-0.5, 0.5))
    assert (free.ci_low, free.ci_high) == pytest.approx((low, high), rel=1e-12) and free.clipped_to is None
    assert (bounded.ci_low, bounded.ci_high) == (-0.5, 0.5) and bounded.clipped_to == (-0.5, 0.5)
    assert (bounded.mean, bounded.t, bounded.p, bounded.mdd) == (free.mean, free.t, free.p, free.mdd)
    reason = S.verdict(bounded, bounded.p)[1]
    assert "(95% CI -0.5 to +0.5, clipped to the difference's range -0.5 to +0.5, 2 seeds)" in reason
    assert "clipped" not in S.verdict(free, free.p)[1]
    # An interval inside the range is left as it is.
    inside = S.paired_difference([0.61, 0.58, 0.66, 0.63, 0.59], [0.51, 0.50, 0.55, 0.52, 0.50], bounds=(-1, 1))
    assert inside.clipped_to is None and 0 < inside.ci_low < inside.ci_high < 1
    with pytest.raises(ValueError, match="low < high"):
        S.paired_difference(a, b, bounds=(0.5, -0.5))


def test_result_is_frozen():
    result = S.paired_difference(*PAIRS[0])
    with pytest.raises(AttributeError):
        result.p = 0.0


@pytest.mark.parametrize("a, b, message", [([1.0, 2.0, 3.0], [1.0, 2.0], "aligned by seed"),
                                           ([1.0], [0.5], "2 or more seeds"),
                                           ([[1.0, 2.0]], [[0.0, 1.0]], "1-D")])
def test_bad_inputs_are_clear_errors(a, b, message):
    with pytest.raises(ValueError, match=message):
        S.paired_difference(a, b)


def test_bad_alternative_and_alpha():
    with pytest.raises(ValueError, match="alternative"):
        S.paired_difference([1.0, 2.0], [0.0, 1.0], alternative="bigger")
    with pytest.raises(ValueError, match="alpha"):
        S.paired_difference([1.0, 2.0], [0.0, 1.0], alpha=1.5)


# --- missing values and a zero spread ------------------------------------------------------------------------------

def test_seeds_missing_on_either_side_are_dropped_from_both():
    a = [0.61, np.nan, 0.66, 0.63, 0.59, None]
    b = [0.55, 0.57, np.inf, 0.60, 0.52, 0.50]
    result = S.paired_difference(a, b)
    reference = scipy_stats.ttest_rel([0.61, 0.63, 0.59], [0.55, 0.60, 0.52])
    assert result.n == 3 and result.dropped == 3
    assert result.t == pytest.approx(reference.statistic) and result.p == pytest.approx(reference.pvalue)
    assert "3 dropped" in S.verdict(result, result.p)[1]


def test_too_few_seeds_after_dropping():
    with pytest.raises(ValueError, match=r"got 1 \(2 dropped"):
        S.paired_difference([0.5, np.nan, 0.7], [0.4, 0.3, np.nan])


def test_zero_spread_is_decided_explicitly():
    # Every seed differs by exactly 0.1 (up to rounding of the subtraction): the sd is 0, not 1e-17.
    result = S.paired_difference([0.3, 0.4, 0.5], [0.2, 0.3, 0.4])
    assert result.sd == 0.0 and result.se == 0.0 and result.mdd == 0.0
    assert result.t == np.inf and result.p == 0.0
    assert result.ci_low == result.ci_high == pytest.approx(0.1)
    assert S.paired_difference([0.3, 0.4, 0.5], [0.2, 0.3, 0.4], alternative="less").p == 1.0
    value, reason = S.verdict(result, result.p)
    assert value == S.HOLDS and "agree exactly" in reason
    assert S.verdict(result, result.p, expected_sign=-1)[0] == S.CONTRADICTED
    # No difference at all: t = 0, never significant.
    same = S.paired_difference([0.3, 0.4, 0.5], [0.3, 0.4, 0.5])
    assert (same.t, same.p, same.mdd) == (0.0, 1.0, 0.0)
    assert S.verdict(same, same.p)[0] == S.INCONCLUSIVE


# --- Holm ---------------------------------------------------------------------------------------------------------

def brute_force_holm(p, alpha):
    """Holm from its definition: reject the k smallest p-values while p_(j) <= alpha / (m - j + 1); the adjusted p
    of a test is the smallest alpha at which this procedure rejects it."""
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    reject = [False] * m
    for j, i in enumerate(order):
        if p[i] > alpha / (m - j):
            break
        reject[i] = True
    adjusted = [min(1.0, max((m - j) * p[order[j]] for j in range(order.index(i) + 1))) for i in range(m)]
    return np.array(adjusted), np.array(reject)


@pytest.mark.parametrize("trial", range(20))
def test_holm_matches_brute_force(trial):
    rng = np.random.default_rng(trial)
    m = int(rng.integers(1, 16))
    p = rng.uniform(0, 0.1, m) ** rng.uniform(0.5, 2)
    if trial % 4 == 0:  # ties and exact values at the thresholds
        p[: m // 2] = p[0]
    for alpha in (0.05, 0.1):
        adjusted, reject = S.holm(p, alpha)
        expected_adjusted, expected_reject = brute_force_holm(p.tolist(), alpha)
        np.testing.assert_allclose(adjusted, expected_adjusted, rtol=1e-12)
        np.testing.assert_array_equal(reject, expected_reject)
        assert np.all(adjusted >= p) and np.all(adjusted <= 1)
        order = np.argsort(p, kind="stable")
        assert np.all(np.diff(adjusted[order]) >= 0)


def test_holm_on_known_values():
    adjusted, reject = S.holm([0.01, 0.04, 0.03, 0.005])
    np.testing.assert_allclose(adjusted, [0.03, 0.06, 0.06, 0.02])
    np.testing.assert_array_equal(reject, [True, False, False, True])
    assert S.holm([0.6, 0.9])[0].tolist() == [1.0, 1.0]
    empty_adjusted, empty_reject = S.holm([])
    assert empty_adjusted.shape == empty_reject.shape == (0,)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        S.holm([0.01, np.nan])


def test_holm_matches_statsmodels():
    multitest = pytest.importorskip("statsmodels.stats.multitest")
    rng = np.random.default_rng(7)
    for m in (1, 2, 5, 15):
        p = rng.uniform(0, 0.2, m)
        reject, adjusted, _, _ = multitest.multipletests(p, alpha=0.05, method="holm")
        ours_adjusted, ours_reject = S.holm(p, 0.05)
        np.testing.assert_allclose(ours_adjusted, adjusted, rtol=1e-12)
        np.testing.assert_array_equal(ours_reject, reject)


def test_brute_force_holm_is_the_step_down_rule():
    # The test's own reference, on every ordering of a small family: rejections stop at the first failure.
    for p in itertools.permutations([0.001, 0.03, 0.013, 0.3]):
        adjusted, reject = brute_force_holm(list(p), 0.05)
        assert sorted(np.array(p)[reject].tolist()) == [0.001, 0.013]  # 0.013 <= 0.05 / 3, 0.03 > 0.05 / 2
        assert sorted(adjusted.tolist()) == pytest.approx([0.004, 0.039, 0.06, 0.3])


# --- verdicts ----------------------------------------------------------------------------------------------------

def test_a_clear_difference_holds_and_its_opposite_is_contradicted():
    a, b = [0.61, 0.58, 0.66, 0.63, 0.59], [0.51, 0.50, 0.55, 0.52, 0.50]
    result = S.paired_difference(a, b)
    value, reason = S.verdict(result, result.p, 0.05, expected_sign=1)
    assert value == S.HOLDS and "as claimed" in reason and "95% CI" in reason
    value, reason = S.verdict(result, result.p, 0.05, expected_sign=-1)
    assert value == S.CONTRADICTED and "against the claim" in reason
    # A one-sided test in the claimed direction decides "holds" but never "contradicted".
    greater = S.paired_difference(a, b, alternative="greater")
    assert S.verdict(greater, greater.p, expected_sign=1)[0] == S.HOLDS
    less = S.paired_difference(a, b, alternative="less")
    assert S.verdict(less, less.p, expected_sign=-1)[0] == S.INCONCLUSIVE
    with pytest.raises(ValueError, match="cannot decide"):
        S.verdict(less, less.p, expected_sign=1)
    with pytest.raises(ValueError, match="expected_sign"):
        S.verdict(result, result.p, expected_sign=0)


def test_a_difference_inside_the_noise_is_not_holds():
    # A locality difference of 0.0008 ± 0.0007 over 3 seeds: mean - std > 0, so the one-std rule said "holds";
    # a paired t test gives p ~ 0.19 (one-sided ~ 0.09), inconclusive even before any correction.
    differences = 0.0008 + 0.0007 * np.array([-1.0, 0.0, 1.0])
    assert np.std(differences, ddof=1) == pytest.approx(0.0007) and np.mean(differences) == pytest.approx(0.0008)
    assert np.mean(differences) - np.std(differences, ddof=1) > 0  # outside one sd of 0
    for alternative in ("two-sided", "greater"):
        result = S.paired_difference(differences, np.zeros(3), alternative=alternative)
        value, reason = S.verdict(result, result.p, 0.05, expected_sign=1)
        assert value == S.INCONCLUSIVE
        assert f"these 3 seeds could detect a difference of at least {result.mdd:.3g}" in reason
        assert result.mdd > result.mean


def test_a_large_effect_can_lose_significance_after_holm_over_15_claims():
    # Differences 1.0, 1.2, 1.4 (6 standard deviations): p ~ 0.009 alone, but one of 15 claims.
    result = S.paired_difference([1.0, 1.2, 1.4], [0.0, 0.0, 0.0])
    assert 0.005 < result.p < 0.01 and result.ci_low > 0
    assert S.verdict(result, result.p, 0.05, expected_sign=1)[0] == S.HOLDS
    others = np.linspace(0.2, 0.9, 14)
    adjusted, reject = S.holm([result.p, *others], 0.05)
    assert not reject[0] and adjusted[0] == pytest.approx(15 * result.p)
    value, reason = S.verdict(result, adjusted[0], 0.05, expected_sign=1)
    assert value == S.INCONCLUSIVE and "Holm-adjusted 0.1" in reason and "could detect" in reason


# --- the minimum detectable difference ------------------------------------------------------------------------------

def simulated_power(delta, sd, n, alpha, alternative, trials=20000, seed=0):
    """The share of `trials` simulated seeds' differences ~ N(delta, sd) [n] that the paired t test rejects."""
    d = np.random.default_rng(seed).normal(delta, sd, size=(trials, n))
    p = scipy_stats.ttest_1samp(d, 0.0, axis=1, alternative=alternative).pvalue
    return float(np.mean(p <= alpha))


@pytest.mark.parametrize("n, alternative", [(3, "two-sided"), (5, "two-sided"), (3, "greater"), (10, "two-sided")])
def test_minimum_detectable_difference_has_80_percent_power(n, alternative):
    sd, alpha = 0.02, 0.05
    mdd = S.minimum_detectable_difference(sd, n, alpha, alternative)
    # 20000 trials: the power's standard error is 0.003; a formula off by a factor of 1.25 lands at 0.6-0.7 or 0.9.
    assert simulated_power(mdd, sd, n, alpha, alternative) == pytest.approx(0.8, abs=0.015)
    assert simulated_power(mdd / 1.25, sd, n, alpha, alternative) < 0.72
    assert simulated_power(mdd * 1.25, sd, n, alpha, alternative) > 0.88


def test_minimum_detectable_difference_is_the_textbook_formula_at_many_seeds():
    sd, n = 0.02, 40
    closed_form = (scipy_stats.t.ppf(0.975, n - 1) + scipy_stats.t.ppf(0.8, n - 1)) * sd / np.sqrt(n)
    assert S.minimum_detectable_difference(sd, n) == pytest.approx(closed_form, rel=0.01)
    # Fewer seeds: the closed form is optimistic (about 77% power at n = 3), the exact value is larger.
    closed_form_3 = (scipy_stats.t.ppf(0.975, 2) + scipy_stats.t.ppf(0.8, 2)) * sd / np.sqrt(3)
    assert S.minimum_detectable_difference(sd, 3) > closed_form_3


def test_paired_difference_reports_the_minimum_detectable_difference_of_its_spread():
    a, b = PAIRS[1]
    result = S.paired_difference(a, b, alternative="greater", alpha=0.1)
    assert result.mdd == pytest.approx(S.minimum_detectable_difference(result.sd, result.n, 0.1, "greater"))
    assert S.paired_difference(a, b).mdd > result.mdd  # two-sided at 0.05 needs a larger difference


# --- the NaN policy, one rule wherever runs' numbers are read ---------------------------------------------------

@pytest.mark.parametrize("values, verdict", [
    ([1.0, float("nan")], "holds"),  # the NaN run did not measure it: the other one holds
    ([1.0, float("inf")], "holds"),
    ([1.0, None, float("-inf")], "holds"),
    ([float("nan")], "inconclusive"),  # nothing measured
    ([None, float("inf")], "inconclusive"),
    ([9.0, float("nan")], "contradicted"),
    ([1.0, 9.0, float("nan")], "inconclusive")])
def test_a_bound_leaves_out_runs_that_did_not_measure_it(values, verdict):
    from jaxpos.reproduction.judging import bound

    part = bound(values, lambda x: x <= 4, "error", "<= 4")
    assert part["verdict"] == verdict
    if verdict == "inconclusive" and all(v is None or not math.isfinite(v) for v in values):
        assert part["reason"].startswith("not measured")


def test_a_nan_run_leaves_its_seed_in_a_pooled_mean():
    from jaxpos.reproduction.readings import mean_by_seed

    pooled = mean_by_seed([{0: 1.0, 1: 2.0}, {0: float("nan"), 1: 4.0}, {0: 3.0, 1: float("inf")}])
    assert pooled == {0: 2.0, 1: 3.0}  # seed 0 keeps its two finite runs: (1 + 3) / 2; seed 1: (2 + 4) / 2
    assert mean_by_seed([{0: float("nan")}]) == {}
