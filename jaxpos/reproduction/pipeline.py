"""What a worker of `jaxpos reproduce` executes. A mechanism's pretraining: its unfinished seeds at once with
`train_mlm_seeds` (`pretrain_group`; checkpoints at the learning curve's steps). One run (one mechanism, one
seed; `execute_run`): its pretraining alone if the group's did not finish it, the held-out masked-LM loss at each
checkpoint (the data layer's held-out rows and masking: `held_out_rows`, `eval_batches`), then the stages the plan
gives the run (`matrix.STAGES`): the loss at longer lengths (`evaluate_lengths`), fine-tuning on the paraphrase
task with `finetune`, Chen et al.'s word-order probe on its test pairs (`paraphrase_probe`), fine-tuning on the
word-order pair task over a learning-rate grid (`order_task`), the analyses over training
(`analyze_over_training`) and at the last checkpoint (on the host's CPU: `on_host_cpu`). Everything measured goes
to OUT/runs/NAME/result.json (the report reads nothing else). Each stage resumes: a finished pretraining or
fine-tuning is not repeated, an unfinished one continues from its last checkpoint. Timings: `time_recipe` (the
estimate's), `time_alone` (the step-time claim's).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
import traceback
from typing import Sequence

import jax
import numpy as np

from jaxpos.analysis.loading import load_run
from jaxpos.analysis.locality import locality, symmetry
from jaxpos.analysis.over_training import analyze_over_training
from jaxpos.analysis.report import analyze, bias_logits, corpus_sentences, measure_sinks, no_position_only_logits
from jaxpos.config.files import write_json_atomically
from jaxpos.config.checks import typed
from jaxpos.config.run import FinetuneDataConfig, TrainConfig
from jaxpos.training.validate import check_run_config
from jaxpos.data.classification import jaxpos_tokenizer, load_examples, order_minimal_pairs
from jaxpos.data.mlm import PackedExamples
from jaxpos.data.pipeline import MLMTrainIterator, eval_batches, held_out_rows
from jaxpos.data.tokenizer import load_tokenizer
from jaxpos.evaluation.lengths import evaluate_lengths, masked_lm_metrics
from jaxpos.evaluation.pseudo_likelihood import NothingToScore, minimal_pair_preference
from jaxpos.positions.base import LengthError
from jaxpos.progress import status
from jaxpos.reproduction import host
from jaxpos.reproduction.matrix import (FAILED_FILE, LOG_FILE, RESULT_FILE, extension_config, finetune_config,
                                      group_log, load_plan, mark_failed, pretrain_config, pretrain_dir,
                                      pretraining_finished, pretraining_groups, profile_of, require_plan, run_dir,
                                      trained_to)
from jaxpos.run import Run
from jaxpos.training.interrupt import RunStopped
from jaxpos.training.loop import SeedRun, Trainer
from jaxpos.training.mlm import MaskedLMTask
from jaxpos.workflows.analyze import analysis_texts
from jaxpos.workflows.finetune import finetune, load_finetuned, read_evals
from jaxpos.workflows.lengths import evaluation_run
from jaxpos.workflows.mlm import train_mlm, train_mlm_seeds
from jaxpos.workflows.probes import paraphrase_probe

LENGTH_BATCH = 8  # rows a batch of the length evaluation (4x the training length at most)
PRETRAIN_TIMING_FILE = "pretrain_timing.json"  # a run's pretraining: its wall seconds and the seeds it trained with
OVER_TRAINING = ("position_gram", "identical_word", "rank", "decomposition")  # at every analysed checkpoint
FINAL_ONLY = ("effective_attention", "identifiability")  # at the last checkpoint


SINK_SENTENCES = 64  # held-out sentences a run's attention sinks are measured on


def learning_curve(workdir: str, steps: list[int]) -> list[dict]:
    """{"step", "loss", "accuracy"} of the held-out masked-LM rows at each checkpoint `steps` of the run in
    WORKDIR: `train.eval_batches` batches of `train.batch_size` rows, masked as the run's own evaluation masks
    them (data.seed), so runs with the same seed are scored on the same predictions."""
    run = Run.open(workdir, "mlm")
    data, train = run.config.data, run.config.train
    tokenizer = run.tokenizer()
    rows = held_out_rows(data, tokenizer)
    task = MaskedLMTask.of(run.config, model=run.model_config)
    curve = []
    for step in steps:
        _, params = run.params(step)
        metrics = masked_lm_metrics(task, params, eval_batches(rows, tokenizer, train.batch_size, train.eval_batches,
                                                               data.seed, data.mask_prob))
        curve.append(dict(step=step, loss=metrics["loss"], accuracy=metrics["accuracy"]))
    return curve


def on_host_cpu():
    """A block whose computations default to the host's CPU (where JAX_PLATFORMS has one): the diagnostics'. They
    are many small programs, each read back at once; on a GPU shared by the pool's workers every read waits its turn
    (4-33 s a checkpoint on an H200 shared by 12 runs), on a CPU core these tiny models take about a second, and
    float32 products are exact there."""
    try:
        return jax.default_device(jax.devices("cpu")[0])
    except RuntimeError:  # JAX_PLATFORMS names no CPU
        return contextlib.nullcontext()


def parameter_counts(params: dict) -> dict:
    """Parameters of an encoder: positional (the `position` module), segment (type embeddings or per-head
    segment tables) and all."""
    def size(tree):
        return int(sum(np.size(x) for x in jax.tree.leaves(tree)))

    encoder = params["encoder"]
    segment = size(encoder.get("segments", {})) + size(params.get("type_embed", {}))
    return dict(positional=size(encoder.get("position", {})), segment=segment, total=size(params))


def positional_attention(cfg, params, length: int) -> dict:
    """Locality and symmetry (Chen eq. 6-7) of the position-only attention softmax_j(bias[i, j]) of a logit-bias
    mechanism, averaged over layers and heads, beside a uniform matrix's locality; {"skipped": why} for other
    mechanisms."""
    logits = bias_logits(cfg, params, length)  # [L, H, T, T]
    if logits is None:
        return {"skipped": no_position_only_logits(cfg)}
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    loc = np.asarray([[locality(m) for m in layer] for layer in weights])
    sym = np.asarray([[symmetry(m) for m in layer] for layer in weights])
    return dict(length=length, locality=float(loc.mean()), symmetry=float(sym.mean()),
                head_locality=loc.tolist(), uniform_locality=float(locality(np.full((length, length), 1 / length))))


def _check_finished(stage: str, step: int, steps: int, workdir: str) -> None:
    """A stage whose report ends short of its steps must not pass for a finished one (a stop signal raises
    `RunStopped` in the loop instead; this guards what reaches the report)."""
    if step != steps:
        raise RuntimeError(f"{stage} in {workdir} ended at step {step} of {steps}; run the command again to resume")


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


def execute_logged(out: str, name: str) -> str:
    """Executes run NAME of the plan in OUT with its output in runs/NAME/run.log; "done", or "failed: why" (the
    traceback in the log, runs/NAME/failed.txt). A run stopped by SIGTERM (checkpointed) ends its worker."""
    folder = run_dir(out, name)
    os.makedirs(folder, exist_ok=True)
    if os.path.exists(os.path.join(folder, FAILED_FILE)):
        os.remove(os.path.join(folder, FAILED_FILE))
    outcome = _logged(os.path.join(folder, LOG_FILE), execute_run, out, name)
    if outcome != "done":
        mark_failed(out, name, outcome.removeprefix("failed: "))
    return outcome


def pretrain_group_logged(out: str, mechanism: str) -> str:
    """Pretrains the unfinished runs of MECHANISM at once (`pretrain_group`) with the output in its group log;
    "done", or "failed: why" (the traceback in the log)."""
    os.makedirs(os.path.join(out, "runs"), exist_ok=True)
    return _logged(group_log(out, mechanism), pretrain_group, out, mechanism)


def _logged(log: str, function, *args) -> str:
    """function(*args) with this process's output appended to LOG: "done", or "failed: why" with the traceback in
    the log. A stage stopped by a signal (checkpointed) raises RunStopped: a pool worker then ends
    (`pool._call_in_worker`), a command run in this process (`--run NAME`) says so and exits."""
    try:
        with _output_to(log):
            function(*args)
    except RunStopped:
        raise
    except Exception as error:  # noqa: BLE001 - recorded; the other runs go on
        with open(log, "a") as f:
            traceback.print_exc(file=f)
        return "failed: " + f"{type(error).__name__}: {error}".splitlines()[0]
    return "done"


def pretrain_group(out: str, mechanism: str) -> list[str]:
    """Pretrains the runs of MECHANISM in the plan in OUT that have not finished pretraining, their seeds at once
    in one program (`train_mlm_seeds`), each in its own folder as if alone; each folder records the group's wall
    time (pretrain_timing.json). Returns the names trained."""
    plan = require_plan(out, f"start with `jaxpos reproduce --out {out}`")
    groups = pretraining_groups(plan)
    if mechanism not in groups:
        raise ValueError(f"{mechanism!r} is not a mechanism of {out}/plan.json; mechanisms: {', '.join(groups)}")
    steps = profile_of(plan).steps
    names = [n for n in groups[mechanism] if not pretraining_finished(out, n, steps)]
    if not names:
        return []
    start = time.perf_counter()
    configs = [pretrain_config(plan, mechanism, plan["runs"][n]["seed"]) for n in names]
    train_mlm_seeds(configs, [pretrain_dir(out, n) for n in names])
    record_pretraining(out, names, time.perf_counter() - start)
    return names


def record_pretraining(out: str, names: Sequence[str], seconds: float) -> None:
    """Each run's pretrain_timing.json: the wall seconds of the pretraining that trained `names` together."""
    timing = dict(pretrain_s=round(seconds, 3), seeds_at_once=len(names))
    for name in names:
        write_json_atomically(os.path.join(pretrain_dir(out, name), PRETRAIN_TIMING_FILE), timing)


