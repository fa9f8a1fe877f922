"""bench/: the GPU runbook (bench/gpu_runs.sh) names only paths, mechanisms, implementations, peers and test files
that exist and fits each stage into ten minutes; the benchmarks run end to end on the CPU at tiny shapes (GPU
minutes go to measuring, not to finding a broken flag)."""

import os
import subprocess
import sys

import pytest

from bench import attention_bias, local_attention
from jaxpos.cli import build_parser
from jaxpos.attention.registry import attention_impls
from jaxpos.positions import MECHANISMS
from jaxpos.reproduction.matrix import PROFILES
from tests.helpers import SMALL_MLM, bias_terms
from tests.test_launch import ROOT, dry_run
from tests.xla_flags import quick_compile_flags

STAGES = ("recipes", "attention", "variants", "peers", "reproduce", "lengths")
STAGE_S = 600  # a stage's commands' limits together, with room for set-up


def options(argv: list[str]) -> dict[str, str]:
    return {a: b for a, b in zip(argv, argv[1:]) if a.startswith("--")}


@pytest.mark.parametrize("stage", STAGES)
def test_gpu_runbook_names_what_exists_and_fits_ten_minutes(stage):
    commands = dry_run("bench/gpu_runs.sh", stage)
    assert all(argv[:3] == ["timeout", "-k", "10"] for argv in commands)
    assert sum(int(argv[3]) for argv in commands) <= STAGE_S - 30
    known_paths = set(attention_bias.paths(True, {}))
    for argv in commands:
        command = argv[4:]
        opts = options(command)
        if "pytest" in command:
            files = [a for a in command if a.startswith("tests/")]
            assert files and all(os.path.exists(os.path.join(ROOT, f)) for f in files)
        elif "bench/attention_bias.py" in command:
            assert set(opts["--paths"].split(",")) <= known_paths
        elif "bench/local_attention.py" in command:
            assert set(opts["--paths"].split(",")) <= set(local_attention.PATHS)
        elif "bench/train_throughput.py" in command:
            assert set(opts["--kinds"].split(",")) <= set(MECHANISMS)
            paths = opts["--paths"].split(",") if "--paths" in opts else opts["--impl"].split(",")
            assert {path.partition("@")[0] for path in paths} <= set(attention_impls())
            assert set(filter(None, opts["--peers"].split(","))) <= {"plain_jax", "huggingface"}
        elif "bench.profile_step" in command:
            assert opts["--kind"] in MECHANISMS and opts["--impl"] in attention_impls()
        elif "bench/decode_throughput.py" in command:
            assert set(opts["--kinds"].split(",")) <= set(MECHANISMS)
        elif command[1:4] == ["-m", "jaxpos.cli", "reproduce"]:
            assert build_parser().parse_args(command[3:]).out == opts["--out"]
            assert opts.get("--profile", "full") in PROFILES
        elif command[1:4] == ["-m", "jaxpos.cli", "compare"]:
            assert build_parser().parse_known_args(command[3:])[0].out == opts["--out"]  # --config.* after
            if "--mechanisms" in opts:  # every variant parses and is checked through its run config
                from jaxpos.reproduction import compare as comp

                overrides = [a for a in command if a.startswith("--config.")]
                plan = comp.new_plan(os.path.join(ROOT, opts["--config"]), overrides, opts["--mechanisms"].split(","),
                                     2, 1, (1, 2, 4, 8))
                assert len(plan["runs"]) >= 2 * 20
        elif command[0] == "tar":
            folder = command[command.index("-C") + 1]
            assert folder in ("runs/reproduce-full", "runs/lengths-gpu")
            assert {"plan.json", "tokenizer", "runs"} <= set(command)
        else:
            pytest.fail(f"a command the test does not check: {command}")


