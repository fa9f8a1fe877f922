"""The command line: a user's mistake is one line on stderr with exit status 2; faults keep their traceback."""

import os
import signal
import subprocess
import sys

import pytest

from jaxpos import cli
from jaxpos.training.interrupt import RunStopped

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "configs", "mlm", "tiny.py")
WMT_TINY = os.path.join(ROOT, "configs", "wmt", "tiny.py")


def _error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


@pytest.mark.parametrize("overrides, expected", [
    (["--config.model.position.kind=bogus"], "unknown position mechanism 'bogus'"),
    (["--config.data.source=text", "--config.data.paths=['/nonexistent/dir/*.txt']"], "matches no file"),
    (["--config.train.num_steps=many"], "--config.train.num_steps=many"),
    (["--config.model.no_such_field=1"], "unknown config field"),
    (["--config.model.positon.kind=x"], "unknown config field model.positon (did you mean model.position?)"),
    (["--config.model.attention_dropout=1.0"], "attention_dropout=1.0 must be in [0, 1)"),
    (["--config.model.num_heads=0"], "num_heads=0 must be an integer >= 1"),
    (["--config.train.batch_size=0"], "train.batch_size=0 must be an integer >= 1"),
    (["--config.data.mask_prob=1.5"], "data.mask_prob=1.5 must be in (0, 1]"),
    (["--config.model.attention_impl=cudnn", "--config.model.attention_dropout=0.1"],
     "attention dropout needs attention_impl='auto', 'xla', 'pallas' or 'mosaic_gpu', not 'cudnn'"),
    (["--config", WMT_TINY, "--config.decode.beam_size=0"], "decode.beam_size=0 must be an integer >= 1"),
    (["--config.data.eval_fraction=1.5"], "data.eval_fraction=1.5 must be in [0, 1)"),
    (["--config.model.attention_impl=pallas", "--config.model.position.kind=shaw"],
     "attention_impl='pallas' cannot compute this model's attention here: it lacks Shaw's relative vectors"),
    (["--config.model.attention_impl=cudnn", "--config.model.attention_dropout=0", "--config.model.dtype=bfloat16"],
     "attention_impl='cudnn' cannot compute this model's attention here: it lacks the cpu backend"),
    (["--config", WMT_TINY, "--config.data.max_pairs=-1"], "data.max_pairs=-1 must be an integer >= 0"),
    (["--config.model.position.kind=diet_abs", "--config.model.position.diet_abs.linformer_k=4"],
     "mixes the sequences of packed rows"),  # masked-LM rows always pack
    (["--config", WMT_TINY, "--config.model.position.kind=diet_abs", "--config.model.position.diet_abs.linformer_k=4"],
     "mixes the sequences of packed rows"),  # translation rows pack unless data.pack=False
])
def test_user_errors_are_one_line(tmp_path, capsys, overrides, expected):
    """Each refused before any data is read: the run's folder holds nothing (no tokenizer, no corpus)."""
    status = cli.main(["train", "--config", TINY, "--workdir", str(tmp_path / "run"), *overrides])
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())
    lines = _error_lines(capsys)
    assert status == 2
    assert len(lines) == 1 and lines[0].startswith("jaxpos: error: ") and expected in lines[0], lines


def test_missing_config_file_is_one_line(tmp_path, capsys):
    assert cli.main(["train", "--config", str(tmp_path / "nope.py"), "--workdir", str(tmp_path)]) == 2
    assert _error_lines(capsys) == [f"jaxpos: error: config file {str(tmp_path / 'nope.py')!r} does not exist"]


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(ValueError, match="unknown position mechanism"):
        cli.main(["--debug", "train", "--config", TINY, "--workdir", str(tmp_path),
                  "--config.model.position.kind=bogus"])
    with pytest.raises(ValueError, match="unknown position mechanism"):  # after the subcommand too
        cli.main(["train", "--config", TINY, "--workdir", str(tmp_path), "--config.model.position.kind=bogus",
                  "--debug"])


@pytest.mark.parametrize("value", ["1", "yes"])
def test_jaxpos_debug_in_the_environment_shows_the_traceback(monkeypatch, tmp_path, value):
    """The same command, unchanged, shows where a one-line error came from (a bug can raise a user error's type)."""
    monkeypatch.setenv("JAXPOS_DEBUG", value)
    with pytest.raises(ValueError, match="unknown position mechanism"):
        cli.main(["train", "--config", TINY, "--workdir", str(tmp_path), "--config.model.position.kind=bogus"])


@pytest.mark.parametrize("value", ["0", ""])
def test_jaxpos_debug_off_keeps_one_line(monkeypatch, tmp_path, capsys, value):
    monkeypatch.setenv("JAXPOS_DEBUG", value)
    assert cli.main(["train", "--config", TINY, "--workdir", str(tmp_path),
                     "--config.model.position.kind=bogus"]) == 2
    assert len(_error_lines(capsys)) == 1