def pretraining_record(out: str, name: str) -> dict:
    """Run NAME's pretrain_timing.json ({} where its pretraining stopped before writing one)."""
    path = os.path.join(pretrain_dir(out, name), PRETRAIN_TIMING_FILE)
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


def execute_run(out: str, name: str) -> dict:
    """Runs NAME of the plan in OUT and writes OUT/runs/NAME/result.json."""
    wall = time.perf_counter()
    plan = require_plan(out, f"start with `jaxpos reproduce --out {out}`")
    spec = plan["runs"].get(name)
    if spec is None:
        raise ValueError(f"{name!r} is not a run of {out}/plan.json; runs: {', '.join(plan['runs'])}")
    profile = profile_of(plan)
    mechanism, seed, stages = spec["mechanism"], spec["seed"], set(spec["stages"])
    folder = run_dir(out, name)
    pretrained = pretrain_dir(out, name)
    timing = {}

    @contextlib.contextmanager
    def timed(key):  # the seconds of each stage, in result.json
        start = time.perf_counter()
        yield
        timing[key] = round(time.perf_counter() - start, 3)

    pretrain = trained_report("pretraining", pretrain_config(plan, mechanism, seed), pretrained, profile.steps,
                              lambda seconds: record_pretraining(out, [name], seconds))
    timing.update(pretraining_record(out, name))
    with timed("curve_s"):
        curve = learning_curve(pretrained, profile.curve_steps())
    recipe = Run.open(pretrained, "mlm").config  # the typed blocks the run trained with
    seq_len, batch_size = recipe.data.seq_len, recipe.train.batch_size
    extension = extension_config(plan, mechanism, seed, os.path.abspath(pretrained))
    extended = None
    if extension is not None:  # context extension: the stages below score the extended weights
        with timed("extension_s"):
            extended = extend_run(extension, os.path.join(folder, "extended"))
        pretrained = os.path.join(folder, "extended")
    model = load_run(pretrained)
    result = dict(
        name=name, mechanism=mechanism, seed=seed, stages=sorted(stages), steps=profile.steps,
        tokens=profile.steps * batch_size * seq_len, batch_size=batch_size,
        seq_len=seq_len, d_model=model.cfg.d_model, head_dim=model.cfg.head_dim, num_layers=model.cfg.num_layers,
        params=parameter_counts(model.params),
        pretrain=dict(eval_loss=pretrain["eval"].get("loss"), eval_accuracy=pretrain["eval"].get("accuracy"),
                      train_loss=pretrain["train"].get("loss"), step_time_s=pretrain["train"].get("step_time"),
                      unigram_entropy=pretrain.get("unigram_entropy"), seeds_at_once=timing.get("seeds_at_once")),
        curve=curve, **({"extension": extended} if extended else {}))
    with on_host_cpu():
        result["positional_attention"] = positional_attention(model.cfg, model.params, seq_len)
        with timed("sinks_s"):  # where attention sinks, every run: the report compares the variants on it
            result["sinks"] = sinks_record(model)
    if "lengths" in stages:
        with timed("lengths_s"):
            result.update(lengths_stage(pretrained, seq_len, profile, mechanism))
    if "finetune" in stages:
        result.update(finetune_stage(plan, seed, pretrained, folder, "probe" in stages, profile, timed))

    if "order" in stages:
        with timed("order_s"):
            result["order"] = order_task(plan, seed, pretrained, os.path.join(folder, "order"))

    with on_host_cpu():
        result.update(analyses(model, stages, profile, os.path.join(folder, "analysis"), timed))
    timing["wall_s"] = round(time.perf_counter() - wall, 3)
    result["timing"] = timing
    write_json_atomically(os.path.join(folder, RESULT_FILE), result, indent=1, allow_nan=False)
    status(f"wrote {os.path.join(folder, RESULT_FILE)} ({timing['wall_s']:.0f} s)")
    return result


