"""The persistent compilation cache every `jaxpos` command turns on: where it lives (the user's choice, then jax's,
then a per-user folder named by the jax and jaxlib versions), that a command turns it on before it compiles, and
that a compiled program lands there and loads from there in the next process."""

import os
import subprocess
import sys
from importlib import metadata

import jax
import pytest

from jaxpos import cli, compilation_cache
from tests.cli.test_main import TINY

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A fresh process that turns the cache on, compiles one program and says whether jax's cache held it.
COMPILE_ONE = """
import jax, jax.numpy as jnp
from jaxpos.compilation_cache import enable_compilation_cache
hits = []
jax.monitoring.register_event_listener(lambda event, **_: hits.append(event == "/jax/compilation_cache/cache_hits"))
print(enable_compilation_cache())
jax.jit(lambda x: jnp.sin(x) @ x.T + 1).lower(jnp.ones((8, 8))).compile()
print("hit" if any(hits) else "miss")
"""


@pytest.fixture
def jax_cache_dir():
    """Restores the suite's own cache folder after a test that changes it."""
    before = jax.config.jax_compilation_cache_dir
    yield
    jax.config.update("jax_compilation_cache_dir", before)


def test_the_folder_is_the_users_then_jaxs_then_a_versioned_one(monkeypatch, tmp_path, jax_cache_dir):
    jax.config.update("jax_compilation_cache_dir", None)
    monkeypatch.delenv(compilation_cache.JAX_ENV, raising=False)
    monkeypatch.delenv(compilation_cache.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    versions = f"jax-{metadata.version('jax')}-jaxlib-{metadata.version('jaxlib')}"
    assert compilation_cache.cache_folder() == str(tmp_path / "xdg" / "jaxpos" / versions)
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "configured"))
    assert compilation_cache.cache_folder() == str(tmp_path / "configured")
    monkeypatch.setenv(compilation_cache.JAX_ENV, str(tmp_path / "jax"))
    assert compilation_cache.cache_folder() == str(tmp_path / "jax")
    monkeypatch.setenv(compilation_cache.ENV, str(tmp_path / "mine"))
    assert compilation_cache.cache_folder() == str(tmp_path / "mine")
    for off in ("off", "OFF", "0"):
        monkeypatch.setenv(compilation_cache.ENV, off)
        assert compilation_cache.cache_folder() is None and compilation_cache.enable_compilation_cache() is None


def test_enabling_sets_jax_and_the_environment_for_child_processes(monkeypatch, tmp_path, jax_cache_dir):
    monkeypatch.setenv(compilation_cache.ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(compilation_cache.JAX_ENV, raising=False)
    assert compilation_cache.enable_compilation_cache() == str(tmp_path / "cache")
    assert os.path.isdir(tmp_path / "cache") and jax.config.jax_compilation_cache_dir == str(tmp_path / "cache")
    assert os.environ[compilation_cache.JAX_ENV] == str(tmp_path / "cache")


def test_an_unwritable_folder_leaves_the_cache_off(monkeypatch, tmp_path, jax_cache_dir):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(compilation_cache.ENV, str(tmp_path / "file" / "cache"))
    assert compilation_cache.enable_compilation_cache() is None


def test_every_command_turns_it_on_before_running(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(cli, "enable_compilation_cache", lambda: calls.append("on"))
    assert cli.main(["train", "--config", TINY, "--workdir", str(tmp_path),
                     "--config.model.position.kind=bogus"]) == 2
    assert calls == ["on"]


def test_a_program_compiled_in_one_process_loads_in_the_next(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COMPILATION", "JAXPOS_"))}
    env.update(XDG_CACHE_HOME=str(tmp_path), JAX_PLATFORMS="cpu", JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               PYTHONPATH=ROOT)
    runs = [subprocess.run([sys.executable, "-c", COMPILE_ONE], capture_output=True, text=True, env=env, cwd=ROOT,
                           timeout=120) for _ in range(2)]
    assert all(run.returncode == 0 for run in runs), runs[-1].stderr
    (folder, first), (again, second) = (run.stdout.split() for run in runs)
    assert folder == again and folder.startswith(str(tmp_path / "jaxpos" / "jax-")) and os.listdir(folder)
    assert (first, second) == ("miss", "hit")
