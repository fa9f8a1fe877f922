"""What resuming does with a checkpoint that does not restore: an error of the storage is read again (and, if it
persists, stops the run with one line and changes nothing); only a step known to be corrupt (files missing,
partial or unparsable) is moved aside. The same policy for one run and for seeds trained at once."""

import errno
import os

import pytest

from jaxpos.training import checkpoint
from jaxpos.training.checkpoint import CheckpointError, read_failure
from tests.training import synthetic


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch):
    monkeypatch.setattr(checkpoint, "RETRY_DELAYS_S", (0.0, 0.0, 0.0))


def failing_reads(monkeypatch, error: Exception, times: int, step: int | None = None) -> list[int]:
    """Checkpointer.restore raises `error` on its first `times` reads (of `step`, or any); returns the steps read."""
    real, reads = checkpoint.Checkpointer.restore, []

    def restore(self, read_step, abstract_state):
        reads.append(read_step)
        if (step is None or read_step == step) and len([s for s in reads if step is None or s == step]) <= times:
            raise error
        return real(self, read_step, abstract_state)

    monkeypatch.setattr(checkpoint.Checkpointer, "restore", restore)
    return reads


def listing(workdir) -> dict[str, list[str]]:
    return {folder: sorted(os.listdir(workdir / folder)) for folder in ("checkpoints", "checkpoints_corrupt")
            if (workdir / folder).exists()}


def test_a_transient_read_error_is_retried_and_the_newest_step_kept(tmp_path, monkeypatch, capsys):
    synthetic.run(str(tmp_path), 10, checkpoint_every=5)
    reads = failing_reads(monkeypatch, OSError(errno.EIO, "Input/output error"), times=2)
    resumed = synthetic.run(str(tmp_path), 10, checkpoint_every=5)
    assert resumed.resumed_from == 10 and reads == [10, 10, 10]
    assert listing(tmp_path) == {"checkpoints": ["10", "5"]} and "WARNING" not in capsys.readouterr().out


@pytest.mark.parametrize("error", [OSError(errno.EIO, "Input/output error"), RuntimeError("an unexplained fault"),
                                   ValueError("UNAVAILABLE: the bucket did not answer")])
def test_a_step_that_cannot_be_read_stops_the_run_and_changes_nothing(tmp_path, monkeypatch, error):
    synthetic.run(str(tmp_path), 10, checkpoint_every=5)
    before = listing(tmp_path)
    failing_reads(monkeypatch, error, times=100)
    with pytest.raises(CheckpointError, match=r"could not read checkpoint step 10 .*nothing was moved or deleted"):
        synthetic.run(str(tmp_path), 10, checkpoint_every=5)
    assert listing(tmp_path) == before