def trained_report(stage: str, config, workdir: str, steps: int, on_trained=None) -> dict:
    """WORKDIR's report.json once `config` has trained there for `steps`: trained now (resuming) unless the report
    says so already (a pretraining done with its mechanism's seeds, or before); `on_trained(seconds)` after training
    now. A report short of `steps` raises (`_check_finished`), naming `stage`."""
    if trained_to(workdir) != steps:
        start = time.perf_counter()
        train_mlm(config, workdir)
        if on_trained is not None:
            on_trained(time.perf_counter() - start)
    with open(os.path.join(workdir, "report.json")) as f:
        report = json.load(f)
    _check_finished(stage, report["step"], steps, workdir)
    return report


def sinks_record(model) -> dict:
    """Where `model` attention sinks, over SINK_SENTENCES of the analysis text: result.json's "sinks"."""
    found = measure_sinks(model, corpus_sentences(model, analysis_texts(None), SINK_SENTENCES))
    return dict(sentences=found["sentences"], tokens=found["tokens"],
                mean={k: v if math.isfinite(v) else None for k, v in found["mean"].items()})


def lengths_stage(pretrained: str, seq_len: int, profile, mechanism: str) -> dict:
    """The `lengths` stage: {"lengths": the run scored at the profile's multiples of its training length,
    "lengths_by_rule": {rule: the same weights under each of the mechanism's evaluation rules}}."""
    lengths = [seq_len * f for f in profile.length_factors]
    scored = evaluate_lengths(Run.open(pretrained, "mlm"), lengths, LENGTH_BATCH, profile.length_tokens)["lengths"]
    rules = profile.variants.get(mechanism, {}).get("eval", {})
    return dict(lengths=scored, lengths_by_rule={
        rule: evaluate_lengths(evaluation_run(Run.open(pretrained, "mlm"), overrides), lengths, LENGTH_BATCH,
                               profile.length_tokens)["lengths"] for rule, overrides in rules.items()})


