"""A local attention layer against a global one: attention forward + backward with a window of keys around each
query (ModernBERT's local layers: window 128, 64 keys a side and the query's own) and without, at T = 1k, 4k, 8k.

    python bench/local_attention.py                  # GPU: B*T = 16k, H = 12, D = 64, bf16, window 128
    python bench/local_attention.py --lengths 1024 --paths mgpu,mgpu+table --window 256
    python bench/local_attention.py --cpu            # no GPU: tiles and FLOPs, CPU times at B = H = 1, lowering

Paths (each global and local; the gradient of sum(out * g) to q, k, v and to the table where one is used):
  xla+table     attend(implementation="xla"): einsum, softmax and the dense [T, S] mask (every entry computed)
  cudnn+table   attend(implementation="cudnn"): the model's cuDNN path, the table and the mask materialised
  cudnn-window  peer: jax.nn.dot_product_attention(local_window_size=(w/2, w/2)) on cuDNN, no table: cuDNN's own
                sliding window, no mask tensor
  pallas+table  toeplitz_attention(window=w), the Pallas kernel (Triton on a GPU, the interpreter on the CPU)
  mgpu          toeplitz_attention(window=w, backend="mosaic_gpu"): the Hopper kernels, no table
  mgpu+table    the same with the table
Columns: ms of the global and the local call (median of --runs), local / global measured, and predicted: the
tiles the path computes for the local call over the global one (the kernels' loop bounds and visit lists,
`tiles`; a dense mask computes every tile: 1.00).

--cpu: the same rows at the GPU shape with tiles visited ("dense": every entry of [T, S]) and matmul GFLOP of
forward + backward in place of the GPU's times; the XLA path and the Pallas kernel (its interpreter) timed on the
CPU at B = H = 1; the Hopper kernels lowered for CUDA (custom calls counted, lowering seconds).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from bench.peers.flex_attention import add_shape_arguments  # noqa: E402
from jaxpos.attention import PositionalBias, attend  # noqa: E402
from jaxpos.attention.bias import LowRankFactors, ToeplitzTable  # noqa: E402
from jaxpos.attention.kernels import toeplitz_attention  # noqa: E402
from jaxpos.attention.mask import AttentionMask  # noqa: E402
from jaxpos.compilation_cache import enable_compilation_cache  # noqa: E402

PATHS = ("xla+table", "cudnn+table", "cudnn-window", "pallas+table", "mgpu", "mgpu+table")
KERNELS = ("pallas+table", "mgpu", "mgpu+table")


def losses(window: int | None, interpret: bool | None = None) -> dict:
    """path -> loss(q, k, v, table, g) of a global (window None) or local call (`interpret`: the kernels', None
    from the backend)."""
    mask = AttentionMask(window=window)

    def through_attend(implementation, q, k, v, table, g):
        pos = jnp.arange(q.shape[1])
        out, _ = attend(q, k, v, bias=PositionalBias.of(ToeplitzTable(table)), q_pos=pos, k_pos=pos, mask=mask,
                        implementation=implementation)
        return jnp.sum(out.astype(jnp.float32) * g)

    def cudnn_window(q, k, v, table, g):
        sides = None if window is None else (window // 2, window // 2)
        out = jax.nn.dot_product_attention(q, k, v, local_window_size=sides, implementation="cudnn")
        return jnp.sum(out.astype(jnp.float32) * g)

    def kernel(q, k, v, table, g, **options):
        out = toeplitz_attention(q, k, v, table, window=window, interpret=interpret, **options)
        return jnp.sum(out.astype(jnp.float32) * g)

    return {"xla+table": functools.partial(through_attend, "xla"),
            "cudnn+table": functools.partial(through_attend, "cudnn"), "cudnn-window": cudnn_window,
            "pallas+table": kernel,
            "mgpu": lambda q, k, v, table, g: kernel(q, k, v, None, g, backend="mosaic_gpu"),
            "mgpu+table": functools.partial(kernel, backend="mosaic_gpu")}


def tiles(path: str, length: int, window: int | None, head_dim: int) -> tuple[int, float]:
    """(tiles, matmul FLOPs) of one (batch row, head) of forward + backward at T = S = length: the tiles each
    kernel visits by its own loop bounds or visit lists, times its products per tile; the dense paths compute
    every entry (6 products of T x S x D: q.k, P.v; dP, dV, dQ, dK). cuDNN's sliding window: counted as the
    Hopper kernels' 128-row tiles without a table (an estimate: its tiles are its own)."""
    path = "mgpu" if path == "cudnn-window" else path
    if not path.startswith(("pallas", "mgpu")):
        return 0, 6 * 2.0 * length * length * head_dim
    if path.startswith("mgpu"):
        from jaxpos.attention.kernels.mosaic_gpu import BLOCK, MosaicGpuSpec
        from jaxpos.attention.kernels.mosaic_gpu_tiles import live_within_limits

        spec = MosaicGpuSpec(scale=1.0, causal=False, q_offset=0, t_pad=length, s_pad=length, use_q_ids=False,
                             masked=False, interpret=False, half_window=None if window is None else window // 2)
        live = int(np.sum(live_within_limits(spec)))
        # forward 2 products a tile, dQ 3, dK/dV 4, the table gradient 2 (the same tiles in every kernel)
        products = 2 + 3 + 4 + (2 if path.endswith("+table") else 0)
        return live, live * products * 2.0 * BLOCK * BLOCK * head_dim
    from jaxpos.attention.kernels.pallas import PallasSpec, default_dq_group
    from jaxpos.attention.kernels.pallas_tiles import key_blocks, query_blocks

    bq = bk = 64
    b = 32  # Triton's default blocks: forward and dK/dV 64 x 64, dq and its table-gradient rows 32 x 32
    group = default_dq_group(length, length, b, head_dim)
    spec = PallasSpec(scale=1.0, causal=False, q_offset=0, half_window=None if window is None else window // 2,
                      block_q=bq, block_k=bk, block_dq=b, dq_group=group, table_grad="tiles", t_pad=length,
                      s_pad=length, use_q_pieces=False, masked=window is not None, skip_tiles=False, dropout_rate=0.0,
                      interpret=False, backend="triton", num_warps=4, num_stages=3)

    def span(first_end):
        return int(first_end[1]) - int(first_end[0])

    forward = sum(span(key_blocks(i * bq, bq, bk, spec, length // bk)) for i in range(length // bq))
    dkdv = sum(span(query_blocks(j * bk, bq, bk, spec, length // bq)) for j in range(length // bk))
    dq = group * sum(span((key_blocks(g * b, b, b, spec, length // b)[0],
                           key_blocks((g + group - 1) * b, b, b, spec, length // b)[1]))
                     for g in range(0, length // b, group))
    flops = (2 * forward + 4 * dkdv) * 2.0 * bq * bk * head_dim + 3 * dq * 2.0 * b * b * head_dim
    return forward, flops


def time_call(loss, args, warmup: int, runs: int) -> float:
    """Median ms of the jitted gradient of loss(q, k, v, table, g) to q, k, v and the table."""
    step = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
    for _ in range(warmup):
        jax.block_until_ready(step(*args))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(step(*args))
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def inputs(batch: int, length: int, heads: int, head_dim: int, dtype, seed: int = 0):
    rng = np.random.default_rng(seed + length)
    q, k, v, g = (jnp.asarray(rng.normal(size=(batch, length, heads, head_dim)), dtype) for _ in range(4))
    table = jnp.asarray(rng.normal(size=(heads, 2 * length - 1)), jnp.float32)
    return q, k, v, table, g.astype(jnp.float32)


def lowered_calls(path: str, window: int | None, batch: int, length: int, heads: int, head_dim: int):
    """(custom calls, seconds) of the Hopper kernels' forward + backward lowered for CUDA from this host."""
    shape = jax.ShapeDtypeStruct((batch, length, heads, head_dim), jnp.bfloat16)
    table = jax.ShapeDtypeStruct((heads, 2 * length - 1), jnp.float32)
    loss = losses(window, interpret=False)[path]
    start = time.perf_counter()
    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).trace(
        shape, shape, shape, table, jax.ShapeDtypeStruct(shape.shape, jnp.float32)).lower(
        lowering_platforms=("cuda",)).as_text()
    return text.count("custom_call @mosaic_gpu"), time.perf_counter() - start


def print_row(length, batch, path, global_ms, local_ms, predicted, extra=""):
    def fmt(x):
        return f"{x:10.3f}" if isinstance(x, float) else f"{x:>10}"

    ratio = f"{local_ms / global_ms:8.3f}" if isinstance(local_ms, float) and isinstance(global_ms, float) else \
        f"{'-':>8}"
    print(f"{f'{length} ({batch})':>12} {path:>14} {fmt(global_ms)} {fmt(local_ms)} {ratio} {predicted:10.3f}"
          f"{extra}", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shape_arguments(parser)
    parser.set_defaults(lengths="1024,4096,8192")
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--cpu", action="store_true", help="no GPU: tiles, FLOPs, CPU times at B = H = 1, lowering")
    parser.add_argument("--cpu-paths", default="xla+table,pallas+table", help="--cpu: the paths timed on the CPU")
    args = parser.parse_args(argv)
    wanted = [p for p in args.paths.split(",") if p]
    unknown = sorted(set(wanted) - set(PATHS))
    if unknown:
        parser.error(f"unknown path(s) {', '.join(unknown)}; choose from {', '.join(PATHS)}")
    enable_compilation_cache()
    lengths = [int(x) for x in args.lengths.split(",")]
    if args.cpu:
        return cpu_report(args, wanted, lengths)
    print(f"device: {jax.devices()[0].device_kind}; H={args.heads} D={args.head_dim} B*T={args.tokens} bf16; window "
          f"{args.window}; median of {args.runs} runs (ms, forward+backward)")
    print(f"{'T (B)':>12} {'path':>14} {'global ms':>10} {'local ms':>10} {'measured':>8} {'predicted':>10}")
    for length in lengths:
        batch = max(1, args.tokens // length)
        args_ = inputs(batch, length, args.heads, args.head_dim, jnp.bfloat16)
        for path in wanted:
            times = []
            for window in (None, args.window):
                try:
                    times.append(time_call(losses(window)[path], args_, args.warmup, args.runs))
                except Exception as error:  # one path failing (cuDNN's limits) must not hide the others
                    times.append(f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:40]}")
            predicted = predicted_ratio(path, length, args.window, args.head_dim)
            print_row(length, batch, path, *times, predicted)


def predicted_ratio(path: str, length: int, window: int, head_dim: int) -> float:
    """Local over global matmul FLOPs of the path (`tiles`)."""
    return tiles(path, length, window, head_dim)[1] / tiles(path, length, None, head_dim)[1]


def cpu_report(args, wanted: list[str], lengths: list[int]) -> None:
    """The --cpu rows: per length and path the tiles (per batch row and head, at the GPU shape) and GFLOP of the
    global and the local call, CPU times at B = H = 1, and the Hopper kernels' CUDA lowering."""
    jax.config.update("jax_platforms", "cpu")
    os.environ.setdefault("PJRT_NPROC", "4")
    timed = set(filter(None, args.cpu_paths.split(",")))
    print(f"CPU: {os.cpu_count()} cores; GPU shape H={args.heads} D={args.head_dim} B*T={args.tokens}; window "
          f"{args.window}; tiles per (batch row, head); GFLOP: forward + backward matmuls at the GPU shape; CPU ms: "
          f"B = H = 1, float32, median of {args.runs}")
    print(f"{'T (B)':>12} {'path':>14} {'tiles':>13} {'GFLOP':>15} {'predicted':>9} {'CPU ms':>21} {'measured':>8}"
          f"  CUDA lowering")
    for length in lengths:
        batch = max(1, args.tokens // length)
        small = inputs(1, length, 1, args.head_dim, jnp.float32)
        for path in wanted:
            counts = [tiles(path, length, window, args.head_dim) for window in (None, args.window)]
            flops = [c[1] * batch * args.heads / 1e9 for c in counts]
            tile_text = f"{counts[0][0]} / {counts[1][0]}" if counts[0][0] else "dense"
            ms = ["-", "-"]
            if path in timed:
                ms = [time_call(losses(window, interpret=True)[path], small, min(args.warmup, 1), args.runs)
                      for window in (None, args.window)]
            lowering = ""
            if path.startswith("mgpu"):
                low = [lowered_calls(path, window, batch, length, args.heads, args.head_dim)
                       for window in (None, args.window)]
                lowering = "  " + " / ".join(f"{calls} calls {s:.1f} s" for calls, s in low)
            measured = f"{ms[1] / ms[0]:8.3f}" if path in timed else f"{'-':>8}"
            cpu = f"{ms[0]:.1f} / {ms[1]:.1f}" if path in timed else "-"
            print(f"{f'{length} ({batch})':>12} {path:>14} {tile_text:>13} {f'{flops[0]:.4g} / {flops[1]:.4g}':>15} "
                  f"{flops[1] / flops[0]:9.3f} {cpu:>21} {measured}{lowering}", flush=True)


if __name__ == "__main__":
    main()
