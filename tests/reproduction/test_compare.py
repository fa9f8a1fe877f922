"""`jaxpos compare`: variants parsed from their names, the report's statistics against numbers worked out by hand
(scipy's t distribution, a hand-written Holm), and the command end to end at a tiny size: labels from mechanisms,
never folders, and a killed command resumed without training its finished runs again."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from scipy import stats as scipy_stats

from jaxpos import cli
from jaxpos.reproduction import compare as comp
from tests.helpers import SMALL_MLM, TINY_MLM_CONFIG

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_variant_is_a_mechanism_with_options():
    name, variant, rule = comp.parse_variant("rope+partial0.25", (1, 4), 128, 256)
    assert (name, rule) == ("rope+partial0.25", None)
    assert variant["overrides"] == ["--config.model.position.kind=rope", "--config.model.position.rope.fraction=0.25"]
    assert variant["label"] == "RoPE, partial 0.25"
    name, variant, rule = comp.parse_variant("rope+yarn@eval", (1, 2, 8), 128, 256)
    assert name == "rope" and variant["overrides"] == ["--config.model.position.kind=rope"]  # trained as plain RoPE
    assert variant["eval"] == {"rope+yarn@eval": ["--config.model.position.rope.scaling=yarn",
                                                  "--config.model.position.rope.factor=8.0",
                                                  "--config.model.position.rope.original_max_length=128"]}
    assert rule == "RoPE, YaRN ×8 at evaluation"
    name, variant, _ = comp.parse_variant("absolute+random", (1, 8), 128, 256)
    assert name == "absolute+random" and variant["overrides"][-1] == "--config.model.position.randomized_max_length=1024"
    assert comp.parse_variant("alibi+local64", (1,), 128, 256)[1]["overrides"][-1] == "--config.model.local_window=64"
    name, variant, _ = comp.parse_variant("diet_rel+clip16", (1,), 128, 256)
    assert variant["overrides"][-1] == "--config.model.position.diet_rel.max_distance=16"
    assert variant["label"].endswith("clipped at ±16")
    assert comp.parse_variant("rope+nope4", (1,), 128, 256)[1]["overrides"][-1] == "--config.model.nope_every=4"
    for bad, message in (("ropee", "unknown mechanism"), ("rope+yarm", "unknown option"),
                         ("rope@train", "only '@eval'"), ("alibi@eval", "give one"),
                         ("alibi+local", "give the window"), ("diet_rel+clip", "give the clip")):
        with pytest.raises(ValueError, match=message):
            comp.parse_variant(bad, (1, 2), 128, 256)


@pytest.mark.parametrize("mechanisms, overrides, message", [
    ("rope+random+local32", ["--config.model.num_layers=2"], r"variant 'rope\+random\+local32': model\.local_window counts keys by their distance"),
    ("diet_abs+yarn", [], r"variant 'diet_abs\+yarn': model\.position\.rope: options of 'rope', but "
                          r"model\.position\.kind is 'diet_abs'"),
    ("alibi+clip16", [], r"model\.position\.diet_rel: options of 'diet_rel', but model\.position\.kind is 'alibi'"),
    ("alibi+yarn@eval", [], r"variant 'alibi': alibi\+yarn@eval: a 'alibi' run, whose options all change its "
                            r"parameters"),
    ("cope", ["--config.model.attention_impl=jax", "--config.model.attention_dropout=0.0"],
     r"variant 'cope': attention_impl='jax' cannot compute this model's attention here: it lacks CoPE's contextual"),
], ids=["random_with_a_window", "options_of_another_kind", "clip_of_another_kind", "rule_of_another_kind",
        "a_path_that_cannot_run_it"])
def test_the_plan_refuses_in_one_line_what_a_run_would_refuse(mechanisms, overrides, message, capsys):
    """--dry-run and --plan-only check every variant through its run config: nothing fails minutes later."""
    for mode in ("--dry-run", "--plan-only"):
        assert cli.main(["compare", "--config", TINY_MLM_CONFIG, "--mechanisms", mechanisms, "--lengths", "1,2",
                         "--out", "unused", mode, *SMALL_MLM, *overrides]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and re.search(message, err), err


def test_intervals_and_paired_comparisons_against_numbers_worked_by_hand():
    values = [3.1, 2.9, 3.4, 3.0]
    got = comp.mean_interval(values)
    half = scipy_stats.t.ppf(0.975, 3) * np.std(values, ddof=1) / 2
    assert got["mean"] == pytest.approx(3.1) and got["high"] - got["mean"] == pytest.approx(half)
    clipped = comp.mean_interval([0.02, 0.10, 0.0], bounds=(0.0, 1.0))
    assert clipped["low"] == 0.0 and clipped["clipped"]
    # three variants against a baseline on one quantity each: the p-values as scipy gives them, Holm by hand
    base = {0: 5.0, 1: 5.2, 2: 4.9}
    sides = {"a": {0: 4.5, 1: 4.8, 2: 4.4}, "b": {0: 5.01, 1: 5.19, 2: 4.93}, "c": {0: 5.5, 1: 5.6, 2: 5.45}}
    rows = {name: dict(loss=loss, accuracy={}, lengths={}, train_length=128, finetune={}, order={})
            for name, loss in dict(none=base, **sides).items()}
    found = comp.comparisons(rows, "none", all_pairs=False)
    assert [(c["a"], c["quantity"]) for c in found] == [("a", "held-out loss"), ("b", "held-out loss"),
                                                          ("c", "held-out loss")]
    p = [scipy_stats.ttest_rel([sides[k][s] for s in range(3)], [base[s] for s in range(3)]).pvalue for k in "abc"]
    order = np.argsort(p)
    holm = np.empty(3)
    running = 0.0
    for rank, index in enumerate(order):  # the k-th smallest times (m - k), never below the one before
        running = max(running, min(1.0, (3 - rank) * p[index]))
        holm[index] = running
    assert [c["test"].p for c in found] == pytest.approx(p, rel=1e-9)
    assert [c["adjusted_p"] for c in found] == pytest.approx(holm, rel=1e-9)
    assert [c["decided"] for c in found] == [h <= 0.05 for h in holm]
    assert "could detect" in comp.comparison_text(found[1])  # b is within the noise: the detectable difference
    assert comp.comparison_text(found[0]).endswith(": lower")
    # p = 0.005 alone but not after a correction over more comparisons: no uncorrected detectable difference
    assert comp.comparison_text(dict(found[0], decided=False)).endswith(
        "not resolved after Holm's correction (alone it would read lower)")
    # a variant past its training length against itself at it: the same seeds' losses, paired
    at_128, at_512 = [4.0, 4.2, 4.1], [4.6, 4.5, 4.9]
    rows = {"none": dict(rows["none"]), "a": dict(rows["a"], lengths={
        128: {s: {"loss": v} for s, v in enumerate(at_128)}, 512: {s: {"loss": v} for s, v in enumerate(at_512)}})}
    itself = [c for c in comp.comparisons(rows, "none", all_pairs=False) if c["b"] == "a"]
    assert [(c["a"], c["quantity"]) for c in itself] == [("a", "loss at 512 − at 128 tokens")]
    assert itself[0]["test"].p == pytest.approx(scipy_stats.ttest_rel(at_512, at_128).pvalue, rel=1e-9)
    assert itself[0]["test"].mean == pytest.approx(np.mean(at_512) - np.mean(at_128))


def test_repeated_mechanisms_flags_join(tmp_path, capsys):
    argv = small(str(tmp_path / "cmp"))
    at = argv.index("--mechanisms")
    argv[at:at + 2] = ["--mechanisms", "alibi", "--mechanisms", "rope+yarn@eval,t5"]
    assert cli.main([*argv, "--dry-run"]) == 0
    planned = [line.split()[0] for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    assert sorted(planned) == ["alibi", "none", "rope", "t5"]  # with the baseline; the rule's runs are plain RoPE's


def small(out: str) -> list[str]:
    return ["compare", "--config", TINY_MLM_CONFIG, "--mechanisms", "alibi,rope+yarn@eval", "--seeds", "2",
            "--lengths", "1,2", "--workers", "1", "--out", out, *SMALL_MLM, "--config.train.num_steps=4"]


def test_the_command_end_to_end_resumes_after_a_kill(tmp_path):
    out = tmp_path / "cmp"
    env = dict(os.environ, JAXPOS_COMPILATION_CACHE=str(tmp_path / "cache"))
    proc = subprocess.Popen([sys.executable, "-m", "jaxpos.cli", *small(str(out))], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    first = out / "runs" / "none_s0" / "result.json"
    deadline = time.time() + 400
    while time.time() < deadline and proc.poll() is None and not first.exists():
        time.sleep(0.2)
    assert proc.poll() is None, "the command ended before it could be killed:\n" + proc.stdout.read()
    os.killpg(proc.pid, signal.SIGTERM)  # as a scheduler stops a job: the command's whole process group
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    said = [line for line in err.splitlines() if line.startswith("jaxpos:")]
    assert said == ["jaxpos: stopped by SIGTERM; what was saved before is kept; run the same command again to "
                    "resume"], err
    kept = first.stat().st_mtime
    assert cli.main(small(str(out))) == 0  # the same command resumes
    assert first.stat().st_mtime == kept  # a finished run is not made again
    numbers = json.loads((out / "comparison.json").read_text())
    assert {r["label"] for r in numbers["rows"].values()} == {"none (bag of words)", "ALiBi", "RoPE",
                                                              "RoPE, YaRN ×2 at evaluation"}
    rope = numbers["rows"]["rope+yarn@eval"]
    assert set(rope["lengths"]) == {"32", "64"} and rope["loss"]["n"] == 0  # a rule at evaluation: lengths only
    assert numbers["rows"]["alibi"]["loss"]["n"] == 2 and numbers["rows"]["alibi"]["lengths"]["64"]["n"] == 2
    for name in ("alibi", "rope"):  # when each parts from bag of words, tested on its curve by seed
        assert re.match(r"(parts from bag of words at step \d+|has not parted from bag of words by step \d+) \(bag "
                        r"of words' held-out loss minus its: [-+]", numbers["rows"][name]["parting"])
    against = [c for c in numbers["comparisons"] if c["b"] != c["a"]]
    assert all(c["b"] == "none" for c in against) and len(against) == 4 + 4 + 2  # alibi, rope: 4; the rule: 2 lengths
    itself = {(c["a"], c["quantity"]) for c in numbers["comparisons"] if c["b"] == c["a"]}
    assert itself == {(name, "loss at 64 − at 32 tokens") for name in ("none", "alibi", "rope", "rope+yarn@eval")}
    report = (out / "COMPARISON.md").read_text()
    assert "| ALiBi |" in report and "runs/" not in report.split("## Held-out")[1]  # labelled by mechanism
    assert (out / "figures" / "learning_curves.png").stat().st_size > 1000


def test_a_run_stopped_in_this_process_says_so_and_exits_with_the_signal(tmp_path, monkeypatch, capsys):
    """`compare --run NAME` (an array task) trains in this process: Ctrl-C there is one line and 130, not a silent
    exit."""
    from jaxpos.reproduction import pipeline
    from jaxpos.training.interrupt import RunStopped

    out = tmp_path / "cmp"
    assert cli.main([*small(str(out)), "--plan-only"]) == 0

    def stopped(*args):
        raise RunStopped(signal.SIGINT)

    monkeypatch.setattr(pipeline, "pretrain_group", stopped)
    monkeypatch.setattr(pipeline, "execute_run", stopped)
    capsys.readouterr()
    assert cli.main(["compare", "--out", str(out), "--run", "alibi"]) == 128 + signal.SIGINT
    err = capsys.readouterr().err
    assert err == "jaxpos: stopped by SIGINT; what was saved before is kept; run the same command again to resume\n"


@pytest.mark.parametrize("lengths", ["0.5,2", "2,x", "0"])
def test_lengths_that_are_not_whole_multiples_say_what_the_flag_takes(lengths, capsys):
    assert cli.main(["compare", "--config", TINY_MLM_CONFIG, "--mechanisms", "alibi", "--lengths", lengths,
                     "--out", "unused", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"jaxpos: error: --lengths {lengths}: give whole multiples of the training length") and \
        err.count("\n") == 1 and "invalid literal" not in err
