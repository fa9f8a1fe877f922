"""Test set-up: a simulated 8-device CPU host, float32 matmuls at full precision, unoptimised XLA code."""

import os

from tests.xla_flags import quick_compile_flags

# The suite's programs are tiny and compile once each: unoptimised code with XLA's older CPU emitters compiles them
# in about a third of the default's time (tests/xla_flags.py).
if "XLA_FLAGS" not in os.environ:
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count=8 {quick_compile_flags()}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The Mosaic GPU interpreter runs a kernel's three warpgroups as concurrent host callbacks on the CPU client's
# thread pool (one thread per core by default: two on CI, where they would wait on each other for ever).
os.environ.setdefault("PJRT_NPROC", "4")
# The tests expect user errors as one line: a shell's JAXPOS_DEBUG=1 would turn them into tracebacks.
os.environ.pop("JAXPOS_DEBUG", None)

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

# Identical programs (the same tiny train step in several tests, or in a killed and a resumed run) compile once.
jax.config.update("jax_compilation_cache_dir", os.path.join(os.path.dirname(__file__), "..", ".jax_cache"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def pytest_collection_modifyitems(items):
    """Tests marked `long` first: with two xdist workers, one each from the start, so that the run does not end
    on one worker finishing a long test while the other idles."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)  # a stable sort keeps the rest in order


def _compile_interpreter_threads_once():
    """jax 0.10's Pallas interpreter jits each thread's jaxpr through a function it defines anew on every call, so
    jit's cache never hits and every warpgroup of every kernel call compiles its own copy (jax 0.11 defines that
    function once). A runner defined once here made tests/attention/test_toeplitz_mosaic_gpu.py 3.6x faster on jax
    0.10 (410 s -> 115 s with two workers)."""
    from jax._src.pallas.mosaic.interpret import thread_map

    if hasattr(thread_map, "_run"):  # jax >= 0.11: already cached
        return

    def run(jaxpr, consts, *args):
        jax.core.eval_jaxpr(jaxpr, consts, *args)

    def run_jaxpr(jaxpr, consts, *args):  # as jax 0.11 runs it, with `run` the same function every time
        jax.jit(run, static_argnums=(0,)).trace(jaxpr, consts, *args).lower().compile()(consts, *args)

    thread_map._run_jaxpr = run_jaxpr


_compile_interpreter_threads_once()


@pytest.fixture(scope="module")
def one_device_training():
    """tests.helpers.one_device_training for a whole module (`pytestmark = pytest.mark.usefixtures(...)`), its
    module-scoped fixtures included."""
    from tests.helpers import one_device_training as block

    with block():
        yield
