"""The verdicts of the papers' claims on a table of runs: which mechanisms use positions by the end of pretraining
(`training_status`, against the bag-of-words model's held-out loss, paired by seed), then each claim's parts
tested, every comparison's p-value Holm-corrected with the rest of the report (`evaluate_claims`). The claims
themselves, their parts and the papers' figures: jaxpos/reproduction/claims.py; the tests: stats.py."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jaxpos.reproduction import stats
from jaxpos.reproduction.claims import CLAIMS, Claim
from jaxpos.reproduction.judging import ALPHA, NOT_LEARNED, NOT_TRAINED, all_of, learned_task
from jaxpos.reproduction.readings import label
from jaxpos.reproduction.matrix import BAG_OF_WORDS
from jaxpos.reproduction.stats import INCONCLUSIVE


# --- is a mechanism trained? ---------------------------------------------------------------------------------------

def training_status(table: dict, alpha: float = ALPHA) -> dict[str, dict]:
    """For each mechanism but the bag-of-words model: does its held-out MLM loss lie below the bag-of-words
    model's (paired by seed, two-sided (1 - alpha) interval of none − mechanism above 0), at each curve step?
    {mechanism: {"trained": bool | None (None: cannot tell), "parted_at": first step from which it stays below,
    or None, "last_step", "difference" (the test at the last step, or None), "reason"}}."""
    base = {r["seed"]: {p["step"]: p["loss"] for p in r.get("curve", [])} for r in table.get(BAG_OF_WORDS, [])}
    status = {}
    for m, results in table.items():
        if m == BAG_OF_WORDS:
            continue
        curves = {r["seed"]: {p["step"]: p["loss"] for p in r.get("curve", [])} for r in results}
        steps = sorted({s for c in curves.values() for s in c})
        seeds = sorted(set(curves) & set(base))
        if not base or len(seeds) < 2 or not steps:
            why = ("cannot be compared: no bag-of-words runs" if not base else
                   f"cannot be compared with bag of words: {len(seeds)} seed(s) with both curves, a paired test "
                   "needs 2")
            status[m] = dict(trained=None, parted_at=None, last_step=steps[-1] if steps else None, difference=None,
                             below=[], reason=why)
            continue
        below, tests = [], {}
        for step in steps:
            a = [base[s].get(step) for s in seeds]
            b = [curves[s].get(step) for s in seeds]
            try:
                tests[step] = stats.paired_difference(a, b, alpha=alpha)
            except ValueError:
                tests[step] = None
            below.append(tests[step] is not None and tests[step].ci_low > 0)
        parted_at = None
        for k in range(len(steps) - 1, -1, -1):  # the start of the final run of steps where it stays below
            if not below[k]:
                break
            parted_at = steps[k]
        last = tests[steps[-1]]
        said = "" if last is None else (f" (bag of words' held-out loss minus its: {last.mean:+.3g}, 95% CI "
                                        f"{last.ci_low:+.3g} to {last.ci_high:+.3g})")
        if below[-1]:
            reason = f"parts from bag of words at step {parted_at}{said}"
        else:
            reason = f"has not parted from bag of words by step {steps[-1]}{said}"
        status[m] = dict(trained=bool(below[-1]), parted_at=parted_at, last_step=steps[-1],
                         difference=None if last is None else _test_dict(last), below=below, reason=reason)
    return status


def _test_dict(result: stats.PairedDifference) -> dict:
    return dict(n=result.n, dropped=result.dropped, mean=result.mean, sd=result.sd, ci_low=result.ci_low,
                ci_high=result.ci_high, t=result.t, p=result.p, mdd=result.mdd,
                clipped_to=None if result.clipped_to is None else list(result.clipped_to))


# --- verdicts ----------------------------------------------------------------------------------------------------

def _not_trained_reason(about: Sequence[str], training: dict) -> str | None:
    """Why a comparison about `about` cannot be tested yet, or None when every mechanism uses positions."""
    late = [m for m in about if not (training.get(m) or {}).get("trained")]
    if not late:
        return None
    said = [f"{label(m)} has no runs here" if m not in training else f"{label(m)} {training[m]['reason']}"
            for m in late]
    return f"{NOT_TRAINED}: " + "; ".join(said)


def _not_learned_reason(part: dict, table: dict) -> str | None:
    """Why a comparison of scores on a downstream task cannot be tested: a side at chance in some seed (it would
    be decided by a model that never learned the task), or None."""
    if not part.get("task"):
        return None
    said = []
    for m in part["about"]:
        missed = [r["seed"] for r in table.get(m, []) if r.get(part["task"]) and learned_task(r[part["task"]]) is False]
        if missed:
            said.append(f"{label(m)} in seed{'s' * (len(missed) > 1)} {', '.join(map(str, missed))}")
    if not said:
        return None
    return f"{NOT_LEARNED}: " + "; ".join(said) + " (best dev accuracy inside chance's interval for its looks)"


def _direction(mean: float | None, expected_sign: int) -> str | None:
    if mean is None or mean == 0:
        return None
    return "agrees" if np.sign(mean) == expected_sign else "disagrees"


def evaluate_claims(table: dict, claims: Sequence[Claim] | None = None, alpha: float = ALPHA) -> dict:
    """Every claim's record (id, paper, reference, claim, figure, parts, measured, verdict, reason, caveat), the
    training status of each mechanism, and `comparisons`: the tested comparisons with their Holm-adjusted
    p-values. Deterministic in `table`."""
    claims = CLAIMS if claims is None else claims
    training = training_status(table, alpha)
    trained = {m: info["parted_at"] for m, info in training.items() if info["trained"]}
    records = []
    tested = []  # (record index, part index, PairedDifference)
    for claim in claims:
        parts, measured = claim.judge(table, trained)
        for index, part in enumerate(parts):
            if part["kind"] != "comparison":
                continue
            pairs = [(a, b) for a, b in zip(part["a"], part["b"]) if stats.counts(a) and stats.counts(b)]
            part["measured_mean"] = float(np.mean([a - b for a, b in pairs])) if pairs else None
            part["direction"] = _direction(part["measured_mean"], part["expected_sign"])
            late = _not_trained_reason(part["about"], training)
            if not pairs:
                part.update(verdict=INCONCLUSIVE, why="not measured",
                            reason="not measured: no seed gives a value"
                                   + (f" ({', '.join(map(label, part['about']))})" if part["about"] else ""))
            elif len(pairs) < 2:  # before the training status, which one seed cannot test either
                part.update(verdict=INCONCLUSIVE, why="one seed",
                            reason=f"one seed ({part['measured_mean']:+.3g}) gives no spread to judge it by")
            elif late:
                part.update(verdict=INCONCLUSIVE, why=NOT_TRAINED, reason=late)
            elif unlearned := _not_learned_reason(part, table):
                part.update(verdict=INCONCLUSIVE, why=NOT_LEARNED, reason=unlearned)
            else:
                tested.append((len(records), index, stats.paired_difference(part["a"], part["b"], alpha=alpha,
                                                                             bounds=part.get("bounds"))))
        records.append(dict(id=claim.id, paper=claim.paper, reference=claim.reference, claim=claim.statement,
                            figure=dataclasses.asdict(claim.figure), parts=parts, measured=measured,
                            caveat=claim.caveat))
    adjusted, _ = stats.holm([t.p for _, _, t in tested], alpha)
    comparisons = []
    for (r, k, result), p_holm in zip(tested, adjusted):
        part = records[r]["parts"][k]
        value, reason = stats.verdict(result, float(p_holm), alpha, part["expected_sign"])
        why = "decided" if value != INCONCLUSIVE else "not detected"
        part.update(verdict=value, why=why, reason=reason, test=dict(_test_dict(result), p_holm=float(p_holm)))
        comparisons.append(dict(claim=records[r]["id"], part=part["what"], verdict=value, **part["test"]))
    for record in records:
        record["verdict"], record["reason"] = all_of(record["parts"])
    return dict(claims=records, training=training, comparisons=comparisons, alpha=alpha, family=len(tested))
