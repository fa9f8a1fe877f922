"""Console output of a run: a bar on a terminal that ends once, plain lines with an ETA in a log file."""

import io
import sys

from jaxpos.training.metrics import MetricWriter


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _run(writer: MetricWriter, steps: int):
    for step in range(1, steps + 1):
        writer.advance()
        writer.postfix(loss=1.0 / step)
        if step == steps:
            writer.finish_bar()
        writer.scalars(step, {"loss": 1.0 / step})
    writer.scalars(steps, {"loss": 0.5}, prefix="eval")
    writer.close()


def test_log_file_gets_plain_lines_with_eta(tmp_path, monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    _run(MetricWriter(str(tmp_path), total_steps=3), 3)
    text = out.getvalue()
    assert "\r" not in text
    assert text.splitlines() == ["[train step 1/3 eta 0:00:00] loss=1", "[train step 2/3 eta 0:00:00] loss=0.5",
                                 "[train step 3/3 eta 0:00:00] loss=0.3333", "[eval step 3] loss=0.5"]


def _screen(text: str) -> list[str]:
    """What a terminal shows: each carriage return goes back to the start of the line (redraws overwrite)."""
    return [line.rsplit("\r", 1)[-1].rstrip() for line in text.split("\n") if line.rsplit("\r", 1)[-1].strip()]


def test_terminal_bar_ends_once_before_the_last_lines(tmp_path, monkeypatch):
    out = _Terminal()
    monkeypatch.setattr(sys, "stdout", out)
    _run(MetricWriter(str(tmp_path), total_steps=3), 3)
    screen = _screen(out.getvalue())
    assert screen[:2] == ["[train step 1] loss=1", "[train step 2] loss=0.5"]
    assert len(screen) == 5 and screen[2].startswith("train: 100%") and "3/3" in screen[2], screen
    assert screen[2].endswith("loss=0.3333]")  # the bar's final state, once, with the last step's loss
    assert screen[3:] == ["[train step 3] loss=0.3333", "[eval step 3] loss=0.5"]
