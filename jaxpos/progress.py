"""Progress of long work (training, analysis, decoding): a live bar on a terminal, plain lines anywhere else.

A bar redraws itself with carriage returns and cursor movements, which pile up in a log file; so the bar is drawn
only when the stream is a terminal. Elsewhere `Progress` prints an occasional plain line (count, elapsed time, ETA)
at most every `plain_every_s` seconds, never a '\\r' or an escape code, or nothing at all when the caller prints its
own lines (training's logged steps carry their ETA). `status` prints the one-off plain lines of long work (what
starts, what was read, where results went); with the bars, the library's only console output (jaxpos.cli prints
the rest).
"""

from __future__ import annotations

import sys
import time
from typing import Iterable, Iterator, TextIO

from tqdm.auto import tqdm


def is_terminal(stream) -> bool:
    """Whether `stream` is an interactive terminal (False for files, pipes and streams without isatty)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def status(line: str, stream: TextIO | None = None) -> None:
    """Prints one plain line about long work on `stream` (default: sys.stdout at the time of the call), flushed."""
    print(line, file=sys.stdout if stream is None else stream, flush=True)


def clock(seconds: float) -> str:
    """H:MM:SS."""
    minutes, secs = divmod(int(max(0.0, seconds)), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


class Progress:
    """Wraps an iterable (or counts `update` calls) and shows progress on `stream` (default: sys.stderr).

    On a terminal: a tqdm bar (nested bars with leave=False vanish when done). Elsewhere: a plain line
    "DESC: N/TOTAL UNIT (POSTFIX) elapsed H:MM:SS eta H:MM:SS" at most every `plain_every_s` seconds and, with
    `leave`, one when the work is done; `plain_every_s=None` prints no progress lines. `enabled=False` shows
    nothing, though `write` still prints.
    """

    def __init__(self, iterable: Iterable | None = None, *, desc: str, total: int | None = None, initial: int = 0,
                 unit: str = "it", stream: TextIO | None = None, leave: bool = True,
                 plain_every_s: float | None = 30.0, enabled: bool = True, **bar_options):
        self.iterable, self.desc, self.unit, self.leave = iterable, desc, unit, leave
        self.stream = sys.stderr if stream is None else stream
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.total, self.count, self.initial = total, initial, initial
        self.enabled, self.plain_every_s = enabled, plain_every_s
        self.live = enabled and is_terminal(self.stream)
        self.bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, file=self.stream, leave=leave,
                        **bar_options) if self.live else None
        self.postfix = ""
        self.started = self.printed = time.monotonic()
        self.closed = False

    def __iter__(self) -> Iterator:
        try:
            for item in self.iterable:
                yield item
                self.update()
        finally:
            self.close()

    def update(self, steps: int = 1) -> None:
        self.count += steps
        if self.bar is not None:
            self.bar.update(steps)
        elif self.enabled and self.plain_every_s is not None and time.monotonic() - self.printed >= self.plain_every_s:
            self._plain_line()

    def set_postfix(self, values: dict, refresh: bool = True) -> None:
        """Shows `values` ({name: text}) beside the count."""
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())
        if self.bar is not None:
            self.bar.set_postfix(values, refresh=refresh)

    def set_postfix_str(self, text: str) -> None:
        """Shows `text` beside the count (e.g. the item being worked on)."""
        self.postfix = text
        if self.bar is not None:
            self.bar.set_postfix_str(text)

    def write(self, line: str) -> None:
        """Prints a line above a live bar, or plainly."""
        if self.bar is not None:
            tqdm.write(line, file=self.stream)
        else:
            status(line, self.stream)

    def eta(self, done: int | None = None) -> str:
        """Time left at the pace so far, from `done` (default: the count) out of the total; '?' when unknown."""
        done = self.count if done is None else done
        if self.total is None or done <= self.initial:
            return "?"
        return clock((time.monotonic() - self.started) / (done - self.initial) * (self.total - done))

    def close(self) -> None:
        """Ends the bar (drawing its final state once), or prints the plain 'done' line; idempotent."""
        if self.closed:
            return
        self.closed = True
        if self.bar is not None:
            self.bar.close()
        elif self.enabled and self.plain_every_s is not None and self.leave and self.count > self.initial:
            self.write(f"{self.desc}: {self._counted()} done in {clock(time.monotonic() - self.started)}")

    def _counted(self) -> str:
        shown = f"{self.count}/{self.total}" if self.total is not None else f"{self.count}"
        return f"{shown} {self.unit}" + (f" ({self.postfix})" if self.postfix else "")

    def _plain_line(self) -> None:
        self.printed = time.monotonic()
        self.write(f"{self.desc}: {self._counted()} elapsed {clock(self.printed - self.started)} eta {self.eta()}")


def progress(iterable: Iterable, *, desc: str, **options) -> Progress:
    """`Progress(iterable, desc=desc, **options)`: iterate over it to show progress."""
    return Progress(iterable, desc=desc, **options)
