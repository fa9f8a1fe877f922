"""A training command's hold on its workdir: a refused command leaves the folder as it found it.

Every check that can refuse a run (the config, the data, the tokenizer's vocabulary, the checkpoint's model, the
mesh) comes before the run writes its own files (config.json, TensorBoard events, checkpoints). What the checks
themselves may write is the cached tokenizer; in a folder this command created, a refusal removes the folder
again, so nothing is left behind. An existing folder is never removed: its cached tokenizer is only written when
it had none.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import jax
from etils import epath


def check_workdir(workdir: str) -> None:
    """Raises NotADirectoryError when WORKDIR exists and is not a folder (local or a URL)."""
    path = epath.Path(workdir)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"workdir {workdir!r} is a file, not a folder: give a new or existing folder")


class Admission:
    """What `claimed_workdir` yields: call `admit()` once every check has passed; from then on the folder is the
    run's, whatever happens (a crash keeps its checkpoints)."""

    def __init__(self):
        self.admitted = False

    def admit(self) -> None:
        self.admitted = True


@contextlib.contextmanager
def claimed_workdir(workdir: str) -> Iterator[Admission]:
    """Makes WORKDIR (refusing a file); if this call made it and the block leaves before `admit()` (a refused
    config or data, a signal), removes it again. Process 0 makes and removes; every process checks."""
    check_workdir(workdir)
    path = epath.Path(workdir)
    made = not path.exists()
    if made:
        path.mkdir(parents=True, exist_ok=True)
    admission = Admission()
    try:
        yield admission
    except BaseException:
        if made and not admission.admitted and jax.process_index() == 0 and path.exists():
            path.rmtree()  # what the checks wrote here (a cached tokenizer) goes with it
        raise
