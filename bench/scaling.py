"""What scanned layers and rematerialisation change: the training step's compile time against depth (unrolled
against scanned) and its memory per remat policy, from XLA's own analysis of the compiled program (nothing runs:
the state and batch are abstract, so a model larger than the host's memory is measured too).

    python bench/scaling.py                                   # both tables at their default sizes, on this host
    python bench/scaling.py --depths 12,24,48 --compile-size 256x4 --memory-size bert_base --batch 8 --length 512

Both tables run the shipped recipes (configs/mlm/bert_base.py and bert_large.py: bf16 compute, AdamW) with TISA
and no dropout; the memory table also takes configs/mlm/modern_base.py (`--memory-size modern_base`: its own RoPE,
local and global layers scanned in groups of three, GeGLU). Compile table: bert_base's recipe at d x heads
(`--compile-size`, e.g. 256x4) and each depth, unrolled and scanned: seconds to lower and compile the jitted train
step. Memory table: `--memory-size` (bert_base, bert_large, modern_base, or DxHxL on bert_base's recipe) at batch x
length, per remat policy: XLA's temporary bytes
(the activations a step keeps for its backward pass, and workspace) beside the arguments' (parameters, optimiser
state, batch).
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
SHIPPED = ("bert_base", "bert_large", "modern_base")  # configs/mlm/NAME.py
OWN_POSITIONS = ("modern_base",)  # recipes measured with their own positional mechanism rather than TISA


def run_config(size: str, batch: int, length: int, **model):
    """The masked-LM recipe of configs/mlm/SIZE.py (bert_base, bert_large or modern_base), or of bert_base at "DxHxL"
    (d_model x heads x layers, mlp 4d), at batch x length tokens with TISA (modern_base: its RoPE) and no dropout,
    the recipe's share of predicted tokens; `model`: further model fields."""
    from jaxpos.config.files import load_config
    from jaxpos.training.validate import check_run_config

    config = load_config(os.path.join(ROOT, "configs", "mlm", f"{size if size in SHIPPED else 'bert_base'}.py"))
    if size not in SHIPPED:
        d_model, heads, layers = (int(x) for x in size.split("x"))
        config.model.update(d_model=d_model, num_heads=heads, num_layers=layers, mlp_dim=4 * d_model)
    config.model.update(max_length=length, dropout=0.0, attention_dropout=0.0, **model)
    if size not in OWN_POSITIONS:
        config.model.position.kind = "tisa"
    config.data.update(seq_len=length)
    config.train.update(batch_size=batch, max_predictions=max(1, int(length * config.data.mask_prob)), num_steps=10)
    return check_run_config(config, task="mlm")


def compiled_step(run):
    """(seconds to lower and compile, the compiled train step) of `run`'s Trainer on abstract inputs."""
    import jax.numpy as jnp

    from jaxpos.sharding import make_mesh
    from jaxpos.training.checkpoint import abstract_like
    from jaxpos.training.loop import Trainer
    from jaxpos.training.mlm import MaskedLMTask

    with tempfile.TemporaryDirectory() as workdir:
        task = MaskedLMTask.of(run)
        trainer = Trainer(run.train, workdir, task, mesh=make_mesh(devices=jax.devices()[:1]), log=False)
        try:
            state = abstract_like(trainer.abstract_state, trainer.state_shardings)
            shape = (run.train.batch_size, run.data.seq_len)
            batch = {key: jax.ShapeDtypeStruct(shape, jnp.float32 if key == "mask_weights" else jnp.int32,
                                               sharding=trainer.batch_sharding)
                     for key in ("input_ids", "targets", "mask_weights", "piece_ids", "token_types", "positions")}
            start = time.perf_counter()
            compiled = trainer.train_step.lower(state, batch).compile()
            return time.perf_counter() - start, compiled
        finally:
            trainer.close()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depths", default="12,24,48", help="comma-separated depths of the compile table")
    parser.add_argument("--compile-size", default="256x4", help="d_model x heads of the compile table")
    parser.add_argument("--compile-shape", default="8x128", help="batch x length of the compile table")
    parser.add_argument("--memory-size", default="bert_base", help="bert_base, bert_large, modern_base or DxHxL")
    parser.add_argument("--batch", type=int, default=8, help="rows a step of the memory table")
    parser.add_argument("--length", type=int, default=512, help="tokens a row of the memory table")
    parser.add_argument("--policies", default="none,save_projections,save_dots,full")
    parser.add_argument("--skip", choices=("compile", "memory"), help="leave one table out")
    args = parser.parse_args(argv)
    device = jax.devices()[0]
    print(f"device: {device.platform} {device.device_kind}  jax {jax.__version__}  {datetime.date.today()}")
    if args.skip != "compile":
        batch, length = (int(x) for x in args.compile_shape.split("x"))
        print(f"\ncompile seconds of the train step, d x heads = {args.compile_size}, {batch} x {length} tokens")
        print(f"{'layers':>6} {'unrolled':>9} {'scanned':>8}")
        for depth in (int(x) for x in args.depths.split(",")):
            row = [compiled_step(run_config(f"{args.compile_size}x{depth}", batch, length, scan_layers=scan))[0]
                   for scan in (False, True)]
            print(f"{depth:>6} {row[0]:9.1f} {row[1]:8.1f}")
    if args.skip != "memory":
        print(f"\nmemory of the train step (XLA's analysis), {args.memory_size}, scanned, {args.batch} x {args.length} "
              "tokens")
        print(f"{'remat':<18} {'temporary MiB':>13} {'arguments MiB':>13} {'compile s':>9}")
        for policy in args.policies.split(","):
            seconds, compiled = compiled_step(run_config(args.memory_size, args.batch, args.length, scan_layers=True,
                                                         remat=policy))
            memory = compiled.memory_analysis()
            print(f"{policy:<18} {memory.temp_size_in_bytes / 2**20:13.1f} "
                  f"{memory.argument_size_in_bytes / 2**20:13.1f} {seconds:9.1f}")


if __name__ == "__main__":
    main()
