"""Metrics to TensorBoard event files in the workdir and to the console with a progress bar and ETA."""

from __future__ import annotations

import os
import sys
import time

from tqdm.auto import tqdm


class MetricWriter:
    def __init__(self, workdir: str, total_steps: int, start_step: int = 0, enabled: bool = True):
        self.enabled = enabled
        self.writer = None
        if enabled:
            from tensorboardX import SummaryWriter
            self.writer = SummaryWriter(os.path.join(workdir, "tensorboard"))
        self.bar = tqdm(total=total_steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True,
                        file=sys.stdout, disable=not enabled, mininterval=1.0)
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
            self.bar.write(f"[{prefix} step {step}] {shown}")

    def postfix(self, **values) -> None:
        self.bar.set_postfix({k: _fmt(v) for k, v in values.items()}, refresh=False)

    def close(self) -> None:
        self.bar.close()
        if self.writer is not None:
            self.writer.close()


def _fmt(v) -> str:
    v = float(v)
    if v == 0 or 1e-3 <= abs(v) < 1e5:
        return f"{v:.4g}"
    return f"{v:.3e}"