def test_gpu_runbook_reproduces_a_subset():
    """REPRODUCE's arguments reach `jaxpos reproduce` and name mechanisms and claims that exist; REPRODUCE_S
    limits it."""
    from jaxpos.reproduction.reproduce import new_plan

    subset = "--mechanisms none,tisa --claims tisa_local,muppet_exact --seeds 3 --workers 6"
    command = dry_run("bench/gpu_runs.sh", "reproduce", REPRODUCE=subset, REPRODUCE_S="195")[0]
    assert command[3] == "195" and command[-len(subset.split()):] == subset.split()
    args = build_parser().parse_args(command[7:])
    plan = new_plan(args.profile, args.seeds, args.workers, args.mechanisms.split(","), args.claims.split(","))
    assert sorted(plan["runs"]) == sorted(f"{m}_s{s}" for m in ("none", "tisa") for s in range(3))


def test_gpu_runbook_refuses_an_unknown_stage():
    proc = subprocess.run(["bash", "bench/gpu_runs.sh", "recipe"], capture_output=True, text=True, timeout=30,
                          cwd=ROOT)
    assert proc.returncode == 2 and "usage" in proc.stderr


def test_attention_benchmark_on_the_cpu(capsys):
    """Every row measured and printed with its ratio, no-bias paths first whatever order --paths gives."""
    attention_bias.main(["--cpu-smoke", "--paths", "pallas+table,cudnn+bias,cudnn"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [row[2] for row in rows] == ["cudnn", "cudnn+bias", "pallas+table"]
    assert rows[0][4] == "1.00" and all(float(row[3]) > 0 and float(row[4]) > 0 for row in rows)


def test_local_attention_benchmark_on_the_cpu(capsys):
    """--cpu at a tiny shape: per path the tiles of the global and the local call, the predicted ratio, the CPU
    times of the XLA path and the Pallas interpreter (printed, not compared: one run each), and the Hopper kernels
    lowered for CUDA (3 custom calls without a table, 4 with)."""
    local_attention.main(["--cpu", "--lengths", "512", "--tokens", "512", "--heads", "2", "--head-dim", "16",
                          "--runs", "1", "--paths", "xla+table,pallas+table,mgpu,mgpu+table"])
    rows = {line.split()[2]: line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("512")}
    assert list(rows) == ["xla+table", "pallas+table", "mgpu", "mgpu+table"]
    assert " dense " in rows["xla+table"] and " 1.000 " in rows["xla+table"]  # the mask saves no product
    assert " 16 / 10 " in rows["mgpu"]  # 4 x 4 tiles of 128; 3 per query block, 2 at the ends
    assert "3 calls" in rows["mgpu"] and "4 calls" in rows["mgpu+table"]
    assert " 64 / 22 " in rows["pallas+table"] and float(rows["pallas+table"].split()[-1]) > 0  # blocks of 64


def test_attention_benchmark_refuses_an_unknown_path(capsys):
    with pytest.raises(SystemExit):
        attention_bias.main(["--cpu-smoke", "--paths", "mgpu+tabel"])
    assert "unknown path(s) mgpu+tabel" in capsys.readouterr().err


def table_rows(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines() if line.startswith(("jaxpos ", "plain JAX"))]


def test_training_benchmark_paths_and_peer_in_concurrent_workers():
    """Two workers compiling at once, taking turns on the device: every path (and the first row again) and the
    plain-JAX peer, each in its own process, are measured once; the table in row order follows, and the summary
    names each case's fastest path."""
    proc = subprocess.run([sys.executable, "bench/train_throughput.py", "--size", "tiny", "--shapes", "8x32",
                           "--kinds", "none", "--paths", "xla@0,xla@0.1", "--steps", "2", "--jobs", "2",
                           "--repeat-first", "--peers", "plain_jax"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=dict(os.environ, XLA_FLAGS=quick_compile_flags()))  # one device: half the time
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = table_rows(proc.stdout)
    assert len(rows) == 8, proc.stdout  # four as measured, four in row order
    jaxpos, peer = [row for row in rows[4:] if row[0] == "jaxpos"], [row for row in rows[4:] if row[0] == "plain"]
    assert [(row[1], row[2]) for row in jaxpos] == [("none", "xla@0"), ("none", "xla@0"), ("none", "xla@0.1")]
    assert len(peer) == 1 and peer[0][3] == "8x32" and float(peer[0][4]) > 0, proc.stdout
    # jaxpos rows give the fastest step beside the median; the peer's has no such column
    assert all(row[4] != "failed" and float(row[4]) >= float(row[5]) > 0 for row in rows if row[0] == "jaxpos"), \
        proc.stdout
    assert "fastest none       with attention dropout: xla@0.1" in proc.stdout


def test_loop_overhead_benchmark_runs_every_way_at_a_tiny_size():
    proc = subprocess.run([sys.executable, "bench/loop_overhead.py", "--steps", "4", "--repeats", "1", "--seeds", "2",
                           "--dispatch-steps", "2", "--overrides", "model.d_model=32", "model.num_layers=1",
                           "model.mlp_dim=48", "data.vocab_size=300", "data.max_documents=20",
                           "data.tokenizer_max_sentences=2000", "train.batch_size=8"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=dict(os.environ, XLA_FLAGS=quick_compile_flags()))  # one device
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("jaxpos train loop", "bare"))]
    assert [row[:30] for row in rows] == [
        "bare jitted step, batches on t", "jaxpos train loop, batches mad", "jaxpos train loop, batches mad",
        "bare step vmapped over 2 seeds", "jaxpos train loop, 2 seeds at ", "bare, 2 steps a dispatch (lax."], \
        proc.stdout
    assert rows[0].split()[-1] == "1.00", proc.stdout
    for row in rows:  # ms a dispatch, ms a seed-step (half the dispatch for two seeds), tokens a second
        dispatch, seed_step, tokens = (float(x) for x in row.split()[-4:-1])
        assert dispatch > 0 and tokens > 0 and seed_step == pytest.approx(dispatch / (2 if " 2 seeds" in row
                                                                                      else 1), abs=0.01), row


def test_scaling_benchmark_at_a_tiny_size():
    """Both tables from the shipped recipe at a tiny size: a compile time per depth and layout, and per remat policy
    XLA's temporaries beside the arguments (the same parameters and moments under every policy)."""
    proc = subprocess.run([sys.executable, "bench/scaling.py", "--depths", "1,2", "--compile-size", "32x4",
                           "--compile-shape", "2x16", "--memory-size", "32x4x2", "--batch", "2", "--length", "16",
                           "--policies", "none,full"], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=dict(os.environ, XLA_FLAGS=quick_compile_flags()))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    depths = [line.split() for line in lines if line.strip()[:1].isdigit()]
    assert [row[0] for row in depths] == ["1", "2"] and all(float(x) > 0 for row in depths for x in row[1:])
    memory = {line.split()[0]: [float(x) for x in line.split()[1:]] for line in lines
              if line.startswith(("none ", "full "))}
    assert set(memory) == {"none", "full"} and memory["none"][1] == memory["full"][1] > 0
    assert 0 < memory["full"][0] <= memory["none"][0]


def test_gpu_verify_stage_lists_every_step_in_order_within_eight_minutes():
    """`verify`: the compiled kernel tests while the later steps' programs compile in the background, then each
    measurement alone (the MLM rows wait for the file the stage touches after the tests), and a compile from the
    persistent cache last; every name it passes exists, and the stage's deadline is at most 8 minutes."""
    from bench import train_throughput
    from jaxpos.config.model import REMAT_POLICIES

    commands = dry_run("bench/gpu_runs.sh", "verify")
    background = [argv[:-1] for argv in commands if argv[-1] == "&"]
    assert all(argv[:3] == ["timeout", "-k", "10"] for argv in commands if argv[0] != "touch")
    mlm, warm_loop, warm_attention = background
    tests = next(argv for argv in commands if "pytest" in argv)
    touch = next(argv for argv in commands if argv[0] == "touch")
    loop, attention, again = [argv for argv in commands if argv[-1] != "&" and argv not in (tests, touch)]
    assert commands.index(tests) > commands.index(mlm + ["&"]) and commands.index(touch) > commands.index(tests)
    assert {"tests/attention/test_toeplitz_mosaic_gpu.py", "tests/attention/test_auto.py"} <= set(tests)
    # the MLM rows: none without dropout first, the recipes through auto with and without attention dropout,
    # scanned TISA under every remat policy, the plain-JAX peer; timed only after the touched file exists
    rows = train_throughput.parse_rows(options(mlm)["--rows"])
    assert rows[0] == ("none", "auto", 0.0, "unrolled")
    assert {(kind, rate) for kind, impl, rate, layers in rows if layers == "unrolled"} == {
        (kind, rate) for kind in ("none", "tisa", "t5", "diet_rel") for rate in (0.0, 0.1)}
    assert {layers for *_, layers in rows} - {"unrolled"} == {f"scan-{p}" for p in REMAT_POLICIES}
    assert all(impl == "auto" and kind in MECHANISMS for kind, impl, *_ in rows)
    assert options(mlm)["--start-after"] == touch[1] and options(mlm)["--peers"] == "plain_jax"
    assert int(options(mlm)["--jobs"]) == len(rows) and options(mlm)["--shapes"] == "32x512"
    for warm, timed in ((warm_loop, loop), (warm_attention, attention)):  # the same programs, compiled first
        assert warm[4:6] == timed[4:6] and options(warm).get("--paths") == options(timed).get("--paths")
    assert options(loop)["--recipe"] == "full" and options(loop)["--seeds"] == "1,5,10"
    assert set(options(attention)["--paths"].split(",")) <= set(attention_bias.paths(True, {}))
    assert options(attention)["--peers"] == "flex" and "--causal" not in attention
    assert "--start-after" not in again and "auto@0.1" in options(again)["--paths"]
    with open(os.path.join(ROOT, "bench", "gpu_runs.sh")) as f:
        budget = int(next(line for line in f if line.startswith("VERIFY_S=")).split("=")[1])
    assert budget <= 480 and all(int(argv[3]) <= budget for argv in commands if argv[0] != "touch")


def test_training_benchmark_rows_layouts_and_a_start_file(tmp_path):
    """Rows named one by one (a scanned one with full remat among them) compile, then wait for the start file: no
    row is timed before it exists; each row gives its compile and first-step seconds and XLA's memory plan."""
    start = tmp_path / "go"
    proc = subprocess.Popen([sys.executable, "bench/train_throughput.py", "--size", "tiny", "--shapes", "8x32",
                             "--rows", "none:xla@0,tisa:xla@0.1/scan-full", "--steps", "2", "--jobs", "2",
                             "--peers", "", "--start-after", str(start)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env=dict(os.environ, XLA_FLAGS=quick_compile_flags()))
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=25)  # not done before the file exists (compiling takes about 20 s on 2 cores)
        start.touch()
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, stdout + stderr
    rows = table_rows(stdout)[2:]  # in row order
    assert [(row[1], row[2]) for row in rows] == [("none", "xla@0"), ("tisa", "xla@0.1/scan-full")], stdout
    assert all("compile" in row and "plan" in row and "first" in row for row in rows), stdout


def test_training_benchmark_refuses_unknown_rows(capsys):
    from bench import train_throughput

    for rows, message in (("tisa:xla@0/scan-most", "unknown layer layout"), ("tisaa:xla@0", "unknown mechanism"),
                          ("tisa:xlb@0", "unknown attention_impl")):
        with pytest.raises(SystemExit):
            train_throughput.main(["--rows", rows, "--peers", ""])
        assert message in capsys.readouterr().err


def test_flex_attention_peer_is_the_table_attention_of_jaxpos():
    """The peer's score_mod reads the table as jaxpos's expand_toeplitz does: its output equals jaxpos's attention
    with the same table (eager FlexAttention on the CPU, float32; its backward needs a GPU, where the peer checks
    its gradients against materialised attention before timing)."""
    import jax.numpy as jnp
    import numpy as np
    import torch

    from bench.peers.flex_attention import table_attention
    from jaxpos.attention import attend
    from jaxpos.attention.mask import AttentionMask

    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(2, 24, 3, 8)).astype(np.float32) for _ in range(3))
    table = rng.normal(size=(3, 47)).astype(np.float32) * 2
    pos = jnp.arange(24)
    want, _ = attend(q, k, v, bias=bias_terms(table=table), q_pos=pos, k_pos=pos, mask=AttentionMask())
    heads_first = [torch.tensor(np.moveaxis(x, 1, 2)) for x in (q, k, v)]
    got = np.moveaxis(table_attention(*heads_first, torch.tensor(table)).numpy(), 1, 2)
    np.testing.assert_allclose(got, np.asarray(want), rtol=1e-5, atol=1e-5)
    flipped = table_attention(*heads_first, torch.tensor(table[:, ::-1].copy())).numpy()  # q - k: another function
    assert np.abs(np.moveaxis(flipped, 1, 2) - np.asarray(want)).max() > 0.1


