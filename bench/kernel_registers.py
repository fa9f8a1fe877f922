"""Registers and spills of the Mosaic GPU attention kernels, as ptxas reports them for sm_90a, per benchmark path.

    python bench/kernel_registers.py                       # attention_bias.py's mgpu paths and jax-fa3, T = 512
    python bench/kernel_registers.py --lengths 512,8192 --head-dim 128 --paths mgpu+table,mgpu+dropout
    python bench/kernel_registers.py --paths mgpu+table --masks causal,padded   # masked variants (or window)

Each path of `bench/attention_bias.py` is lowered for CUDA (forward and backward, the same jitted gradient that
the benchmark times), and each Mosaic GPU kernel in it is compiled by the CUDA plugin's own compiler
(`MosaicGpuCompile`: Mosaic's passes, LLVM's NVPTX backend, then ptxas with `MOSAIC_GPU_DUMP_PTXAS`), one
subprocess per kernel. The table gives what ptxas prints for the kernel: registers at launch (the consumers raise
theirs to 240 with setmaxnreg, the producer lowers its to 24), stack frame and spill bytes. Spill bytes count
the whole kernel: a few scalars kept across the prologue or the producer's loop cost little, spills in the
consumers' loop (values the tile's registers did not hold) cost most; none is the aim.

Needs the CUDA plugin of the installed jax (`pip install jax-cuda13-plugin==<jax version>`, or the cuda12 one)
and ptxas (`pip install nvidia-cuda-nvcc`, or `--cuda-root`). It runs without a GPU: the compiler asks the
driver only for the compute capability before ptxas runs, so where no driver is installed the script builds a
stand-in `libcuda.so.1` (with `cc`) that answers 9.0 and refuses to load the module afterwards.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import importlib.util
import os
import pathlib
import re
import subprocess
import sys
import tempfile

_DRIVER_STAND_IN = r"""
typedef int CUresult;
CUresult cuInit(unsigned int flags) { return 0; }
CUresult cuCtxGetDevice(int *device) { *device = 0; return 0; }
CUresult cuDeviceGet(int *device, int ordinal) { *device = 0; return 0; }
CUresult cuDeviceGetAttribute(int *value, int attribute, int device) {
  *value = attribute == 75 ? 9 : 0;  /* compute capability major 9, minor 0 */
  return 0;
}
CUresult cuGetErrorString(CUresult error, const char **text) {
  *text = "no GPU (kernel_registers.py stand-in)";
  return 0;
}
CUresult cuGetErrorName(CUresult error, const char **text) { *text = "CUDA_ERROR_NO_DEVICE"; return 0; }
CUresult cuModuleLoadData(void **module, const void *image) { return 100; }
"""

_PTXAS_STATS = {"kernel": r"entry function '(\w+)'", "registers": r"Used (\d+) registers",
                "stack": r"(\d+) bytes stack frame", "spill stores": r"(\d+) bytes spill stores",
                "spill loads": r"(\d+) bytes spill loads"}


def _plugin_library(explicit: str | None) -> str:
    """Path of the CUDA PJRT plugin's shared library (which carries MosaicGpuCompile)."""
    if explicit:
        return explicit
    for name in ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12"):
        spec = importlib.util.find_spec(name)
        if spec and spec.origin:
            return str(pathlib.Path(spec.origin).parent / "xla_cuda_plugin.so")
    raise SystemExit("kernel_registers: error: no CUDA plugin; pip install jax-cuda13-plugin==<jax version>")


def _cuda_root(explicit: str | None) -> str | None:
    """The CUDA tree whose bin/ptxas Mosaic runs: --cuda-root, else the nvidia-cuda-nvcc wheel's, else Mosaic's own
    search."""
    if explicit:
        return explicit
    for name in ("nvidia.cu13", "nvidia.cuda_nvcc"):
        try:
            spec = importlib.util.find_spec(name)
        except ModuleNotFoundError:
            continue
        for location in (spec.submodule_search_locations or []) if spec else []:
            if (pathlib.Path(location) / "bin" / "ptxas").exists():
                return location
    return None


def _driver_stand_in(workdir: pathlib.Path) -> str | None:
    """A directory holding the stand-in libcuda.so.1 when this machine has no CUDA driver, else None."""
    if ctypes.util.find_library("cuda"):
        return None
    source = workdir / "libcuda_stand_in.c"
    source.write_text(_DRIVER_STAND_IN)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(workdir / "libcuda.so.1"), str(source)], check=True)
    return str(workdir)


def _compile_module(library: str, module_file: str) -> None:
    """Subprocess body: compile one serialized Mosaic GPU module; ptxas's report goes to stderr."""
    compile_module = ctypes.CDLL(library).MosaicGpuCompile
    compile_module.argtypes = [ctypes.c_char_p, ctypes.c_int]
    compile_module.restype = ctypes.c_void_p
    module = pathlib.Path(module_file).read_bytes()
    compile_module(module, len(module))


