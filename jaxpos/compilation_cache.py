"""jax's persistent compilation cache, on for every `jaxpos` command: a program compiled once on a machine (the
Hopper kernels' BERT-base step takes 85-160 s) loads from disk in the next process that builds it.

Where it lives, in this order: $JAXPOS_COMPILATION_CACHE (a folder, or `off`: jaxpos leaves jax's setting alone), a
folder jax was already given (JAX_COMPILATION_CACHE_DIR or `jax.config`), else
`$XDG_CACHE_HOME/jaxpos/jax-VERSION-jaxlib-VERSION` (XDG_CACHE_HOME: ~/.cache where unset). jax keys each entry by
the program, its compile options, the jax and jaxlib versions, the backend and the device kind, so a stale entry is
never loaded; the versioned folder keeps each release's entries apart, so an old release's folder can be deleted
whole. The folder is also exported as JAX_COMPILATION_CACHE_DIR, so the processes a command starts share it.
"""

from __future__ import annotations

import logging
import os
import sys
from importlib import metadata

ENV = "JAXPOS_COMPILATION_CACHE"
JAX_ENV = "JAX_COMPILATION_CACHE_DIR"
OFF = ("off", "0", "false", "no", "none")

logger = logging.getLogger(__name__)


def default_folder() -> str:
    """`$XDG_CACHE_HOME/jaxpos/jax-VERSION-jaxlib-VERSION` (XDG_CACHE_HOME: ~/.cache where unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    versions = f"jax-{metadata.version('jax')}-jaxlib-{metadata.version('jaxlib')}"
    return os.path.join(base, "jaxpos", versions)


def cache_folder() -> str | None:
    """The folder `enable_compilation_cache` uses (the module docstring's order), or None when turned off."""
    chosen = os.environ.get(ENV, "").strip()
    if chosen.lower() in OFF and chosen:
        return None
    given = os.environ.get(JAX_ENV) or (sys.modules["jax"].config.jax_compilation_cache_dir
                                        if "jax" in sys.modules else None)
    return os.path.abspath(os.path.expanduser(chosen or given or default_folder()))


def enable_compilation_cache() -> str | None:
    """Turns jax's persistent compilation cache on, before the first compilation; the folder, or None (turned off,
    or the folder cannot be made: then programs compile as before)."""
    folder = cache_folder()
    if folder is None:
        return None
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as error:  # a read-only home: compile as before rather than fail the command
        logger.warning("compilation cache off: cannot create %s (%s)", folder, error)
        return None
    os.environ[JAX_ENV] = folder  # read by `import jax` here if it comes later, and by child processes
    if "jax" in sys.modules:
        sys.modules["jax"].config.update("jax_compilation_cache_dir", folder)
    return folder