def finetune_stage(plan: dict, seed: int, pretrained: str, folder: str, probe: bool, profile, timed) -> dict:
    """The `finetune` stage (and `probe`, the offline paraphrase probe of the fine-tuned model, where asked):
    {"finetune": its last and best dev accuracy, chance, steps, step time; "probe": ...}."""
    ft_config = finetune_config(plan, seed)
    ft_data, ft_train = typed(FinetuneDataConfig, ft_config.data, "data"), typed(TrainConfig, ft_config.train, "train")
    ft_dir = os.path.join(folder, "paraphrase")
    with timed("finetune_s"):
        report = finetune(ft_config, pretrained, ft_dir, log=False)
    _check_finished("fine-tuning", report["step"], ft_train.num_steps, ft_dir)
    result = dict(finetune=dict(task=report["task"], last=report["dev"]["dev"]["accuracy"],
                                best=report["best"]["dev"]["accuracy"], chance=report["chance"]["accuracy"],
                                steps=ft_train.num_steps, step_time_s=report["train"].get("step_time")))
    if probe:
        examples = load_examples(ft_data, "test")[:profile.probe_examples]
        with timed("probe_s"):
            result["probe"] = paraphrase_probe(load_finetuned(ft_dir), examples, tuple(ft_data.offline_windows),
                                               ft_data.offline_min_distance, seed)
    return result


