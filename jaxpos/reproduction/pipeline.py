"""One run of `jaxpos reproduce` (one mechanism, one seed), in its own process: pretrain with `train_mlm`,
fine-tune on the offline word-order task with `finetune`, probe word order with the masked-LM head, analyse every
checkpoint with `analyze_over_training` and the last one further; everything measured goes to
OUT/runs/NAME/result.json (the report reads nothing else).

The word-order probe (Chen et al. Table 3) needs a task whose labels survive a reordering; the offline corpus has
no such classification task (the word-order task's labels are the reordering), so the masked-LM task stands in:
masked-token accuracy on the word-order task's test sentences (the masked words are the labels, which no
reordering changes), original against every window of x words shuffled (x = 2..5) and two distant content words
swapped, through `jaxpos.evaluation.probes.word_order_drops` (the perturbations of `jaxpos probe-word-order`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback

import numpy as np

from jaxpos.progress import status
from jaxpos.reproduction import runs
from jaxpos.reproduction.runs import RESULT_FILE, RUN_MECHANISMS, load_plan, profile_of, repo_config, run_dir

OVER_TRAINING = ("position_gram", "identical_word", "rank", "decomposition")  # at every checkpoint
FINAL_ONLY = ("effective_attention", "identifiability")  # at the last checkpoint
MASK_SHARE = 0.15  # of the pieces of a probe sentence


def clean_log_every(steps: int, every: int) -> int:
    """A logging interval whose last window, (steps - every + 1, steps], holds no checkpoint or evaluation (they
    happen at multiples of `every`), so its mean step time is the step's own cost (the budget and the step-time
    comparison read it)."""
    return steps - (every - 1) if every > 1 else steps


def pretrain_config(plan: dict, mechanism: str, seed: int, steps: int):
    """configs/mlm/tiny.py with the profile's overrides, the mechanism's position block, the shared tokenizer,
    `steps` steps and `profile.checkpoints` evenly spaced checkpoints (all kept)."""
    from jaxpos.config.files import load_config

    profile = profile_of(plan)
    config = load_config(repo_config("configs/mlm/tiny.py"))
    config.model.update(profile.model)
    for key, value in RUN_MECHANISMS[mechanism].position.items():
        if isinstance(value, dict):
            config.model.position[key].update(value)
        else:
            config.model.position[key] = value
    config.data.update(profile.data)
    config.data.update(tokenizer_path=plan["tokenizer"], seed=seed)
    every = max(1, steps // profile.checkpoints)
    config.train.update(profile.train)
    config.train.update(num_steps=steps, seed=seed, log_every=clean_log_every(steps, every), eval_every=steps,
                        checkpoint_every=every, keep_checkpoints=profile.checkpoints + 1)
    return config


def finetune_config(plan: dict, seed: int, steps: int):
    """configs/finetune/tiny.py (the offline word-order task) with the profile's overrides, `steps` steps and
    two dev evaluations (half-way and at the end; a run's score is the better one, as in the papers' protocol)."""
    from jaxpos.config.files import load_config

    profile = profile_of(plan)
    config = load_config(repo_config("configs/finetune/tiny.py"))
    config.data.update(profile.finetune_data)
    config.data.seed = seed
    config.train.update(profile.finetune_train)
    every = max(1, steps // 2)
    config.train.update(num_steps=steps, seed=seed, eval_every=every, log_every=clean_log_every(steps, every),
                        checkpoint_every=steps)
    return config


def _timed(timing: dict, key: str, fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    timing[key] = round(time.perf_counter() - start, 3)
    return out


def parameter_counts(params: dict) -> dict:
    """Parameters of an encoder: positional (the `position` module), segment (type embeddings or per-head
    segment tables) and all."""
    import jax

    def size(tree):
        return int(sum(np.size(x) for x in jax.tree.leaves(tree)))

    encoder = params["encoder"]
    segment = size(encoder.get("segments", {})) + size(params.get("type_embed", {}))
    return dict(positional=size(encoder.get("position", {})), segment=segment, total=size(params))


def positional_attention(cfg, params, length: int) -> dict | None:
    """Locality and symmetry (Chen eq. 6-7) of the position-only attention softmax_j(bias[i, j]) of a logit-bias
    mechanism, averaged over layers and heads, beside a uniform matrix's locality; None for other mechanisms."""
    from jaxpos.analysis.locality import locality, symmetry
    from jaxpos.analysis.report import bias_logits

    logits = bias_logits(cfg, params, length)  # [L, H, T, T]
    if logits is None:
        return None
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    loc = np.asarray([[locality(m) for m in layer] for layer in weights])
    sym = np.asarray([[symmetry(m) for m in layer] for layer in weights])
    return dict(length=length, locality=float(loc.mean()), symmetry=float(sym.mean()),
                head_locality=loc.tolist(), uniform_locality=float(locality(np.full((length, length), 1 / length))))


