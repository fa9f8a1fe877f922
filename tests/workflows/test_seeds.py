"""`jaxpos train --seeds N`: N seeds of a masked-LM config in one program, each folder what the seed trained alone
would have left (its tokenizer, data order, masking, initialisation, checkpoints and report)."""

import json
import os

import jax
import numpy as np
import pytest

from jaxpos import cli
from jaxpos.run import Run
from tests.helpers import SMALL_MLM, TINY_MLM_CONFIG as TINY, one_device_training

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = [*SMALL_MLM, "--config.train.num_steps=4", "--config.train.log_every=2", "--config.train.eval_every=4",
         "--config.train.checkpoint_every=2"]


def test_seeds_train_at_once_as_each_would_alone(tmp_path, capsys):
    with one_device_training():
        assert cli.main(["train", "--config", TINY, "--workdir", str(tmp_path / "batch"), "--seeds", "2",
                         "--config.train.seed=5", "--config.data.seed=5", *SMALL]) == 0
    printed = capsys.readouterr().out
    assert len([line for line in printed.splitlines() if line.startswith("baseline: unigram entropy")]) == 1
    with open(tmp_path / "batch" / "seed_5" / "report.json") as f:
        speed = json.load(f)["train"]
    tokens = 8 * 32  # SMALL_MLM's batch of 8 rows of 32: each seed's tokens a step, whatever trains beside it
    assert speed["tokens_per_s"] == pytest.approx(tokens / speed["step_time"], rel=1e-6)
    with one_device_training():
        assert cli.main(["train", "--config", TINY, "--workdir", str(tmp_path / "alone"),
                         "--config.train.seed=6", "--config.data.seed=6", *SMALL]) == 0
    assert sorted(os.listdir(tmp_path / "batch")) == ["seed_5", "seed_6"]
    for seed in (5, 6):
        folder = tmp_path / "batch" / f"seed_{seed}"
        with open(folder / "config.json") as f:
            saved = json.load(f)
        assert saved["train"]["seed"] == seed and saved["data"]["seed"] == seed
        with open(folder / "report.json") as f:
            assert json.load(f)["step"] == 4
    in_batch, alone = Run.open(str(tmp_path / "batch" / "seed_6")), Run.open(str(tmp_path / "alone"))
    vocabulary = [run.tokenizer_file.with_suffix(".vocab").read_text() for run in (in_batch, alone)]
    assert vocabulary[0] == vocabulary[1]  # the model files differ in where their training text lay
    (step, a), (_, b) = in_batch.params(), alone.params()
    assert step == 4
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=2e-5)
    with open(tmp_path / "batch" / "seed_6" / "report.json") as f, open(tmp_path / "alone" / "report.json") as g:
        assert json.load(f)["eval"]["loss"] == pytest.approx(json.load(g)["eval"]["loss"], rel=1e-5)


def test_seeds_of_a_translation_config_are_refused_in_one_line(tmp_path, capsys):
    config = os.path.join(ROOT, "configs", "wmt", "tiny.py")
    assert cli.main(["train", "--config", config, "--workdir", str(tmp_path / "t"), "--seeds", "2"]) == 2
    assert "--seeds trains masked-LM configs" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()
