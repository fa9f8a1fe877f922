"""Training on any (data, fsdp, tensor) mesh: 5 steps of the tiny masked-LM and translation configs give the same
losses, gradient norms, parameters and optimiser state on every mesh as on one device.

All cases run in one subprocess with 8 simulated CPU devices (`python -m tests.training.test_mesh_training OUT
CASES`): for each mechanism it trains the (1, 1, 1) reference, then each mesh from the same initial state on the
same batches (dropout on), through the Trainer's jitted, sharded step, and checks the compiled step of every mesh
with fsdp for all-gathers and all-reduces of [B, T, ...] activations, which mean the activation constraints were
lost. Each case compiles a train step (10-15 s of CPU), so all of this runs with `make test-all`; the default run
makes the same two checks for TISA on (2, 2, 2) in test_multiprocess.py, whose one-process reference compiles that
step anyway.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 5
MESHES = ((8, 1, 1), (2, 4, 1), (2, 2, 2), (1, 8, 1))  # each against (1, 1, 1)
MECHANISMS = {
    "tisa": dict(kind="tisa"),
    "diet_abs_layer": dict(kind="diet_abs", diet_abs=dict(sharing="layer")),
    "t5": dict(kind="t5"),
    "absolute": dict(kind="absolute"),
}
# Every mechanism on every mesh for masked-LM; for translation each mesh with two mechanisms.
ALL = tuple(("mlm", kind, mesh) for kind in MECHANISMS for mesh in MESHES) + tuple(
    ("translation", kind, mesh) for i, kind in enumerate(MECHANISMS) for j, mesh in enumerate(MESHES)
    if (i - j) % 4 in (0, 1))


def case_name(task: str, kind: str, mesh) -> str:
    return f"{task}-{kind}-{'x'.join(map(str, mesh))}"


# --- the subprocess ----------------------------------------------------------------------------------------------

def tiny_config(task: str, kind: str):
    """The tiny config of `task` with mechanism `kind`: 5 steps with a short warmup (so the updates are large), and
    Adam's eps at 1e-6 for both tasks (translation's 1e-9 makes the step of a weight whose gradient is ~0, such as
    a key bias, a function of float32 rounding, which differs between any two reduction orders)."""
    from jaxpos.config.files import apply_overrides, load_config

    path = os.path.join(ROOT, "configs", "mlm" if task == "mlm" else "wmt", "tiny.py")
    config = load_config(path)
    config.model.position.update(json.loads(json.dumps(MECHANISMS[kind])))
    if task == "mlm":  # the tokenizer's vocabulary (at most data.vocab_size) replaces BERT's 30522 in a run
        config.model.vocab_size = config.data.vocab_size
    return apply_overrides(config, [f"--config.train.num_steps={STEPS}", "--config.train.warmup_steps=2",
                                    "--config.train.async_checkpoints=False", "--config.train.eps=1e-6"])


def synthetic_batches(task: str, config, steps: int) -> list[dict]:
    """Global batches of random tokens in packed rows (two pieces a row), shaped like the tiny config's."""
    rng = np.random.default_rng(0)
    batch, vocab = config.train.batch_size, config.model.vocab_size
    out = []
    for _ in range(steps):
        if task == "mlm":
            length = config.data.seq_len
            targets = rng.integers(5, vocab, (batch, length)).astype(np.int32)
            piece_ids = np.where(np.arange(length) < length // 3, 1, 2)[None].repeat(batch, 0).astype(np.int32)
            piece_ids[:, -5:] = 0  # padding
            weights = ((rng.random((batch, length)) < 0.15) & (piece_ids > 0)).astype(np.float32)
            out.append(dict(input_ids=np.where(weights > 0, 4, targets).astype(np.int32), targets=targets,
                            mask_weights=weights, piece_ids=piece_ids, token_types=np.zeros_like(targets)))
        else:
            length = config.data.max_length
            row = {}
            for side, prefix in (("inputs", "input"), ("targets", "target")):
                split = length // 2 - 3
                piece_ids = np.where(np.arange(length) < split, 1, 2)[None].repeat(batch, 0).astype(np.int32)
                piece_ids[:, -4:] = 0
                tokens = np.where(piece_ids > 0, rng.integers(4, vocab, (batch, length)), 0).astype(np.int32)
                positions = np.where(np.arange(length) < split, np.arange(length), np.arange(length) - split)
                row[side] = tokens
                row[f"{prefix}_piece_ids"] = piece_ids
                row[f"{prefix}_positions"] = (positions[None].repeat(batch, 0) * (piece_ids > 0)).astype(np.int32)
            out.append(row)
    return out


def make_trainer(task: str, config, mesh_shape, workdir: str):
    import jax

    from jaxpos.config.run import run_config
    from jaxpos.models import BertForMaskedLM, EncoderDecoder
    from jaxpos.sharding import make_mesh
    from jaxpos.training.loop import Trainer
    from jaxpos.training.mlm import MaskedLMTask
    from jaxpos.training.translation import TranslationTask

    run = run_config(config, task=task)
    cfg = run.model
    if task == "mlm":
        model_task = MaskedLMTask(BertForMaskedLM(cfg), run.data.seq_len, run.train.max_predictions)
    else:
        model_task = TranslationTask(EncoderDecoder(cfg), run.data.max_length, run.data.max_length,
                                     run.train.label_smoothing)
    devices = jax.devices()[:int(np.prod(mesh_shape))]
    return Trainer(run.train, workdir, model_task, log=False, mesh=make_mesh(*mesh_shape, devices=devices))


def batch_collectives(hlo: str, batch: int, length: int) -> list[str]:
    """Floating-point all-gathers / all-reduces in compiled HLO of [batch, length, ...] activations: summed or
    gathered over the batch instead of the weights being gathered. The embedding look-up (`_take`) is left out:
    XLA splits it by the table's fsdp-sharded features and moves [B, T, d/fsdp] rows (and their gradients), which
    the constraints downstream of it cannot change (the table would have to be gathered in the look-up)."""
    found = []
    for line in hlo.splitlines():
        match = re.search(r"= (\(.*?\)|\S+) (all-gather|all-reduce)(-start)?\(", line)
        name = re.search(r'op_name="([^"]*)"', line)
        if not match or (name and "_take" in name.group(1)):
            continue
        for dtype, dims in re.findall(r"(f\d+|bf16)\[([\d,]+)\]", match.group(1)):
            shape = [int(d) for d in dims.split(",")]
            if len(shape) >= 3 and shape[:2] == [batch, length]:
                found.append(f"{match.group(2)} {dtype}{shape} {name.group(1)[:200] if name else ''}")
    return found


def flat(tree) -> dict[str, np.ndarray]:
    import jax

    tree = jax.device_get(tree)
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def run_cases(cases, out: str) -> None:
    """Trains every case and its (1, 1, 1) reference; writes arrays and metrics to OUT (npz + json)."""
    import jax

    results, arrays = {}, {}
    groups = {}
    for task, kind, mesh in cases:
        groups.setdefault((task, kind), []).append(tuple(mesh))
    with tempfile.TemporaryDirectory() as tmp:
        for (task, kind), meshes in groups.items():
            config = tiny_config(task, kind)
            batches = synthetic_batches(task, config, STEPS)
            start = None
            for mesh in [(1, 1, 1)] + meshes:
                tick, cpu = time.perf_counter(), time.process_time()
                trainer = make_trainer(task, config, mesh, os.path.join(tmp, case_name(task, kind, mesh)))
                name = case_name(task, kind, mesh)
                if start is None:
                    state = trainer._init(jax.random.PRNGKey(config.train.seed))
                    start = jax.device_get(state)
                    arrays.update({f"{task}-{kind}-init{k}": v for k, v in flat({"params": state.params}).items()})
                elif mesh == meshes[0] and len(meshes) > 1:  # initialised on the mesh: the same parameters
                    state = trainer._init(jax.random.PRNGKey(config.train.seed))
                    arrays.update({f"{name}-init{k}": v for k, v in flat({"params": state.params}).items()})
                else:  # the same initial state, placed by this mesh's rules
                    state = jax.device_put(start, trainer.state_shardings)
                global_batches = [trainer.global_batch(b) for b in batches]
                step = trainer.train_step.lower(state, global_batches[0]).compile()
                compiled = time.process_time() - cpu
                if mesh[1] > 1:  # fsdp
                    length = config.data.seq_len if task == "mlm" else config.data.max_length
                    results[f"{name}/batch_collectives"] = batch_collectives(step.as_text(), config.train.batch_size,
                                                                             length)
                metrics = []
                for batch in global_batches:
                    state, m = step(state, batch)
                    metrics.append({k: float(v) for k, v in jax.device_get(m).items()})
                results[f"{name}/metrics"] = metrics
                for key, value in flat({"params": state.params, "opt_state": state.opt_state}).items():
                    arrays[f"{name}{key}"] = value
                trainer.close()
                print(f"{name}: {time.perf_counter() - tick:.1f}s ({compiled:.1f}s cpu to compile, "
                      f"{time.process_time() - cpu - compiled:.1f}s cpu to run)", flush=True)
    np.savez(out + ".npz", **arrays)
    with open(out + ".json", "w") as f:
        json.dump(results, f)


# --- the tests ---------------------------------------------------------------------------------------------------

def sweep(cases, tmp_path_factory) -> tuple[dict, dict]:
    out = str(tmp_path_factory.mktemp("mesh") / "sweep")
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_COMPILATION_CACHE_DIR=os.path.join(ROOT, ".jax_cache"),  # as tests/conftest.py
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5")
    proc = subprocess.run([sys.executable, "-m", "tests.training.test_mesh_training", out, json.dumps(cases)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    print(proc.stdout)
    with open(out + ".json") as f:
        results = json.load(f)
    return results, dict(np.load(out + ".npz"))


@pytest.fixture(scope="module")
def full_sweep(tmp_path_factory):
    return sweep(ALL, tmp_path_factory)


def assert_trained_alike(got: dict, want: dict, init: dict, label: str) -> None:
    """Parameters and optimiser state (by key path) after the same steps on two meshes agree to float32 tolerance;
    `init` (the parameters before training) shows the tolerance is far below how far training moved them."""
    assert got.keys() == want.keys() and len(want) > 10
    moved = []
    for key in want:
        a, b = got[key], want[key]
        assert a.shape == b.shape, key
        # Parameters move by up to lr = 2e-3 a step; float32 reduction-order noise stays below 1e-6. The exception:
        # a ReLU unit (translation) at its kink for some token switches with rounding, which moves that unit's
        # weights differently by up to ~1% of a step; such weights are a few in a thousand.
        close = np.isclose(a, b, rtol=1e-4, atol=2e-6)
        assert np.sum(~close) <= max(2, a.size // 1000) and np.max(np.abs(a - b)) <= 1e-4, \
            f"{label} {key}: {np.sum(~close)} of {a.size} differ, by up to {np.max(np.abs(a - b)):.3g}"
        if key in init:
            moved.append(np.max(np.abs(b - init[key])) > 100 * 2e-6)
    # Training moved nearly every parameter far beyond the tolerance (not all: e.g. key biases get no gradient).
    assert len(moved) > 10 and np.mean(moved) > 0.9, np.mean(moved)


def check_case(results, arrays, task, kind, mesh):
    name, reference = case_name(task, kind, mesh), case_name(task, kind, (1, 1, 1))
    got, want = results[f"{name}/metrics"], results[f"{reference}/metrics"]
    for step, (g, w) in enumerate(zip(got, want)):
        for key in ("loss", "accuracy", "grad_norm"):
            np.testing.assert_allclose(g[key], w[key], rtol=2e-5, err_msg=f"{name} step {step} {key}")
    assert got[-1]["loss"] != got[0]["loss"]  # it trained

    def select(prefix):
        return {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix + "[")}

    init = select(f"{task}-{kind}-init")
    assert_trained_alike(select(name), select(reference), init, name)
    for key, value in select(f"{name}-init").items():  # initialised on the mesh: the same parameters
        # Another program (partitioned over the mesh) may fuse the elementwise draws otherwise (last bits); a draw
        # from another key or shard differs by ~0.02.
        np.testing.assert_allclose(value, init[key], rtol=1e-6, atol=1e-7, err_msg=f"{name} init {key}")


@pytest.mark.slow
@pytest.mark.parametrize("task,kind,mesh", ALL, ids=[case_name(*c) for c in ALL])
def test_training_on_every_mesh_matches_one_device(full_sweep, task, kind, mesh):
    check_case(*full_sweep, task, kind, mesh)


@pytest.mark.slow
def test_fsdp_steps_keep_activations_sharded(full_sweep):
    results, _ = full_sweep
    checked = {k: v for k, v in results.items() if k.endswith("/batch_collectives")}
    assert len(checked) == sum(mesh[1] > 1 for _, _, mesh in ALL), checked.keys()
    assert all(v == [] for v in checked.values()), {k: v for k, v in checked.items() if v}


if __name__ == "__main__":
    import jax

    jax.config.update("jax_default_matmul_precision", "highest")  # as the tests' conftest
    run_cases([(t, k, tuple(m)) for t, k, m in json.loads(sys.argv[2])], sys.argv[1])
