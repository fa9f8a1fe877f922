"""Paired tests over seeds for the reproduction's claims, with Holm's correction across claims; checked against
scipy (and statsmodels' Holm where installed) in tests/reproduction/test_stats.py.

Runs with the same seed share data order and masking, so two mechanisms are compared seed by seed: the per-seed
differences d = a - b [n] are tested with a paired t test (n - 1 degrees of freedom).

    paired_difference   mean difference, standard error, the (1 - alpha) two-sided t interval, t, its p-value
                        (two-sided or one-sided) and the minimum detectable difference
    holm                Holm-Bonferroni step-down: adjusted p-values and reject flags over a family of tests
    verdict             holds / contradicted / inconclusive from a result and its Holm-adjusted p-value

Decisions use the Holm-adjusted p-value; the interval reported beside them is the unadjusted one (95% at
alpha = 0.05), the usual practice: it says how large the difference is, the adjusted p says whether it is decided.
A two-sided test is significant at level a exactly when its (1 - a) interval excludes 0, and then the interval
lies on the side of the mean; so "the interval at the Holm-adjusted level excludes 0 on the claimed side" is
"adjusted p <= alpha and the mean difference has the claimed sign", which is what `verdict` checks. An adjusted p
<= alpha implies an unadjusted p <= alpha, so the reported interval then excludes 0 too. Test a directional claim
two-sided: a one-sided p in the claimed direction can say "holds" but never "contradicted".

NaN policy: a seed where either side is NaN, infinite or None (a run that diverged or did not measure the value) is
dropped from both sides, and `dropped` counts it; fewer than 2 seeds left is a ValueError. `counts` applies the
policy to one value wherever the reproduction reads runs' numbers.

Minimum detectable difference: the smallest true mean difference that these n seeds, with a per-seed spread equal
to the observed sd, would detect with 80% power at the same alpha and alternative. The usual closed form
(t_{1-alpha/2, n-1} + t_{0.8, n-1}) * sd / sqrt(n) (t_{1-alpha, n-1} one-sided) gives about 77% power at n = 3 and
73% at n = 2, so the value here solves the noncentral t power equation exactly:
    P(|T| > t_{1-alpha/2, n-1}) = 0.8,  T ~ noncentral t(n - 1, sqrt(n) * delta / sd)   (one-sided: T > t_{1-alpha})
for delta (the closed form sizes the root-finder's bracket). It is the power of a single test at `alpha`, before
Holm's correction over the other claims (which makes each decided difference larger still).

Bounded quantities: a t interval assumes a mean that can take any value, and with few seeds it can reach far past
what the difference can be (±6 on a share minus 0.5 at 2 seeds); given the difference's `bounds`, the reported
interval is clipped to them and `clipped_to` says so. The test, its p-value and the minimum detectable difference are
the t test's, unchanged.

Degenerate spread: when the per-seed differences agree to rounding (sd <= n * eps * max|d|) the sd is taken as 0.
Then a nonzero mean gives t = +-inf (p = 0 on its side, as scipy), interval [mean, mean] and a minimum detectable
difference of 0; an all-zero difference gives t = 0 (two-sided p = 1).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
from scipy import optimize
from scipy import stats as distributions

HOLDS, CONTRADICTED, INCONCLUSIVE = "holds", "contradicted", "inconclusive"
ALTERNATIVES = ("two-sided", "greater", "less")
POWER = 0.8  # the power at which the minimum detectable difference is quoted


@dataclasses.dataclass(frozen=True)
class PairedDifference:
    """A paired t test of a - b over seeds.

    n, dropped      seeds used, seeds dropped for a NaN / infinite / None value on either side
    mean, sd, se    mean and sample standard deviation (ddof=1) of the per-seed differences; se = sd / sqrt(n)
    ci_low, ci_high the two-sided (1 - alpha) t interval of the mean difference, whatever the alternative
    t, p            the t statistic mean / se and its p-value under `alternative` (n - 1 degrees of freedom)
    alternative     'two-sided', 'greater' (a > b) or 'less' (a < b)
    alpha           the test's level (interval and minimum detectable difference)
    mdd             the minimum detectable difference at `alpha`, `alternative` and 80% power
    clipped_to      the range of a - b the t interval reached past and was clipped to, or None
    """
    n: int
    dropped: int
    mean: float
    sd: float
    se: float
    ci_low: float
    ci_high: float
    t: float
    p: float
    alternative: str
    alpha: float
    mdd: float
    clipped_to: tuple[float, float] | None = None

    @property
    def df(self) -> int:
        return self.n - 1

    @property
    def confidence(self) -> float:
        return 1.0 - self.alpha


def counts(value) -> bool:
    """Whether a seed's value counts under the NaN policy (module docstring): None, NaN and inf do not."""
    return value is not None and bool(np.isfinite(value))


