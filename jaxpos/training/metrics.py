"""Metrics to TensorBoard event files in the workdir and to the console with a progress bar and ETA."""

from __future__ import annotations

import os
import shutil
import struct
import sys
import tempfile
import time

from etils import epath

from jaxpos.progress import Progress


class MetricWriter:
    """TensorBoard scalars plus console output: a live progress bar on a terminal, plain lines in a log file.

    A piped or redirected stdout gets no bar (its carriage-return redraws would pile up in the file); each logged
    line carries the ETA instead. A workdir URL (gs://...) gets its event files through etils.epath: they are
    written locally and copied to WORKDIR/tensorboard at most every `sync_every_s` seconds and at `close`.
    """

    def __init__(self, workdir: str, total_steps: int, start_step: int = 0, enabled: bool = True,
                 sync_every_s: float = 60.0, console: bool = True):
        """`enabled`: writes anything at all; `console`: also the bar and the lines (TensorBoard only without)."""
        self.enabled, self.console = enabled, enabled and console
        self.writer = None
        self.remote = epath.Path(workdir) / "tensorboard" if "://" in str(workdir) else None
        self.local_dir = os.path.join(workdir, "tensorboard")
        self.sync_every_s, self.synced = sync_every_s, float("-inf")  # the first write is copied at once
        if enabled:
            from tensorboardX import SummaryWriter  # lazy: ~3 s at import; runs that log train, evaluations do not

            if self.remote is not None:
                self.local_dir = tempfile.mkdtemp(prefix="jaxpos_tensorboard_")
            self.writer = SummaryWriter(self.local_dir)
        self.total_steps, self.start_step = total_steps, start_step
        # No plain progress lines: without a live bar each logged line carries the ETA instead.
        self.bar = Progress(desc="train", total=total_steps, initial=start_step, unit="step", stream=sys.stdout,
                            enabled=self.console, plain_every_s=None, dynamic_ncols=True, mininterval=1.0)
        self.live_bar = self.bar.live

    def advance(self, steps: int = 1) -> None:
        self.bar.update(steps)

    def scalars(self, step: int, values: dict, prefix: str = "train", echo: bool = True) -> None:
        if not self.enabled:
            return
        for key, value in values.items():
            self.writer.add_scalar(f"{prefix}/{key}", float(value), step)
        self.writer.flush()
        if self.remote is not None and time.monotonic() - self.synced >= self.sync_every_s:
            self.sync()
        if echo and self.console:
            shown = " ".join(f"{k}={_fmt(v)}" for k, v in values.items())
            where = f"{prefix} step {step}"
            if prefix == "train" and not self.live_bar:  # no bar to show progress: say it in the line
                where += f"/{self.total_steps} eta {self.bar.eta(step)}"
            self.write(f"[{where}] {shown}")

    def write(self, line: str) -> None:
        """Prints a line above the bar (plainly once the bar is closed or absent)."""
        if self.console:
            self.bar.write(line)

    def postfix(self, **values) -> None:
        self.bar.set_postfix({k: _fmt(v) for k, v in values.items()}, refresh=False)

    def finish_bar(self) -> None:
        """Draws the bar's final state once and retires it, so the run's last lines print below it cleanly."""
        self.bar.close()  # draws the final state (with the latest postfix) once; idempotent

    def sync(self) -> None:
        """Copies the local event files to a remote workdir's tensorboard folder (whole files: they are small)."""
        if self.remote is None or self.writer is None:
            return
        self.remote.mkdir(parents=True, exist_ok=True)
        for name in sorted(os.listdir(self.local_dir)):
            with open(os.path.join(self.local_dir, name), "rb") as f:
                (self.remote / name).write_bytes(f.read())
        self.synced = time.monotonic()

    def close(self) -> None:
        self.bar.close()
        if self.writer is not None:
            self.writer.close()
            if self.remote is not None:
                self.sync()
                shutil.rmtree(self.local_dir, ignore_errors=True)
                self.writer = None


def _fmt(v) -> str:
    v = float(v)
    if v == 0 or 1e-3 <= abs(v) < 1e5:
        return f"{v:.4g}"
    return f"{v:.3e}"


def read_scalars(workdir: str) -> dict[str, dict[int, float]]:
    """Every scalar a run logged to WORKDIR/tensorboard (local or a URL): {tag: {step: value}}, tags as written
    ("train/loss", "eval/loss", ...). The event files are read in the order they were written, so the steps a
    resumed run trained again keep their last value. Raises FileNotFoundError when there are none."""
    from tensorboardX.proto import event_pb2  # lazy: protobuf, which only readers of the curves need

    folder = epath.Path(workdir) / "tensorboard"
    files = sorted((p for p in folder.glob("events.out.tfevents.*")), key=_written_at) if folder.is_dir() else []
    if not files:
        raise FileNotFoundError(f"{folder} holds no TensorBoard event file: is {workdir!r} the workdir of a "
                                "jaxpos training run?")
    scalars: dict[str, dict[int, float]] = {}
    for path in files:
        for record in _records(path.read_bytes()):
            event = event_pb2.Event.FromString(record)
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    scalars.setdefault(value.tag, {})[int(event.step)] = float(value.simple_value)
    return scalars


def _written_at(path: epath.Path) -> tuple[int, str]:
    """events.out.tfevents.<unix time>.<host>...: the time a writer opened the file, then the name."""
    parts = path.name.split(".")
    return (int(parts[3]) if len(parts) > 3 and parts[3].isdigit() else 0), path.name


def _records(data: bytes):
    """The payloads of a TFRecord file (length, its CRC, payload, its CRC); a record cut short ends the file."""
    offset = 0
    while offset + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        start, end = offset + 12, offset + 12 + length
        if end + 4 > len(data):
            return
        yield data[start:end]
        offset = end + 4
