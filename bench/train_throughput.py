"""Masked-LM training throughput per positional mechanism: tokens/s and step time of the jitted train step.

    python bench/train_throughput.py                       # bert_base, 32x512 and 256x128, every mechanism
    python bench/train_throughput.py --size tiny --shapes 8x128 --kinds tisa,diet_rel --steps 5

Runs on whatever device JAX sees (CPU, GPU, TPU); synthetic batches (15% masked), bf16 compute with float32
parameters unless --dtype float32. Step time is the median over --steps timed steps after two warm-up steps.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import jax
import numpy as np

from jaxpos.config import POSITION_KINDS, model_config
from jaxpos.config.defaults import mesh_block, model_block, train_block
from jaxpos.models import BertForMaskedLM
from jaxpos.training.loop import Trainer
from jaxpos.training.mlm import MaskedLMTask

SIZES = {
    "bert_base": dict(d_model=768, num_layers=12, num_heads=12, mlp_dim=3072),
    "bert_small": dict(d_model=512, num_layers=4, num_heads=8, mlp_dim=2048),
    "tiny": dict(d_model=128, num_layers=2, num_heads=4, mlp_dim=512),
}


def synthetic_batch(batch: int, seq_len: int, vocab: int, rng: np.random.Generator) -> dict:
    targets = rng.integers(5, vocab, (batch, seq_len), dtype=np.int32)
    weights = (rng.random((batch, seq_len)) < 0.15).astype(np.float32)
    return dict(input_ids=np.where(weights > 0, 4, targets).astype(np.int32), targets=targets, mask_weights=weights,
                segment_ids=np.ones((batch, seq_len), np.int32), token_types=np.zeros((batch, seq_len), np.int32))


def measure(kind: str, size: str, batch: int, seq_len: int, steps: int, dtype: str, impl: str) -> tuple[float, float]:
    import ml_collections

    config = ml_collections.ConfigDict()
    config.model = model_block(vocab_size=30522, max_length=max(512, seq_len), dtype=dtype, attention_impl=impl,
                               attention_dropout=0.0 if impl != "xla" else 0.1, **SIZES[size])
    config.model.position.kind = kind
    config.data = ml_collections.ConfigDict(dict(seq_len=seq_len))
    config.train = train_block(num_steps=1000, batch_size=batch, max_predictions=int(seq_len * 0.15 * 1.5) + 1)
    config.mesh = mesh_block()
    model = BertForMaskedLM(model_config(config.model))
    with tempfile.TemporaryDirectory() as workdir:
        trainer = Trainer(config, workdir, MaskedLMTask(model, seq_len, config.train.max_predictions), log=False)
        state = trainer._init(jax.random.PRNGKey(0))
        rng = np.random.default_rng(0)
        batches = [trainer.global_batch(synthetic_batch(batch, seq_len, 30522, rng)) for _ in range(2)]
        for i in range(2):  # compile + warm-up
            state, metrics = trainer.train_step(state, batches[i % 2])
        jax.block_until_ready(metrics)
        times = []
        for i in range(steps):
            start = time.perf_counter()
            state, metrics = trainer.train_step(state, batches[i % 2])
            jax.block_until_ready(metrics)
            times.append(time.perf_counter() - start)
        trainer.close()
    step = statistics.median(times)
    return batch * seq_len / step, step * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="bert_base", choices=SIZES)
    parser.add_argument("--shapes", default="32x512,256x128", help="comma-separated BATCHxSEQ")
    parser.add_argument("--kinds", default=",".join(POSITION_KINDS))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--impl", default="xla", choices=("xla", "jax", "cudnn"))
    args = parser.parse_args()
    print(f"device: {jax.devices()[0].device_kind} x{jax.device_count()}  size={args.size} dtype={args.dtype} "
          f"attention={args.impl}")
    print(f"{'mechanism':<12} {'shape':>8} {'tokens/s':>10} {'step ms':>9}")
    for shape in args.shapes.split(","):
        batch, seq_len = (int(x) for x in shape.split("x"))
        for kind in args.kinds.split(","):
            try:
                tps, ms = measure(kind, args.size, batch, seq_len, args.steps, args.dtype, args.impl)
                print(f"{kind:<12} {shape:>8} {tps:>10.0f} {ms:>9.1f}", flush=True)
            except Exception as err:  # noqa: BLE001 - a mechanism an implementation cannot run is reported
                print(f"{kind:<12} {shape:>8} {'failed':>10} {type(err).__name__}: {str(err)[:80]}", flush=True)


if __name__ == "__main__":
    main()
