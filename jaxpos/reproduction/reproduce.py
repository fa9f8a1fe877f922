"""`jaxpos reproduce` from start to report: the plan of a profile's fixed recipe for the chosen claims and
mechanisms (resumed from OUT/plan.json where there is one), the shared tokenizer, a short timing that estimates
the wall time (and changes nothing), the runs on a pool of worker processes (each mechanism's seeds pretrained at
once, then each run's stages), the step times of the cost claims timed alone, and REPRODUCTION.md. A SLURM array
task executes a mechanism or one run through `run_one`."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Sequence

import numpy as np

from jaxpos.data.bible import bible_db_path
from jaxpos.progress import status
from jaxpos.reproduction import host, matrix
from jaxpos.config.files import write_json_atomically
from jaxpos.reproduction.claims import STEP_TIMES_FILE, runs_needed, select_claims
from jaxpos.reproduction.pool import Pool, execute, worker_env

WALL_FILE = "wall_time.json"
RUNS_LIST_FILE = "runs.txt"
# Compiling a stage costs, in compiles of the timed train step: its train step and its forward-only evaluations
# (about a third each). Fitted to the smoke profile's stages on 2 CPU cores (2026-11-27: a mechanism's two seeds
# pretrained in 34 s of which 27 s stepping; a fine-tuning of 60 steps in 8 s).
COMPILED_PROGRAMS = dict(pretrain=1.5, finetune=1.0)
# An analysed checkpoint of configs/mlm/tiny.py on one CPU core, where every worker runs its analyses: about 2 s
# (a rough allowance; 11 s for five on a 2-core AMD EPYC, compiling included)
ANALYSIS_S = 2.0
# The order stage's zero-shot scoring: a masked copy of each dev side per token (about a third of max_length
# tokens a side), each row max_length long and forward-only with the head at one position, costing this fraction of
# a train step per batch of rows. Fitted to the smoke profile on 2 CPU cores (2026-11-27: 7 s a run); it puts the
# `full` profile's at 77 s a run where 25 s were measured, a rough allowance beside its runs of over an hour there.
ZERO_SHOT_STEP_FRACTION = 1 / 4


def new_plan(profile: str, seeds: int | None = None, workers: int | None = None,
             mechanisms: Sequence[str] | None = None, claims: Sequence[str] | None = None) -> dict:
    """The run matrix of these settings without writing anything: the runs (mechanism x seed, with their stages)
    that the chosen claims need of the chosen mechanisms (default: the profile's), and the bag-of-words runs."""
    chosen = matrix.PROFILES[profile] if profile in matrix.PROFILES else matrix.load_profile(profile)
    available = list(mechanisms or chosen.mechanisms)
    unknown = [m for m in available if m not in matrix.RUN_MECHANISMS]
    if unknown or not available:
        raise ValueError(f"unknown mechanisms {unknown}; choose from {', '.join(matrix.RUN_MECHANISMS)}")
    selected = select_claims(claims)
    needs = runs_needed(selected, available)
    return matrix.make_plan(chosen, seeds or chosen.seeds, needs, workers or host.default_workers(),
                          [c.id for c in selected])


def _same(a, b) -> bool:
    return json.loads(json.dumps(a)) == json.loads(json.dumps(b))


def resumed_plan(old: dict, new: dict) -> dict:
    """The plan to carry on with in an --out folder that holds `old`: `old` itself when `new` asks for the same,
    or `old` grown by the runs of mechanisms `new` adds (its finished runs, tokenizer and timing kept; the same
    recipe, seeds and claims). Raises ValueError otherwise. Profiles compare with their defaults filled in, so a
    plan saved before a profile field was added still resumes."""
    profiles = [dataclasses.asdict(matrix.profile_of(p)) for p in (old, new)]
    if _same(profiles[0], profiles[1]) and old["seeds"] == new["seeds"] and _same(old["runs"], new["runs"]):
        return old
    grown = [dict(p, mechanisms=None, variants=None) for p in profiles]
    kept = all(name in new["runs"] and _same(spec, new["runs"][name]) for name, spec in old["runs"].items())
    kept = kept and all(_same(v, profiles[1]["variants"].get(k)) for k, v in profiles[0]["variants"].items())
    if (not _same(grown[0], grown[1]) or old["seeds"] != new["seeds"] or not kept
            or old.get("claims") != new.get("claims")):
        raise ValueError("the recipe, seeds or runs differ from the plan already in this --out folder: use a new --out, "
                         "or the same settings (more mechanisms may be added) to resume")
    runs = dict(old["runs"], **{name: spec for name, spec in new["runs"].items() if name not in old["runs"]})
    added = [m for m in new["mechanisms"] if m not in old["mechanisms"]]
    status(f"adding {len(runs) - len(old['runs'])} run(s) of {', '.join(added)} to the plan")
    return dict(old, profile=new["profile"], mechanisms=[*old["mechanisms"], *added], runs=runs,
                **{key: new[key] for key in ("comparison",) if key in new})


def _shared_tokenizer(out: str, plan: dict) -> tuple[str, dict]:
    """The SentencePiece model every run uses (the same data for all), trained once as `jaxpos train` would, and
    the size of the training corpus and its unigram entropy."""
    from jaxpos.data.pipeline import build_mlm_data  # the data layer: only where the plan needs a tokenizer

    config = matrix.pretrain_config(dict(plan, tokenizer=""), plan["mechanisms"][0], 0)
    data = build_mlm_data(config.data, config.train.batch_size, os.path.join(out, "tokenizer"))
    corpus = dict(source=config.data.source, editions=list(config.data.get("bible_editions", ())),
                  documents=data.stats.documents, tokens=data.stats.tokens, rows=data.stats.packed_examples,
                  held_out_rows=len(data.eval_examples), unigram_entropy=data.unigram_entropy)
    return os.path.abspath(data.tokenizer.path), corpus


def estimate(plan: dict, timing: dict, workers: int,
             unfinished: dict[str, tuple[list[str], list[str]]] | None = None) -> dict:
    """The wall time of the `unfinished` runs (`matrix.unfinished_groups`; default: every run, none pretrained) on
    `workers` processes, scheduled as `pool.execute` runs them,
    from a timing of the recipe taken on every worker at once (so a step's cost includes sharing the device):
    first each mechanism's pretraining, the seeds left to pretrain at once (the group's step, timed at the plan's
    seed count; with its other stages where one is left),
    then each run's learning curve, fine-tunings (the order task's at each learning rate of its grid, each compiled,
    and its zero-shot scoring), length evaluation (a program a length) and an allowance per analysed checkpoint
    (one seed's step), the tasks taken in turn by the first free worker. Every group compiles its programs; a run
    compiles its fine-tunings and evaluations unless a run of its mechanism had finished them before it started
    (the compilation cache).
    {"run_s": {name: s}, "group_s": {mechanism: s}, "total_s", "workers"}."""
    profile = matrix.profile_of(plan)
    step, group_step = timing["step_s"], timing.get("group_step_s", timing["step_s"])
    compile_s = max(0.0, timing["first_step_s"] - step)
    group_compile_s = max(0.0, timing.get("group_first_step_s", timing["first_step_s"]) - group_step)
    pretrain_rows = profile.train["batch_size"] * profile.data["seq_len"]

    def step_of(tokens: int) -> float:
        """A step of `tokens` tokens: a pretraining step's time in proportion on CPU cores (compute-bound); on an
        accelerator, where a tiny model's step is latency-bound, never less than a pretraining step."""
        share = tokens / pretrain_rows
        return step * (share if timing.get("platform", "cpu") == "cpu" else max(1.0, share))

    finetune_step = step_of(profile.finetune_train["batch_size"] * profile.finetune_data["max_length"])
    groups = unfinished or {m: (names, names) for m, names in matrix.pretraining_groups(plan).items()}

    def rest_s(name: str, compiles: bool, pretrains: bool) -> float:
        stages = set(plan["runs"][name]["stages"])
        s = profile.curve_points * profile.eval_batches * step / 3  # forward only: ~1/3
        if pretrains:  # alone: the only seed of its mechanism left to pretrain
            s += profile.steps * step + COMPILED_PROGRAMS["pretrain"] * compile_s
        if "finetune" in stages:
            s += profile.finetune_train["num_steps"] * finetune_step + COMPILED_PROGRAMS["finetune"] * compile_s * \
                compiles
        if "order" in stages:  # a fine-tuning a learning rate, each its own program (the rate is a constant)
            rates, order, inputs = len(profile.order_rates()), profile.order_recipe(), profile.order_inputs()
            length = inputs["max_length"]
            order_step = step_of(order["batch_size"] * length)
            s += rates * (order["num_steps"] * order_step + COMPILED_PROGRAMS["finetune"] * compile_s * compiles)
            # a couple is two dev pairs and two versions of its swapped side, a masked row a token of each
            masked_rows = inputs["offline_dev_examples"] * length / 3
            s += compile_s * compiles + masked_rows * length / pretrain_rows * step * ZERO_SHOT_STEP_FRACTION
        if "lengths" in stages:  # a forward-only program a length: about a third of a train step's compiling
            s += len(profile.length_factors) * compile_s / 3 * compiles
        # over training: the initialisation and every analysed step; else the last step alone
        analysed = 1 + len(profile.analysis_steps()) if "over_training" in stages else int(bool(stages & {"last",
                                                                                                           "final"}))
        return s + analysed * ANALYSIS_S

    free = [0.0] * max(1, workers)  # when each worker takes its next task
    queue = [task for m, (names, to_pretrain) in groups.items() for task in
             ([("group", m)] if len(to_pretrain) > 1 else [("run", n) for n in names])]
    ready = {}  # a queued task -> when it was queued (a group's runs: when it ended)
    cached: dict[str, float] = {}  # mechanism -> when its first run ended
    seconds, group_seconds = {}, {}
    while queue:  # the executor's queue: groups first, a group's runs once it ended, in the order they came
        kind, name = queue.pop(min(range(len(queue)), key=lambda k: (ready.get(queue[k], 0.0), k)))
        start = max(min(free), ready.get((kind, name), 0.0))
        worker = free.index(min(free))
        if kind == "group":
            s = profile.steps * group_step + COMPILED_PROGRAMS["pretrain"] * group_compile_s
            group_seconds[name] = s
            queue += [("run", n) for n in groups[name][0]]
            ready.update({("run", n): start + s for n in groups[name][0]})
        else:
            mechanism = plan["runs"][name]["mechanism"]
            to_pretrain = groups[mechanism][1]
            s = rest_s(name, cached.get(mechanism, math.inf) > start, len(to_pretrain) == 1 and name in to_pretrain)
            seconds[name] = s
            cached[mechanism] = min(cached.get(mechanism, math.inf), start + s)
        free[worker] = start + s
    return dict(run_s=seconds, group_s=group_seconds, total_s=max(free), workers=workers)


def time_on_every_worker(pool: Pool) -> dict:
    """The recipe timed on every worker of `pool` at once, as the runs will share the device and the cores: the
    median over workers of each figure of `pipeline.time_recipe` (one seed's first step, compiling included, and
    step; the same of the plan's seeds at once), the platform, and each worker's timing."""
    timings = pool.call_on_every_worker("time_recipe", matrix.TIMING_MECHANISM)
    keys = ("first_step_s", "step_s", "group_first_step_s", "group_step_s")
    return dict({key: float(np.median([t[key] for t in timings])) for key in keys},
                seeds_at_once=timings[0]["seeds_at_once"], platform=timings[0]["platform"],
                mechanism=matrix.TIMING_MECHANISM, workers=timings)


def describe_estimate(plan: dict, estimated: dict, device: str) -> str:
    timing = plan["timing"]
    group = (f", {timing['seeds_at_once']} seeds at once {timing['group_step_s'] * 1000:.0f} ms"
             if timing.get("seeds_at_once", 1) > 1 else "")
    return (f"estimated wall time: {estimated['total_s'] / 60:.1f} min for {len(estimated['run_s'])} run(s) on "
            f"{device} (a step {timing['step_s'] * 1000:.0f} ms{group}, {timing['first_step_s']:.1f} s to compile, "
            f"timed on every worker at once; fine-tuning and analyses are rough allowances)")


def time_alone(out: str, plan: dict, pool: Pool) -> dict | None:
    """The step times that `timed_alone` claims read, once the runs have finished and the device is free: each of
    their mechanisms in the plan timed alone on one worker (`pipeline.time_alone`), written to OUT/step_times.json
    (kept: a resumed command does not time again). None where no chosen claim reads them."""
    path = os.path.join(out, STEP_TIMES_FILE)
    if not plan["claims"]:  # a comparison: no claim reads step times
        return None
    wanted = list(dict.fromkeys(m for claim in select_claims(plan["claims"]) for m in claim.timed(plan["mechanisms"])))
    if not wanted or os.path.isfile(path):
        return None
    status(f"timing {', '.join(wanted)} alone on the device (the step-time claims)")
    times = pool.call("time_alone", ",".join(wanted))
    record = dict(step_s=times, steps=matrix.profile_of(plan).timing_steps, device=pool.device,
                  at=time.strftime("%Y-%m-%d %H:%M:%S"))
    write_json_atomically(path, record, indent=1)
    return record


@dataclasses.dataclass
class Reproduction:
    plan: dict  # OUT/plan.json
    numbers: dict | None = None  # OUT/numbers.json (None when only planned)
    wall_s: float | None = None  # the whole command's seconds (None when only planned)


def reproduce(out: str, profile: str, seeds: int | None = None, workers: int | None = None,
              mechanisms: Sequence[str] | None = None, claims: Sequence[str] | None = None, *,
              command: str = "jaxpos reproduce", plan_only: bool = False) -> Reproduction:
    """Plans (or resumes the plan in OUT), trains the shared tokenizer, times the recipe to estimate the wall time,
    executes every run on `workers` processes and writes the report (`command` is quoted in it). `plan_only`:
    stops after the tokenizer, with the mechanisms in OUT/runs.txt for array tasks started elsewhere."""
    from jaxpos.reproduction.report import write_report  # matplotlib: only once there is a report to write

    bible_db_path()  # the Bible corpora are in an extra: say which before anything runs
    plan = new_plan(profile, seeds, workers, mechanisms, claims)
    chosen = matrix.profile_of(plan)
    about = (f"jaxpos reproduce: profile {chosen.name} ({chosen.purpose}): {len(plan['runs'])} runs of "
             f"{len(plan['mechanisms'])} mechanisms x {plan['seeds']} seed(s) for {len(plan['claims'])} claim(s)")
    return run_plan(out, plan, "jaxpos reproduce", about, write_report, command=command, plan_only=plan_only)


def run_plan(out: str, plan: dict, name: str, about: str, write_report, *, command: str,
             plan_only: bool) -> Reproduction:
    """The engine of `jaxpos reproduce` and `jaxpos compare` (`name`): resumes the plan in OUT (refusing another),
    trains the shared tokenizer, times the recipe to estimate the wall time, executes every run on the plan's
    workers and writes the report with `write_report(out, wall_s=, command=)`. `about`: a new plan's status line."""
    start = time.perf_counter()
    workers = plan["workers"]
    old = matrix.load_plan(out)
    if old is not None:
        status(f"{name}: resuming the plan in {out}")
        plan = resumed_plan(old, plan)
        matrix.save_plan(out, plan)
    else:
        status(f"{about} -> {out}")
    if "tokenizer" not in plan:
        plan["tokenizer"], plan["corpus"] = _shared_tokenizer(out, plan)
        matrix.save_plan(out, plan)
    names = list(plan["runs"])
    with open(os.path.join(out, RUNS_LIST_FILE), "w") as f:  # an array task a mechanism: its seeds at once
        f.write("".join(mechanism + "\n" for mechanism in matrix.pretraining_groups(plan)))
    if plan_only:
        return Reproduction(plan)
    try:  # a stopped or failed command's time counts too: the report sums every command that ran the plan
        with Pool(out, min(workers, len(names)), matrix.profile_of(plan).xla_flags) as pool:
            unfinished = matrix.unfinished_groups(out, plan)
            if unfinished:
                if "timing" not in plan:
                    plan["timing"] = time_on_every_worker(pool)
                    matrix.save_plan(out, plan)
                estimated = estimate(plan, plan["timing"], pool.workers, unfinished)
                plan.setdefault("estimates", []).append(dict(estimated, at=time.strftime("%Y-%m-%d %H:%M:%S")))
                matrix.save_plan(out, plan)
                status(describe_estimate(plan, estimated, pool.device))
            execute(out, plan, pool)
            time_alone(out, plan, pool)
    finally:
        plan.setdefault("commands", []).append(dict(at=time.strftime("%Y-%m-%d %H:%M:%S"),
                                                    wall_s=round(time.perf_counter() - start, 1)))
        matrix.save_plan(out, plan)
    wall = sum(c["wall_s"] for c in plan["commands"])  # every command that ran this plan, the last included
    numbers = write_report(out, wall_s=wall, command=command)
    with open(os.path.join(out, WALL_FILE), "w") as f:
        json.dump(dict(wall_s=wall, commands=len(plan["commands"])), f)
    return Reproduction(plan, numbers, wall)


def report_only(out: str, command: str = "jaxpos reproduce", write_report=None) -> dict:
    """Writes the report from the finished runs in OUT (`write_report`: the reproduction's by default, or a
    comparison's), with the wall time of the command that ran them; returns the numbers."""
    if write_report is None:
        from jaxpos.reproduction.report import write_report  # matplotlib: only once there is a report to write

    wall = None
    if os.path.isfile(os.path.join(out, WALL_FILE)):  # the wall time of the command that ran the runs
        with open(os.path.join(out, WALL_FILE)) as f:
            wall = json.load(f)["wall_s"]
    return write_report(out, wall_s=wall, command=command)


def run_one(out: str, name: str) -> str:
    """Executes NAME of the plan in OUT in this process (a SLURM array task; the scheduler gives it its device):
    a mechanism (its unfinished seeds pretrained at once, then each run's stages in turn) or one run. Returns
    "done", or "already finished"; raises RuntimeError naming what failed."""
    plan = matrix.require_plan(out, f"plan with `jaxpos reproduce --out {out} --plan-only`")  # its imports too
    mechanisms = matrix.pretraining_groups(plan)
    if name not in plan["runs"] and name not in mechanisms:
        raise ValueError(f"{name!r} is neither a mechanism nor a run of {out}/plan.json; mechanisms: "
                         f"{', '.join(mechanisms)}")
    unfinished = matrix.unfinished_groups(out, plan)
    if name in mechanisms:
        names, to_pretrain = unfinished.get(name, ([], []))
    else:
        names = [name] if matrix.read_result(out, name) is None else []
        to_pretrain = []
    if not names:
        return "already finished"
    flags = matrix.profile_of(plan).xla_flags
    if flags and flags not in os.environ.get("XLA_FLAGS", ""):  # read when the backend starts
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()
    env = worker_env(out, 0, 0)
    for key in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"):
        os.environ.setdefault(key, env[key])
    from jaxpos.reproduction.pipeline import execute_logged, pretrain_group_logged  # jax starts here, after the flags

    if len(to_pretrain) > 1:  # as pool.execute decides
        outcome = pretrain_group_logged(out, name)
        if outcome != "done":  # each run then pretrains alone
            status(f"{name}: pretraining its seeds at once {outcome}; see {matrix.group_log(out, name)}")
    failed = []
    for run in names:
        outcome = execute_logged(out, run)
        if outcome != "done":
            failed.append(f"{run} {outcome}; its log is {os.path.join(matrix.run_dir(out, run), matrix.LOG_FILE)}")
    if failed:
        raise RuntimeError("; ".join(failed))
    return "done"
