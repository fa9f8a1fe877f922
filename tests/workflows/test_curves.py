"""`jaxpos curves`: the scalars of TensorBoard event files read back as written (a resumed run's repeated steps keep
their last value), one figure of several runs, and the table's last and best values."""

import os
import time

import pytest

from jaxpos import cli
from jaxpos.training.metrics import read_scalars
from jaxpos.workflows.curves import compare_runs, curves_table


def log(workdir, points: dict, wall_time: float):
    """Writes {tag: [(step, value), ...]} with tensorboardX, as a training run does, into a new event file."""
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(os.path.join(workdir, "tensorboard"), filename_suffix=f".{wall_time}")
    for tag, values in points.items():
        for step, value in values:
            writer.add_scalar(tag, value, step, walltime=wall_time)
    writer.close()


@pytest.fixture
def runs(tmp_path):
    first, second = str(tmp_path / "tisa"), str(tmp_path / "none")
    log(first, {"train/loss": [(50, 6.0), (100, 5.0), (150, 4.5)], "eval/loss": [(100, 5.2)]}, time.time())
    time.sleep(1.1)  # a resumed run's file is named after a later second
    log(first, {"train/loss": [(150, 4.4), (200, 4.0)], "eval/loss": [(200, 4.8)]}, time.time())
    log(second, {"train/loss": [(100, 5.5), (200, 5.4)], "eval/loss": [(100, 5.3), (200, 5.35)],
                 "eval/accuracy": [(100, 0.1), (200, 0.1)]}, time.time())
    return first, second


def test_the_scalars_read_back_as_written_with_the_last_value_of_a_repeated_step(runs):
    scalars = read_scalars(runs[0])
    assert scalars["train/loss"] == pytest.approx({50: 6.0, 100: 5.0, 150: 4.4, 200: 4.0})
    assert scalars["eval/loss"] == pytest.approx({100: 5.2, 200: 4.8})


def test_one_figure_and_a_table_of_the_last_and_best_values(runs, tmp_path, capsys):
    out = str(tmp_path / "figures" / "curves.png")
    rows = compare_runs(runs, out)
    assert os.path.getsize(out) > 0
    tisa, none = rows
    assert (tisa.name, tisa.step, tisa.train_last, tisa.eval_last, tisa.eval_best, tisa.eval_best_step) == \
        ("tisa", 200, pytest.approx(4.0), pytest.approx(4.8), pytest.approx(4.8), 200)
    assert (none.eval_last, none.eval_best, none.eval_best_step) == (pytest.approx(5.35), pytest.approx(5.3), 100)
    accuracy = compare_runs(runs[1:], out, metric="accuracy")[0]
    assert accuracy.eval_best_step == 100 and accuracy.train_last is None  # equal values: the earliest step
    assert "-" in curves_table([accuracy], "accuracy").splitlines()[1].split()
    assert cli.main(["curves", *runs, "--out", out]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].split()[:3] == ["run", "step", "train"] and printed[1].split()[:3] == ["tisa", "200", "4.0000"]
    assert printed[-1] == f"wrote {out}"


def test_clear_errors(runs, tmp_path, capsys):
    assert cli.main(["curves", str(tmp_path)]) == 2
    assert "holds no TensorBoard event file" in capsys.readouterr().err
    assert cli.main(["curves", runs[0], "--metric", "bleu", "--out", str(tmp_path / "c.png")]) == 2
    assert capsys.readouterr().err.strip() == "jaxpos: error: no run logged 'bleu'; logged: loss"
