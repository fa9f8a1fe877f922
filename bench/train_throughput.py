"""Masked-LM training throughput: jaxpos per positional mechanism beside a plain-JAX script and Hugging Face.

    python bench/train_throughput.py                     # GPU: bert_base, 32x512 and 256x128, every system
    python bench/train_throughput.py --kinds none,tisa --shapes 32x512 --peers plain_jax
    python bench/train_throughput.py --kinds none,tisa,diet_rel --impl cudnn,pallas --peers ''   # both attention paths
    python bench/train_throughput.py --kinds none,tisa --impl xla,pallas --attention-dropout 0.1 --peers 
    python bench/train_throughput.py --size tiny --shapes 4x64 --kinds none,tisa --steps 3 --peers plain_jax  # CPU
    python bench/train_throughput.py --shapes 32x512 --kinds none,tisa --paths cudnn@0,xla@0.1,mosaic_gpu@0.1 \
        --jobs 6 --peers plain_jax        # the recipes as shipped and as they could be; six programs compiling at once

Every system trains on the same synthetic batches (15% of positions masked to the [MASK] id, token type 0
everywhere: the hot embedding rows of real data), bf16 compute with float32 parameters, dropout 0 (jaxpos:
attention dropout --attention-dropout), AdamW. Step time is the median over --steps timed steps after warm-up.
Each system runs in its own process (so that one framework's memory pool cannot starve the next). MFU counts the
model FLOPs of one step (6 x non-embedding parameters x tokens, 12 L T d per token for attention, and the MLM
head and tied logits at the masked positions only: what masked-LM needs, the same count for every system)
against the bf16 matmul rate measured in the same run (an 8192^3 product).

A row is a mechanism through one path, `impl@attention_dropout`, unrolled or `/scan-POLICY` (scanned layers with
model.remat=POLICY; --layers gives every row each layout). With --jobs N, N processes build and compile their rows
at once (compilation is host work, and XLA autotunes on the device while it compiles); only when every process has
compiled (and the --start-after file exists) does timing begin, each row in turn under an exclusive file lock
(`exclusive_device`), so no row is timed while anything compiles or another row runs. The peers compile before
their turn too. Each row reports its compile seconds (and whether jax's persistent compilation cache held the program:
`cache`, or compiled from `scratch`), its first step's seconds, its process's peak device memory (`peak GiB`; XLA's
autotuning while compiling counts too) and XLA's plan for the step (`plan`: arguments, outputs and temporaries); the
table
shows the fastest step beside the median, and --repeat-first measures the first row again at the end.

    python bench/train_throughput.py --shapes 32x512 --kinds tisa --paths auto@0 \
        --layers unrolled,scan-none,scan-save_projections,scan-save_dots,scan-full --jobs 5 --peers ''
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
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
DEVICE_LOCK_ENV = "JAXPOS_BENCH_DEVICE_LOCK"
BARRIER_ENV = "JAXPOS_BENCH_BARRIER"  # a folder: one mark per worker that has compiled
WORKERS_ENV = "JAXPOS_BENCH_WORKERS"  # how many marks timing waits for
START_ENV = "JAXPOS_BENCH_START"  # a file that must exist before anything is timed (--start-after)
UNROLLED = "unrolled"
SCANNED = "scan-"  # "scan-POLICY": scanned layers with model.remat=POLICY


def synthetic_batch(batch: int, seq_len: int, vocab: int, rng: np.random.Generator) -> dict:
    """Random targets, 15% of positions masked to [MASK], token type 0 (numpy arrays [batch, seq_len])."""
    targets = rng.integers(5, vocab, (batch, seq_len), dtype=np.int32)
    weights = (rng.random((batch, seq_len)) < 0.15).astype(np.float32)
    return dict(input_ids=np.where(weights > 0, MASK_ID, targets).astype(np.int32), targets=targets,
                mask_weights=weights, piece_ids=np.ones((batch, seq_len), np.int32),
                token_types=np.zeros((batch, seq_len), np.int32))


def max_predictions(seq_len: int) -> int:
    return int(seq_len * 0.15 * 1.5) + 1


def model_flops(size: str, batch: int, seq_len: int, vocab: int = VOCAB) -> float:
    """Model FLOPs of one training step (forward + backward = 3 x forward; jaxpos.training.flops, the count the
    training logs use), the head at the 15% of positions that are masked."""
    from jaxpos.config import model_config
    from jaxpos.training.flops import mlm_step_flops

    cfg = model_config(dict(SIZES[size], vocab_size=vocab, max_length=seq_len))
    return mlm_step_flops(cfg, batch, seq_len, 0.15 * seq_len)


def jaxpos_trainer(kind: str, size: str, batch: int, seq_len: int, dtype: str, impl: str, workdir: str,
                   attention_dropout: float = 0.0, layers: str = UNROLLED):
    """(trainer, state, two global batches) for a jaxpos masked-LM step of this shape; `layers`: UNROLLED, or
    "scan-POLICY" (scanned layers with model.remat=POLICY)."""
    import jax
    import ml_collections

    from jaxpos.config.defaults import mesh_block, model_block, train_block
    from jaxpos.config.run import run_config
    from jaxpos.training.loop import Trainer
    from jaxpos.training.mlm import MaskedLMTask

    config = ml_collections.ConfigDict()
    config.model = model_block(vocab_size=VOCAB, max_length=max(512, seq_len), dtype=dtype, attention_impl=impl,
                               dropout=0.0, attention_dropout=attention_dropout, **SIZES[size])
    if layers != UNROLLED:
        config.model.update(scan_layers=True, remat=layers.removeprefix(SCANNED))
    config.model.position.kind = kind
    config.data = ml_collections.ConfigDict(dict(seq_len=seq_len))
    config.train = train_block(num_steps=1000, batch_size=batch, max_predictions=max_predictions(seq_len))
    config.mesh = mesh_block()
    run = run_config(config, task="mlm")
    trainer = Trainer(run.train, workdir, MaskedLMTask.of(run), mesh=run.mesh, log=False)
    state = trainer._init(jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    batches = [trainer.global_batch(synthetic_batch(batch, seq_len, VOCAB, rng)) for _ in range(2)]
    return trainer, state, batches


def mark_compiled(name: str) -> None:
    """Tells the workers that `name` (a worker) has compiled what it times (or ended): see `exclusive_device`."""
    folder = os.environ.get(BARRIER_ENV)
    if folder:
        open(os.path.join(folder, f"compiled-{name}"), "a").close()


def wait_for_start(poll_s: float = 0.2) -> None:
    """Until every worker has compiled (BARRIER_ENV's folder holds their marks) and the start file, if one was
    named, exists: no timed step runs while another process compiles (XLA autotunes on the device then)."""
    folder = os.environ.get(BARRIER_ENV)
    if not folder:
        return
    workers = int(os.environ[WORKERS_ENV])
    start = os.environ.get(START_ENV)
    while (len([f for f in os.listdir(folder) if f.startswith("compiled-")]) < workers
           or (start and not os.path.exists(start))):
        time.sleep(poll_s)


@contextlib.contextmanager
def exclusive_device():
    """Holds the device alone among this benchmark's worker processes (the lock file the parent names), if any,
    once every worker has compiled (`wait_for_start`)."""
    wait_for_start()
    path = os.environ.get(DEVICE_LOCK_ENV)
    if not path:
        yield
        return
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def timed_steps(step, state, batches, steps: int) -> tuple[list[float], dict, float]:
    """Three warm-up steps, then `steps` timed ones (seconds each) under `exclusive_device`; the last metrics and
    the first warm-up step's seconds (what loading a compiled program leaves to its first run)."""
    import jax

    with exclusive_device():
        start = time.perf_counter()
        state, metrics = step(state, batches[0])
        jax.block_until_ready(metrics)
        first_s = time.perf_counter() - start
        for i in range(1, 3):
            state, metrics = step(state, batches[i % 2])
        jax.block_until_ready(metrics)
        times = []
        for i in range(steps):
            start = time.perf_counter()
            state, metrics = step(state, batches[i % 2])
            jax.block_until_ready(metrics)
            times.append(time.perf_counter() - start)
    return times, metrics, first_s


def peak_gib() -> float | None:
    """This process's peak device memory so far (GiB), where the backend counts it (GPUs, TPUs; not CPUs)."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return stats["peak_bytes_in_use"] / 2**30 if "peak_bytes_in_use" in stats else None


CACHE_EVENTS = {"/jax/compilation_cache/compile_requests_use_cache": 0, "/jax/compilation_cache/cache_hits": 0}


def count_cache_events() -> None:
    """Counts jax's persistent-cache lookups and hits in CACHE_EVENTS (so a row can say where its program came from)."""
    import jax

    def listener(event: str, **_):
        if event in CACHE_EVENTS:
            CACHE_EVENTS[event] += 1

    jax.monitoring.register_event_listener(listener)


def prepare_jaxpos(row: tuple, size, batch, seq_len, dtype) -> dict:
    """A row's trainer, state, batches and compiled step (host work, done before any row is timed)."""
    kind, impl, rate, layers = row
    scratch = tempfile.TemporaryDirectory()
    trainer, state, batches = jaxpos_trainer(kind, size, batch, seq_len, dtype, impl, scratch.name, rate, layers)
    before = dict(CACHE_EVENTS)
    start = time.perf_counter()
    step = trainer.train_step.lower(state, batches[0]).compile()
    compile_s = time.perf_counter() - start
    looked, hits = (CACHE_EVENTS[event] - before[event] for event in CACHE_EVENTS)
    memory = step.memory_analysis()  # XLA's plan: arguments, outputs not aliased to them, temporaries
    plan = None if memory is None else (memory.argument_size_in_bytes + memory.output_size_in_bytes
                                        - memory.alias_size_in_bytes + memory.temp_size_in_bytes) / 2**30
    return dict(trainer=trainer, state=state, batches=batches, step=step, scratch=scratch, compile_s=compile_s,
                plan_gib=plan, compiled_from="cache" if hits else "scratch" if looked else "scratch, no cache")


def time_jaxpos(row: tuple, prepared: dict, batch: int, seq_len: int, steps: int) -> dict:
    """Times a prepared row (`prepare_jaxpos`), then frees it."""
    kind, impl, rate, layers = row
    try:
        times, metrics, first_s = timed_steps(prepared["step"], prepared["state"], prepared["batches"], steps)
    finally:
        prepared["trainer"].close()
        prepared["scratch"].cleanup()
    ms = statistics.median(times) * 1e3
    return dict(system="jaxpos", kind=kind, impl=impl, attention_dropout=rate, layers=layers, ms=ms,
                ms_min=min(times) * 1e3, tokens_per_s=batch * seq_len / ms * 1e3, loss=float(metrics["loss"]),
                compile_s=prepared["compile_s"], first_step_s=first_s, peak_gib=peak_gib(),
                plan_gib=prepared["plan_gib"], compiled_from=prepared["compiled_from"])


def parse_rows(text: str) -> list[tuple[str, str, float, str]]:
    """"kind:impl@rate[/layers],..." -> [(kind, impl, attention dropout, layers)]."""
    rows = []
    for item in filter(None, text.split(",")):
        kind, path = item.split(":")
        rows.append((kind, *parse_path(path)))
    return rows


def parse_path(path: str) -> tuple[str, float, str]:
    """"impl@rate[/layers]" (no rate: no attention dropout; no layers: unrolled) -> (impl, rate, layers)."""
    path, _, layers = path.partition("/")
    impl, _, rate = path.partition("@")
    return impl, float(rate or 0.0), layers or UNROLLED


def row_text(row: tuple) -> str:
    kind, impl, rate, layers = row
    return f"{kind}:{impl}@{rate:g}" + ("" if layers == UNROLLED else f"/{layers}")


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
    """One process: the ceiling, a list of jaxpos rows, or one peer; prints a JSON line per result. Every row is
    compiled before any is timed (`exclusive_device` waits for every worker's mark)."""
    from jaxpos.compilation_cache import enable_compilation_cache

    enable_compilation_cache()
    count_cache_events()
    batch, seq_len = (int(x) for x in args.shape.split("x"))
    rng = np.random.default_rng(0)
    if args.worker == "jaxpos":
        prepared = []
        try:
            for row in parse_rows(args.rows):
                try:
                    prepared.append((row, prepare_jaxpos(row, args.size, batch, seq_len, args.dtype)))
                except Exception as err:  # noqa: BLE001 - one mechanism failing must not hide the others
                    print(json.dumps(row_error(row, err)), flush=True)
        finally:
            mark_compiled(args.worker_name)
        for row, ready in prepared:
            try:
                result = time_jaxpos(row, ready, batch, seq_len, args.steps)
            except Exception as err:  # noqa: BLE001
                result = row_error(row, err)
            print(json.dumps(result), flush=True)
        return
    if args.worker == "ceiling":
        mark_compiled(args.worker_name)  # compiles inside its turn: one small product
        with exclusive_device():
            result = matmul_ceiling()
    elif args.worker == "plain_jax":
        from bench.peers.plain_jax_bert import measure

        data = [synthetic_batch(batch, seq_len, VOCAB, rng) for _ in range(2)]
        result = measure(batch, seq_len, args.steps, data, size=SIZES[args.size], hold=exclusive_device,
                         compiled=lambda: mark_compiled(args.worker_name))
    elif args.worker == "huggingface":
        from bench.peers.hf_bert import measure

        mark_compiled(args.worker_name)  # eager PyTorch: nothing compiles before its turn
        data = [synthetic_batch(batch, seq_len, VOCAB, rng) for _ in range(2)]
        with exclusive_device():
            result = measure(batch, seq_len, args.steps, data, size=SIZES[args.size])
    else:
        raise ValueError(f"unknown worker {args.worker!r}")
    print(json.dumps(result), flush=True)


def row_error(row: tuple, err: Exception) -> dict:
    kind, impl, rate, layers = row
    return dict(system="jaxpos", kind=kind, impl=impl, attention_dropout=rate, layers=layers,
                error=f"{type(err).__name__}: {str(err)[:160]}")


def run_worker(name: str, args, shape: str, extra: list[str] = (), on_result=None, env: dict | None = None,
               worker_name: str | None = None) -> list[dict]:
    """Runs one worker process; each JSON line it prints is a result, handed to on_result as it arrives. When it
    ends, its compiled mark is set whatever happened (a worker that died must not hold the others' turns)."""
    worker_name = worker_name or name
    command = [sys.executable, "-m", "bench.train_throughput", "--worker", name, "--worker-name", worker_name,
               "--shape", shape, "--size", args.size, "--steps", str(args.steps), "--dtype", args.dtype, *extra]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, **(env or {}))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    results = []
    with tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=root, env=env)
        for line in proc.stdout:
            if line.startswith("{"):
                results.append(json.loads(line))
                if on_result:
                    on_result(results[-1])
        proc.wait()
        if env.get(BARRIER_ENV):
            open(os.path.join(env[BARRIER_ENV], f"compiled-{worker_name}"), "a").close()
        if proc.returncode != 0:
            stderr.seek(0)
            tail = (stderr.read().strip().splitlines() or ["?"])[-1]
            failed = dict(system=name, error=f"exit {proc.returncode}: {tail[:160]}")
            results.append(failed)
            if on_result:
                on_result(failed)
    return results


