"""What the training loop adds to a small model's step, and what training seeds at once and several steps a dispatch
save: a recipe's model through `Trainer.run` with its real data pipeline (packed and masked on the host), against
the same compiled step run bare on batches already on the device.

    python bench/loop_overhead.py                                   # the tiny recipe (configs/mlm/tiny.py)
    python bench/loop_overhead.py --recipe full --seeds 1,5,10 --dispatch-steps 10   # the reproduction's model
    python bench/loop_overhead.py --steps 200 --repeats 3 --overrides model.position.kind=none

Rows, each printed as soon as it is measured: the bare jitted step; the loop with batches made ahead on a background
thread (train.prefetch_batches = 2) and made in turn (0); for each --seeds S > 1, the bare step vmapped over S seeds
and the loop training S seeds at once (`SeedRun`s); with --dispatch-steps K, K bare steps a dispatch (`lax.scan`). Columns: ms a dispatch (the
fastest of --repeats windows of --steps steps, each after a warm-up window that compiles), ms a seed-step, tokens a
second over all seeds, and the seed-step's ratio to the bare step of one seed.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def recipe(name: str, overrides: list[str]):
    """configs/mlm/tiny.py, or the reproduction's `full` profile model and recipe on the embedded corpus."""
    from jaxpos.config.files import apply_overrides, load_config
    from jaxpos.training.validate import check_run_config

    config = load_config(os.path.join(ROOT, "configs", "mlm", "tiny.py"))
    if name == "full":
        from jaxpos.reproduction.matrix import PROFILES

        profile = PROFILES["full"]
        config.model.update(profile.model)
        config.data.update(seq_len=profile.data["seq_len"], vocab_size=profile.data["vocab_size"])
        config.train.update(profile.train)
    config = apply_overrides(config, [f"--config.{o}" for o in overrides])
    return check_run_config(config, task="mlm")


def trainer_for(run, workdir: str, task, seeds: int, **train_changes):
    """A Trainer of `run` in WORKDIR: one seed, or `seeds` SeedRuns in its subfolders."""
    from jaxpos.training.loop import SeedRun, Trainer

    folders = workdir if seeds == 1 else [SeedRun(k, os.path.join(workdir, str(k))) for k in range(seeds)]
    return Trainer(dataclasses.replace(run.train, **train_changes), folders, task, mesh=run.mesh, log=False)


def loop_ms(run, data_factory, task_factory, steps: int, repeats: int, prefetch: int, seeds: int = 1) -> float:
    """ms a dispatch of `Trainer.run_seeds` over windows of `steps` steps after one that compiles (a fresh workdir
    each)."""
    best = float("inf")
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as workdir:
            trainer = trainer_for(run, workdir, task_factory(), seeds, num_steps=2 * steps, log_every=steps,
                                  eval_every=2 * steps, checkpoint_every=2 * steps, prefetch_batches=prefetch)
            try:
                result = trainer.run_seeds([data_factory(k) for k in range(seeds)])[0]
            finally:
                trainer.close()
        best = min(best, result.final_metrics["step_time"] * 1e3)  # the second window: compiled, warm
    return best