def mlm_word_order_probe(workdir: str, model, sentences: list[str], seq_len: int, seed: int) -> dict:
    """`word_order_drops` with masked-token accuracy as the score: `sentences` perturbed as `jaxpos
    probe-word-order` perturbs them, MASK_SHARE of each one's pieces masked at positions drawn from (seed,
    sentence index) only, so every variant of a sentence is masked alike."""
    import jax

    from jaxpos.data.classification import Example
    from jaxpos.data.tokenizer import MLM_SPECIAL_TOKENS
    from jaxpos.evaluation.probes import word_order_drops
    from jaxpos.models import BertForMaskedLM
    from jaxpos.run import Run
    from jaxpos.training.mlm import MaskedLMTask

    mask_id = MLM_SPECIAL_TOKENS.index("[MASK]")
    task = MaskedLMTask(BertForMaskedLM(model.cfg), seq_len)
    _, params = Run.open(workdir, "mlm").params()
    sums_fn = jax.jit(lambda p, b: task.loss(p, b, None, False)[1])

    def accuracy(examples) -> float:
        rows = []
        for index, example in enumerate(examples):
            ids = np.asarray(model.encode(example.text_a)[:seq_len], np.int32)
            ids[-1] = model.sep_id  # a cut sentence still ends as the model saw rows end
            body = len(ids) - 2
            count = max(1, int(round(MASK_SHARE * body)))
            picked = 1 + np.random.default_rng([seed, index]).permutation(body)[:count]
            rows.append((ids, picked))
        correct = weight = 0.0
        for start in range(0, len(rows), 32):
            chunk = rows[start:start + 32] + [rows[0]] * (32 - len(rows[start:start + 32]))  # one shape: one compile
            real = min(32, len(rows) - start)
            batch = {k: np.zeros((32, seq_len), np.int32) for k in ("input_ids", "targets", "segment_ids",
                                                                     "token_types")}
            batch["mask_weights"] = np.zeros((32, seq_len), np.float32)
            for row, (ids, picked) in enumerate(chunk):
                batch["targets"][row, :len(ids)] = ids
                batch["input_ids"][row, :len(ids)] = ids
                batch["input_ids"][row, picked] = mask_id
                batch["segment_ids"][row, :len(ids)] = 1
                batch["mask_weights"][row, picked] = 1.0 if row < real else 0.0
            sums = jax.device_get(sums_fn(params, batch))
            correct, weight = correct + float(sums["correct"]), weight + float(sums["weight"])
        return correct / weight

    examples = [Example(s, None, 0.0) for s in sentences]
    result = word_order_drops(accuracy, examples, seed=seed)
    drops = [v["drop"] for k, v in result["variants"].items() if k.startswith("local")]
    result.update(local_drop=float(np.mean(drops)), global_drop=result["variants"]["global"]["drop"],
                  sentences=len(sentences), score="masked-token accuracy", mask_share=MASK_SHARE)
    return result


class RunInterrupted(RuntimeError):
    """A stage stopped early (SIGTERM checkpoints and returns); executing the run again resumes it."""


def _check_finished(stage: str, step: int, steps: int, workdir: str) -> None:
    """A stage the loop left early (SIGTERM checkpoints and returns) must not pass for a finished one."""
    if step != steps:
        raise RunInterrupted(f"{stage} in {workdir} stopped at step {step} of {steps}; run the command again to "
                             "resume")


