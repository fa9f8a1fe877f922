"""`jaxpos reproduce`: the verdict rules on constructed numbers, the budget split, and the micro profile end to end
(report structure, every number in numbers.json, verdicts recomputable from the runs)."""

import json
import os
import platform
import subprocess
import sys
import time

import numpy as np
import pytest

from jaxpos.reproduction import claims as C
from jaxpos.reproduction.runs import PROFILES, calibration_estimate, finetune_steps_for, steps_for_budget


# --- verdict rules -------------------------------------------------------------------------------------------------

def test_compare_needs_separated_spreads():
    assert C.compare([0.50, 0.52, 0.54], [0.40, 0.41, 0.42], "greater", "a", "b")["verdict"] == C.HOLDS
    assert C.compare([0.50, 0.52, 0.54], [0.40, 0.41, 0.42], "less", "a", "b")["verdict"] == C.CONTRADICTED
    overlapping = C.compare([0.50, 0.56, 0.44], [0.47, 0.49, 0.51], "greater", "a", "b")  # mean 0.50 > 0.49
    assert overlapping["verdict"] == C.INCONCLUSIVE and "within the seeds' spread" in overlapping["reason"]
    # A large difference with one seed is still no evidence: there is no spread to judge it by.
    single = C.compare([0.9], [0.1], "greater", "a", "b")
    assert single["verdict"] == C.INCONCLUSIVE and "one seed" in single["reason"]
    assert C.compare([0.9, 0.8], [], "greater", "a", "b")["reason"].startswith("not measured: b")
    # Intervals that just touch count as overlapping (never rounded into a verdict).
    assert C.compare([1.0, 3.0], [-1.0, 1.0], "greater", "a", "b")["verdict"] == C.INCONCLUSIVE


def test_sign_and_bound_and_all_of():
    assert C.sign([0.1, 0.12, 0.09], "positive", "d")["verdict"] == C.HOLDS
    assert C.sign([0.1, 0.12, 0.09], "negative", "d")["verdict"] == C.CONTRADICTED
    assert C.sign([0.1, -0.05, 0.02], "positive", "d")["verdict"] == C.INCONCLUSIVE  # 0 inside mean ± std
    assert C.sign([5.0], "positive", "d")["verdict"] == C.INCONCLUSIVE
    assert C.sign([None, float("nan")], "positive", "d")["reason"].startswith("not measured")
    s = C.stats([1.0, 2.0, 3.0])
    assert s["mean"] == 2.0 and s["std"] == pytest.approx(1.0) and s["n"] == 3  # sample std (ddof = 1)
    le = lambda x: x <= 0  # noqa: E731
    assert C.bound([-3, 0], le, "x", "<= 0") == dict(verdict=C.HOLDS, kind="bound",
                                                      reason="x <= 0 in all 2 runs (-3, 0)")
    assert C.bound([2], le, "x", "<= 0")["verdict"] == C.CONTRADICTED  # a bound is decided run by run
    assert C.bound([2, -1], le, "x", "<= 0")["verdict"] == C.INCONCLUSIVE
    h, c, i = (dict(verdict=v) for v in (C.HOLDS, C.CONTRADICTED, C.INCONCLUSIVE))
    assert C.all_of([h, h])["verdict"] == C.HOLDS
    assert C.all_of([h, i])["verdict"] == C.INCONCLUSIVE
    assert C.all_of([h, i, c])["verdict"] == C.CONTRADICTED


def fake_run(mechanism, seed, accuracy=0.4, **extra):
    run = dict(name=f"{mechanism}_s{seed}", mechanism=mechanism, seed=seed, head_dim=8,
               finetune=dict(best=accuracy), pretrain=dict(step_time_s=0.1, eval_loss=5.0),
               params=dict(positional=100), over_training=dict(steps=[1, 2], series={}), final={})
    run.update(extra)
    return run


