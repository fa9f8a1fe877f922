"""Masked-LM training throughput: jaxpos per positional mechanism beside a plain-JAX script and Hugging Face.

    python bench/train_throughput.py                     # GPU: bert_base, 32x512 and 256x128, every system
    python bench/train_throughput.py --kinds none,tisa --shapes 32x512 --peers plain_jax
    python bench/train_throughput.py --kinds none,tisa,diet_rel --impl cudnn,pallas --peers ''   # both attention paths
    python bench/train_throughput.py --kinds none,tisa --impl xla,pallas --attention-dropout 0.1 --peers 
    python bench/train_throughput.py --size tiny --shapes 4x64 --kinds none,tisa --steps 3 --peers plain_jax  # CPU

Every system trains on the same synthetic batches (15% of positions masked to the [MASK] id, token type 0
everywhere: the hot embedding rows of real data), bf16 compute with float32 parameters, dropout 0 (jaxpos:
attention dropout --attention-dropout), AdamW. Step time is the median over --steps timed steps after warm-up.
Each system runs in its own process (so that one framework's memory pool cannot starve the next). MFU counts the
model FLOPs of one step (6 x non-embedding parameters x tokens, 12 L T d per token for attention, and the MLM
head and tied logits at the masked positions only: what masked-LM needs, the same count for every system)
against the bf16 matmul rate measured in the same run (an 8192^3 product).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

SIZES = {
    "bert_base": dict(d_model=768, num_layers=12, num_heads=12, mlp_dim=3072),
    "bert_small": dict(d_model=512, num_layers=4, num_heads=8, mlp_dim=2048),
    "tiny": dict(d_model=128, num_layers=2, num_heads=4, mlp_dim=512),
}
VOCAB = 30522
MASK_ID = 4
PAPER_KINDS = "none,absolute,tisa,diet_rel,diet_abs,t5,alibi,rope"


def synthetic_batch(batch: int, seq_len: int, vocab: int, rng: np.random.Generator) -> dict:
    """Random targets, 15% of positions masked to [MASK], token type 0 (numpy arrays [batch, seq_len])."""
    targets = rng.integers(5, vocab, (batch, seq_len), dtype=np.int32)
    weights = (rng.random((batch, seq_len)) < 0.15).astype(np.float32)
    return dict(input_ids=np.where(weights > 0, MASK_ID, targets).astype(np.int32), targets=targets,
                mask_weights=weights, segment_ids=np.ones((batch, seq_len), np.int32),
                token_types=np.zeros((batch, seq_len), np.int32))


def max_predictions(seq_len: int) -> int:
    return int(seq_len * 0.15 * 1.5) + 1


def model_flops(size: str, batch: int, seq_len: int, vocab: int = VOCAB) -> float:
    """Model FLOPs of one training step (forward + backward = 3 x forward)."""
    s = SIZES[size]
    d, layers, mlp = s["d_model"], s["num_layers"], s["mlp_dim"]
    tokens = batch * seq_len
    predicted = 0.15 * tokens
    dense = layers * (4 * d * d + 2 * d * mlp)
    return 6 * dense * tokens + 12 * layers * seq_len * d * tokens + 6 * predicted * (d * d + d * vocab)


def jaxpos_trainer(kind: str, size: str, batch: int, seq_len: int, dtype: str, impl: str, workdir: str,
                   attention_dropout: float = 0.0):
    """(trainer, state, two global batches) for a jaxpos masked-LM step of this shape."""
    import jax
    import ml_collections

    from jaxpos.config import model_config
    from jaxpos.config.defaults import mesh_block, model_block, train_block
    from jaxpos.models import BertForMaskedLM
    from jaxpos.training.loop import Trainer
    from jaxpos.training.mlm import MaskedLMTask

    config = ml_collections.ConfigDict()
    config.model = model_block(vocab_size=VOCAB, max_length=max(512, seq_len), dtype=dtype, attention_impl=impl,
                               dropout=0.0, attention_dropout=attention_dropout, **SIZES[size])
    config.model.position.kind = kind
    config.data = ml_collections.ConfigDict(dict(seq_len=seq_len))
    config.train = train_block(num_steps=1000, batch_size=batch, max_predictions=max_predictions(seq_len))
    config.mesh = mesh_block()
    model = BertForMaskedLM(model_config(config.model))
    trainer = Trainer(config, workdir, MaskedLMTask(model, seq_len, config.train.max_predictions), log=False)
    state = trainer._init(jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    batches = [trainer.global_batch(synthetic_batch(batch, seq_len, VOCAB, rng)) for _ in range(2)]
    return trainer, state, batches


def time_jaxpos(kind, size, batch, seq_len, steps, dtype, impl, attention_dropout=0.0) -> dict:
    import jax

    with tempfile.TemporaryDirectory() as workdir:
        trainer, state, batches = jaxpos_trainer(kind, size, batch, seq_len, dtype, impl, workdir,
                                                 attention_dropout)
        start = time.perf_counter()
        for i in range(3):  # compile + warm-up
            state, metrics = trainer.train_step(state, batches[i % 2])
        jax.block_until_ready(metrics)
        compile_s = time.perf_counter() - start
        times = []
        for i in range(steps):
            start = time.perf_counter()
            state, metrics = trainer.train_step(state, batches[i % 2])
            jax.block_until_ready(metrics)
            times.append(time.perf_counter() - start)
        trainer.close()
    ms = statistics.median(times) * 1e3
    return dict(system="jaxpos", kind=kind, impl=impl, ms=ms, tokens_per_s=batch * seq_len / ms * 1e3,
                loss=float(metrics["loss"]), compile_s=compile_s)


def matmul_ceiling() -> dict:
    """bf16 TFLOP/s of an 8192^3 product on random data (median of 10 after warm-up)."""
    import jax
    import jax.numpy as jnp

    n = 8192 if jax.default_backend() != "cpu" else 1024
    a, b = (jax.random.normal(jax.random.PRNGKey(i), (n, n), jnp.bfloat16) for i in (0, 1))
    f = jax.jit(lambda a, b: a @ b)
    jax.block_until_ready(f(a, b))
    times = []
    for _ in range(10):
        start = time.perf_counter()
        jax.block_until_ready(f(a, b))
        times.append(time.perf_counter() - start)
    return dict(tflops=2 * n**3 / statistics.median(times) / 1e12, device=jax.devices()[0].device_kind,
                jax=jax.__version__)


def worker(args) -> None:
    """One process: the ceiling, the jaxpos mechanisms, or one peer; prints JSON lines."""
    batch, seq_len = (int(x) for x in args.shape.split("x"))
    rng = np.random.default_rng(0)
    if args.worker == "ceiling":
        results = [matmul_ceiling()]
    elif args.worker == "jaxpos":
        for impl in args.impl.split(","):
            for kind in args.kinds.split(","):
                try:
                    result = time_jaxpos(kind, args.size, batch, seq_len, args.steps, args.dtype, impl,
                                         args.attention_dropout)
                except Exception as err:  # noqa: BLE001 - one mechanism failing must not hide the others
                    result = dict(system="jaxpos", kind=kind, impl=impl,
                                  error=f"{type(err).__name__}: {str(err)[:120]}")
                print(json.dumps(result), flush=True)
        return
    elif args.worker == "plain_jax":
        from bench.peers.plain_jax_bert import measure

        data = [synthetic_batch(batch, seq_len, VOCAB, rng) for _ in range(2)]
        results = [measure(batch, seq_len, args.steps, data, size=SIZES[args.size])]
    elif args.worker == "huggingface":
        from bench.peers.hf_bert import measure

        data = [synthetic_batch(batch, seq_len, VOCAB, rng) for _ in range(2)]
        results = [measure(batch, seq_len, args.steps, data, size=SIZES[args.size])]
    else:
        raise ValueError(f"unknown worker {args.worker!r}")
    for r in results:
        print(json.dumps(r), flush=True)


def run_worker(name: str, args, shape: str, extra: list[str] = (), on_result=None) -> list[dict]:
    """Runs one worker process; each JSON line it prints is a result, handed to on_result as it arrives."""
    command = [sys.executable, "-m", "bench.train_throughput", "--worker", name, "--shape", shape, "--size",
               args.size, "--steps", str(args.steps), "--dtype", args.dtype, "--impl", args.impl,
               "--attention-dropout", str(args.attention_dropout), *extra]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    results = []
    with tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=root, env=env)
        for line in proc.stdout:
            if line.startswith("{"):
                results.append(json.loads(line))
                if on_result:
                    on_result(results[-1])
        proc.wait()
        if proc.returncode != 0 and not results:
            stderr.seek(0)
            tail = (stderr.read().strip().splitlines() or ["?"])[-1]
            results = [dict(system=name, error=f"exit {proc.returncode}: {tail[:160]}")]
            if on_result:
                on_result(results[-1])
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="bert_base", choices=SIZES)
    parser.add_argument("--shapes", default="32x512,256x128", help="comma-separated BATCHxSEQ")
    parser.add_argument("--kinds", default=PAPER_KINDS)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--impl", default="cudnn",
                        help="attention_impl for jaxpos: xla, jax, cudnn, pallas or mosaic_gpu, or a comma list "
                             "(each kind under each; 'x none' is against none under the first)")
    parser.add_argument("--peers", default="plain_jax,huggingface", help="comma list, or '' for none")
    parser.add_argument("--attention-dropout", type=float, default=0.0,
                        help="jaxpos only (BERT's recipe: 0.1; xla and pallas have it, cudnn does not)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    args = parser.parse_args()
    from jaxpos.config.model import ATTENTION_IMPLS
    unknown = set(args.impl.split(",")) - set(ATTENTION_IMPLS)
    if unknown:
        parser.error(f"--impl: unknown attention_impl {sorted(unknown)}; choose from {', '.join(ATTENTION_IMPLS)}")
    if args.worker:
        return worker(args)

    ceiling = run_worker("ceiling", args, "1x1")[0]  # a failed worker returns its error instead
    print(f"device: {ceiling.get('device')}  jax {ceiling.get('jax')}  bf16 matmul ceiling "
          f"{ceiling.get('tflops', float('nan')):.0f} TFLOP/s  size={args.size} attention_impl={args.impl}  "
          f"attention_dropout={args.attention_dropout}  "
          f"median of {args.steps} steps", flush=True)
    print_header()
    for shape in args.shapes.split(","):
        batch, seq_len = (int(x) for x in shape.split("x"))
        flops = model_flops(args.size, batch, seq_len)
        results: list[dict] = []

        def show(result):
            results.append(result)
            print_rows(shape, flops, [result], results, ceiling.get("tflops"))

        run_worker("jaxpos", args, shape, ["--kinds", args.kinds], on_result=show)
        for peer in filter(None, args.peers.split(",")):
            run_worker(peer, args, shape, on_result=show)
        summary(shape, results)


def summary(shape: str, results: list[dict]) -> None:
    """One line per shape: jaxpos none against each peer, and the mechanisms' spread around none."""
    first_impl = next((r["impl"] for r in results if "impl" in r), None)
    timed = {(r.get("system"), r.get("kind", "-") + ("" if r.get("impl", first_impl) == first_impl
                                                     else f" ({r['impl']})")): r["tokens_per_s"]
             for r in results if "ms" in r}
    none = timed.get(("jaxpos", "none"))
    if not none:
        return
    peers = [f"{name} {tps / 1e3:.0f}k (jaxpos none at {none / tps:.2f}x)" for (name, _), tps in timed.items()
             if name != "jaxpos"]
    worst = max(((none / tps, kind) for (name, kind), tps in timed.items() if name == "jaxpos"), default=None)
    parts = [f"jaxpos none {none / 1e3:.0f}k tokens/s", *peers]
    if worst:
        parts.append(f"slowest mechanism {worst[1]} x{worst[0]:.2f} step time of none")
    print(f"{shape}: " + "; ".join(parts), flush=True)