def _use_xla_flags(profile) -> None:
    """The profile's XLA flags, read when the backend starts (which no jaxpos import does)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if profile.xla_flags and profile.xla_flags not in flags:
        os.environ["XLA_FLAGS"] = (flags + " " + profile.xla_flags).strip()


@contextlib.contextmanager
def _output_to(path: str):
    """This process's output into `path`: file descriptors 1 and 2 (XLA, subprocesses) and sys.stdout/stderr."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "a") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            f.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def execute_runs(out: str, names: list[str]) -> int:
    """A worker: executes, one after another in this process, each run of `names` that is unfinished and that no
    other live process has claimed (`runs.claim`), its output in runs/NAME/run.log. A run that raises is marked
    failed and the worker goes on; an interrupted one (SIGTERM) stops the worker. Returns the failures' count."""
    plan = load_plan(out)
    if plan is None:
        raise FileNotFoundError(f"{out}/plan.json is missing: start with `jaxpos reproduce --out {out}`")
    unknown = [n for n in names if n not in plan["runs"] and n not in plan.get("calibration", {})]
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not runs of {out}/plan.json; runs: {', '.join(plan['runs'])}")
    _use_xla_flags(profile_of(plan))
    import jax

    import jaxpos.analysis.over_training  # noqa: F401 - the stages' imports and the backend count as start-up
    import jaxpos.workflows.finetune  # noqa: F401
    import jaxpos.workflows.mlm  # noqa: F401

    jax.devices()
    started = os.environ.get(runs.STARTED_ENV)
    startup = time.time() - float(started) if started else None  # recorded with the first run
    failures = 0
    for name in names:
        if runs.read_result(out, name) is not None or not runs.claim(out, name):
            continue
        status(f"{time.strftime('%H:%M:%S')} {name}")
        try:
            with _output_to(os.path.join(run_dir(out, name), runs.LOG_FILE)):
                execute_run(out, name, startup_s=startup)
            startup = None
        except RunInterrupted as stop:
            status(f"stopped: {stop}")
            break
        except Exception as error:  # noqa: BLE001 - recorded; the other runs go on
            failures += 1
            runs.mark_failed(out, name, f"{type(error).__name__}: {error}".splitlines()[0])
            with open(os.path.join(run_dir(out, name), runs.LOG_FILE), "a") as f:
                traceback.print_exc(file=f)
            status(f"failed: {error}")
    return failures