def test_claims_on_constructed_tables():
    table = {m: [fake_run(m, s, acc + 0.01 * s) for s in range(3)]
             for m, acc in (("diet_abs", 0.60), ("diet_abs_unshared", 0.40), ("diet_rel", 0.50),
                            ("diet_rel_layer", 0.49))}
    claim = C.diet_sharing(table)
    assert [p["verdict"] for p in claim["parts"]] == [C.HOLDS, C.INCONCLUSIVE]  # 0.49 vs 0.50 ± 0.01: overlap
    assert claim["verdict"] == C.INCONCLUSIVE
    assert claim["measured"]["accuracy"]["diet_abs"]["mean"] == pytest.approx(0.61)
    table["diet_rel_layer"] = [fake_run("diet_rel_layer", s, 0.70 + 0.01 * s) for s in range(3)]
    assert C.diet_sharing(table)["verdict"] == C.CONTRADICTED  # sharing helped DIET-Rel beyond the spread

    # TISA Fig. 1-2 on the change of R^2 between the first and the last checkpoint, seed by seed.
    rising = {"absolute": [fake_run("absolute", s, over_training=dict(
        steps=[1, 2], series=dict(toeplitz_r2=[0.3, 0.5 + 0.01 * s]))) for s in range(3)]}
    assert C.tisa_toeplitz(rising)["verdict"] == C.HOLDS
    assert C.tisa_toeplitz({"absolute": rising["absolute"][:1]})["verdict"] == C.INCONCLUSIVE  # one seed
    assert C.tisa_toeplitz({})["parts"][0]["reason"].startswith("not measured")

    # DIET Fig. 2 is a bound, decided with one seed: input positions <= D, per-head biases above it.
    ranks = {m: [fake_run(m, 0, final=dict(rank=dict(logit_rank_max=r, length=16)))]
             for m, r in (("absolute", 8), ("diet_rel", 15), ("diet_abs", 12))}
    assert C.diet_rank(ranks)["verdict"] == C.HOLDS
    ranks["absolute"][0]["final"]["rank"]["logit_rank_max"] = 9
    assert C.diet_rank(ranks)["verdict"] == C.CONTRADICTED

    every = C.evaluate_claims(table)
    assert {c["paper"] for c in every} == set(C.PAPERS)
    assert all(c["verdict"] in C.VERDICTS for c in every)


def test_rank_correlation_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for _ in range(5):
        x, y = rng.normal(size=7), rng.integers(0, 3, size=7).astype(float)  # ties on one side
        assert C.rank_correlation(x, y) == pytest.approx(scipy_stats.spearmanr(x, y).statistic)
    assert C.rank_correlation([1, 2], [2, 1]) is None
    assert C.rank_correlation([1, 2, 3], [5, 5, 5]) is None


# --- the budget ----------------------------------------------------------------------------------------------------

def test_steps_fit_the_budget():
    profile = PROFILES["tiny"]
    steps, finetune, note = steps_for_budget(1800, runs=51, workers=2, fixed_s=30, step_s=0.15,
                                             finetune_step_s=0.2, profile=profile)
    rounds = 26
    assert steps % profile.checkpoints == 0 and finetune == finetune_steps_for(steps, profile)
    assert rounds * (30 + 0.15 * steps + 0.2 * finetune) <= 1800
    assert rounds * (30 + 0.15 * (steps + 4) + 0.2 * finetune_steps_for(steps + 4, profile)) > 1800  # the most
    assert "26 rounds of 2 parallel runs" in note
    # Later seeds of a mechanism find their programs compiled: cheaper runs leave more steps.
    warm, _, note = steps_for_budget(1800, runs=51, workers=2, fixed_s=30, step_s=0.15, finetune_step_s=0.2,
                                     profile=profile, cold_runs=17, warm_fixed_s=15)
    assert warm > steps and "(15 s once compiled)" in note
    assert (17 * 30 + 34 * 15) / 2 + rounds * (0.15 * warm + 0.2 * finetune_steps_for(warm, profile)) <= 1800
    floor, _, note = steps_for_budget(100, runs=17, workers=2, fixed_s=60, step_s=0.15, finetune_step_s=0.2,
                                      profile=profile)
    assert floor == profile.min_steps and note.startswith("OVER BUDGET")
    with pytest.raises(ValueError, match="at least one run and one worker"):
        steps_for_budget(100, runs=3, workers=0, fixed_s=1, step_s=1, finetune_step_s=1, profile=profile)
    timing = lambda wall, step: dict(timing=dict(wall_s=wall, pretrain_steps=32, pretrain_step_s=step,  # noqa
                                                 finetune_steps=16, finetune_step_s=0.5))
    assert calibration_estimate([timing(50, 0.25), timing(40, 0.5)]) == (50 - 8 - 8, 0.5, 0.5, 0.0)
    started = timing(50, 0.25)
    started["timing"]["worker_startup_s"] = 9.0
    assert calibration_estimate([started, timing(40, 0.5)])[3] == 9.0
    # A worker's start-up is paid once, not per run.
    with_startup, _, _ = steps_for_budget(1800, runs=51, workers=2, fixed_s=30, step_s=0.15, finetune_step_s=0.2,
                                          profile=profile, startup_s=40)
    assert with_startup < steps
    assert 40 + 51 * 30 / 2 + rounds * (0.15 * with_startup + 0.2 * finetune_steps_for(with_startup, profile)) <= 1800


