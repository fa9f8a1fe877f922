"""`jaxpos analyze --checkpoints`: the diagnostics at every checkpoint of a trained run equal the one-checkpoint
analysis of that checkpoint, the series and figure are written, and bad step lists are refused by name."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from jaxpos.analysis import over_training
from jaxpos.analysis.over_training import headline, select_steps
from jaxpos.analysis.plots import plot_over_training
from jaxpos.cli import main
from jaxpos.training.checkpoint import saved_steps
from tests.xla_flags import quick_compile_flags

OPTIONS = ["--quick", "--only", "position_gram,identical_word,rank,decomposition", "--max-sentences", "24",
           "--probe-words", "4", "--probe-length", "16", "--lengths", "16"]


TRAIN = dict(model=dict(d_model=32, num_layers=2, num_heads=4, mlp_dim=48, max_length=16, dropout=0.0,
                        attention_dropout=0.0),
             data=dict(seq_len=16, vocab_size=300, max_documents=40),
             train=dict(num_steps=4, batch_size=8, learning_rate=1e-2, warmup_steps=1, max_predictions=4, log_every=2,
                        eval_every=4, eval_batches=1, checkpoint_every=2, keep_checkpoints=5, async_checkpoints=False))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A tiny absolute-position BERT trained 4 steps by `jaxpos train`, checkpoints at steps 2 and 4. In its own
    process: one CPU device and unoptimised code compile far faster than the tests' 8 simulated devices."""
    path = str(tmp_path_factory.mktemp("ot") / "run")
    overrides = [f"--config.{block}.{k}={v}" for block, values in TRAIN.items() for k, v in values.items()]
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=quick_compile_flags())
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    subprocess.run([sys.executable, "-m", "jaxpos.cli", "train", "--config", "configs/mlm/tiny.py", "--workdir", path,
                    "--config.model.position.kind=absolute"] + overrides, cwd=root, env=env, check=True,
                   capture_output=True)
    return path


def only_step(workdir: str, step: int, into: str) -> str:
    """A copy of the run whose only checkpoint is `step` (what `jaxpos analyze` alone then reads)."""
    shutil.copytree(workdir, into, ignore=lambda d, names: [n for n in names if n.isdigit() and int(n) != step
                                                             and os.path.basename(d) == "checkpoints"])
    return into


def comparable(report: dict) -> dict:
    """A report without what legitimately differs between two folders: timings and the source path."""
    out = {k: v for k, v in report.items() if k not in ("seconds", "model")}
    out["model"] = {k: v for k, v in report["model"].items() if k not in ("source", "name", "origin")}
    out["model"]["origin"] = {k: v for k, v in report["model"]["origin"].items() if k != "tokenizer"}
    return out


def test_every_checkpoint_matches_the_single_analysis(workdir, tmp_path, capsys, monkeypatch):
    assert saved_steps(workdir) == [2, 4]
    out = tmp_path / "over"
    drawn = []  # the figure's arguments: its rank panel marks D and the analysis length T

    def record(*args, **kwargs):
        drawn.append(kwargs)
        return plot_over_training(*args, **kwargs)

    monkeypatch.setattr(over_training, "plot_over_training", record)
    assert main(["analyze", "--workdir", workdir, "--checkpoints", "all", "--out", str(out)] + OPTIONS) == 0
    printed = capsys.readouterr().out
    result = json.loads((out / "over_training.json").read_text())
    assert result["steps"] == [2, 4] and os.path.getsize(out / "over_training.png") > 1000
    assert "step  Toeplitz R^2(P)" in printed
    assert [(d["head_dim"], d["length"]) for d in drawn] == [(8, 16)]  # D = 32 / 4 heads; T = --lengths 16

    reports = {}
    for index, step in enumerate((2, 4)):
        copy = only_step(workdir, step, str(tmp_path / f"only_{step}"))
        single_out = tmp_path / f"single_{step}"
        assert main(["analyze", "--workdir", copy, "--out", str(single_out)] + OPTIONS) == 0
        single = json.loads((single_out / "report.json").read_text())
        per_step = json.loads((out / f"step_{step}" / "report.json").read_text())
        assert per_step["model"]["origin"]["step"] == single["model"]["origin"]["step"] == step
        # the same numbers, diagnostic for diagnostic: `analyze` on the same restored parameters in this process
        assert comparable(per_step) == comparable(single)
        for name, values in result["series"].items():  # the series are the single analysis' headline numbers
            assert values[index] == headline(single)[name], name
        reports[step] = per_step
    assert result["series"]["toeplitz_r2"][0] == reports[2]["position_gram"]["toeplitz_r2"]
    assert len(result["series"]["importance_last"][1]) == 4
    # Two different checkpoints were read: training moved the position table, and with it P.
    assert reports[2]["position_gram"]["toeplitz_r2"] != reports[4]["position_gram"]["toeplitz_r2"]
    assert not np.allclose(reports[2]["decomposition"]["importance"], reports[4]["decomposition"]["importance"])


def test_step_lists(workdir, tmp_path, capsys):
    assert select_steps("all", [2, 4]) == [2, 4]
    assert select_steps(" 4,2 ", [2, 4]) == [2, 4]
    with pytest.raises(ValueError, match=r"no checkpoint at step\(s\) \[3\]; the run has 2, 4"):
        select_steps("2,3", [2, 4])
    with pytest.raises(ValueError, match="'all' or a comma-separated list"):
        select_steps("last", [2, 4])
    assert main(["analyze", "--workdir", workdir, "--checkpoints", "5", "--out", str(tmp_path / "x")]) == 2
    assert "jaxpos: error: --checkpoints '5': no checkpoint at step(s) [5]" in capsys.readouterr().err
    assert main(["analyze", "--hf", str(tmp_path), "--checkpoints", "all"]) == 2
    assert "--checkpoints needs --workdir" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="holds no checkpoint"):
        os.makedirs(tmp_path / "empty" / "checkpoints")
        saved_steps(str(tmp_path / "empty"))
