"""Continued pretraining (`jaxpos train --init RUN`, train.init_from): a context extension starts from the source
run's parameters exactly, with its tokenizer and a fresh optimiser, records where it came from and resumes from its
own checkpoints; what cannot continue (another mechanism, a learned table too short) is refused in one line before
anything is written."""

import json
import os

import jax
import numpy as np
import pytest

from jaxpos import cli
from jaxpos.run import Run
from tests.helpers import SMALL_MLM, TINY_MLM_CONFIG, one_device_training, train_tiny_mlm

LONGER = ["--config.model.max_length=64", "--config.data.seq_len=64"]


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory):
    return train_tiny_mlm(str(tmp_path_factory.mktemp("rope") / "run"), kind="rope")


def continue_run(source, workdir, *more):
    with one_device_training():
        return cli.main(["train", "--config", TINY_MLM_CONFIG, "--workdir", workdir, "--init", source, *SMALL_MLM,
                         "--config.model.position.kind=rope", "--config.train.log_every=1", *more])


def test_a_context_extension_starts_from_the_source_and_resumes_from_its_own(rope_run, tmp_path, capsys):
    workdir = str(tmp_path / "extended")
    status = continue_run(rope_run, workdir, *LONGER, "--config.model.position.rope.base=160000",
                          "--config.train.num_steps=2", "--config.train.checkpoint_initial=true")
    assert status == 0
    source = Run.open(rope_run)
    assert "parameters from step 2 of " + rope_run in capsys.readouterr().out
    extended = Run.open(workdir)
    assert extended.steps() == [0, 2]
    for got, want in zip(jax.tree.leaves(extended.params(0)[1]), jax.tree.leaves(source.params()[1])):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))  # the source's weights, bit for bit
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(extended.params(2)[1]),
                                                        jax.tree.leaves(extended.params(0)[1])))  # then trained
    with open(os.path.join(workdir, "config.json")) as f:
        recorded = json.load(f)
    assert recorded["train"]["init_from"] == rope_run
    assert recorded["data"]["tokenizer_path"] == os.path.abspath(os.fspath(source.tokenizer_file))
    assert recorded["model"]["max_length"] == 64 and recorded["model"]["position"]["rope"]["base"] == 160000
    assert extended.tokenizer().vocab_size == source.tokenizer().vocab_size
    # the same command with more steps resumes from the extension's own step 2, not from the source again
    assert continue_run(rope_run, workdir, *LONGER, "--config.model.position.rope.base=160000",
                        "--config.train.num_steps=4") == 0
    out = capsys.readouterr().out
    assert "parameters from step" not in out and Run.open(workdir).steps()[-1] == 4


def test_another_mechanism_is_refused_before_anything_is_written(rope_run, tmp_path, capsys):
    workdir = tmp_path / "alibi"
    with one_device_training():
        status = cli.main(["train", "--config", TINY_MLM_CONFIG, "--workdir", str(workdir), "--init", rope_run,
                           *SMALL_MLM, "--config.model.position.kind=alibi", "--config.train.num_steps=2"])
    assert status == 2 and not workdir.exists()
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == [f"jaxpos: error: train.init_from: {rope_run} trained position.kind='rope', this run's is 'alibi'; "
                   "continued pretraining keeps the mechanism (its options without parameters may change)"]


def test_a_learned_table_too_short_is_refused_with_the_reason(tmp_path, capsys):
    source = train_tiny_mlm(str(tmp_path / "absolute"), kind="absolute")
    workdir = tmp_path / "longer"
    with one_device_training():
        status = cli.main(["train", "--config", TINY_MLM_CONFIG, "--workdir", str(workdir), "--init", source,
                           *SMALL_MLM, "--config.model.position.kind=absolute", *LONGER, "--config.train.num_steps=2"])
    assert status == 2 and not workdir.exists()
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith(f"jaxpos: error: train.init_from: step 2 of {source} holds other "
                                               "parameters than this model: params/")
    assert "shape (32, 32) in the checkpoint, shape (64, 32) in this run (a learned position table cannot be " \
           "lengthened" in err[0]
