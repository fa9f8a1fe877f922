"""XLA flags that compile the suite's tiny programs quickly, for the test processes and the ones they start.

Imports no jax: tests/conftest.py sets XLA_FLAGS from here before the backend starts."""

import os
import subprocess
import sys

from jaxpos.reproduction.profiles import FAST_COMPILE as UNOPTIMISED  # the programs are tiny and each compiles once
# XLA's older CPU fusion emitters, in one codegen module: the suite's programs compile in about half the time
# (backend compiling fell from 286 s to 109 s over tests/models/test_decode.py, tests/positions/test_mechanisms.py
# and tests/analysis/test_taps.py; 2 AMD EPYC cores, jax 0.10.2, 2026-11-26). XLA releases without those
# emitters reject the flag, and an unknown flag aborts the process, so a child process tries them first.
OLDER_EMITTERS = "--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1"
_ACCEPTED = "JAXPOS_TESTS_QUICK_XLA_FLAGS"  # the answer, for this process's children (xdist workers among them)


def quick_compile_flags() -> str:
    """UNOPTIMISED, with OLDER_EMITTERS where this XLA accepts them."""
    if _ACCEPTED not in os.environ:
        probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices('cpu')"], capture_output=True,
                               env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=OLDER_EMITTERS), timeout=300)
        os.environ[_ACCEPTED] = f"{UNOPTIMISED} {OLDER_EMITTERS}" if probe.returncode == 0 else UNOPTIMISED
    return os.environ[_ACCEPTED]
