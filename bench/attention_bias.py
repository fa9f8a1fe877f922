"""Attention forward+backward with and without a positional bias (a Toeplitz table, or DIET-Abs low-rank factors):
median ms, ratio to the fastest no-bias path, and the bias memory (targets 2 and 3 of bench/RESULTS.md).

    python bench/attention_bias.py                  # GPU: T = 512, 2048, 8192 with B*T = 16k, H = 12, D = 64, bf16
    python bench/attention_bias.py --runs 50 --lengths 512,2048
    python bench/attention_bias.py --cpu-smoke      # tiny shapes on the CPU (Pallas interpreter): runs every path
    python bench/attention_bias.py --causal         # every path causal (decoder self-attention)

Paths (each jitted; the gradient of sum(out * g) to q, k, v and to the table or the factors where used):
  cudnn            jax.nn.dot_product_attention(implementation="cudnn"), no bias
  cudnn+bias       the same with the table expanded to a [1, H, T, T] bf16 bias (gradient to the table through it)
  xla+table        jaxpos attend(implementation="xla"): einsum + softmax with the expanded float32 bias
  pallas           jaxpos toeplitz_attention, no table
  pallas+table     jaxpos toeplitz_attention with the table inside the kernel (table gradient summed per tile)
  pallas+diag      the same with table_grad="diagonals" (the table gradient by a kernel per head and block
                   diagonal: dS recomputed and summed over the batch, one skew per diagonal)
  pallas+dropout   pallas+table with attention dropout 0.1 (the keep mask hashed per tile, forward and backward)
  pallas+segments  pallas+table with a per-head segment table over 2 token types (a rank-1 pair term)
  cudnn+folded     DIET-Abs as the model's cudnn path runs it: P_Q [H, T, r], P_K folded into q and k (width
                   D + r, --rank, default D), v padded to the same width
  pallas+folded    the same folding through toeplitz_attention, v at its own width D
  mgpu             toeplitz_attention(backend="mosaic_gpu"): the Hopper kernels (wgmma, TMA), no table
  mgpu+table       the same with the table, read from per-block-diagonal tiles; its gradient by a kernel per
                   (head, block diagonal, split)
  mgpu+dropout     mgpu+table with attention dropout 0.1 (the same keep mask, hashed per tile in each kernel)
  mgpu+segments    mgpu+table with pallas+segments' per-head segment table (a rank-1 pair term)
  mgpu+folded      pallas+folded on the Hopper kernels
  jax-fa3          peer: jax's own FlashAttention-3 kernel in Mosaic GPU (jax.experimental.pallas.ops.gpu
                   .attention_mgpu), no bias; in float16 (its shared-memory buffers are f16 whatever the input:
                   bf16 fails to lower), the casts inside the timed step (~3 x 25 MiB of copies)
Peers in their own process (--peers), run before jax takes the GPU:
  flex             PyTorch FlexAttention with a learnable table (bench/peers/flex_attention.py: score_mod reads
                   table[h, kv - q + T - 1], the table's gradient by atomics in its backward kernel), timed with
                   CUDA events; its ratio is to the fastest jax no-bias path of the same length
Times: warm-up runs, then the median of --runs timed runs, each ended by block_until_ready. Bias memory: what
the bias (and its gradient partials) takes beside q, k, v; the table alone is H * (2T - 1) floats.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from bench.peers.flex_attention import add_shape_arguments  # noqa: E402
from jaxpos.attention import PositionalBias, attend  # noqa: E402
from jaxpos.attention.bias import LowRankFactors, ToeplitzTable  # noqa: E402
from jaxpos.attention.bias import expand_toeplitz, segment_pair_factors  # noqa: E402
from jaxpos.attention.core import fold_factors  # noqa: E402
from jaxpos.attention.kernels import toeplitz_attention  # noqa: E402
from jaxpos.attention.mask import AttentionMask  # noqa: E402
from jaxpos.compilation_cache import enable_compilation_cache  # noqa: E402


def paths(smoke: bool, blocks: dict, mgpu_options: dict | None = None, causal: bool = False):
    """name -> (positional input: None, "table" or "factors"; no-bias path; loss(q, k, v, positional, g)).
    `mgpu_options` (for kernel_registers.py): more toeplitz_attention options of the mgpu paths, and padded=True
    for piece ids whose last eighth of every row's keys is padding. `causal`: every path with a causal mask."""
    dpa_impl = None if smoke else "cudnn"  # the CPU has no cuDNN: the smoke run times the XLA composite
    blocks = dict(blocks, causal=causal)


    def kernel(q, k, v, table, padded=False, **options):
        if padded:
            ids = jnp.broadcast_to(jnp.arange(k.shape[1]) < k.shape[1] - k.shape[1] // 8, k.shape[:2])
            options.update(q_piece_ids=jnp.ones(q.shape[:2], jnp.int32), kv_piece_ids=ids.astype(jnp.int32))
        return toeplitz_attention(q, k, v, table, **options)

    def dpa(q, k, v, table, g):
        out = jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation=dpa_impl)
        return jnp.sum(out.astype(jnp.float32) * g)

    def dpa_bias(q, k, v, table, g):
        pos = jnp.arange(q.shape[1])
        bias = expand_toeplitz(table, pos, pos)[None].astype(q.dtype)  # [1, H, T, T]
        out = jax.nn.dot_product_attention(q, k, v, bias=bias, is_causal=causal, implementation=dpa_impl)
        return jnp.sum(out.astype(jnp.float32) * g)

    def xla(q, k, v, table, g):
        pos = jnp.arange(q.shape[1])
        out, _ = attend(q, k, v, bias=PositionalBias.of(ToeplitzTable(table)), q_pos=pos, k_pos=pos,
                        mask=AttentionMask(causal=causal))
        return jnp.sum(out.astype(jnp.float32) * g)

    def pallas(q, k, v, table, g):
        return jnp.sum(toeplitz_attention(q, k, v, None, **blocks).astype(jnp.float32) * g)

    def pallas_table(q, k, v, table, g, table_grad="tiles"):
        out = toeplitz_attention(q, k, v, table, table_grad=table_grad, **blocks)
        return jnp.sum(out.astype(jnp.float32) * g)

    def pallas_dropout(q, k, v, table, g):
        out = toeplitz_attention(q, k, v, table, dropout_rate=0.1, dropout_seed=jnp.int32(0), **blocks)
        return jnp.sum(out.astype(jnp.float32) * g)

    def pallas_segments(q, k, v, table, g, **options):
        types = jnp.broadcast_to(jnp.arange(q.shape[1]) >= q.shape[1] // 2, q.shape[:2]).astype(jnp.int32)
        segment_table = jnp.linspace(-1.0, 1.0, q.shape[2] * 4).reshape(q.shape[2], 2, 2)
        out = kernel(q, k, v, table, pair_bias=segment_pair_factors(segment_table, types, types),
                     **(options or blocks))
        return jnp.sum(out.astype(jnp.float32) * g)

    def dpa_folded(q, k, v, factors, g):  # the model's cudnn path (attend folds the factors, pads v)
        pos = jnp.arange(q.shape[1])
        out, _ = attend(q, k, v, bias=PositionalBias.of(LowRankFactors(*factors)), q_pos=pos, k_pos=pos,
                        mask=AttentionMask(causal=causal), implementation=dpa_impl or "jax")
        return jnp.sum(out.astype(jnp.float32) * g)

    def pallas_folded(q, k, v, factors, g, **options):
        scale = q.shape[-1] ** -0.5
        qf, kf = fold_factors(q, k, factors, scale)
        return jnp.sum(kernel(qf, kf, v, None, scale=scale, **(options or blocks)).astype(jnp.float32) * g)

    mgpu = dict(backend="mosaic_gpu", causal=causal, **(mgpu_options or {}))

    def mosaic_gpu(q, k, v, table, g, **options):
        return jnp.sum(kernel(q, k, v, table, **mgpu, **options).astype(jnp.float32) * g)

    def jax_fa3(q, k, v, table, g):
        from jax.experimental.pallas.ops.gpu import attention_mgpu as fa3
        config = fa3.TuningConfig(block_q=64, block_kv=128, max_concurrent_steps=2, block_q_dkv=64,
                                  block_kv_dkv=64, block_q_dq=64, block_kv_dq=64, causal=causal)
        half = [x.astype(jnp.float16) for x in (q, k, v)]  # its kernels stage through f16 buffers (jax 0.11.2)
        return jnp.sum(fa3.attention(*half, config).astype(jnp.float32) * g)

    return {"cudnn": (None, True, dpa), "cudnn+bias": ("table", False, dpa_bias), "xla+table": ("table", False, xla),
            "pallas": (None, True, pallas), "pallas+table": ("table", False, pallas_table),
            "pallas+diag": ("table", False, functools.partial(pallas_table, table_grad="diagonals")),
            "pallas+dropout": ("table", False, pallas_dropout), "pallas+segments": ("table", False, pallas_segments),
            "cudnn+folded": ("factors", False, dpa_folded), "pallas+folded": ("factors", False, pallas_folded),
            "mgpu": (None, True, lambda q, k, v, table, g: mosaic_gpu(q, k, v, None, g)),
            "mgpu+table": ("table", False, mosaic_gpu),
            "mgpu+dropout": ("table", False, functools.partial(mosaic_gpu, dropout_rate=0.1,
                                                               dropout_seed=jnp.int32(0))),
            "mgpu+segments": ("table", False, functools.partial(pallas_segments, **mgpu)),
            "mgpu+folded": ("factors", False, functools.partial(pallas_folded, **mgpu)),
            "jax-fa3": (None, True, jax_fa3)}


def bias_bytes(name: str, batch: int, length: int, heads: int, block_dq: int, head_dim: int, rank: int,
               causal: bool = False) -> int:
    """Bytes of the bias-related buffers of a path (not counting the attention weights of the XLA path)."""
    if name.endswith("+folded"):  # factors [H, T, r] x 2 (float32), r bf16 channels more in q, k (and cuDNN's v)
        widened = 3 if name.startswith("cudnn") else 2
        return heads * length * rank * 4 * 2 + widened * batch * length * heads * rank * 2
    if name == "cudnn+bias":
        return heads * length * length * 2  # [1, H, T, T] bf16 (and as much again for its gradient)
    if name == "xla+table":
        return heads * length * length * 4  # [H, T, T] float32 expansion
    if name in ("pallas+table", "pallas+dropout", "pallas+segments"):  # dropout: one int32 key per query row
        from jaxpos.attention.kernels.pallas import default_dq_group

        group = default_dq_group(length, length, block_dq, head_dim)  # query blocks per row of dS diagonal sums
        rows = batch * heads * (length // block_dq // group) * (length + group * block_dq) * 4
        return heads * 2 * length * 4 + rows
    if name in ("mgpu+table", "mgpu+dropout", "mgpu+segments"):
        # per block diagonal a 128 x 128 tile: bf16, bf16 transposed, and float32 gradients (one per split)
        from jaxpos.attention.kernels import mosaic_gpu as mgpu

        padded = -(-length // 128) * 128
        tiles = heads * (2 * padded // 128 - 1) * 128 * 128
        spec = mgpu.MosaicGpuSpec(scale=1.0, causal=causal, q_offset=0, t_pad=padded, s_pad=padded,
                                  use_q_ids=False, masked=False, interpret=False)
        return heads * 2 * length * 4 + tiles * (2 + 2 + 4 * mgpu.table_gradient_splits(batch, heads, 1, spec))
    if name == "pallas+diag":  # the table, and per (head, block diagonal) a window [2, b] and the skew's [b, b]
        diagonals = 2 * length // block_dq - 1
        return heads * 2 * length * 4 + heads * diagonals * (2 * block_dq + block_dq**2) * 4
    return 0


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS = ("flex",)


def flex_peer(args) -> dict[int, float | str]:
    """ms (or an error) per length of the FlexAttention peer, run in its own process before jax takes the GPU."""
    lengths = [int(x) for x in args.lengths.split(",")]
    command = [sys.executable, "-m", "bench.peers.flex_attention", "--lengths", args.lengths, "--tokens",
               str(args.tokens), "--heads", str(args.heads), "--head-dim", str(args.head_dim), "--runs",
               str(args.runs), "--warmup", str(args.warmup)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            if "check" in row:  # its output and gradients against materialised attention in float32
                check = dict(row["check"])
                options = check.pop("kernel_options")
                print("flex peer against float32 attention with the bias materialised (relative L2 error): "
                      + ", ".join(f"{name} {error:.1e}" for name, error in check.items())
                      + f"; kernel options {options or 'default'}", flush=True)
            else:
                results[row["length"]] = row.get("ms", row.get("error"))
    tail = (proc.stderr.strip().splitlines() or ["?"])[-1][:80]
    return {length: results.get(length, f"exit {proc.returncode}: {tail}") for length in lengths}


def time_path(loss, positional, q, k, v, g, warmup, runs):
    """Median ms of the jitted gradient of loss(q, k, v, positional, g) (to the positional input too, if any)."""
    argnums = (0, 1, 2) if positional is None else (0, 1, 2, 3)
    step = jax.jit(jax.grad(loss, argnums=argnums))
    for _ in range(warmup):
        jax.block_until_ready(step(q, k, v, positional, g))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(step(q, k, v, positional, g))
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shape_arguments(parser)
    parser.add_argument("--block-q", type=int, default=None, help="default: the kernel's (64 GPU, 128 TPU)")
    parser.add_argument("--block-k", type=int, default=None, help="default: the kernel's (64 GPU, 128 TPU)")
    parser.add_argument("--block-dq", type=int, default=None, help="default: the kernel's (32 GPU, 128 TPU)")
    parser.add_argument("--num-warps", type=int, default=4)
    parser.add_argument("--num-stages", type=int, default=3)
    parser.add_argument("--paths", default="cudnn,jax-fa3,cudnn+bias,xla+table,pallas,pallas+table,pallas+diag,"
                                           "pallas+dropout,pallas+segments,cudnn+folded,pallas+folded,mgpu,"
                                           "mgpu+table,mgpu+dropout,mgpu+segments,mgpu+folded")
    parser.add_argument("--rank", type=int, default=None, help="DIET-Abs factor rank r (default: the head dim)")
    parser.add_argument("--kernel-configs", default="",
                        help="tuning sweep: also time pallas+table for each BQ/BK/BDQ/WARPS/STAGES in this comma list")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny shapes, 2 runs, on the CPU (interpreter)")
    parser.add_argument("--causal", action="store_true", help="every path causal (decoder self-attention)")
    parser.add_argument("--peers", default="", help=f"comma list of peers in their own process: {', '.join(PEERS)}")
    args = parser.parse_args(argv)
    peers = [p for p in args.peers.split(",") if p]
    if set(peers) - set(PEERS):
        parser.error(f"unknown peer(s) {', '.join(sorted(set(peers) - set(PEERS)))}; choose from {', '.join(PEERS)}")
    if peers and (args.causal or args.cpu_smoke):
        parser.error("the flex peer runs non-causal attention on a GPU: leave out --causal and --cpu-smoke")
    enable_compilation_cache()
    flex = flex_peer(args) if "flex" in peers else {}  # before jax takes the GPU
    dtype = jnp.bfloat16
    if args.cpu_smoke:
        os.environ.setdefault("PJRT_NPROC", "4")  # the Mosaic GPU interpreter runs 3 warpgroups as threads
        jax.config.update("jax_platforms", "cpu")
        args.lengths, args.tokens, args.heads, args.head_dim, args.runs, args.warmup = "32", 64, 2, 16, 2, 1
        args.block_q = args.block_k = args.block_dq = 16
    blocks = dict(block_q=args.block_q, block_k=args.block_k, block_dq=args.block_dq, num_warps=args.num_warps,
                  num_stages=args.num_stages)
    default_dq = 128 if jax.default_backend() == "tpu" else 32
    rank = args.rank or args.head_dim
    available, wanted = paths(args.cpu_smoke, blocks, causal=args.causal), args.paths.split(",")
    unknown = sorted(set(wanted) - set(available))
    if unknown:
        parser.error(f"unknown path(s) {', '.join(unknown)}; choose from {', '.join(available)}")
    # No-bias paths first, so that each row prints its ratio as soon as it is measured (a cut-off run keeps them).
    chosen = {name: p for name, p in sorted(available.items(), key=lambda item: not item[1][1]) if name in wanted}
    for spec in filter(None, args.kernel_configs.split(",")):
        bq, bk, bdq, warps, stages = map(int, spec.split("/"))
        tuned = dict(block_q=bq, block_k=bk, block_dq=bdq, num_warps=warps, num_stages=stages)
        chosen[f"pallas+table {spec}"] = paths(args.cpu_smoke, tuned, causal=args.causal)["pallas+table"]
    print(f"device: {jax.devices()[0].device_kind}; H={args.heads} D={args.head_dim} B*T={args.tokens} bf16; "
          f"{'causal; ' if args.causal else ''}blocks {blocks}; median of {args.runs} runs (ms, forward+backward)")
    print(f"{'T (B)':>12} {'path':>28} {'ms':>9} {'x fastest no-bias':>18} {'bias MiB':>10}")
    for length in map(int, args.lengths.split(",")):
        batch = max(1, args.tokens // length)
        rng = np.random.default_rng(length)
        q, k, v, g = (jnp.asarray(rng.normal(size=(batch, length, args.heads, args.head_dim)), dtype)
                      for _ in range(4))
        inputs = {"table": jnp.asarray(rng.normal(size=(args.heads, 2 * length - 1)), jnp.float32),
                  "factors": tuple(jnp.asarray(rng.normal(size=(args.heads, length, rank)) / 8, jnp.float32)
                                   for _ in range(2))}
        fastest = None
        for name, (positional, no_bias, loss) in chosen.items():
            try:
                value = time_path(loss, inputs.get(positional), q, k, v, g.astype(jnp.float32), args.warmup,
                                  args.runs)
                if no_bias:
                    fastest = min(value, fastest or value)
            except Exception as error:  # one path failing (e.g. cuDNN shape limits) must not hide the others
                first_line = (str(error).splitlines() or [""])[0]  # an assert may carry no message
                value = f"{type(error).__name__}: {first_line[:60]}"
            block_dq = int(name.split()[1].split("/")[2]) if " " in name else args.block_dq or default_dq
            mib = bias_bytes(name.split()[0], batch, length, args.heads, block_dq, args.head_dim, rank,
                             args.causal) / 2**20
            print_row(length, batch, name, value, fastest, mib)
        if length in flex:  # the table and its gradient, float32
            print_row(length, batch, "flex+table (torch)", flex[length], fastest, 2 * args.heads * (2 * length - 1)
                      * 4 / 2**20)


def print_row(length: int, batch: int, name: str, value: float | str, fastest: float | None, mib: float) -> None:
    """One row: ms and its ratio to the fastest no-bias path, or the error of a path that failed."""
    if isinstance(value, float):
        ratio = f"{value / fastest:.2f}" if fastest else "-"
        print(f"{f'{length} ({batch})':>12} {name:>28} {value:9.3f} {ratio:>18} {mib:10.1f}", flush=True)
    else:
        print(f"{f'{length} ({batch})':>12} {name:>28} {'failed':>9} {value}", flush=True)


if __name__ == "__main__":
    main()
