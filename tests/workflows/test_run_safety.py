"""A run folder that nothing corrupts: a refused command leaves it byte for byte as it was (or makes none), and
SIGTERM or SIGINT, before or after the first evaluation, checkpoints the step in progress, says so in one line and
exits with 128 + the signal's number; the run then resumes."""

import os
import signal
import subprocess
import sys
import time

import pytest

from jaxpos import cli
from tests.helpers import SMALL_MLM, TINY_MLM_CONFIG, folder_digest, one_device_training, train_tiny_mlm
from tests.xla_flags import quick_compile_flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = TINY_MLM_CONFIG
SMALL = SMALL_MLM


def error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def tisa_run(tmp_path_factory):
    return train_tiny_mlm(str(tmp_path_factory.mktemp("tisa") / "run"))


def test_a_refused_resume_leaves_the_run_folder_as_it_was(tisa_run, capsys):
    before = folder_digest(tisa_run)
    assert "config.json" in before and "checkpoints/2" in before
    with one_device_training():
        status = cli.main(["train", "--config", TINY, "--workdir", tisa_run, *SMALL,
                           "--config.model.position.kind=diet_rel", "--config.train.num_steps=4"])
    assert status == 2
    captured = capsys.readouterr()
    assert "was saved for another model (model.position.kind: 'tisa' in the checkpoint, 'diet_rel'" in \
        captured.err.strip().splitlines()[-1]
    assert "data (" not in captured.out and "tokenizer:" not in captured.out  # refused before reading the corpus
    assert folder_digest(tisa_run) == before
    from jaxpos.run import Run  # the run still reads as the model its checkpoints hold

    assert Run.open(tisa_run).model_config.position.kind == "tisa"


def test_a_resume_refused_by_its_data_position_leaves_the_folder_as_it_was(tisa_run, capsys):
    """Another batch size passes every check of the model and tokenizer but not the data position the checkpoint
    saved, which is restored with the state: still before the run writes anything."""
    before = folder_digest(tisa_run)
    with one_device_training():
        status = cli.main(["train", "--config", TINY, "--workdir", tisa_run, *SMALL, "--config.train.batch_size=16",
                           "--config.train.num_steps=4"])
    assert status == 2 and "data position" in error_lines(capsys)[-1]
    assert folder_digest(tisa_run) == before


def test_a_refused_new_run_leaves_no_folder(tmp_path, capsys):
    """Refused after its tokenizer was trained (the corpus packs into fewer rows than one batch): the folder this
    command made goes again; an existing one keeps only what it held."""
    workdir = tmp_path / "new" / "run"
    with one_device_training():
        status = cli.main(["train", "--config", TINY, "--workdir", str(workdir), *SMALL,
                           "--config.train.batch_size=4096"])
    assert status == 2 and "fewer than one global batch" in error_lines(capsys)[-1]
    assert not (tmp_path / "new").exists()  # nor the parent it made
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "notes.txt").write_text("mine")
    assert cli.main(["train", "--config", TINY, "--workdir", str(existing), "--config.data.source=bibel"]) == 2
    assert error_lines(capsys) == ["jaxpos: error: data.source='bibel'; choose 'embedded', 'text', 'tfds' or 'bible'"]
    assert sorted(os.listdir(existing)) == ["notes.txt"]


def test_a_workdir_that_is_a_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "file"
    path.write_text("not a folder")
    assert cli.main(["train", "--config", TINY, "--workdir", str(path)]) == 2
    assert error_lines(capsys) == [f"jaxpos: error: workdir {str(path)!r} is a file, not a folder: give a new or "
                                   "existing folder"]
    assert cli.main(["analyze", "--workdir", str(path)]) == 2
    assert error_lines(capsys) == [f"jaxpos: error: workdir {str(path)!r} is a file, not a run's folder"]
    assert path.read_text() == "not a folder"


def test_a_warmup_longer_than_the_run_is_a_one_line_warning(tmp_path, capsys):
    from jaxpos.config.defaults import mlm_config
    from jaxpos.training.validate import run_config_warnings

    config = mlm_config()
    config.train.update(num_steps=200, warmup_steps=300, learning_rate=2e-3)
    assert run_config_warnings(config) == [
        "train.warmup_steps=300 is more than train.num_steps=200: the learning rate never reaches its peak "
        "train.learning_rate=0.002 (it stops at 66% of it); lower train.warmup_steps or set it to None to use "
        "train.warmup_fraction"]
    config.train.warmup_steps = 200
    assert run_config_warnings(config) == []
    config.train.warmup_steps = None  # warmup_fraction is at most 1
    assert run_config_warnings(config) == []


# --- signals, in a real process ----------------------------------------------------------------------------------