# --- end to end ----------------------------------------------------------------------------------------------------

@pytest.mark.long
def test_micro_profile_end_to_end(tmp_path, capsys):
    from jaxpos.cli import main

    out = tmp_path / "repro"
    assert main(["reproduce", "--out", str(out), "--profile", "micro", "--seeds", "1", "--workers", "2",
                 "--budget-minutes", "5"]) == 0
    report = (out / "REPRODUCTION.md").read_text()
    numbers = json.loads((out / "numbers.json").read_text())
    for heading in ["## Summary", "## Mechanisms"] + [f"## {paper}" for paper in C.PAPERS]:
        assert heading in report, heading
    assert "tiny models" in report and "not a replacement for the papers' runs" in report
    assert set(numbers["mechanisms"]) == {"absolute", "diet_rel"} and numbers["missing"] == []
    for path in numbers["figures"].values():
        assert os.path.getsize(out / path) > 1000 and f"]({path})" in report

    runs = numbers["runs"]
    assert set(runs) == {"absolute_s0", "diet_rel_s0"}
    assert runs["absolute_s0"]["params"]["positional"] == 16 * 32  # a learned row per position
    assert runs["diet_rel_s0"]["params"]["positional"] == 2 * 4 * 31  # a scalar per layer, head and offset
    for run in runs.values():
        assert run["steps"] == 4 and run["tokens"] == 4 * 8 * 16 and run["over_training"]["steps"] == [2, 4]
        assert 0 <= run["finetune"]["best"] <= 1 and run["timing"]["pretrain_step_s"] > 0
        assert set(run["probe"]["variants"]) == {"local_2", "local_3", "local_4", "local_5", "global"}
        assert run["final"]["decomposition"]["max_reconstruction_error"] < 1e-4
        analysis = out / "runs" / run["name"] / "analysis"  # numbers only: the report draws the figures
        assert (analysis / "over_training.json").is_file() and not list(analysis.rglob("*.png"))
        assert (out / "runs" / run["name"] / "run.log").stat().st_size > 0
    # Two workers shared the runs; each recorded its start-up with its first run.
    assert len(list((out / "workers").glob("*.log"))) == 2
    assert all(run["timing"]["worker_startup_s"] > 0 for run in runs.values())

    claims = numbers["claims"]
    assert len(claims) == len(C.CLAIMS) and all(c["verdict"] in C.VERDICTS for c in claims)
    for claim in claims:
        assert f"### {claim['claim']}" in report
        for part in claim["parts"]:  # one seed: every comparison is inconclusive, only bounds are decided
            assert part["kind"] == "bound" or part["verdict"] == C.INCONCLUSIVE, (claim["id"], part)
    by_id = {c["id"]: c for c in claims}
    assert by_id["muppet_exact"]["verdict"] == C.HOLDS
    assert by_id["diet_rank"]["parts"][0]["verdict"] == C.HOLDS  # input positions keep the rank <= D = 8
    # The verdicts are a function of the runs' numbers alone.
    table = {m: [runs[f"{m}_s0"]] for m in ("absolute", "diet_rel")}
    assert json.loads(json.dumps(C.evaluate_claims(table))) == claims

    # A second call resumes the plan (here: nothing left to run); other settings in the same folder are refused.
    capsys.readouterr()
    assert main(["reproduce", "--out", str(out), "--profile", "micro", "--seeds", "1", "--plan-only"]) == 0
    assert "resuming the plan" in capsys.readouterr().out
    assert (out / "runs.txt").read_text().split() == ["absolute_s0", "diet_rel_s0"]
    assert main(["reproduce", "--out", str(out), "--profile", "micro", "--seeds", "2"]) == 2
    assert "seeds differs from the plan" in capsys.readouterr().err


