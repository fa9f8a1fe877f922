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
    name, variant, _ = comp.parse_variant("rope+partial0.5+extend4+ntk4", (1, 4), 128, 256)
    assert variant["overrides"] == ["--config.model.position.kind=rope", "--config.model.position.rope.fraction=0.5"]
    assert variant["extend"] == {"factor": 4, "overrides": ["--config.model.position.rope.scaling=ntk",
                                                            "--config.model.position.rope.factor=4.0",
                                                            "--config.model.position.rope.original_max_length=128"]}
    assert variant["label"] == "RoPE, partial 0.5, extended to 4× for 1/4 of the steps, NTK ×4 in the extension"
    name, variant, _ = comp.parse_variant("alibi+heads2+gate+sink+qknorm+ssmax", (1,), 128, 256)
    assert variant["overrides"][1:] == ["--config.model.position.alibi.heads=2", "--config.model.output_gate=true",
                                        "--config.model.attention_sinks=true", "--config.model.qk_norm=true",
                                        "--config.model.length_scaled_logits=true"]
    assert variant["label"] == "ALiBi, on the first 2 heads, output gate, sink logit, QK-norm, Scalable-Softmax"
    for bad, message in (("ropee", "unknown mechanism"), ("rope+yarm", "unknown option"),
                         ("rope@train", "only '@eval'"), ("alibi@eval", "give one"),
                         ("alibi+local", "give the window"), ("diet_rel+clip", "give the clip"),
                         ("rope+extend1", "a whole factor of 2 or more"), ("rope+extend2+extend4", "give one")):
        with pytest.raises(ValueError, match=message):
            comp.parse_variant(bad, (1, 2), 128, 256)