def execute_run(out: str, name: str, startup_s: float | None = None) -> dict:
    """Runs NAME of the plan in OUT (or one of its calibration runs) and writes OUT/runs/NAME/result.json.
    Each stage resumes: a finished pretraining or fine-tuning is not repeated. `startup_s`: the worker's
    start-up before this run (its first), recorded for the budget."""
    from jaxpos.analysis.loading import load_run
    from jaxpos.analysis.over_training import analyze_over_training
    from jaxpos.analysis.report import analyze, corpus_sentences
    from jaxpos.data.word_order import split_sentence_pools
    from jaxpos.workflows.analyze import analysis_texts
    from jaxpos.workflows.finetune import finetune
    from jaxpos.workflows.mlm import train_mlm

    wall = time.perf_counter()
    plan = load_plan(out)
    if plan is None:
        raise FileNotFoundError(f"{out}/plan.json is missing: start with `jaxpos reproduce --out {out}`")
    spec = plan["runs"].get(name) or plan.get("calibration", {}).get(name)
    if spec is None:
        raise ValueError(f"{name!r} is not a run of {out}/plan.json; runs: {', '.join(plan['runs'])}")
    profile = profile_of(plan)
    _use_xla_flags(profile)
    steps = spec.get("steps") or plan.get("steps")
    if not steps:
        raise ValueError(f"{out}/plan.json has no step count yet (the calibration has not run)")
    finetune_steps = spec.get("finetune_steps") or plan.get("finetune_steps")
    mechanism, seed = spec["mechanism"], spec["seed"]
    folder = run_dir(out, name)
    pretrain_dir, finetune_dir = os.path.join(folder, "pretrain"), os.path.join(folder, "word_order")
    timing = dict(pretrain_steps=steps, finetune_steps=finetune_steps)

    config = pretrain_config(plan, mechanism, seed, steps)
    _timed(timing, "pretrain_s", train_mlm, config, pretrain_dir)
    with open(os.path.join(pretrain_dir, "report.json")) as f:
        pretrain = json.load(f)
    _check_finished("pretraining", pretrain["step"], steps, pretrain_dir)
    ft_report = _timed(timing, "finetune_s", finetune, finetune_config(plan, seed, finetune_steps),
                       pretrain_dir, finetune_dir, log=False)
    _check_finished("fine-tuning", ft_report["step"], finetune_steps, finetune_dir)

    start = time.perf_counter()
    model = load_run(pretrain_dir)
    seq_len = config.data.seq_len
    probe_pool = list(split_sentence_pools()["test"])
    probe_sentences = [probe_pool[i] for i in np.random.default_rng([seed, 7]).permutation(len(probe_pool))
                       [:profile.probe_sentences]]
    probe = mlm_word_order_probe(pretrain_dir, model, probe_sentences, seq_len, seed)
    timing["probe_s"] = round(time.perf_counter() - start, 3)

    start = time.perf_counter()
    sentences = corpus_sentences(model, analysis_texts(None), profile.max_sentences)
    options = dict(profile.analysis, figures=False)  # the report draws its own figures from the numbers
    analysis_dir = os.path.join(folder, "analysis")
    over = analyze_over_training(model, analysis_dir, sentences=sentences, only=OVER_TRAINING, **options)
    with open(os.path.join(analysis_dir, over["reports"][str(over["steps"][-1])])) as f:
        last = json.load(f)
    final = analyze(model, os.path.join(analysis_dir, "final"), sentences=sentences, only=FINAL_ONLY, **options)
    timing["analysis_s"] = round(time.perf_counter() - start, 3)

    decomposition = last.get("decomposition", {})
    rank = last.get("rank", {})
    effective, ident = final.get("effective_attention", {}), final.get("identifiability", {})
    result = dict(
        name=name, mechanism=mechanism, seed=seed, steps=steps, tokens=steps * config.train.batch_size * seq_len,
        seq_len=seq_len, d_model=model.cfg.d_model, head_dim=model.cfg.head_dim, num_layers=model.cfg.num_layers,
        params=parameter_counts(model.params),
        pretrain=dict(eval_loss=pretrain["eval"].get("loss"), eval_accuracy=pretrain["eval"].get("accuracy"),
                      train_loss=pretrain["train"].get("loss"), step_time_s=pretrain["train"].get("step_time"),
                      unigram_entropy=pretrain.get("unigram_entropy")),
        finetune=dict(task=ft_report["task"], last=ft_report["dev"]["dev"]["accuracy"],
                      best=ft_report["best"]["dev"]["accuracy"], chance=ft_report["chance"]["accuracy"],
                      step_time_s=ft_report["train"].get("step_time")),
        probe=probe,
        positional_attention=positional_attention(model.cfg, model.params, seq_len),
        over_training=dict(steps=over["steps"], series=over["series"]),
        final=dict(
            step=over["steps"][-1],
            rank=None if "skipped" in rank else dict(length=rank["length"], logit_rank_mean=rank["logit_rank_mean"],
                                                     logit_rank_max=rank["logit_rank_max"]),
            decomposition=None if "skipped" in decomposition else dict(
                importance=decomposition["importance"], max_reconstruction_error=decomposition[
                    "max_reconstruction_error"]),
            effective_attention=None if "skipped" in effective else dict(lengths=effective["lengths"],
                                                                         correlation=effective["correlation"]),
            identifiability=None if "skipped" in ident else dict(rates=ident["rates"])),
        skipped={**last.get("skipped", {}), **final.get("skipped", {})})
    timing["pretrain_step_s"] = result["pretrain"]["step_time_s"]
    timing["finetune_step_s"] = result["finetune"]["step_time_s"]
    timing["wall_s"] = round(time.perf_counter() - wall, 3)
    if startup_s is not None:
        timing["worker_startup_s"] = round(startup_s, 3)
    result["timing"] = timing
    tmp = os.path.join(folder, RESULT_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1, allow_nan=False)
    os.replace(tmp, os.path.join(folder, RESULT_FILE))
    status(f"wrote {os.path.join(folder, RESULT_FILE)} ({timing['wall_s']:.0f} s)")
    return result
