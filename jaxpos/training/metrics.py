"""Metrics to TensorBoard event files in the workdir and to the console with a progress bar and ETA."""

from __future__ import annotations

import os
import sys
import time

from tqdm.auto import tqdm


class MetricWriter:
    """TensorBoard scalars plus console output: a live progress bar on a terminal, plain lines in a log file.

    A piped or redirected stdout gets no bar (its carriage-return redraws would pile up in the file); each logged
    line carries the ETA instead.
    """

    def __init__(self, workdir: str, total_steps: int, start_step: int = 0, enabled: bool = True):
        self.enabled = enabled
        self.writer = None
        if enabled:
            from tensorboardX import SummaryWriter
            self.writer = SummaryWriter(os.path.join(workdir, "tensorboard"))
        self.total_steps, self.start_step = total_steps, start_step
        self.live_bar = enabled and sys.stdout.isatty()
        self.bar = tqdm(total=total_steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True,
                        file=sys.stdout, disable=not self.live_bar, mininterval=1.0)
        self.started = time.time()

    def advance(self, steps: int = 1) -> None:
        self.bar.update(steps)

    def scalars(self, step: int, values: dict, prefix: str = "train", echo: bool = True) -> None:
        if not self.enabled:
            return
        for key, value in values.items():
            self.writer.add_scalar(f"{prefix}/{key}", float(value), step)
        self.writer.flush()
        if echo:
            shown = " ".join(f"{k}={_fmt(v)}" for k, v in values.items())
            where = f"{prefix} step {step}"
            if prefix == "train" and not self.live_bar:  # no bar to show progress: say it in the line
                where += f"/{self.total_steps} eta {self._eta(step)}"
            self.write(f"[{where}] {shown}")

    def write(self, line: str) -> None:
        """Prints a line above the bar (plainly once the bar is closed or absent)."""
        if self.enabled:
            tqdm.write(line, file=sys.stdout)

    def postfix(self, **values) -> None:
        self.bar.set_postfix({k: _fmt(v) for k, v in values.items()}, refresh=False)

    def finish_bar(self) -> None:
        """Draws the bar's final state once and retires it, so the run's last lines print below it cleanly."""
        self.bar.close()  # draws the final state (with the latest postfix) once; idempotent

    def close(self) -> None:
        self.bar.close()
        if self.writer is not None:
            self.writer.close()

    def _eta(self, step: int) -> str:
        done = step - self.start_step
        if done <= 0:
            return "?"
        remaining = (time.time() - self.started) / done * (self.total_steps - step)
        minutes, seconds = divmod(int(remaining), 60)
        return f"{minutes // 60}:{minutes % 60:02d}:{seconds:02d}"


def _fmt(v) -> str:
    v = float(v)
    if v == 0 or 1e-3 <= abs(v) < 1e5:
        return f"{v:.4g}"
    return f"{v:.3e}"