def test_attention_benchmark_refuses_a_peer_it_cannot_run(capsys):
    for argv, message in ((["--peers", "flash"], "unknown peer(s) flash"),
                          (["--peers", "flex", "--cpu-smoke"], "the flex peer runs non-causal attention on a GPU")):
        with pytest.raises(SystemExit):
            attention_bias.main(argv)
        assert message in capsys.readouterr().err


@pytest.mark.long
def test_the_lengths_stage_runs_at_a_tiny_size_and_a_later_host_continues_from_its_pack(tmp_path):
    """`bash bench/gpu_runs.sh lengths` on the CPU at a tiny size: the comparison, its report and the pack of its
    results; on a "later host" (another folder, the first one gone) LENGTHS_FROM continues from the pack and trains
    nothing that had finished."""
    import shutil

    small = " ".join([*SMALL_MLM, "--config.data.seq_len=16", "--config.model.max_length=16",
                      "--config.train.log_every=2"])
    env = dict(os.environ, PYTHON=sys.executable, LENGTHS_MECHANISMS_OVERRIDE="none,alibi", LENGTHS_SEEDS="2",
               LENGTHS_STEPS="4", LENGTHS_BATCH="8", LENGTHS_WORKERS="1", LENGTHS_FACTORS="1,2",
               LENGTHS_OVERRIDES=small, LENGTHS_S="400", XLA_FLAGS=quick_compile_flags())
    first = dict(env, OUT=str(tmp_path / "out1"), LENGTHS_OUT=str(tmp_path / "host1"))
    proc = subprocess.run(["bash", "bench/gpu_runs.sh", "lengths"], capture_output=True, text=True, timeout=600,
                          cwd=ROOT, env=first)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    pack = tmp_path / "out1" / "lengths-gpu.tar.gz"
    assert pack.stat().st_size > 0 and (tmp_path / "host1" / "COMPARISON.md").is_file()
    assert "# estimate: 2 pretrainings x 2 seeds x 4 steps" in proc.stdout + proc.stderr
    shutil.rmtree(tmp_path / "host1")  # the first host is gone; its pack came back
    second = dict(env, OUT=str(tmp_path / "out2"), LENGTHS_OUT=str(tmp_path / "host2"), LENGTHS_FROM=str(pack))
    proc = subprocess.run(["bash", "bench/gpu_runs.sh", "lengths"], capture_output=True, text=True, timeout=600,
                          cwd=ROOT, env=second)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "run(s) on" not in proc.stdout + proc.stderr  # every run had finished: nothing trains again
    report = (tmp_path / "host2" / "COMPARISON.md").read_text()
    assert "| ALiBi |" in report and "## Held-out loss by length" in report