@pytest.mark.parametrize("mechanisms, overrides, message", [
    ("rope+random+local32", ["--config.model.num_layers=2"], r"variant 'rope\+random\+local32': model\.local_window counts keys by their distance"),
    ("diet_abs+yarn", [], r"variant 'diet_abs\+yarn': model\.position\.rope: options of 'rope', but "
                          r"model\.position\.kind is 'diet_abs'"),
    ("alibi+clip16", [], r"model\.position\.diet_rel: options of 'diet_rel', but model\.position\.kind is 'alibi'"),
    ("fox+heads2", [], r"model\.position\.fox\.heads"),
    ("absolute+extend2", [], r"variant 'absolute\+extend2': extend: absolute, learned \(BERT\) has learned positions "
                             r"for 32 tokens only; rows of 64 cannot start from them"),
    ("alibi+yarn@eval", [], r"variant 'alibi': alibi\+yarn@eval: a 'alibi' run, whose options all change its "
                            r"parameters"),
    ("cope", ["--config.model.attention_impl=jax", "--config.model.attention_dropout=0.0"],
     r"variant 'cope': attention_impl='jax' cannot compute this model's attention here: it lacks CoPE's contextual"),
], ids=["random_with_a_window", "options_of_another_kind", "clip_of_another_kind", "heads_of_a_kind_without",
        "extension_of_a_learned_table",
        "rule_of_another_kind",
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


def test_where_the_loss_by_position_degrades_against_numbers_worked_by_hand():
    """Trained at 8 tokens, buckets of 2 columns: at 16 tokens bucket [8, 10) is within the seeds' noise, [10, 12)
    is above the loss at 8 tokens in every seed; the interval is scipy's paired t interval."""
    base = [4.0, 4.2, 4.1]

    def entry(losses):  # buckets of columns 0-1, 2-3, ... 14-15
        return {"loss": float(np.mean(losses)), "by_position": [dict(start=2 * k, end=2 * k + 2, predicted=5, loss=v)
                                                                for k, v in enumerate(losses)]}

    seeds = [[3.9] * 4 + [4.3, 4.5] + [5.0] * 2, [4.1] * 4 + [3.9, 4.9] + [5.1] * 2, [4.0] * 4 + [4.0, 4.6] + [5.2] * 2]
    row = dict(train_length=8, lengths={8: {s: {"loss": v} for s, v in enumerate(base)},
                                        16: {s: entry(l) for s, l in enumerate(seeds)},
                                        32: {s: {"skipped": "no learned position"} for s in range(3)}})
    got = comp.degradation(row)
    differences = np.array([4.5, 4.9, 4.6]) - base
    half = scipy_stats.t.ppf(0.975, 2) * np.std(differences, ddof=1) / np.sqrt(3)
    assert got["16"]["start"] == 10 and got["16"]["end"] == 12 and got["16"]["n"] == 3
    assert got["16"]["mean"] == pytest.approx(differences.mean()) and got["16"]["low"] == pytest.approx(
        differences.mean() - half)
    assert got["32"] == {"skipped": "cannot run"}
    assert comp.degradation_text(got["16"]).startswith("from column 10 (columns 10–11: +0.567 [")
    flat = dict(row, lengths={8: row["lengths"][8], 16: {s: entry([4.1] * 8) for s in range(3)}})
    assert comp.degradation(flat)["16"] == {"none": 4, "n": 3}
    # the passkey cells: the share of keys retrieved per depth over seeds, the skipped length named
    for seed, share in enumerate([0.4, 0.5, 0.6]):
        row["lengths"][16][seed]["passkey"] = {"depths": {"0.5": dict(accuracy=share, examples=16, floor=1e-5,
                                                                      digit_floor=0.1)}}
    cells = comp.passkey_cells(row)
    half = scipy_stats.t.ppf(0.975, 2) * 0.1 / np.sqrt(3)
    assert cells["16"]["depths"]["0.5"]["mean"] == pytest.approx(0.5)
    assert cells["16"]["depths"]["0.5"]["high"] == pytest.approx(0.5 + half) and cells["16"]["floor"] == 1e-5
    assert cells["32"] == {"skipped": "no learned position"} and "8" not in cells


def test_repeated_mechanisms_flags_join(tmp_path, capsys):
    argv = small(str(tmp_path / "cmp"))
    at = argv.index("--mechanisms")
    argv[at:at + 2] = ["--mechanisms", "alibi", "--mechanisms", "rope+yarn@eval,t5"]
    assert cli.main([*argv, "--dry-run"]) == 0
    planned = [line.split()[0] for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    assert sorted(planned) == ["alibi", "none", "rope", "t5"]  # with the baseline; the rule's runs are plain RoPE's


def small(out: str) -> list[str]:
    return ["compare", "--config", TINY_MLM_CONFIG, "--mechanisms", "alibi,rope+yarn@eval,rope+extend2", "--seeds", "2",
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
                                                              "RoPE, YaRN ×2 at evaluation",
                                                              "RoPE, extended to 2× for 1/4 of the steps"}
    # the extension continued each seed's pretraining at 64 tokens for 1 step (4 // 4), and was scored from there
    extended = json.loads((out / "runs" / "rope+extend2_s0" / "result.json").read_text())
    assert extended["extension"]["seq_len"] == 64 and extended["extension"]["steps"] == 1
    assert json.loads((out / "runs" / "rope+extend2_s0" / "extended" / "config.json").read_text())["train"][
        "init_from"].endswith(os.path.join("rope+extend2_s0", "pretrain"))
    rope = numbers["rows"]["rope+yarn@eval"]
    assert set(rope["lengths"]) == {"32", "64"} and rope["loss"]["n"] == 0  # a rule at evaluation: lengths only
    assert numbers["rows"]["alibi"]["loss"]["n"] == 2 and numbers["rows"]["alibi"]["lengths"]["64"]["n"] == 2
    for name in ("alibi", "rope"):  # when each parts from bag of words, tested on its curve by seed
        assert re.match(r"(parts from bag of words at step \d+|has not parted from bag of words by step \d+) \(bag "
                        r"of words' held-out loss minus its: [-+]", numbers["rows"][name]["parting"])
    against = [c for c in numbers["comparisons"] if c["b"] != c["a"]]
    assert all(c["b"] == "none" for c in against) and len(against) == 4 + 4 + 2 + 4  # the rule: 2 lengths
    itself = {(c["a"], c["quantity"]) for c in numbers["comparisons"] if c["b"] == c["a"]}
    assert itself == {(name, "loss at 64 − at 32 tokens") for name in ("none", "alibi", "rope", "rope+yarn@eval",
                                                                       "rope+extend2")}
    report = (out / "COMPARISON.md").read_text()
    assert "| ALiBi |" in report and "runs/" not in report.split("## Held-out")[1]  # labelled by mechanism
    assert (out / "figures" / "learning_curves.png").stat().st_size > 1000
    # loss by position and the passkey probe, past the training length; the wall time of both commands
    assert "## Where the loss by position degrades" in report and "| RoPE, YaRN ×2 at evaluation | " in report
    assert (out / "figures" / "loss_by_position.png").stat().st_size > 1000
    assert numbers["rows"]["alibi"]["passkey"]["32"] == {"skipped": numbers["rows"]["alibi"]["passkey"]["32"][
        "skipped"]} and "depths" in numbers["rows"]["alibi"]["passkey"]["64"]
    assert "## Passkey retrieval (zero-shot)" in report
    assert "- resumed: the wall time is the sum over the 2 commands that ran this plan" in report
    # where attention sinks, each trained variant's over its seeds
    assert "## Where attention sinks (last checkpoint)" in report
    sinks = numbers["rows"]["alibi"]["sinks"]
    assert sinks["first"]["n"] == 2 and 0 < sinks["uniform"]["mean"] <= 1 and sinks["learned"]["mean"] < 1e-5


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


def test_a_tasks_progress_line_reads_its_logs_last_step(tmp_path):
    from jaxpos.reproduction.matrix import resumed_line
    from jaxpos.reproduction.pool import progress_text

    log = tmp_path / "run.log"
    log.write_text("data (embedded): ...\n[train step 1/160 eta 0:02:00] accuracy=0 grad_norm=2.4 learning_rate=0 "
                   "loss=5.658 perplexity=286\n[eval step 20] loss=5.1 accuracy=0.1\n[train step 40/160 eta "
                   "0:01:10] accuracy=0.1 grad_norm=1.2 learning_rate=1e-3 loss=4.25 perplexity=70\n")
    assert progress_text(str(log)) == "step 40/160 (25%), loss 4.250, about 0:01:10 left"
    assert progress_text(str(tmp_path / "missing.log")) is None
    log.write_text("data (embedded): ...\n")
    assert progress_text(str(log)) is None  # before the first step
    plan = dict(commands=[dict(wall_s=60.0)] * 3, created="2026-12-02 01:00:00", started_unix=0.0)
    assert resumed_line(plan)[0].startswith("- resumed: the wall time is the sum over the 3 commands that ran")
    assert resumed_line(dict(plan, commands=plan["commands"][:1])) == []


def test_the_report_says_when_it_cannot_say_anything():
    from jaxpos.reproduction.stats import paired_difference

    same = paired_difference([5.0, 5.1, 5.2], [5.0, 5.1, 5.2])  # the seeds agree exactly
    text = comp.comparison_text(dict(test=same, adjusted_p=1.0, decided=False))
    assert text.endswith("the seeds agree exactly (every paired difference +0): nothing to test against")
    noisy = paired_difference([5.0, 5.3, 4.9], [5.05, 5.1, 5.0])  # differences -0.05, +0.2, -0.1: sd 0.16
    d = np.array([-0.05, 0.2, -0.1])
    want = int(np.ceil(((scipy_stats.norm.ppf(0.975) + scipy_stats.norm.ppf(0.8)) * d.std(ddof=1) / d.mean()) ** 2)) + 1
    assert comp.seeds_to_resolve(noisy) == want and want > 3
    assert f"about {want} seeds would resolve" in comp.comparison_text(dict(test=noisy, adjusted_p=0.9, decided=False))
    flat = {"rope": dict(trained=False), "alibi": dict(trained=False), "t5": dict(trained=None)}
    assert "no variant's held-out loss left bag of words'" in comp.cannot_say(flat)
    assert comp.cannot_say(dict(flat, alibi=dict(trained=True))) is None