def print_header() -> None:
    print(f"{'system':<14} {'mechanism':<10} {'shape':>8} {'step ms':>8} {'tokens/s':>10} {'x none':>7} "
          f"{'MFU':>6}  note", flush=True)


def print_rows(shape: str, flops: float, rows: list[dict], context: list[dict], ceiling_tflops) -> None:
    """Rows of the table; 'x none' is the step time over jaxpos none's (context: every result of the shape)."""
    none = next((r["ms"] for r in context if r.get("kind") == "none" and "ms" in r), None)
    for r in rows:
        name, kind = r.get("system", "?"), r.get("kind", "-")
        if "ms" not in r:
            print(f"{name:<14} {kind:<10} {shape:>8} {'failed':>8}  {r.get('error', '')}", flush=True)
            continue
        vs_none = f"{r['ms'] / none:.2f}" if none else "-"
        mfu = f"{flops / (r['ms'] * 1e-3) / (ceiling_tflops * 1e12):.1%}" if ceiling_tflops else "-"
        note = f"{r['impl']}, compile {r['compile_s']:.0f}s" if "compile_s" in r else r.get("attention", "")
        print(f"{name:<14} {kind:<10} {shape:>8} {r['ms']:8.1f} {r['tokens_per_s']:10,.0f} {vs_none:>7} "
              f"{mfu:>6}  {note}", flush=True)


if __name__ == "__main__":
    main()
