"""Progress of long work: a live bar only on a terminal; anywhere else plain lines without '\r' or escape codes."""

import io

from jaxpos.progress import Progress, clock, is_terminal, progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def no_redraws(text: str) -> bool:
    return "\r" not in text and "\x1b" not in text


def test_a_log_gets_plain_lines_and_the_items_all_pass():
    log = io.StringIO()
    outer = Progress(["a", "b", "c"], desc="analyze", unit="diagnostic", stream=log, plain_every_s=0.0)
    seen = []
    for name in outer:
        outer.set_postfix_str(name)
        inner = list(progress(range(4), desc="windows", unit="window", leave=False, stream=log, plain_every_s=0.0))
        seen.append((name, inner))
    assert seen == [(n, [0, 1, 2, 3]) for n in "abc"]
    text = log.getvalue()
    assert no_redraws(text), repr(text)
    lines = text.splitlines()
    assert lines[0].startswith("windows: 1/4 window elapsed 0:00:00 eta ")
    assert "analyze: 1/3 diagnostic (a) elapsed 0:00:00 eta 0:00:00" in lines
    assert lines[-1].startswith("analyze: 3/3 diagnostic (c) done in 0:00:0")
    assert sum(line.startswith("windows:") for line in lines) == 12  # every inner step (plain_every_s=0)
    assert not any(line.startswith("windows") and "done" in line for line in lines)  # leave=False: no final line


def test_plain_lines_are_occasional():
    log = io.StringIO()
    for _ in progress(range(1000), desc="decoding", unit="batch", stream=log):  # default: at most every 30 s
        pass
    assert log.getvalue().splitlines() == [log.getvalue().splitlines()[-1]]
    assert log.getvalue().startswith("decoding: 1000/1000 batch done in 0:00:0")
    quiet = io.StringIO()
    bar = Progress(desc="train", total=5, stream=quiet, plain_every_s=None)  # the caller prints its own lines
    bar.update(5)
    bar.write("a line of the caller")
    bar.close()
    assert quiet.getvalue() == "a line of the caller\n"
    silent = io.StringIO()
    list(progress(range(3), desc="x", stream=silent, plain_every_s=0.0, enabled=False))
    assert silent.getvalue() == ""


def test_a_terminal_gets_a_live_bar():
    screen = Terminal()
    for _ in progress(range(3), desc="analyze", stream=screen, mininterval=0):
        pass
    assert "\r" in screen.getvalue() and "3/3" in screen.getvalue()
    assert is_terminal(Terminal()) and not is_terminal(io.StringIO()) and not is_terminal(object())


def test_eta_and_clock():
    assert clock(3725.9) == "1:02:05" and clock(-1) == "0:00:00"
    bar = Progress(desc="train", total=10, initial=4, stream=io.StringIO())
    assert bar.eta() == "?"  # nothing done since the start
    bar.started -= 6.0  # 6 s for 2 steps: 3 s a step, 4 steps left
    bar.update(2)
    assert bar.eta() == "0:00:12"
