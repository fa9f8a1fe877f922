"""Stopping a run on SIGTERM (a scheduler's pre-emption, `timeout`) or SIGINT (Ctrl-C), the same way every time.

While the training loop runs (`deferred_stop`), either signal only asks it to stop: the loop finishes its step,
checkpoints it and ends, and the workflow raises `RunStopped` instead of evaluating or reporting. A second Ctrl-C
aborts at once (KeyboardInterrupt): the run keeps its last saved checkpoint. Outside the loop (reading data,
compiling, the final evaluation, decoding) `stop_on_signals` turns either signal into `RunStopped` at once: nothing
trained is lost there, since the loop saved its last step before it ended.

`jaxpos` exits with 128 + the signal's number (143 for SIGTERM, 130 for SIGINT), as a shell reports a process
the signal ended, after one line saying what was saved. Running the same command again resumes.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _handled() -> list[int]:
    """The stop signals this process does not ignore (a shell starts background jobs with SIGINT ignored, so that
    Ctrl-C reaches the foreground only; Python keeps that, and so does jaxpos)."""
    return [s for s in STOP_SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]


class RunStopped(BaseException):
    """A command stopped by SIGTERM or SIGINT. `step`: the newest checkpoint once the loop stopped (None when the
    signal came outside the loop, or before anything was saved). A BaseException, like KeyboardInterrupt, so that
    code catching every Exception (a checkpoint that does not restore, a worker that failed) lets it through."""

    def __init__(self, signum: int, step: int | None = None, where: str = ""):
        self.signum, self.step, self.where = signum, step, where
        name = signal.Signals(signum).name
        if step is None:
            text = f"stopped by {name}; what was saved before is kept"
        else:
            text = f"stopped by {name}: checkpointed step {step}" + (f" in {where}" if where else "")
        super().__init__(text + "; run the same command again to resume")

    @property
    def exit_status(self) -> int:
        """128 + the signal number, as a shell reports a process the signal ended."""
        return 128 + self.signum


@contextlib.contextmanager
def _handling(handler) -> Iterator[None]:
    """`handler` for the stop signals this process does not ignore, inside; the previous handlers on leaving. A
    no-op outside the main thread (Python sets handlers there only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in _handled()}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Inside: SIGTERM and SIGINT raise `RunStopped` where the program is (the loop defers them: `deferred_stop`).
    The previous handlers come back on leaving. A no-op outside the main thread; an ignored signal stays ignored."""
    def stop(signum, frame):
        raise RunStopped(signum)

    with _handling(stop):
        yield


class StopRequest:
    """What `deferred_stop` yields: `signum` is the first stop signal received, or None."""

    def __init__(self):
        self.signum: int | None = None

    def __bool__(self) -> bool:
        return self.signum is not None


@contextlib.contextmanager
def deferred_stop() -> Iterator[StopRequest]:
    """Inside: the first SIGTERM or SIGINT is recorded in the yielded StopRequest (the loop stops at its next step
    boundary, after a checkpoint); a second SIGINT raises KeyboardInterrupt at once. Previous handlers come back on
    leaving. Outside the main thread nothing is installed and the request stays empty."""
    request = StopRequest()

    def record(signum, frame):
        if request.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt("a second Ctrl-C")
        if request.signum is None:
            request.signum = signum

    with _handling(record):
        yield request