def requested_rows(args) -> list[tuple[str, str, float, str]]:
    """Every mechanism through every path and layer layout, mechanism by mechanism in the order given (the first
    row: the baseline of 'x base')."""
    paths = args.paths.split(",") if args.paths else [f"{impl}@{args.attention_dropout}"
                                                       for impl in args.impl.split(",")]
    layouts = args.layers.split(",")
    rows = parse_rows(args.rows) if args.rows else [
        (kind, impl, rate, layers) for kind in args.kinds.split(",") for path in paths
        for impl, rate, given in [parse_path(path)] for layers in ([given] if given != UNROLLED else layouts)]
    return rows + rows[:1] if args.repeat_first else rows


def run_concurrently(jobs: list) -> None:
    """Runs each zero-argument callable in its own thread and waits for all of them."""
    threads = [threading.Thread(target=job) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="bert_base", choices=SIZES)
    parser.add_argument("--shapes", default="32x512,256x128", help="comma-separated BATCHxSEQ")
    parser.add_argument("--kinds", default=PAPER_KINDS)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--impl", default="cudnn",
                        help="attention_impl for jaxpos (xla, jax, cudnn, pallas or mosaic_gpu) or a comma list, "
                             "each with --attention-dropout; ignored with --paths")
    parser.add_argument("--attention-dropout", type=float, default=0.0,
                        help="jaxpos only (BERT's recipe: 0.1; xla, pallas and mosaic_gpu have it, cudnn not)")
    parser.add_argument("--paths", default="",
                        help="comma list of impl@attention_dropout, e.g. cudnn@0,xla@0.1: every mechanism "
                             "through each")
    parser.add_argument("--jobs", type=int, default=1,
                        help="jaxpos worker processes compiling at once (they take turns on the device)")
    parser.add_argument("--repeat-first", action="store_true",
                        help="measure the first row again at the end (the run's noise on one program)")
    parser.add_argument("--peers", default="plain_jax,huggingface", help="comma list, or '' for none")
    parser.add_argument("--layers", default=UNROLLED,
                        help=f"comma list of layer layouts for every row: {UNROLLED} (default) or scan-POLICY "
                             "(scanned layers with model.remat=POLICY: none, save_projections, save_dots, full); "
                             "a path may name its own as impl@rate/scan-POLICY")
    parser.add_argument("--start-after", default="",
                        help="a file: the workers compile at once, then time nothing until it exists (so a script "
                             "can compile this benchmark's programs while other work holds the device)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker-name", help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    parser.add_argument("--rows", default="",
                        help="comma list of kind:impl@rate[/layers] rows, instead of --kinds x --paths x --layers")
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    from jaxpos.attention.registry import attention_impls
    from jaxpos.config.model import REMAT_POLICIES
    from jaxpos.positions import MECHANISMS
    rows = requested_rows(args)
    if {kind for kind, *_ in rows} - set(MECHANISMS):
        parser.error(f"unknown mechanism in {sorted({r[0] for r in rows} - set(MECHANISMS))}")
    unknown = {impl for _, impl, _, _ in rows} - set(attention_impls())
    if unknown:
        parser.error(f"unknown attention_impl {sorted(unknown)}; choose from {', '.join(attention_impls())}")
    layouts = {UNROLLED, *(SCANNED + policy for policy in REMAT_POLICIES)}
    if {layers for *_, layers in rows} - layouts:
        parser.error(f"unknown layer layout in {sorted({r[3] for r in rows} - layouts)}; choose from "
                     f"{', '.join(sorted(layouts))}")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    print(f"{time.strftime('%Y-%m-%d')}  size={args.size}  median of {args.steps} steps; {args.jobs} worker(s) "
          "compile at once, then each row is timed alone", flush=True)
    ceiling: dict = {}
    for shape in args.shapes.split(","):
        measure_shape(args, shape, rows, ceiling)


def measure_shape(args, shape: str, rows: list, ceiling: dict) -> None:
    """Every row and peer at one shape (and the matmul ceiling, once), printed as each is measured, then the table
    in row order. Every process compiles first; then they take turns on the device (`exclusive_device`)."""
    batch, seq_len = (int(x) for x in shape.split("x"))
    flops = model_flops(args.size, batch, seq_len)
    results: list[dict] = []
    printing = threading.Lock()

    def show(result):
        with printing:
            results.append(result)
            print_rows(shape, flops, [result], results, ceiling.get("tflops"))

    def found_ceiling(result):
        with printing:
            ceiling.update(result)
            print(f"device: {result.get('device')}  jax {result.get('jax')}  bf16 matmul ceiling "
                  f"{result.get('tflops', float('nan')):.0f} TFLOP/s", flush=True)

    def rows_of(job):
        text = ",".join(row_text(row) for row in rows[job::args.jobs])
        return lambda: run_worker("jaxpos", args, shape, ["--rows", text], on_result=show, env=env,
                                  worker_name=f"jaxpos-{job}")

    with tempfile.TemporaryDirectory() as scratch:
        env = {DEVICE_LOCK_ENV: os.path.join(scratch, "device.lock"), BARRIER_ENV: scratch,
               START_ENV: os.path.abspath(args.start_after) if args.start_after else "",
               # each process takes device memory as it needs it, not 75% of it up front
               "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        jobs = [rows_of(job) for job in range(min(args.jobs, len(rows)))]
        jobs += [lambda peer=peer: run_worker(peer, args, shape, on_result=show, env=env)
                 for peer in filter(None, args.peers.split(","))]
        if not ceiling:
            jobs.append(lambda: run_worker("ceiling", args, "1x1", on_result=found_ceiling, env=env))
        env[WORKERS_ENV] = str(len(jobs))
        run_concurrently(jobs)
    if len(rows) > 1 or len(jobs) > 2:
        print(f"\n{shape}, in row order:", flush=True)
        print_header()
        order = {row: i for i, row in reversed(list(enumerate(rows)))}
        ranked = sorted(results, key=lambda r: order.get(row_key(r), len(order)))
        print_rows(shape, flops, ranked, results, ceiling.get("tflops"))
    summary(shape, results)


def row_key(result: dict) -> tuple:
    return (result.get("kind"), result.get("impl"), result.get("attention_dropout", 0.0),
            result.get("layers", UNROLLED))


def path_name(result: dict) -> str:
    """impl@rate, with /layers where not unrolled (peers: the attention they use)."""
    if "impl" not in result:
        return result.get("attention", "")
    return row_text(row_key(result)).partition(":")[2]


def baseline(results: list[dict]) -> dict | None:
    """The first measured jaxpos `none` row without attention dropout, unrolled (the 'x base' of every row)."""
    return next((r for r in results if r.get("kind") == "none" and "ms" in r and not r.get("attention_dropout")
                 and r.get("layers", UNROLLED) == UNROLLED), None)


def summary(shape: str, results: list[dict]) -> None:
    """Per shape: jaxpos none against each peer, and each mechanism's fastest path with and without attention
    dropout as a multiple of the baseline's step."""
    base = baseline(results)
    if base is None:
        return
    peers = [f"{r['system']} {r['tokens_per_s'] / 1e3:.0f}k (jaxpos none at {r['ms'] / base['ms']:.2f}x its "
             "step time)" for r in results if r.get("system") != "jaxpos" and "ms" in r]
    print(f"{shape}: jaxpos none ({path_name(base)}) {base['tokens_per_s'] / 1e3:.0f}k tokens/s"
          + "".join(f"; {p}" for p in peers), flush=True)
    fastest: dict[tuple, dict] = {}
    for r in results:
        if r.get("system") == "jaxpos" and "ms" in r:
            key = (r["kind"], bool(r.get("attention_dropout")), r.get("layers", UNROLLED))
            if key not in fastest or r["ms"] < fastest[key]["ms"]:
                fastest[key] = r
    for (kind, dropout, layers), r in fastest.items():
        where = "" if layers == UNROLLED else f", {layers}"
        print(f"  fastest {kind:<10} {'with' if dropout else 'without'} attention dropout{where}: "
              f"{path_name(r):<16} {r['ms'] / base['ms']:.2f}x base", flush=True)


def print_header() -> None:
    print(f"{'system':<11} {'mechanism':<10} {'path':<26} {'shape':>7} {'step ms':>8} {'min ms':>7} "
          f"{'tokens/s':>10} {'x base':>7} {'MFU':>6} {'peak GiB':>8}  note", flush=True)


def print_rows(shape: str, flops: float, rows: list[dict], context: list[dict], ceiling_tflops) -> None:
    """Rows of the table; 'x base' is the step time over the baseline's (`baseline` of context: every result of
    the shape so far); the note gives the compile seconds and the first step's."""
    base = baseline(context)
    for r in rows:
        name, kind = r.get("system", "?"), r.get("kind", "-")
        path = path_name(r)
        if "ms" not in r:
            print(f"{name:<11} {kind:<10} {path:<26} {shape:>7} {'failed':>8}  {r.get('error', '')}", flush=True)
            continue
        vs_base = f"{r['ms'] / base['ms']:.2f}" if base else "-"
        mfu = f"{flops / (r['ms'] * 1e-3) / (ceiling_tflops * 1e12):.1%}" if ceiling_tflops else "-"
        fastest = f"{r['ms_min']:7.1f}" if "ms_min" in r else f"{'':>7}"
        peak = f"{r['peak_gib']:8.1f}" if r.get("peak_gib") is not None else f"{'-':>8}"
        compiled = f" ({r['compiled_from']})" if "compiled_from" in r else ""
        note = " ".join(filter(None, [f"compile {r['compile_s']:.0f}s{compiled}" if "compile_s" in r else "",
                                      f"first step {r['first_step_s']:.1f}s" if "first_step_s" in r else "",
                                      f"plan {r['plan_gib']:.1f} GiB" if r.get("plan_gib") is not None else "",
                                      r.get("attention", "")]))
        print(f"{name:<11} {kind:<10} {path:<26} {shape:>7} {r['ms']:8.1f} {fastest} {r['tokens_per_s']:10,.0f} "
              f"{vs_base:>7} {mfu:>6} {peak}  {note}", flush=True)


if __name__ == "__main__":
    main()