def start_training(workdir, *overrides) -> subprocess.Popen:
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=quick_compile_flags(), PYTHONUNBUFFERED="1",
               JAX_COMPILATION_CACHE_DIR=os.path.join(ROOT, ".jax_cache"))
    return subprocess.Popen([sys.executable, "-c", AS_IN_A_TERMINAL, "train", "--config", TINY, "--workdir",
                             str(workdir), *SMALL, "--config.train.num_steps=100000", "--config.train.log_every=1",
                             "--config.train.checkpoint_every=100000", *overrides],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


# `jaxpos` with SIGINT and SIGTERM at their defaults, as in a terminal's foreground: a suite run as a background job
# passes them on ignored, and an ignored signal stays ignored.
AS_IN_A_TERMINAL = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                    "signal.signal(signal.SIGTERM, signal.SIG_DFL); from jaxpos.cli import main; sys.exit(main())")


def signal_when(proc: subprocess.Popen, seen: str, signum: int, timeout: float = 240) -> list[str]:
    """Sends `signum` once a line of the process's output contains `seen`; returns the lines read until then."""
    lines, deadline = [], time.time() + timeout
    for line in proc.stdout:
        lines.append(line)
        if seen in line:
            proc.send_signal(signum)
            return lines
        assert time.time() < deadline, "".join(lines)
    raise AssertionError(f"the run ended before {seen!r}:\n{''.join(lines)}{proc.stderr.read()}")


def saved_steps(workdir) -> list[int]:
    return sorted(int(d) for d in os.listdir(workdir / "checkpoints") if d.isdigit())


@pytest.mark.long
def test_sigint_and_sigterm_before_and_after_the_first_evaluation_checkpoint_and_exit_cleanly(tmp_path):
    workdir = tmp_path / "run"
    # Ctrl-C before the first evaluation (at step 1000): the step in progress is saved.
    proc = start_training(workdir, "--config.train.eval_every=1000")
    signal_when(proc, "[train step 3/", signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    first = saved_steps(workdir)
    assert len(first) == 1 and first[0] >= 3
    assert err.strip().splitlines() == [f"jaxpos: stopped by SIGINT: checkpointed step {first[0]} in {workdir}/"
                                        "checkpoints; run the same command again to resume"]
    # SIGTERM after an evaluation: resumed from the saved step, evaluated, then stopped and saved again.
    proc = start_training(workdir, f"--config.train.eval_every={first[0] + 2}")
    lines = signal_when(proc, "[eval step", signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert any(f"resumed from checkpoint step {first[0]}" in line for line in lines)
    assert proc.returncode == 143, err
    second = saved_steps(workdir)
    assert second[-1] >= first[0] + 2
    assert err.strip().splitlines() == [f"jaxpos: stopped by SIGTERM: checkpointed step {second[-1]} in {workdir}/"
                                        "checkpoints; run the same command again to resume"]
    assert "Traceback" not in out + err


def test_the_loop_defers_a_stop_and_a_second_ctrl_c_aborts():
    from jaxpos.training.interrupt import RunStopped, deferred_stop, stop_on_signals

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    ignored = {s for s, handler in before.items() if handler is signal.SIG_IGN}
    for s in ignored:  # as in a terminal, where this suite may run as a background job that ignores them
        signal.signal(s, signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL)
    watching = {s: signal.getsignal(s) for s in before}
    with stop_on_signals():
        with deferred_stop() as stop:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)  # the handler runs between bytecodes
            assert stop.signum == signal.SIGTERM
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.01)
        with pytest.raises(RunStopped) as stopped:  # outside the loop: at once
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
        assert stopped.value.exit_status == 143 and stopped.value.step is None
    assert {s: signal.getsignal(s) for s in before} == watching  # the handlers as they were
    for s in ignored:
        signal.signal(s, signal.SIG_IGN)


def test_an_ignored_ctrl_c_stays_ignored():
    """A background job of a shell starts with SIGINT ignored: jaxpos keeps it so (as Python does), and a Ctrl-C
    at the terminal leaves the job running."""
    from jaxpos.training.interrupt import deferred_stop, stop_on_signals

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with stop_on_signals(), deferred_stop() as stop:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
            assert stop.signum is None
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_run_resumed_at_its_last_step_evaluates_it_again(tmp_path):
    """A run stopped right after its last step (checkpointed, then stopped before its report) is complete on
    resume: the last step is evaluated again, so the report holds the same held-out scores."""
    import json

    workdir = train_tiny_mlm(str(tmp_path / "run"))
    report = json.load(open(os.path.join(workdir, "report.json")))
    os.remove(os.path.join(workdir, "report.json"))  # as a stop after the last checkpoint leaves the folder
    train_tiny_mlm(workdir)
    again = json.load(open(os.path.join(workdir, "report.json")))
    assert again["step"] == report["step"] == 2 and again["eval"] == pytest.approx(report["eval"])