def test_dry_runs(tmp_path):
    from jaxpos.cli import main

    out = tmp_path / "nothing"
    assert main(["reproduce", "--out", str(out), "--seeds", "2", "--workers", "2", "--dry-run"]) == 0
    assert not out.exists()
    assert main(["reproduce", "--out", str(out), "--mechanisms", "absolute,rotary", "--dry-run"]) == 2
    script = os.path.join(os.path.dirname(__file__), "..", "launch", "reproduce.sh")
    jaxpos = os.path.join(os.path.dirname(sys.executable), "jaxpos")
    if not os.path.exists(jaxpos):
        pytest.skip("no jaxpos entry point beside the interpreter")
    printed = subprocess.run(["bash", script, str(out), "10", "2", "--mechanisms", "tisa,diet_rel"],
                             env=dict(os.environ, DRY_RUN="1", JAXPOS=jaxpos, WORKERS="2"), check=True,
                             capture_output=True, text=True).stdout
    assert printed.count("--run tisa_s0,diet_rel_s0,tisa_s1,diet_rel_s1") == 2 and "--report-only" in printed
    assert not out.exists()


# --- workers -------------------------------------------------------------------------------------------------------

def test_claims_are_exclusive_and_stale_ones_are_taken_over(tmp_path):
    from jaxpos.reproduction import runs

    out = str(tmp_path)
    assert runs.claim(out, "a_s0")
    claim_file = tmp_path / "runs" / "a_s0" / runs.CLAIM_FILE
    assert claim_file.read_text() == f"{platform.node()} {os.getpid()}"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:  # a live process's claim is respected
        claim_file.write_text(f"{platform.node()} {sleeper.pid}")
        assert not runs.claim(out, "a_s0")
    finally:
        sleeper.kill()
        sleeper.wait()
    runs.mark_failed(out, "a_s0", "ValueError: boom\nmore")
    assert runs.failure(out, "a_s0") == "ValueError: boom\nmore"
    assert runs.claim(out, "a_s0")  # its process has died: stale, taken over; the failure mark is cleared
    assert runs.failure(out, "a_s0") is None
    claim_file.write_text(f"another-host {sleeper.pid}")  # other hosts' claims are theirs to judge
    assert not runs.claim(out, "a_s0")


def test_worker_runs_what_it_claims_and_goes_on_after_a_failure(tmp_path, monkeypatch):
    from jaxpos.reproduction import pipeline, runs

    out = str(tmp_path)
    plan = runs.make_plan(PROFILES["micro"], seeds=1, budget_minutes=5, workers=1,
                          mechanisms=["absolute", "diet_rel", "tisa"])
    runs.save_plan(out, plan)
    executed = []

    def fake_run(out_dir, name, startup_s=None):
        executed.append((name, startup_s))
        print(f"training {name}")
        if name == "absolute_s0":
            raise ValueError("a broken run\nwith details")
        with open(os.path.join(runs.run_dir(out_dir, name), runs.RESULT_FILE), "w") as f:
            json.dump(dict(name=name), f)

    monkeypatch.setattr(pipeline, "execute_run", fake_run)
    monkeypatch.setenv(runs.STARTED_ENV, repr(time.time() - 5))
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))  # restored after: the worker adds the profile's
    assert runs.claim(out, "tisa_s0")  # held by this (live) process's other worker
    (tmp_path / "runs" / "tisa_s0" / runs.CLAIM_FILE).write_text(f"{platform.node()} {os.getppid()}")
    assert pipeline.execute_runs(out, ["absolute_s0", "diet_rel_s0", "tisa_s0"]) == 1
    assert [n for n, _ in executed] == ["absolute_s0", "diet_rel_s0"]
    assert executed[0][1] >= 5 and executed[1][1] >= 5  # the failed run did not use up the start-up record
    assert runs.failure(out, "absolute_s0") == "ValueError: a broken run"
    log = (tmp_path / "runs" / "absolute_s0" / runs.LOG_FILE).read_text()
    assert "training absolute_s0" in log and "Traceback" in log
    with pytest.raises(ValueError, match="nope_s0: not runs of"):
        pipeline.execute_runs(out, ["nope_s0"])
