"""Where a jaxpos masked-LM step spends its GPU time: a jax.profiler trace of a few steps, kernel time summed
by name (the table RESULTS.md quotes before and after each change).

    python -m bench.profile_step --kind none --shape 32x512 --steps 3 [--impl cudnn] [--top 25] [--out DIR]
    python -m bench.profile_step --kind tisa --impl xla --attention-dropout 0.1   # a shipped recipe's step

Kernel names come from the trace's device streams (the XLA fusion or library kernel that ran); times are per
step. The trace stays in --out for TensorBoard or Perfetto.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import tempfile

import jax

from bench.train_throughput import SIZES, jaxpos_trainer


def kernel_times(trace_path: str) -> dict[str, float]:
    """Total microseconds per kernel name over the device-stream events of a Perfetto JSON trace."""
    with gzip.open(trace_path, "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    process = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    thread = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
              if e.get("ph") == "M" and e.get("name") == "thread_name"}
    totals: dict[str, float] = collections.defaultdict(float)
    for e in events:
        if e.get("ph") != "X":
            continue
        where = process.get(e["pid"], "")
        lane = thread.get((e["pid"], e.get("tid")), "")
        if "GPU" in where and "Stream" in lane:
            totals[e["name"]] += float(e.get("dur", 0.0))
    return totals


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kind", default="none")
    parser.add_argument("--size", default="bert_base", choices=SIZES)
    parser.add_argument("--shape", default="32x512")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--impl", default="cudnn")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--attention-dropout", type=float, default=0.0)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", default=None, help="trace directory (default: a temporary one)")
    args = parser.parse_args()
    batch, seq_len = (int(x) for x in args.shape.split("x"))
    out = args.out or tempfile.mkdtemp(prefix="jaxpos_profile_")
    with tempfile.TemporaryDirectory() as workdir:
        trainer, state, batches = jaxpos_trainer(args.kind, args.size, batch, seq_len, args.dtype, args.impl,
                                                 workdir, args.attention_dropout)
        for i in range(3):
            state, metrics = trainer.train_step(state, batches[i % 2])
        jax.block_until_ready(metrics)
        with jax.profiler.trace(out, create_perfetto_trace=True):
            for i in range(args.steps):
                state, metrics = trainer.train_step(state, batches[i % 2])
            jax.block_until_ready(metrics)
        trainer.close()
    traces = sorted(glob.glob(os.path.join(out, "**", "perfetto_trace.json.gz"), recursive=True))
    if not traces:
        raise SystemExit(f"no perfetto_trace.json.gz under {out}")
    totals = kernel_times(traces[-1])
    total = sum(totals.values()) / args.steps / 1e3
    print(f"{args.kind} {args.shape} impl={args.impl} attention_dropout={args.attention_dropout}: GPU kernel time {total:.1f} ms/step over {len(totals)} "
          f"kernel names ({args.steps} steps; trace in {out})")
    print(f"{'ms/step':>8} {'share':>6}  kernel")
    for name, us in sorted(totals.items(), key=lambda kv: -kv[1])[:args.top]:
        ms = us / args.steps / 1e3
        print(f"{ms:8.2f} {ms / total:6.1%}  {name[:110]}")


if __name__ == "__main__":
    main()
