"""`jaxpos reproduce` from a wheel installed outside the checkout: the configs its runs start from ship inside the
package (setup.py maps configs/ onto jaxpos/_configs)."""

import json
import os
import shutil
import site
import subprocess
import sys

import pytest

from jaxpos.reproduction.matrix import repo_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# What the wheel is built from (a copy: the build leaves build/ and jaxpos.egg-info behind, and a stale build/ of
# the checkout would put old files in the wheel).
SOURCES = ("pyproject.toml", "setup.py", "README.md", "jaxpos", "configs")


def run(args, cwd, env):
    """Runs `args` and returns its stdout; a failure shows the command's stdout and stderr."""
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{args} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_reproduce_plans_from_a_wheel_installed_outside_the_checkout(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONNOUSERSITE"] = "1"
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # jaxpos's compilation cache, away from the user's
    source = tmp_path / "source"
    source.mkdir()
    for name in SOURCES:
        if not os.path.exists(os.path.join(ROOT, name)):  # a layout without setup.py
            continue
        if os.path.isdir(os.path.join(ROOT, name)):
            shutil.copytree(os.path.join(ROOT, name), source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(os.path.join(ROOT, name), source / name)
    # Offline: the build uses this interpreter's setuptools, the install reads only the wheel.
    run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path / "wheel")], tmp_path, env)
    (wheel,) = (tmp_path / "wheel").glob("jaxpos-*.whl")

    # A fresh environment that sees this one's dependencies (jax, ...) through a .pth of plain paths: the .pth
    # files in those folders (an editable install's finder) are not processed, so jaxpos is only the wheel's.
    run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], tmp_path, env)
    python = str(tmp_path / "venv" / "bin" / "python")
    purelib = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path, env).strip()
    with open(os.path.join(purelib, "deps.pth"), "w") as f:
        f.write("\n".join(site.getsitepackages()) + "\n")
    run([python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)], tmp_path, env)
    where = run([python, "-c", "import jaxpos; print(jaxpos.__file__)"], tmp_path, env).strip()
    assert where == os.path.join(purelib, "jaxpos", "__init__.py")

    out = tmp_path / "out"
    run([python, "-m", "jaxpos.cli", "reproduce", "--profile", "micro", "--plan-only", "--out", str(out)], tmp_path,
        env)
    plan = json.loads((out / "plan.json").read_text())
    assert plan["profile"]["name"] == "micro" and plan["tokenizer"]
    assert (out / "runs.txt").read_text().split() == ["none", "tisa"]


def test_a_config_is_the_checkouts_in_a_checkout_and_a_missing_one_is_an_error():
    assert repo_config("configs/mlm/tiny.py") == os.path.join(ROOT, "configs", "mlm", "tiny.py")
    with pytest.raises(FileNotFoundError, match="neither in the installed package .* nor in a checkout"):
        repo_config("configs/mlm/missing.py")
