"""docs/extending.md's example mechanism, copied out of the markdown into a folder outside the checkout: registered
by `--import` (and by an installed package's entry point), it trains, evaluates at two lengths, appears in `jaxpos
mechanisms` and runs in a two-mechanism `jaxpos compare`, with no edit to jaxpos."""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import SMALL_MLM, TINY_MLM_CONFIG, extending_example

pytestmark = pytest.mark.long


def jaxpos(cwd, *argv, env=None):
    proc = subprocess.run([sys.executable, "-m", "jaxpos.cli", *argv], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})}, timeout=900)
    assert proc.returncode == 0, f"{argv}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_the_example_mechanism_runs_every_command_from_outside_the_checkout(tmp_path):
    name, source = extending_example()
    project = tmp_path / "project"
    project.mkdir()
    (project / f"{name}.py").write_text(source)
    table = jaxpos(project, "--import", name, "mechanisms", "--kinds", "capped_log,alibi", "--seq-len", "16")
    rows = {line.split()[0]: line.split() for line in table.splitlines()[1:] if line.strip()}
    assert set(rows) == {"capped_log", "alibi"} and float(rows["capped_log"][4].rstrip("*")) > 1e-5  # it acts
    small = [*SMALL_MLM, "--config.train.num_steps=2", "--config.train.eval_every=2",
             "--config.train.checkpoint_every=2"]
    jaxpos(project, "--import", name, "train", "--config", TINY_MLM_CONFIG, "--workdir", "run",
           "--config.model.position.kind=capped_log", "--config.model.position.capped_log.cap=8", *small)
    saved = json.loads((project / "run" / "config.json").read_text())["model"]["position"]
    assert saved["kind"] == "capped_log" and saved["capped_log"] == {"cap": 8, "slope": 0.5}
    jaxpos(project, "evaluate", "--import", name, "--workdir", "run", "--lengths", "32,64")
    lengths = json.loads((project / "run" / "lengths.json").read_text())
    assert [e["length"] for e in lengths["lengths"]] == [32, 64] and all("loss" in e for e in lengths["lengths"])
    jaxpos(project, "--import", name, "compare", "--config", TINY_MLM_CONFIG, "--mechanisms", "capped_log,alibi",
           "--seeds", "2", "--lengths", "1,2", "--workers", "1", "--out", "cmp", *SMALL_MLM,
           "--config.train.num_steps=2")
    numbers = json.loads((project / "cmp" / "comparison.json").read_text())
    assert numbers["rows"]["capped_log"]["label"] == "capped log distance"
    assert numbers["rows"]["capped_log"]["loss"]["n"] == 2 and set(numbers["rows"]["capped_log"]["lengths"]) == \
        {"32", "64"}


def test_an_installed_package_registers_through_its_entry_point(tmp_path):
    """No --import: a package whose metadata lists the module under the entry point group jaxpos.mechanisms."""
    name, source = extending_example()
    site = tmp_path / "site"
    (site / "capped_log_pkg-0.1.dist-info").mkdir(parents=True)
    (site / f"{name}.py").write_text(source)
    (site / "capped_log_pkg-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: capped-log-pkg\n"
                                                                    "Version: 0.1\n")
    (site / "capped_log_pkg-0.1.dist-info" / "entry_points.txt").write_text(
        f"[jaxpos.mechanisms]\ncapped_log = {name}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    table = jaxpos(elsewhere, "mechanisms", "--kinds", "capped_log", "--seq-len", "16",
                   env={"PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert table.splitlines()[1].split()[0] == "capped_log"
