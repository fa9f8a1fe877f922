"""A training command's start (`started_run`: the config checked once, then the workdir claimed) and its hold on
the workdir: a refused command leaves the folder as it found it.

Every check that can refuse a run (the config, the data, the tokenizer's vocabulary, the checkpoint's model, the
mesh) comes before the run writes its own files (config.json, TensorBoard events, checkpoints). What the checks
themselves may write is the cached tokenizer; in a folder this command created, a refusal removes the folder
again, so nothing is left behind. An existing folder is never removed: its cached tokenizer is only written when
it had none.
"""

from __future__ import annotations

import contextlib
import json
from typing import Iterator

import jax
from etils import epath

from jaxpos.config.files import write_run_file
from jaxpos.config.run import RunConfig
from jaxpos.training.validate import check_run_config, run_config_warnings
from jaxpos.progress import status


def check_workdir(workdir: str) -> None:
    """Raises NotADirectoryError when WORKDIR exists and is not a folder (local or a URL)."""
    path = epath.Path(workdir)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"workdir {workdir!r} is a file, not a folder: give a new or existing folder")


class Admission:
    """What `claimed_workdir` yields: `admit(run)` once every check has passed writes the run's config.json; from
    then on the folder is the run's, whatever happens (a crash keeps its checkpoints)."""

    def __init__(self, workdir: str):
        self.workdir, self.admitted = workdir, False

    def admit(self, run: RunConfig) -> None:
        """The folder is the run's: WORKDIR/config.json (written once, by process 0) records `run` as it trains."""
        self.admitted = True
        if jax.process_index() == 0:
            write_run_file(self.workdir, "config.json", json.dumps(run.to_dict(), indent=2))


@contextlib.contextmanager
def claimed_workdir(workdir: str) -> Iterator[Admission]:
    """Makes WORKDIR (refusing a file); if this call made it (and its missing parents) and the block leaves before
    `admit()` (a refused config or data, a signal), removes them again. Process 0 removes; every process checks
    and makes (hosts without a shared disk each need the folder)."""
    check_workdir(workdir)
    path = epath.Path(workdir)
    made = path
    while not made.parent.exists() and made.parent != made:  # the outermost folder this call makes
        made = made.parent
    made = None if path.exists() else made
    path.mkdir(parents=True, exist_ok=True)
    admission = Admission(workdir)
    try:
        yield admission
    except BaseException:
        if made is not None and not admission.admitted and jax.process_index() == 0 and made.exists():
            made.rmtree()  # what the checks wrote here (a cached tokenizer) goes with it
        raise


@contextlib.contextmanager
def started_run(config, task: str, workdir: str, **typed) -> Iterator[tuple[RunConfig, Admission]]:
    """A training command's start: the run config checked once (`check_run_config`; `typed`: its `model` where
    config.model holds overrides only), its warnings printed, then WORKDIR claimed (`claimed_workdir`). Yields
    (RunConfig, Admission)."""
    run = check_run_config(config, task=task, **typed)
    for warning in run_config_warnings(run):
        status(f"warning: {warning}")
    with claimed_workdir(workdir) as admission:
        yield run, admission