def lowered_modules(loss, positional, shapes) -> list[bytes]:
    """The serialized Mosaic GPU modules of jit(grad(loss)) lowered for CUDA, in lowering order."""
    import jax
    from jax.experimental.mosaic.gpu import core as mosaic_core

    argnums = (0, 1, 2) if positional is None else (0, 1, 2, 3)
    mosaic_core.KNOWN_KERNELS.clear()  # the lowering registers each kernel's module here
    q, k, v, table, factors, g = shapes
    inputs = {"table": table, "factors": factors}.get(positional)
    jax.jit(jax.grad(loss, argnums=argnums)).trace(q, k, v, inputs, g).lower(lowering_platforms=("cuda",))
    return list(mosaic_core.KNOWN_KERNELS.values())


def ptxas_report(module: bytes, library: str, env: dict, workdir: pathlib.Path) -> dict:
    """ptxas's statistics of one module (_PTXAS_STATS keys; "error" with the output's tail when absent)."""
    path = workdir / "module.mlirbc"
    path.write_bytes(module)
    run = subprocess.run([sys.executable, __file__, "--compile-module", str(path), "--plugin", library], env=env,
                         capture_output=True, text=True, timeout=600)
    output = run.stdout + run.stderr
    stats = {key: (m.group(1) if (m := re.search(pattern, output)) else None) for key, pattern in _PTXAS_STATS.items()}
    if stats["registers"] is None:
        stats["error"] = " ".join(output.split()[-12:])
    return stats


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="512")
    parser.add_argument("--tokens", type=int, default=16384, help="B * T")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--paths", default="mgpu,mgpu+table,mgpu+dropout,mgpu+segments,mgpu+folded,jax-fa3")
    parser.add_argument("--masks", default="", help="the mgpu paths with these masks: causal, padded (piece ids), "
                                                    "window (a local window of 128)")
    parser.add_argument("--plugin", default=None, help="xla_cuda_plugin.so (default: the installed CUDA plugin's)")
    parser.add_argument("--cuda-root", default=None, help="a CUDA tree with bin/ptxas (default: nvidia-cuda-nvcc's)")
    parser.add_argument("--compile-module", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.compile_module:
        return _compile_module(args.plugin, args.compile_module)

    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # lowering for CUDA needs no GPU; don't start one
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
    from bench.attention_bias import paths

    library = _plugin_library(args.plugin)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="kernel_registers_"))
    env = dict(os.environ, MOSAIC_GPU_DUMP_PTXAS="1")
    if (root := _cuda_root(args.cuda_root)) is not None:
        env["MOSAIC_GPU_CUDA_ROOT"] = root
    if (stand_in := _driver_stand_in(workdir)) is not None:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [stand_in, env.get("LD_LIBRARY_PATH")]))
    ptxas = pathlib.Path(root or "", "bin", "ptxas")
    version = "Mosaic's default"
    if ptxas.exists():
        found = re.search(r"V[\d.]+", subprocess.run([str(ptxas), "--version"], capture_output=True, text=True).stdout)
        version = found.group(0) if found else "unknown version"
    print(f"jax {jax.__version__}; ptxas {version}; sm_90a; H={args.heads} D={args.head_dim} B*T={args.tokens} bf16"
          f"{'; masks ' + args.masks if args.masks else ''}; "
          f"{'driver stand-in (no GPU)' if stand_in else 'CUDA driver'}")
    print("| T (B) | path | kernel | registers | stack B | spill stores B | spill loads B |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    masks = set(filter(None, args.masks.split(",")))
    known = {"causal", "padded", "window"}
    if masks - known:
        raise SystemExit(f"kernel_registers: error: unknown masks {sorted(masks - known)}")
    options = dict(interpret=False, padded="padded" in masks, window=128 if "window" in masks else None)
    chosen = paths(False, {}, options, causal="causal" in masks)
    for length in map(int, args.lengths.split(",")):
        batch = max(1, args.tokens // length)
        act = jax.ShapeDtypeStruct((batch, length, args.heads, args.head_dim), jnp.bfloat16)
        shapes = (act, act, act, jax.ShapeDtypeStruct((args.heads, 2 * length - 1), jnp.float32),
                  (jax.ShapeDtypeStruct((args.heads, length, args.head_dim), jnp.float32),) * 2,
                  jax.ShapeDtypeStruct(act.shape, jnp.float32))
        for name in args.paths.split(","):
            positional, _, loss = chosen[name]
            try:
                modules = lowered_modules(loss, positional, shapes)
            except NotImplementedError as error:  # jax-fa3 has no causal backward (jax 0.11.2)
                print(f"| {length} ({batch}) | {name} | - | not lowered: {str(error).splitlines()[0]} | | | |")
                continue
            for module in modules:
                stats = ptxas_report(module, library, env, workdir)
                kernel = (stats["kernel"] or "?").removesuffix("_mosaic_gpu_kernel").removesuffix("_kernel")
                if "error" in stats:
                    print(f"| {length} ({batch}) | {name} | {kernel} | failed: {stats['error']} | | | |", flush=True)
                    continue
                print(f"| {length} ({batch}) | {name} | {kernel} | {stats['registers']} | {stats['stack']} | "
                      f"{stats['spill stores']} | {stats['spill loads']} |", flush=True)


if __name__ == "__main__":
    main()
