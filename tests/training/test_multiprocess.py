"""Multi-process training: 2 local processes with 4 simulated CPU devices each (jax.distributed on 127.0.0.1,
gloo collectives) train the tiny masked-LM config together on a (2, 2, 2) mesh, each reading only its half of
every batch, and reach the parameters of the one-process run on 8 devices, which matches a run on one device. One
process is killed mid-run after a checkpoint; both restart and resume from it. The checkpoints restore across
process counts and mesh shapes.

The workers are this file run as a module (`python -m tests.training.test_multiprocess worker ...`); the test
starts, waits for and kills every one of them itself, each wait bounded.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.xla_flags import quick_compile_flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS, CHECKPOINT_EVERY, MESH = 6, 3, (2, 2, 2)
PROCESSES, LOCAL_DEVICES = 2, 4
TIMEOUT = 120  # seconds for any one round of worker processes


def run_config(tokenizer_path: str = "", mesh=MESH):
    """configs/mlm/tiny.py on part of the embedded corpus with a small vocabulary, STEPS steps."""
    from jaxpos.config.files import apply_overrides, load_config

    config = load_config(os.path.join(ROOT, "configs", "mlm", "tiny.py"))
    return apply_overrides(config, [
        f"--config.train.num_steps={STEPS}", f"--config.train.checkpoint_every={CHECKPOINT_EVERY}",
        "--config.data.max_documents=200", "--config.data.vocab_size=500",
        f"--config.data.tokenizer_path={tokenizer_path}",
        f"--config.mesh.data={mesh[0]}", f"--config.mesh.fsdp={mesh[1]}", f"--config.mesh.tensor={mesh[2]}"])


def build(config, workdir: str, mesh=None, vocab_size: int | None = None):
    """(data, trainer) for `config`; the data iterator reads this process's share of every batch. With
    `vocab_size` (the tokenizer's), no data is built: (None, trainer)."""
    from jaxpos.training.validate import check_run_config
    from jaxpos.data.pipeline import build_mlm_data
    from jaxpos.models import BertForMaskedLM
    from jaxpos.training.loop import Trainer
    from jaxpos.training.mlm import MaskedLMTask

    run = check_run_config(config, task="mlm")
    data = None if vocab_size else build_mlm_data(run.data, run.train.batch_size, workdir)
    run = run.replace_model(vocab_size=vocab_size or data.tokenizer.vocab_size)
    task = MaskedLMTask(BertForMaskedLM(run.model), run.data.seq_len, run.train.max_predictions)
    return data, Trainer(run.train, workdir, task, log=False, mesh=mesh or run.mesh)


def gathered(state) -> dict[str, np.ndarray]:
    """Every leaf of a (possibly multi-process) state as full numpy arrays, by key path."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.tree.leaves(state)[0].sharding.mesh
    # One jitted copy replicates every leaf on every device (process_allgather compiles one program per leaf).
    full = jax.jit(lambda t: t, out_shardings=NamedSharding(mesh, PartitionSpec()))(state)
    return {jax.tree_util.keystr(k): np.asarray(v.addressable_data(0))
            for k, v in jax.tree_util.tree_flatten_with_path(full)[0]}


# --- the worker process ------------------------------------------------------------------------------------------

def _cpu() -> str:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return f"{usage.ru_utime + usage.ru_stime:.1f}s cpu"


def worker(args) -> None:
    """One process of the 2: trains (stalling after `--stall-after` if given), then saves what the test checks."""
    start = time.time()
    import jax

    jax.config.update("jax_num_cpu_devices", LOCAL_DEVICES)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # cross-process collectives on the CPU
    jax.config.update("jax_default_matmul_precision", "highest")  # as the tests' conftest
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}", num_processes=PROCESSES,
                               process_id=args.process_id, initialization_timeout=TIMEOUT)
    from jax.experimental import multihost_utils

    from jaxpos.sharding import batch_sharding, make_mesh
    from jaxpos.training.checkpoint import abstract_like
    from jaxpos.training.loop import make_global_batch

    data, trainer = build(run_config(args.tokenizer), args.workdir)

    def stall(step, state):  # holds the run mid-way (after the first checkpoint) until the test kills it
        if args.stall_after is not None and step > args.stall_after:
            time.sleep(10 * TIMEOUT)

    result = trainer.run(data.train, hooks=[stall])
    trainer.close()
    print(f"trained in {time.time() - start:.1f}s, {_cpu()}", flush=True)
    out = gathered(result.state)
    out["resumed_from"] = np.asarray(-1 if result.resumed_from is None else result.resumed_from)
    out["shares"] = multihost_utils.process_allgather(np.array([data.train.host_start, data.train.host_rows]))

    # A mesh whose batch axes do not split over the processes (tensor parallelism across them): every device needs
    # every row, so make_global_batch moves each process's half to the other.
    rows = np.arange(16 * 3, dtype=np.float32).reshape(16, 3)[data.train.host_start:][:data.train.host_rows]
    tensor_only = make_global_batch({"x": rows}, batch_sharding(make_mesh(1, 1, 8)))["x"]
    out["unaligned"] = np.asarray(tensor_only.addressable_data(0))

    if args.restore:  # a checkpoint of the one-process run onto this process count, on another mesh shape
        _, other = build(run_config(args.tokenizer), args.restore, mesh=make_mesh(4, 2, 1))
        _, state, _ = other.checkpointer.restore_latest(abstract_like(other.abstract_state, other.state_shardings))
        other.close()
        assert {x.sharding.mesh.devices.shape for x in jax.tree.leaves(state)} == {(4, 2, 1)}
        out.update({f"restored{k}": v for k, v in gathered(state).items()})
    print(f"done in {time.time() - start:.1f}s, {_cpu()}", flush=True)
    if jax.process_index() == 0:
        np.savez(args.out, **out)


# --- the test ----------------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_workers(workdir: str, tokenizer: str, out: str, cache: str, stall_after=None, restore=None):
    port = free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=cache,
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5",
               # Each process has 4 devices (jax_num_cpu_devices), not the conftest's 8; cheaper compilation.
               XLA_FLAGS=quick_compile_flags())
    procs = []
    for i in range(PROCESSES):
        command = [sys.executable, "-m", "tests.training.test_multiprocess", "worker", str(i), str(port), workdir,
                   "--tokenizer", tokenizer, "--out", out]
        command += ["--stall-after", str(stall_after)] if stall_after is not None else []
        command += ["--restore", restore] if restore else []
        with open(f"{out}.{len(os.listdir(os.path.dirname(out)))}.log", "w") as log:  # a pipe could fill and block
            proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        proc.log = log.name
        procs.append(proc)
    return procs


def kill(procs) -> str:
    """SIGKILLs every process still running and returns their output."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
    output = []
    for i, p in enumerate(procs):
        with open(p.log) as f:
            output.append(f"--- process {i} (rc {p.wait()}), {p.log}:\n{f.read()[-4000:]}")
    return "\n".join(output)


def wait_all(procs, timeout: float) -> str:
    """Waits for every process (at most `timeout` seconds in all); returns their output."""
    deadline = time.time() + timeout
    for p in procs:
        try:
            p.wait(max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            pytest.fail(f"workers did not finish in {timeout}s:\n{kill(procs)}")
    output = kill(procs)
    if any(p.returncode for p in procs):
        pytest.fail(f"a worker failed:\n{output}")
    return output


@pytest.mark.long
def test_two_processes_train_kill_resume_and_restore_across_process_counts(tmp_path):
    import jax

    from jaxpos.sharding import make_mesh
    from jaxpos.training.checkpoint import Checkpointer, abstract_like
    from tests.training.test_mesh_training import assert_trained_alike, batch_collectives

    if jax.device_count() != PROCESSES * LOCAL_DEVICES or jax.process_count() != 1:
        pytest.skip("needs one process with 8 (simulated) devices (tests/conftest.py)")
    tick = time.time()
    one_workdir, workdir = str(tmp_path / "one_process"), str(tmp_path / "two_processes")
    out, cache = str(tmp_path / "two.npz"), os.path.join(ROOT, ".jax_cache")  # as tests/conftest.py
    one_data, one_trainer = build(run_config(), one_workdir)  # trains the tokenizer, which every process reads
    tokenizer, vocab = os.path.join(one_workdir, "spm_mlm.model"), one_data.tokenizer.vocab_size
    _, single = build(run_config(tokenizer), str(tmp_path / "one_device"), vocab_size=vocab,
                      mesh=make_mesh(1, 1, 1, devices=jax.devices()[:1]))
    started = []
    try:
        # Both processes start training, and stall once past the first checkpoint ...
        procs = start_workers(workdir, tokenizer, out, cache, stall_after=CHECKPOINT_EVERY)
        started += procs
        # ... while this process trains the one-process reference on its 8 devices (the same mesh) ...
        start = gathered(one_trainer._init(jax.random.PRNGKey(one_trainer.train.seed)))
        try:
            reference = one_trainer.run(one_data.train)
        finally:
            one_trainer.close()
        want = gathered(reference.state)

        # ... checks its compiled step for activations gathered or summed over the batch (test_mesh_training) ...
        batch = one_trainer.global_batch(one_data.train.batch_at(0))
        step = one_trainer.train_step.lower(abstract_like(one_trainer.abstract_state, one_trainer.state_shardings),
                                            batch).compile()
        assert batch_collectives(step.as_text(), *batch["input_ids"].shape) == []

        # ... and trains the same steps from the same state on one device: the (2, 2, 2) run matches it.
        state = jax.device_put(jax.tree.unflatten(jax.tree.structure(single.abstract_state), list(start.values())),
                               single.state_shardings)
        losses = []
        for i in range(STEPS):
            state, metrics = single.train_step(state, single.global_batch(one_data.train.batch_at(i)))
            losses.append(float(metrics["loss"]))
        single.close()
        np.testing.assert_allclose(np.mean(losses), reference.final_metrics["loss"], rtol=2e-5)
        assert_trained_alike(gathered(state), want, {k: v for k, v in start.items() if k.startswith(".params")},
                             "one device vs (2, 2, 2)")
        print(f"one-process runs done after {time.time() - tick:.1f}s")

        # Kill process 1 once the first checkpoint is written, while both are still running; then process 0.
        first = os.path.join(workdir, "checkpoints", str(CHECKPOINT_EVERY))
        deadline = time.time() + TIMEOUT
        while time.time() < deadline and not os.path.isdir(first) and all(p.poll() is None for p in procs):
            time.sleep(0.1)
        if not os.path.isdir(first) or any(p.poll() is not None for p in procs):
            pytest.fail(f"no checkpoint {first} while both processes ran:\n{kill(procs)}")
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait(10)
        print(kill(procs), f"\nkilled after {time.time() - tick:.1f}s")
        assert not os.path.exists(out)

        # Restart both: they resume from that checkpoint, finish, then restore the one-process run's checkpoint
        # onto their 2 processes and another mesh, (4, 2, 1).
        procs = start_workers(workdir, tokenizer, out, cache, restore=one_workdir)
        started += procs
        print(wait_all(procs, TIMEOUT), f"\nresumed run done after {time.time() - tick:.1f}s")
    finally:
        kill(started)
    got = dict(np.load(out))
    assert int(got.pop("resumed_from")) == CHECKPOINT_EVERY
    shares = got.pop("shares")  # (first row, rows) of each process: disjoint halves of every global batch
    assert shares.tolist() == [[0, 8], [8, 8]] and one_data.train.host_rows == 16
    np.testing.assert_array_equal(got.pop("unaligned"), np.arange(16 * 3).reshape(16, 3))

    restored = {k[len("restored"):]: got.pop(k) for k in list(got) if k.startswith("restored")}
    assert set(got) == set(want) == set(restored)
    for key in want:
        # Same mesh: the two-process run equals the one-process run up to float32 reduction order.
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6, err_msg=key)
        np.testing.assert_array_equal(restored[key], want[key], err_msg=key)  # 1 process -> 2, other mesh

    # The two-process checkpoint onto one process and other meshes, optimizer state and step included.
    for shape in ((1, 8, 1), (1, 1, 1)):
        _, trainer = build(run_config(tokenizer), str(tmp_path / "restore"), vocab_size=vocab,
                           mesh=make_mesh(*shape, devices=jax.devices()[:int(np.prod(shape))]))
        trainer.close()
        checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), read_only=True)
        step, state, data_state = checkpointer.restore_latest(abstract_like(trainer.abstract_state,
                                                                            trainer.state_shardings))
        checkpointer.close()
        assert step == STEPS and data_state["step"] == STEPS
        assert {x.sharding.mesh.devices.shape for x in jax.tree.leaves(state)} == {shape}
        for key, value in gathered(state).items():
            np.testing.assert_array_equal(value, got[key], err_msg=f"{shape} {key}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["worker"])
    parser.add_argument("process_id", type=int)
    parser.add_argument("port", type=int)
    parser.add_argument("workdir")
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--stall-after", type=int)
    parser.add_argument("--restore")
    worker(parser.parse_args())