def counted(values) -> list[float]:
    """The values of a sequence that count under the NaN policy (`counts`), in order, as floats."""
    return [float(v) for v in values if counts(v)]


def _check_alternative(alternative: str):
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative={alternative!r}; choose from {ALTERNATIVES}")


def _t_quantile(alpha: float, alternative: str, df: int) -> float:
    """The critical value of the t test: t_{1-alpha/2} two-sided, t_{1-alpha} one-sided."""
    return float(distributions.t.ppf(1 - alpha / 2 if alternative == "two-sided" else 1 - alpha, df))


def _power(noncentrality: float, critical: float, df: int, two_sided: bool) -> float:
    """P(the test rejects) when sqrt(n) * delta / sd = noncentrality > 0."""
    upper = distributions.nct.sf(critical, df, noncentrality)
    # P(T < -critical) as the mirrored upper tail: scipy's nct.cdf returns NaN that far out in the lower tail.
    return float(upper + distributions.nct.sf(critical, df, -noncentrality) if two_sided else upper)


def minimum_detectable_difference(sd: float, n: int, alpha: float = 0.05, alternative: str = "two-sided",
                                  power: float = POWER) -> float:
    """The smallest true mean difference a paired t test over n seeds with per-seed spread `sd` detects with
    probability `power` at level `alpha` (module docstring); 0.0 for sd = 0."""
    _check_alternative(alternative)
    if n < 2:
        raise ValueError(f"a paired t test needs 2 or more seeds, got {n}")
    if sd == 0:
        return 0.0
    df = n - 1
    critical = _t_quantile(alpha, alternative, df)
    closed_form = critical + float(distributions.t.ppf(power, df))
    noncentrality = optimize.brentq(
        lambda nc: _power(nc, critical, df, alternative == "two-sided") - power, 0.0, 4 * closed_form + 10, xtol=1e-10)
    return float(noncentrality * sd / np.sqrt(n))


def paired_difference(a: Sequence[float], b: Sequence[float], alternative: str = "two-sided",
                      alpha: float = 0.05, bounds: tuple[float, float] | None = None) -> PairedDifference:
    """The paired t test of a [n] - b [n], both aligned by seed (module docstring for the NaN policy, sd = 0 and
    `bounds`, the (low, high) range a - b can take). alternative: 'two-sided', 'greater' (a > b) or 'less' (a < b)."""
    _check_alternative(alternative)
    if not 0 < alpha < 1:
        raise ValueError(f"alpha={alpha} is not in (0, 1)")
    if bounds is not None and not bounds[0] < bounds[1]:
        raise ValueError(f"bounds={tuple(bounds)}: give (low, high) with low < high")
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)  # None becomes NaN
    if a.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"the two sides must be 1-D and aligned by seed: {a.shape} vs {b.shape} values")
    kept = np.isfinite(a) & np.isfinite(b)
    d = a[kept] - b[kept]
    n, dropped = len(d), int(np.sum(~kept))
    if n < 2:
        raise ValueError(f"a paired t test needs 2 or more seeds with both values finite, got {n} "
                         f"({dropped} dropped for NaN / inf / None)")
    mean, sd = float(np.mean(d)), float(np.std(d, ddof=1))
    if sd <= n * np.finfo(float).eps * float(np.max(np.abs(d))):  # differences equal to rounding
        sd = 0.0
    se, df = sd / np.sqrt(n), n - 1
    if se > 0:
        t = mean / se
    else:
        t = float(np.copysign(np.inf, mean)) if mean != 0 else 0.0
    if alternative == "two-sided":
        p = 2 * distributions.t.sf(abs(t), df)
    else:
        p = distributions.t.sf(t, df) if alternative == "greater" else distributions.t.cdf(t, df)
    half_width = float(distributions.t.ppf(1 - alpha / 2, df) * se)
    ci_low, ci_high, clipped_to = mean - half_width, mean + half_width, None
    if bounds is not None and (ci_low < bounds[0] or ci_high > bounds[1]):
        clipped_to = (float(bounds[0]), float(bounds[1]))
        ci_low, ci_high = max(ci_low, clipped_to[0]), min(ci_high, clipped_to[1])
    return PairedDifference(n=n, dropped=dropped, mean=mean, sd=sd, se=float(se), ci_low=ci_low, ci_high=ci_high,
                            t=float(t), p=float(min(p, 1.0)), alternative=alternative, alpha=alpha,
                            mdd=minimum_detectable_difference(sd, n, alpha, alternative), clipped_to=clipped_to)