def test_a_truncated_step_is_set_aside_with_one_readable_line(tmp_path, capsys):
    synthetic.run(str(tmp_path), 10, checkpoint_every=5)
    files = [os.path.join(root, name) for root, _, names in os.walk(tmp_path / "checkpoints" / "10" / "state")
             for name in names]
    largest = max(files, key=os.path.getsize)
    with open(largest, "r+b") as f:
        f.truncate(os.path.getsize(largest) // 2)
    capsys.readouterr()
    resumed = synthetic.run(str(tmp_path), 10, checkpoint_every=5)
    assert resumed.resumed_from == 5 and listing(tmp_path)["checkpoints"] == ["10", "5"]  # step 10 saved anew
    assert len(listing(tmp_path)["checkpoints_corrupt"]) == 1
    warnings = [line for line in capsys.readouterr().out.splitlines() if "checkpoint step 10" in line]
    # the disk says why: the file cut short, named with both sizes
    assert len(warnings) == 1 and os.path.basename(largest) in warnings[0] and "bytes, " in warnings[0]
    assert "<bound method" not in warnings[0]


def test_seeds_at_once_retry_a_transient_error_and_set_aside_a_corrupt_copy(tmp_path, monkeypatch):
    workdirs = {0: str(tmp_path / "s0"), 1: str(tmp_path / "s1")}
    synthetic.run_seeds(workdirs, 6, checkpoint_every=3)
    reads = failing_reads(monkeypatch, OSError(errno.EIO, "Input/output error"), times=1, step=6)
    assert [r.resumed_from for r in synthetic.run_seeds(workdirs, 6, checkpoint_every=3)] == [6, 6]
    assert reads[:3] == [6, 6, 6]  # seed 0's read again, then seed 1's
    monkeypatch.undo()
    monkeypatch.setattr(checkpoint, "RETRY_DELAYS_S", (0.0,))
    metadata = os.path.join(workdirs[1], "checkpoints", "6", "state", "_METADATA")
    with open(metadata, "w") as f:
        f.write("{not json")
    assert [r.resumed_from for r in synthetic.run_seeds(workdirs, 6, checkpoint_every=3)] == [3, 3]
    assert len(os.listdir(tmp_path / "s1" / "checkpoints_corrupt")) == 1
    assert not (tmp_path / "s0" / "checkpoints_corrupt").exists()


@pytest.mark.parametrize("error, kind", [
    (OSError(errno.EIO, "Input/output error"), "transient"), (TimeoutError("read timed out"), "transient"),
    (ValueError("DEADLINE_EXCEEDED: GCS"), "transient"), (FileNotFoundError(errno.ENOENT, "gone"), "corrupt"),
    (ValueError('OUT_OF_RANGE: Error reading "params.x/0.0"'), "corrupt"),
    (KeyError('Item "state" was not found in the checkpoint.'), "corrupt"),
    (RuntimeError("something else"), "unknown"), (MemoryError(), "unknown")])
def test_read_failures_are_classified_by_their_cause(error, kind):
    try:
        try:
            raise error
        except Exception as inner:
            raise Exception("Encountered error while reading array index. See details: <bound method x>") from inner
    except Exception as outer:
        assert read_failure(outer) == kind
        assert checkpoint.error_line(outer).startswith(type(error).__name__)


def delete_data_files(step_dir) -> None:
    """Every array data file of a step's state gone (its parameters' included, wherever OCDBT put them)."""
    for root, _, names in os.walk(step_dir / "state"):
        if os.path.basename(root) == "d":
            for name in names:
                os.remove(os.path.join(root, name))


def delete_largest_file(step_dir) -> str:
    files = [os.path.join(root, name) for root, _, names in os.walk(step_dir / "state") for name in names]
    largest = max(files, key=os.path.getsize)
    os.remove(largest)
    return largest


def test_a_step_with_a_data_file_missing_is_set_aside_by_what_is_on_disk(tmp_path, capsys):
    synthetic.run(str(tmp_path), 30, checkpoint_every=15)
    assert os.path.isfile(tmp_path / "checkpoints" / "30" / checkpoint.FILES_MANIFEST)
    removed = delete_largest_file(tmp_path / "checkpoints" / "30")
    capsys.readouterr()
    resumed = synthetic.run(str(tmp_path), 30, checkpoint_every=15)
    assert resumed.resumed_from == 15 and len(listing(tmp_path)["checkpoints_corrupt"]) == 1
    warnings = [line for line in capsys.readouterr().out.splitlines() if "checkpoint step 30" in line]
    assert len(warnings) == 1 and f"{os.path.relpath(removed, tmp_path / 'checkpoints' / '30')} is missing" in \
        warnings[0] and "trying step 15" in warnings[0]


def test_the_disk_decides_over_the_words_of_the_error(tmp_path):
    synthetic.run(str(tmp_path), 10, checkpoint_every=5)
    step_dir = checkpoint.checkpoint_path(tmp_path / "checkpoints") / "10"
    assert checkpoint.step_files(step_dir) == "whole"
    unexplained = RuntimeError("FAILED_PRECONDITION: something the words cannot tell")
    assert read_failure(unexplained, checkpoint.step_files(step_dir)) == "unknown"  # every file there: not corrupt
    assert read_failure(OSError(errno.EIO, "Input/output error"), "whole") == "transient"
    delete_largest_file(tmp_path / "checkpoints" / "10")
    assert checkpoint.step_files(step_dir).endswith("is missing")
    assert read_failure(unexplained, checkpoint.step_files(step_dir)) == "corrupt"


def test_a_read_only_checkpointer_skips_a_corrupt_step_and_changes_nothing(tmp_path, capsys):
    from tests.helpers import folder_digest

    synthetic.run(str(tmp_path), 30, checkpoint_every=15)
    delete_largest_file(tmp_path / "checkpoints" / "30")
    before = folder_digest(tmp_path)
    trainer = synthetic_trainer(tmp_path)
    try:
        reader = checkpoint.Checkpointer(str(tmp_path / "checkpoints"), read_only=True)
        abstract = checkpoint.abstract_like(trainer.abstract_state, trainer.seed_state_shardings)
        step, _, _ = reader.restore_latest(abstract)
        reader.close()
    finally:
        trainer.close()
    assert step == 15 and folder_digest(tmp_path) == before
    lines = [line for line in capsys.readouterr().out.splitlines() if "checkpoint step 30" in line]
    assert len(lines) == 1 and "skipped it and left it in place" in lines[0]


def synthetic_trainer(workdir):
    from jaxpos.config.run import run_config
    from jaxpos.models import BertForMaskedLM
    from jaxpos.training.loop import Trainer
    from jaxpos.training.mlm import MaskedLMTask

    run = run_config(synthetic.config(30, 15), task="mlm")
    return Trainer(run.train, str(workdir), MaskedLMTask(BertForMaskedLM(run.model), synthetic.SEQ), log=False,
                   mesh=synthetic.one_device())


def test_export_and_evaluate_skip_a_step_that_does_not_restore_and_fail_in_one_line_when_none_does(tmp_path,
                                                                                                  capsys):
    from jaxpos.cli import main
    from tests.helpers import folder_digest, one_device_training, train_tiny_mlm

    workdir = train_tiny_mlm(str(tmp_path / "run"), checkpoint_every=1)
    checkpoints = tmp_path / "run" / "checkpoints"
    delete_data_files(checkpoints / "2")
    before = folder_digest(tmp_path / "run")
    capsys.readouterr()
    with one_device_training():
        assert main(["export", "--workdir", workdir, "--out", str(tmp_path / "export")]) == 0
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if "checkpoint step 2" in line][0].endswith(
        "skipped it and left it in place; reading step 1")
    delete_data_files(checkpoints / "1")
    before = folder_digest(tmp_path / "run")
    for command in (["export", "--workdir", workdir, "--out", str(tmp_path / "export2")],
                    ["evaluate", "--workdir", workdir, "--lengths", "32"]):
        with one_device_training():
            assert main(command) == 1  # docs/training.md: a workdir where no checkpoint restores exits with 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("jaxpos: error: no checkpoint in "), err
        assert "pybind11" not in err and "Exception ignored" not in err
    assert folder_digest(tmp_path / "run") == before