def test_every_subcommand_lists_debug_and_keeps_it_from_either_side():
    [subcommands] = [a for a in cli.build_parser()._actions if a.dest == "command"]
    for name, sub in subcommands.choices.items():
        assert "--debug" in sub.format_help(), name
        assert "JAXPOS_DEBUG=1" in " ".join(sub.format_help().split()), name
    assert "JAXPOS_DEBUG=1" in " ".join(cli.build_parser().format_help().split())
    assert cli.parse_command(["--debug", "mechanisms"])[0].debug  # the subcommand's own flag does not reset it
    assert cli.parse_command(["mechanisms", "--debug"])[0].debug
    assert not cli.parse_command(["mechanisms"])[0].debug


@pytest.mark.parametrize("argv, usage, message", [
    (["train", "--config", "c.py"], "usage: jaxpos train ", "the following arguments are required: --workdir"),
    (["trian"], "usage: jaxpos ", "argument command: invalid choice: 'trian'"),
    (["train", "--config", "c.py", "--workdir", "w", "--steps", "3"], "usage: jaxpos ",
     "unrecognised arguments: --steps 3"),
    (["evaluate", "--workdir", "w", "--batch-size", "many"], "usage: jaxpos evaluate ",
     "argument --batch-size: invalid int value: 'many'"),
])
def test_usage_errors_read_like_jaxpos_errors(capsys, argv, usage, message):
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    lines = _error_lines(capsys)
    assert done.value.code == 2
    assert lines[0].startswith(usage) and lines[-1].startswith(f"jaxpos: error: {message}"), lines


@pytest.mark.parametrize("command", ["train", "finetune"])
def test_the_help_of_a_training_command_says_how_it_resumes_stops_and_exits(command):
    [subcommands] = [a for a in cli.build_parser()._actions if a.dest == "command"]
    text = " ".join(subcommands.choices[command].format_help().split())
    for said in ("the same command again resumes from the newest checkpoint in WORKDIR that restores",
                 f"({RunStopped(signal.SIGTERM).exit_status} for SIGTERM, {RunStopped(signal.SIGINT).exit_status} "
                 "for SIGINT)", "a second Ctrl-C aborts at once (130)",
                 "Exit status: 0 done; 2 a mistake in what was given",
                 "1 a run that diverged (NaN or infinite values) or a workdir where no checkpoint restores"):
        assert said in text, said


def test_errors_raised_outside_jaxpos_are_faults(monkeypatch, tmp_path):
    import numpy as np

    def broken(args, overrides):
        np.reshape(np.zeros(3), (2, 2))  # a ValueError raised inside numpy: a bug, not a user error

    monkeypatch.setattr(cli, "_mechanisms", broken)
    with pytest.raises(ValueError):
        cli.main(["mechanisms"])


def test_console_script_exit_status_and_stderr(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "jaxpos.cli", "train", "--config", TINY, "--workdir",
                           str(tmp_path), "--config.model.position.kind=bogus"],
                          capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=120)
    assert proc.returncode == 2
    from jaxpos.positions import MECHANISMS

    assert proc.stderr.strip().splitlines() == [
        f"jaxpos: error: unknown position mechanism 'bogus'; choose one of {', '.join(MECHANISMS)} (a mechanism of "
        "your own registers when its module is imported: --import MODULE, or the entry point group "
        "jaxpos.mechanisms)"]


def test_the_commands_are_listed_in_one_order_and_say_whether_they_take_overrides(capsys):
    parser = cli.build_parser()
    [subcommands] = [a for a in parser._actions if a.dest == "command"]
    listed = cli.__doc__.split(":", 1)[1].replace("\n", " ").rstrip(".").split(", ")
    assert [name.strip() for name in listed] == list(subcommands.choices)  # the description and the usage line
    takes = {name for name, sub in subcommands.choices.items() if sub.get_default("takes_overrides")}
    assert takes == {"train", "tokenizer", "finetune", "evaluate", "finetune-sweep", "probe-word-order", "translate", "compare",
                     "eval-bleu"}
    for name in takes:
        assert "Takes --config.a.b=value overrides: " in subcommands.choices[name].format_help()
    for argv in (["analyze", "--workdir", "x"], ["export", "--workdir", "x", "--out", "y"], ["curves", "x"],
                 ["reproduce", "--out", "x"], ["mechanisms"]):
        assert cli.main([*argv, "--config.model.dropout=0"]) == 2
        assert _error_lines(capsys) == [f"jaxpos: error: `jaxpos {argv[0]}` takes no --config overrides (got "
                                        "--config.model.dropout=0)"]


def test_version(capsys):
    import jaxpos

    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"jaxpos {jaxpos.__version__}\n"