def bare_ms(run, data_factory, task_factory, steps: int, repeats: int, seeds: int = 1,
            dispatch_steps: int = 1) -> float:
    """ms a dispatch of the same Trainer's compiled step (vmapped over `seeds`; `dispatch_steps` of them in a
    `lax.scan`) on batches already on the devices, no host work between."""
    import jax.numpy as jnp

    with tempfile.TemporaryDirectory() as workdir:
        trainer = trainer_for(run, workdir, task_factory(), seeds)
        try:
            data = [data_factory(k) for k in range(seeds)]
            batches = [trainer.global_batch([next(d) for d in data]) for _ in range(8)]
            keys = jax.random.PRNGKey(0) if seeds == 1 else jnp.stack([jax.random.PRNGKey(k) for k in range(seeds)])
            state = trainer._init(keys)
            step = trainer.train_step
            if dispatch_steps > 1:  # K steps a dispatch: the batches stacked [K, ...] on the device
                batches = [jax.tree.map(lambda *xs: jnp.stack(xs), *[batches[(k + i) % len(batches)]
                                                                      for i in range(dispatch_steps)])
                           for k in range(2)]
                step = jax.jit(lambda state, stacked: jax.lax.scan(trainer.train_step, state, stacked),
                               donate_argnums=(0,))
            state, metrics = step(state, batches[0])  # compiles
            jax.block_until_ready(metrics)
            best = float("inf")
            dispatches = max(1, steps // dispatch_steps)
            for _ in range(repeats + 1):
                start = time.perf_counter()
                for k in range(dispatches):
                    state, metrics = step(state, batches[k % len(batches)])
                jax.block_until_ready((state, metrics))
                best = min(best, (time.perf_counter() - start) / dispatches * 1e3)
        finally:
            trainer.close()
    return best


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", choices=("tiny", "full"), default="tiny",
                        help="configs/mlm/tiny.py, or the reproduction's full-profile model (default tiny)")
    parser.add_argument("--steps", type=int, default=100, help="steps a timed window (default 100)")
    parser.add_argument("--repeats", type=int, default=2, help="timed windows; the fastest counts (default 2)")
    parser.add_argument("--seeds", default="1", help="comma-separated seeds at once, e.g. 1,5,10 (default 1)")
    parser.add_argument("--dispatch-steps", type=int, default=1, help="also K bare steps a dispatch (default: no)")
    parser.add_argument("--overrides", nargs="*", default=[], help="config overrides, e.g. model.dropout=0")
    args = parser.parse_args(argv)
    counts = sorted({int(n) for n in args.seeds.split(",")} | {1})
    from jaxpos.compilation_cache import enable_compilation_cache

    enable_compilation_cache()  # the rows share three programs (one per seed count): each compiles once

    from jaxpos.data.pipeline import MLMTrainIterator, build_mlm_data
    from jaxpos.training.mlm import MaskedLMTask

    run = recipe(args.recipe, args.overrides)
    with tempfile.TemporaryDirectory() as scratch:  # the tokenizer, trained once
        built = build_mlm_data(run.data, run.train.batch_size, scratch)
    run = run.replace_model(vocab_size=built.tokenizer.vocab_size)

    def data_factory(seed: int = 0):
        return MLMTrainIterator(built.train.examples, built.tokenizer, run.train.batch_size,
                                seed=run.data.seed + seed, mask_prob=run.data.mask_prob)

    def task_factory():
        return MaskedLMTask.of(run)

    timed = dict(steps=args.steps, repeats=args.repeats)
    device = jax.devices()[0]
    tokens = run.train.batch_size * run.data.seq_len
    print(f"device: {device.platform} {device.device_kind} x{jax.device_count()}  jax {jax.__version__}  "
          f"{datetime.date.today()}  {args.recipe} recipe ({run.model.d_model} x {run.model.num_layers} layers, "
          f"{run.train.batch_size} x {run.data.seq_len} tokens, {run.model.position.kind}) "
          f"{' '.join(args.overrides)}  {args.steps} steps a window, fastest of {args.repeats}")
    print(f"{'how the step runs':<52} {'ms/dispatch':>11} {'ms/seed-step':>12} {'tokens/s':>10} {'x bare':>7}",
          flush=True)
    bare = bare_ms(run, data_factory, task_factory, **timed)

    def show(name: str, seeds: int, ms: float) -> None:  # each row as soon as it is measured
        per_seed = ms / seeds
        print(f"{name:<52} {ms:11.2f} {per_seed:12.2f} {tokens * 1e3 / per_seed:10.0f} {per_seed / bare:7.2f}",
              flush=True)

    show("bare jitted step, batches on the device", 1, bare)
    show("jaxpos train loop, batches made ahead (prefetch 2)", 1,
         loop_ms(run, data_factory, task_factory, prefetch=2, **timed))
    show("jaxpos train loop, batches made in turn (prefetch 0)", 1,
         loop_ms(run, data_factory, task_factory, prefetch=0, **timed))
    for seeds in counts[1:]:
        show(f"bare step vmapped over {seeds} seeds", seeds,
             bare_ms(run, data_factory, task_factory, seeds=seeds, **timed))
        show(f"jaxpos train loop, {seeds} seeds at once", seeds,
             loop_ms(run, data_factory, task_factory, prefetch=0, seeds=seeds, **timed))
    if args.dispatch_steps > 1:
        show(f"bare, {args.dispatch_steps} steps a dispatch (lax.scan)", 1,
             bare_ms(run, data_factory, task_factory, dispatch_steps=args.dispatch_steps, **timed)
             / args.dispatch_steps)


if __name__ == "__main__":
    main()