def holm(p_values: Sequence[float], alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Holm-Bonferroni step-down over m tests: (adjusted p-values [m], reject flags [m]) in the input order.

    Sorted ascending, the k-th smallest p (k = 1..m) is adjusted to max_{j<=k} min(1, (m - j + 1) p_(j)), so the
    adjusted values are monotone in p and capped at 1; a test is rejected when its adjusted p <= alpha, which is
    Holm's "p_(j) <= alpha / (m - j + 1) for every j <= k". Controls the family-wise error rate at alpha."""
    p = np.asarray(p_values, dtype=float)
    if p.ndim != 1:
        raise ValueError(f"p_values must be 1-D, got shape {p.shape}")
    if not np.all((p >= 0) & (p <= 1)):  # also catches NaN
        raise ValueError(f"p-values must lie in [0, 1]: {p.tolist()}")
    m = len(p)
    order = np.argsort(p, kind="stable")
    stepped = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(stepped)
    return adjusted, adjusted <= alpha


def _fmt(x: float) -> str:
    return f"{x:+.3g}"


def clipped_note(clipped_to: Sequence[float] | None) -> str:
    """', clipped to the difference's range LOW to HIGH' after an interval that was clipped, else ''."""
    if clipped_to is None:
        return ""
    return f", clipped to the difference's range {_fmt(clipped_to[0])} to {_fmt(clipped_to[1])}"


def verdict(result: PairedDifference, adjusted_p: float, alpha: float = 0.05,
            expected_sign: int = 1) -> tuple[str, str]:
    """(verdict, one-line reason) for a claim that the mean difference is positive (expected_sign=+1) or
    negative (-1), given its Holm-adjusted p-value over the family of claims.

    holds: adjusted p <= alpha and the mean has the claimed sign; contradicted: adjusted p <= alpha and the opposite
    sign (only a two-sided test can say so); else inconclusive, with the minimum detectable difference. A one-sided
    result must test the claimed direction."""
    if expected_sign not in (1, -1):
        raise ValueError(f"expected_sign={expected_sign!r}; choose +1 (a > b) or -1 (a < b)")
    claimed = "greater" if expected_sign == 1 else "less"
    if result.alternative not in ("two-sided", claimed):
        raise ValueError(f"a one-sided '{result.alternative}' test cannot decide a claim that a is {claimed} than b")
    seeds = f"{result.n} seeds" + (f", {result.dropped} dropped for a missing value" if result.dropped else "")
    said = (f"mean difference {_fmt(result.mean)} ({result.confidence:.0%} CI {_fmt(result.ci_low)} to "
            f"{_fmt(result.ci_high)}{clipped_note(result.clipped_to)}, {seeds}), p = {result.p:.2g}, Holm-adjusted "
            f"{adjusted_p:.2g}")
    if result.sd == 0:
        said += ", the seeds' differences agree exactly"
    decided = adjusted_p <= alpha and result.mean != 0
    if decided and np.sign(result.mean) == expected_sign:
        return HOLDS, f"{said} <= {alpha:g}: {claimed}, as claimed"
    if decided and result.alternative == "two-sided":
        return CONTRADICTED, f"{said} <= {alpha:g}: {'less' if claimed == 'greater' else 'greater'}, against the claim"
    relation = "<=" if adjusted_p <= alpha else ">"  # "<=" only for a one-sided test the mean went against
    return INCONCLUSIVE, (f"{said} {relation} {alpha:g}: these {result.n} seeds could detect a difference of at least "
                          f"{result.mdd:.3g} ({POWER:.0%} power at α = {result.alpha:g} before Holm's correction)")
