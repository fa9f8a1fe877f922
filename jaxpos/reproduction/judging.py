"""How a claim is judged: its parts and the rules that combine them.

A claim is made of parts of two kinds:
  * a comparison (`comparison`): per-seed values of two sides paired by seed (runs with the same seed share data
    order and masking; a one-sided quantity such as a change over training is paired with 0), the direction the
    paper claims, and the mechanisms it is about. It is tested only when each of those mechanisms uses positions
    by the end of pretraining (`verdicts.training_status`: its held-out MLM loss below the bag-of-words model's,
    paired by seed, 95% interval excluding 0); otherwise it is "inconclusive: not trained far enough". Every
    tested comparison of the report gets a paired t test (`stats.paired_difference`, two-sided), their p-values
    are Holm-corrected together (`stats.holm`) and `stats.verdict` decides: holds or contradicted when the
    adjusted p <= alpha, else inconclusive with the difference these seeds could have detected;
  * a bound every run must satisfy (`bound`: the decomposition is exact, input positions keep the logit rank
    <= D), checked run by run with any number of seeds: all satisfy -> holds, none -> contradicted.
A claim holds when every part holds and is contradicted when any part is (`all_of`).
"""

from __future__ import annotations

import statistics
from typing import Callable, Mapping, Sequence

from jaxpos.evaluation.metrics import wilson_interval
from jaxpos.reproduction.stats import CONTRADICTED, HOLDS, INCONCLUSIVE, counted

VERDICTS = (HOLDS, CONTRADICTED, INCONCLUSIVE)
ALPHA = 0.05  # family-wise error rate of the report's comparisons (Holm), and the level of the training check
EXACT_TOLERANCE = 1e-4  # max |sum of the Muppet terms - hidden state| in float32 analyses
RECOVERABLE = 0.5  # "token identity is recoverable": the linear probe identifies most tokens
CALLED_PARAPHRASE = 0.5  # "the swap goes unnoticed": most swapped paraphrases are still called paraphrases
NOT_TRAINED = "not trained far enough"  # the reason of a comparison whose mechanisms do not use positions yet
NOT_LEARNED = "did not learn the task"  # the reason of a downstream comparison with a side at chance
SHARE_DIFFERENCE = (-1.0, 1.0)  # the range of a - b for a, b in [0, 1] (accuracies, rates, attention weights)
CORRELATION = (-1.0, 1.0)  # the range of a correlation


def comparison(what: str, a: Mapping[int, float | None], b: Mapping[int, float | None] | None, expected_sign: int,
               about: Sequence[str], task: str | None = None, bounds: tuple[float, float] | None = None) -> dict:
    """A comparison part: a - b > 0 (expected_sign = +1) or < 0 (-1), per seed; b = None compares a with 0. It is
    tested only when every mechanism of `about` uses positions ((): always) and, for scores on a downstream `task`
    (a result.json key), learned it in every seed (`learned_task`). `bounds`: the range a - b can take, for a
    bounded quantity (a share, a correlation), to which its reported interval is clipped."""
    seeds = sorted(set(a) | set(b or {}))
    return dict(kind="comparison", what=what, seeds=seeds, a=[a.get(s) for s in seeds],
                b=[(b or {}).get(s, None) if b is not None else 0.0 for s in seeds], expected_sign=expected_sign,
                about=list(about), task=task, bounds=None if bounds is None else list(bounds))


def learned_task(score: dict) -> bool | None:
    """Whether a run learned a downstream task: the Wilson interval of its best dev accuracy on its `dev_pairs`
    lies above chance, at the level (Šidák) at which the best of its `looks` dev evaluations of a model at chance
    passes 2.5% of the time; None where the result does not give the pair count."""
    if not score.get("dev_pairs") or score.get("best") is None:
        return None
    z = statistics.NormalDist().inv_cdf(0.975 ** (1 / score.get("looks", 1)))
    low, _ = wilson_interval(score["best"] * score["dev_pairs"], score["dev_pairs"], z)
    return low > score["chance"]


def bound(values: Sequence[float | None], check: Callable[[float], bool], what: str, rule: str) -> dict:
    """A bound part, decided here: every run satisfies `check` (`rule` says it in words, e.g. '<= D = 32'). Runs
    whose value is None, NaN or infinite did not measure it and are left out (the NaN policy, `stats.counts`)."""
    xs = counted(values)
    part = dict(kind="bound", what=f"{what} {rule}")
    if not xs:
        return dict(part, verdict=INCONCLUSIVE, reason=f"not measured: no run gives {what}")
    ok = [bool(check(v)) for v in xs]
    shown = ", ".join(f"{v:.3g}" for v in xs[:12]) + (" ..." if len(xs) > 12 else "")
    if all(ok):
        return dict(part, verdict=HOLDS, reason=f"{what} {rule} in all {len(xs)} runs ({shown})")
    if not any(ok):
        return dict(part, verdict=CONTRADICTED, reason=f"{what} is not {rule} in any of the {len(xs)} runs ({shown})")
    return dict(part, verdict=INCONCLUSIVE, reason=f"{what} is {rule} in {sum(ok)} of {len(xs)} runs ({shown})")


def all_of(parts: Sequence[dict]) -> tuple[str, str]:
    """A claim of several parts: contradicted if any part is, holds if all do, else inconclusive."""
    values = [p["verdict"] for p in parts]
    if CONTRADICTED in values:
        return CONTRADICTED, "a part is contradicted"
    if values and all(v == HOLDS for v in values):
        return HOLDS, "every part holds"
    if any(p.get("why") == NOT_TRAINED for p in parts):
        return INCONCLUSIVE, f"{NOT_TRAINED} for a part"
    if any(p.get("why") == NOT_LEARNED for p in parts):
        return INCONCLUSIVE, f"a side {NOT_LEARNED} for a part"
    return INCONCLUSIVE, "not every part is decided"
