"""What the training loop adds to a small model's step: the tiny recipe (configs/mlm/tiny.py: d = 128, 2 layers,
16 x 128 tokens, TISA, dropout 0.1) through `Trainer.run` with its real data (the embedded corpus, packed and
masked on the host), against the same compiled train step run bare on batches already on the device.

    python bench/loop_overhead.py                       # the tiny recipe on this host's default device
    python bench/loop_overhead.py --steps 200 --repeats 3 --overrides model.position.kind=none

A row per way of running the step: the loop with batches made ahead on a background thread (train.prefetch_batches
= 2, the default), the loop making each batch in turn (0), and the bare jitted step; ms per step (the fastest of
--repeats windows of --steps steps, each after a warm-up window that compiles), and its ratio to the bare step.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def recipe(overrides: list[str]):
    from jaxpos.config.files import apply_overrides, load_config
    from jaxpos.config.validate import check_run_config

    config = apply_overrides(load_config(os.path.join(ROOT, "configs", "mlm", "tiny.py")),
                             [f"--config.{o}" for o in overrides])
    return check_run_config(config, task="mlm")


def loop_ms(run, data_factory, task_factory, steps: int, repeats: int, prefetch: int) -> float:
    """ms a step of `Trainer.run` over windows of `steps` steps after one that compiles (a fresh workdir each)."""
    import dataclasses

    from jaxpos.training.loop import Trainer

    best = float("inf")
    for _ in range(repeats):
        train = dataclasses.replace(run.train, num_steps=2 * steps, log_every=steps, eval_every=2 * steps,
                                    checkpoint_every=2 * steps, prefetch_batches=prefetch)
        with tempfile.TemporaryDirectory() as workdir:
            trainer = Trainer(train, workdir, task_factory(), mesh=run.mesh, log=False)
            try:
                result = trainer.run(data_factory())
            finally:
                trainer.close()
        best = min(best, result.final_metrics["step_time"] * 1e3)  # the second window: compiled, warm
    return best


def bare_ms(run, data_factory, task_factory, steps: int, repeats: int) -> float:
    """ms a step of the same Trainer's compiled step on batches already on the devices, no host work between."""
    from jaxpos.training.loop import Trainer

    with tempfile.TemporaryDirectory() as workdir:
        trainer = Trainer(run.train, workdir, task_factory(), mesh=run.mesh, log=False)
        try:
            data = data_factory()
            batches = [trainer.global_batch(next(data)) for _ in range(8)]
            state = trainer._init(jax.random.PRNGKey(0))
            state, metrics = trainer.train_step(state, batches[0])  # compiles
            jax.block_until_ready(metrics)
            best = float("inf")
            for _ in range(repeats + 1):
                start = time.perf_counter()
                for k in range(steps):
                    state, metrics = trainer.train_step(state, batches[k % len(batches)])
                jax.block_until_ready((state, metrics))
                best = min(best, (time.perf_counter() - start) / steps * 1e3)
        finally:
            trainer.close()
    return best


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100, help="steps a timed window (default 100)")
    parser.add_argument("--repeats", type=int, default=2, help="timed windows; the fastest counts (default 2)")
    parser.add_argument("--overrides", nargs="*", default=[], help="config overrides, e.g. model.dropout=0")
    args = parser.parse_args(argv)

    from jaxpos.data.pipeline import MLMTrainIterator, build_mlm_data
    from jaxpos.models import BertForMaskedLM
    from jaxpos.training.mlm import MaskedLMTask

    run = recipe(args.overrides)
    with tempfile.TemporaryDirectory() as scratch:  # the tokenizer, trained once
        built = build_mlm_data(run.data, run.train.batch_size, scratch)
    run = run.replace_model(vocab_size=built.tokenizer.vocab_size)

    def data_factory():
        return MLMTrainIterator(built.train.examples, built.tokenizer, run.train.batch_size, seed=run.data.seed,
                                mask_prob=run.data.mask_prob)

    def task_factory():
        return MaskedLMTask(BertForMaskedLM(run.model), run.data.seq_len, run.train.max_predictions)

    rows = [("jaxpos train loop, batches made ahead (prefetch 2)",
             loop_ms(run, data_factory, task_factory, args.steps, args.repeats, 2)),
            ("jaxpos train loop, batches made in turn (prefetch 0)",
             loop_ms(run, data_factory, task_factory, args.steps, args.repeats, 0)),
            ("bare jitted step, batches on the device", bare_ms(run, data_factory, task_factory, args.steps,
                                                                 args.repeats))]
    device = jax.devices()[0]
    print(f"device: {device.platform} {device.device_kind} x{jax.device_count()}  jax {jax.__version__}  "
          f"{datetime.date.today()}  tiny recipe {' '.join(args.overrides)}  {args.steps} steps a window, fastest "
          f"of {args.repeats}")
    bare = rows[-1][1]
    print(f"{'how the step runs':<52} {'ms/step':>8} {'x bare':>7}")
    for name, ms in rows:
        print(f"{name:<52} {ms:8.2f} {ms / bare:7.2f}")


if __name__ == "__main__":
    main()
