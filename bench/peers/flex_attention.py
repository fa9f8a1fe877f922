"""PyTorch FlexAttention with a learnable Toeplitz table: the strongest public peer that computes a relative-bias
table's gradient inside its kernel. `score_mod` reads table[h, kv - q + T - 1] (jaxpos's `expand_toeplitz`
convention) from a captured float32 tensor that requires grad; the backward kernel adds the table's gradient
with atomics, so it is not deterministic.

    python -m bench.peers.flex_attention --lengths 512,2048,8192    # GPU: one JSON line per length

Forward + backward of sum(out * g) to q, k, v and the table, bf16 q, k, v as [B, H, T, D], B*T = --tokens; the
median of --runs timed with CUDA events after --warmup runs (the first compiles, with torch.compile's on-disk
cache: a second process loads it).
"""

from __future__ import annotations

import argparse
import json
import statistics


# Kernel options tried in turn until one compiles: torch's defaults, then fewer pipeline stages and smaller tiles (on an
# H200 with torch 2.11, the defaults' forward with a captured float32 table asked for 245,760 bytes of shared memory,
# over the 232,448 a block may have).
KERNEL_OPTIONS = ({}, {"num_stages": 2}, {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 2})


def table_attention(q, k, v, table, flex=None, kernel_options=None):
    """FlexAttention of q, k, v [B, H, T, D] with the bias table[h, kv - q + T - 1] (table [H, 2T - 1]); `flex` is
    the compiled flex_attention (None: the eager one, for checks on the CPU)."""
    from torch.nn.attention.flex_attention import flex_attention

    center = q.shape[-2] - 1

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + table[h, kv_idx - q_idx + center]

    return (flex or flex_attention)(q, k, v, score_mod=score_mod, kernel_options=kernel_options or None)


def first_that_compiles(run):
    """(result, options) of run(options) for the first of KERNEL_OPTIONS whose kernels fit the GPU."""
    for options in KERNEL_OPTIONS:
        try:
            return run(options), options
        except Exception as error:  # noqa: BLE001 - Inductor raises its own error types
            if "out of resource" not in str(error) or options is KERNEL_OPTIONS[-1]:
                raise


def check(flex, length: int = 256, batch: int = 2, heads: int = 4, head_dim: int = 64) -> dict:
    """Relative L2 errors of the compiled peer's output, dq and table gradient against the same attention with the
    bias materialised, in float32 eager PyTorch (on the same bf16 inputs)."""
    import torch

    generator = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, g = (torch.randn(batch, heads, length, head_dim, generator=generator, device="cuda")
                  .to(torch.bfloat16) for _ in range(4))
    table = torch.randn(heads, 2 * length - 1, generator=generator, device="cuda")
    offsets = torch.arange(length, device="cuda")[None, :] - torch.arange(length, device="cuda")[:, None]

    def grads(attention, dtype):
        inputs = [x.to(dtype).requires_grad_() for x in (q, k, v)] + [table.clone().requires_grad_()]
        out = attention(*inputs)
        (out.float() * g.float()).sum().backward()
        return [out.float()] + [inputs[0].grad.float(), inputs[3].grad]

    def dense(q, k, v, table):
        logits = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + table[:, offsets + length - 1]
        return torch.softmax(logits, dim=-1) @ v

    got, options = first_that_compiles(
        lambda options: grads(lambda *x: table_attention(*x, flex=flex, kernel_options=options), torch.bfloat16))
    want = grads(dense, torch.float32)
    errors = {name: float((a - b).norm() / b.norm()) for name, a, b in zip(("out", "dq", "table"), got, want)}
    return dict(errors, kernel_options=options)


def measure(length: int, tokens: int, heads: int, head_dim: int, runs: int, warmup: int, flex) -> tuple:
    """(median ms of forward + backward at one length (B = tokens // length), the kernel options that compiled)."""
    import torch

    batch = max(1, tokens // length)
    generator = torch.Generator(device="cuda").manual_seed(length)

    def normal(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=generator, device="cuda", dtype=dtype).requires_grad_()

    q, k, v = (normal(batch, heads, length, head_dim) for _ in range(3))
    g = torch.randn(batch, heads, length, head_dim, generator=generator, device="cuda")
    table = normal(heads, 2 * length - 1, dtype=torch.float32)

    def step(options):
        out = table_attention(q, k, v, table, flex, options)
        (out.float() * g).sum().backward()

    _, options = first_that_compiles(step)
    for _ in range(warmup - 1):
        step(options)
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(options)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), options


def add_shape_arguments(parser: argparse.ArgumentParser) -> None:
    """The attention benchmarks' shared arguments: lengths, B * T, heads, head width, runs and warm-up runs."""
    parser.add_argument("--lengths", default="512,2048,8192")
    parser.add_argument("--tokens", type=int, default=16384, help="B * T")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shape_arguments(parser)
    args = parser.parse_args(argv)
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    if not torch.cuda.is_available():
        raise SystemExit("flex_attention peer: error: needs a CUDA device")
    flex = torch.compile(flex_attention, dynamic=False)
    print(json.dumps(dict(check=check(flex))), flush=True)
    for length in map(int, args.lengths.split(",")):
        try:
            ms, options = measure(length, args.tokens, args.heads, args.head_dim, args.runs, args.warmup, flex)
            result = dict(length=length, ms=ms, kernel_options=options, torch=torch.__version__)
        except Exception as error:  # noqa: BLE001 - one length failing (memory) must not hide the others
            result = dict(length=length, error=f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:80]}")
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