def order_task(plan: dict, seed: int, pretrained: str, folder: str) -> dict:
    """The `order` stage: the pretrained run fine-tuned on the word-order pair task at each learning rate of the
    profile's grid (a folder each), its score the best dev accuracy over evaluations and rates (the papers'
    protocol); and, without fine-tuning, how often the masked LM scores the dev couples' swapped side higher as it
    is than swapped (`minimal_pair_preference`). {"task", "best", "learning_rate" (the best one's),
    "by_learning_rate": {rate: {"best", "last"}}, "chance", "steps", "dev_pairs", "looks" (the dev evaluations
    the best is taken over), "pooling" (what the classifier's pooler read), "zero_shot", "couples_left_out" ({split:
    couples whose two members the tokenizer splits into different pieces})}."""
    data = typed(FinetuneDataConfig, finetune_config(plan, seed, "order").data, "data")
    mlm = Run.open(pretrained, "mlm")
    # A pair each couple of the dev pairs comes from: the fine-tuning's tokenizer leaves out the same couples.
    dev_minimal_pairs = order_minimal_pairs(data, "dev", jaxpos_tokenizer(mlm.tokenizer()))
    try:
        zero_shot = minimal_pair_preference(mlm, dev_minimal_pairs)
    except (NothingToScore, LengthError) as err:  # the model cannot score the pairs: the report shows none
        zero_shot = dict(skipped=str(err).split(";")[0])
    scores, report, train, looks = {}, None, None, 0
    for rate in profile_of(plan).order_rates():
        config = finetune_config(plan, seed, "order", rate)
        train = typed(TrainConfig, config.train, "train")
        workdir = os.path.join(folder, f"lr_{train.learning_rate:g}")
        report = finetune(config, pretrained, workdir, log=False)
        _check_finished("fine-tuning on the order task", report["step"], train.num_steps, workdir)
        scores[f"{train.learning_rate:g}"] = dict(best=report["best"]["dev"]["accuracy"],
                                                 last=report["dev"]["dev"]["accuracy"])
        looks += len(read_evals(workdir))  # the evaluations its best is taken over
    best_rate = max(scores, key=lambda rate: scores[rate]["best"])
    return dict(task=report["task"], best=scores[best_rate]["best"], learning_rate=float(best_rate),
                by_learning_rate=scores, chance=report["chance"]["accuracy"], steps=train.num_steps,
                dev_pairs=data.offline_dev_examples or 2 * len(dev_minimal_pairs), looks=looks,
                pooling=Run.open(workdir, "finetune").config.model.pooling, zero_shot=zero_shot,
                couples_left_out=report["couples_left_out"])


def extend_run(config, workdir: str) -> dict:
    """Continues pretraining as `config` says (an extension variant's: train.init_from, a longer data.seq_len) in
    WORKDIR, resuming there; {"seq_len", "steps", "eval_loss", "eval_accuracy"} of its end."""
    steps = int(config.train.num_steps)
    report = trained_report("the extension", config, workdir, steps)
    return dict(seq_len=int(config.data.seq_len), steps=steps, eval_loss=report["eval"].get("loss"),
                eval_accuracy=report["eval"].get("accuracy"))


def analyses(model, stages: set, profile, analysis_dir: str, timed) -> dict:
    """The analysis stages of a run (`last`, `over_training`, `final`) that `stages` names: their entries of
    result.json, and "skipped" ({diagnostic: why})."""
    result = {}
    options = dict(profile.analysis, figures=False)  # the report draws its own figures from the numbers
    needs_sentences = stages & {"last", "over_training", "final"}
    sentences = corpus_sentences(model, analysis_texts(None), profile.max_sentences) if needs_sentences else None
    skipped = {}
    if stages & {"last", "over_training"}:
        # over training: from the initialisation (step 0, a reference) to the last step
        steps = [0, *profile.analysis_steps()] if "over_training" in stages else profile.analysis_steps()[-1:]
        with timed("analysis_s"):
            over = analyze_over_training(model, analysis_dir, sentences=sentences, steps=steps, only=OVER_TRAINING,
                                         **options)
        with open(os.path.join(analysis_dir, over["reports"][str(over["steps"][-1])])) as f:
            last = json.load(f)
        decomposition, rank = last.get("decomposition", {}), last.get("rank", {})
        if "over_training" in stages:
            result["over_training"] = dict(steps=over["steps"], series=over["series"])
        result["last"] = dict(
            step=over["steps"][-1], headline={name: values[-1] for name, values in over["series"].items()},
            rank=None if "skipped" in rank else dict(length=rank["length"], logit_rank_mean=rank["logit_rank_mean"],
                                                     logit_rank_max=rank["logit_rank_max"]),
            decomposition=None if "skipped" in decomposition else dict(
                importance=decomposition["importance"],
                max_reconstruction_error=decomposition["max_reconstruction_error"]))
        skipped.update(last.get("skipped", {}))
    if "final" in stages:
        with timed("final_s"):
            final = analyze(model, os.path.join(analysis_dir, "final"), sentences=sentences, only=FINAL_ONLY,
                            **options)
        effective, ident = final.get("effective_attention", {}), final.get("identifiability", {})
        result["final"] = dict(
            effective_attention=None if "skipped" in effective else dict(lengths=effective["lengths"],
                                                                         correlation=effective["correlation"]),
            identifiability=None if "skipped" in ident else dict(rates=ident["rates"]))
        skipped.update(final.get("skipped", {}))
    result["skipped"] = skipped
    return result


class RecipeTiming:
    """The plan's pretraining recipe for `mechanism` on random rows in a scratch folder, `seeds` seeds at once:
    its steps timed in windows (`advance`); nothing of the recipe changes. A context manager (the scratch folder
    and the trainer's checkpoints go at its end)."""

    def __init__(self, plan: dict, mechanism: str, seeds: int = 1):
        config = pretrain_config(plan, mechanism, 0)
        tokenizer = load_tokenizer(plan["tokenizer"])
        config.model.vocab_size = tokenizer.vocab_size  # this scratch copy of the recipe only
        self.run = check_run_config(config, task="mlm")
        batch, length = config.train.batch_size, config.data.seq_len
        self.scratch = tempfile.TemporaryDirectory()
        folder = self.scratch.name
        task = MaskedLMTask.of(self.run)
        runs = folder if seeds == 1 else [SeedRun(k, os.path.join(folder, str(k))) for k in range(seeds)]
        self.trainer = Trainer(self.run.train, runs, task, mesh=self.run.mesh, log=False)
        rng = np.random.default_rng(0)
        rows = PackedExamples(rng.integers(5, tokenizer.vocab_size, (2 * batch, length)).astype(np.int32),
                              np.ones((2 * batch, length), np.int32))
        self.data = [MLMTrainIterator(rows, tokenizer, batch, seed=k) for k in range(seeds)]
        self.done = 0

    def advance(self, steps: int) -> float:
        """Trains `steps` more steps (the first call compiles) and returns their mean seconds a step (the loop's
        step_time: dispatch to the last step's metrics read)."""
        self.done += steps  # the learning-rate schedule stays the recipe's (the trainer built it)
        self.trainer.train = dataclasses.replace(self.run.train, num_steps=self.done, log_every=steps,
                                                 eval_every=self.done, checkpoint_every=self.done)
        result = self.trainer.run_seeds(self.data)[0]
        jax.block_until_ready(result.state.params)
        return result.final_metrics["step_time"]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.trainer.close()
        self.scratch.cleanup()


def time_recipe(out: str, mechanism: str) -> dict:
    """A short timing on this worker: `profile.timing_steps` pretraining steps of the plan's recipe for
    `mechanism` (`RecipeTiming`), of one seed and of the plan's seeds at once (as its mechanisms pretrain), the
    steps after the first taken while every worker of the pool takes them. Returns {"first_step_s", "step_s"} of
    one seed and {"group_first_step_s", "group_step_s", "seeds_at_once"} of the group (first steps: compiling
    included), and the platform (jax's backend); it estimates the wall time."""
    plan = load_plan(out)
    steps = max(2, profile_of(plan).timing_steps)
    seeds = max(1, plan["seeds"])

    def timed(count: int) -> tuple[float, float]:
        start = time.perf_counter()
        with RecipeTiming(plan, mechanism, count) as timing:
            timing.advance(1)  # compiling, then one step
            first_step = time.perf_counter() - start
            host.wait_for_every_worker()  # the timed steps of every worker share the device, as the runs will
            return first_step, timing.advance(steps)

    first_step, step = timed(1)
    group_first_step, group_step = timed(seeds) if seeds > 1 else (first_step, step)
    return dict(first_step_s=first_step, step_s=step, group_first_step_s=group_first_step, group_step_s=group_step,
                platform=jax.default_backend(),
                seeds_at_once=seeds, steps=steps, mechanism=mechanism)


def time_alone(out: str, mechanisms: str) -> dict:
    """The step time of each of `mechanisms` (comma-separated) alone on this worker's device, while nothing else
    runs: each compiled first, then one window of `profile.timing_steps` steps per seed of the plan, the mechanisms
    taking their windows in turn (the order rotating every round, so drift touches all alike). {mechanism: [s a
    step, a window each]} (window k is paired with seed k)."""
    plan = load_plan(out)
    names = [m for m in mechanisms.split(",") if m]
    steps, rounds = max(2, profile_of(plan).timing_steps), max(2, plan["seeds"])
    with contextlib.ExitStack() as stack:
        timings = {m: stack.enter_context(RecipeTiming(plan, m)) for m in names}
        for timing in timings.values():
            timing.advance(1)  # compiling
        times: dict[str, list[float]] = {m: [] for m in names}
        for k in range(rounds):
            for m in names[k % len(names):] + names[:k % len(names)]:
                times[m].append(timings[m].advance(steps))
    return times
