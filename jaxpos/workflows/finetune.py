"""Fine-tuning as `jaxpos finetune` runs it, and `jaxpos evaluate`: a classification or regression head on a
pretrained encoder (a jaxpos masked-LM run or a Hugging Face BERT/ALBERT folder), trained by the shared loop with dev
scores at every evaluation.

A fine-tuned workdir holds config.json (the full model config and where the encoder came from), checkpoints/,
tensorboard/, evals.json (the dev scores of every evaluation, for the maximum over checkpoints) and report.json.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, Iterable

import jax
import ml_collections
import numpy as np
from etils import epath

from jaxpos.analysis.loading import load_hf
from jaxpos.checkpoints import huggingface as hf
from jaxpos.config import ModelConfig
from jaxpos.config.files import load_json_config, write_json_atomically
from jaxpos.config.run import RunConfig
from jaxpos.data.classification import (ClassificationTrainIterator, ExampleStats, encode_examples, eval_batches,
                                        hf_tokenizer, jaxpos_tokenizer, load_examples, task_spec)
from jaxpos.evaluation.metrics import compute_metrics
from jaxpos.evaluation.protocol import best_of
from jaxpos.models import BertForSequenceClassification
from jaxpos.progress import status
from jaxpos.run import Run
from jaxpos.training.finetune import (ClassificationTask, FinetuneTrainer, make_predict_fn, predict,
                                     predictions_from_logits)
from jaxpos.workflows.workdir import started_run

EVALS_FILE, REPORT_FILE = "evals.json", "report.json"


# --- the pretrained encoder --------------------------------------------------------------------------------------

@dataclasses.dataclass
class Pretrained:
    cfg: ModelConfig  # the encoder's config as it was trained (attention_impl and dtype as saved)
    encoder: dict | None  # BertEncoder parameters (numpy), None when only the tokenizer was loaded
    pooler: dict | None  # {"kernel": [d, d], "bias": [d]} where the checkpoint has one (BERT/ALBERT), else None
    tokenizer: Any  # what jaxpos.data.classification.encode_examples takes
    info: dict  # kind ("jaxpos" | "huggingface"), path, checkpoint step, tokenizer file


def init_kind(path: str) -> str:
    """'jaxpos' for a `jaxpos train` masked-LM workdir (local or a URL), 'huggingface' for a BERT-family folder;
    else a clear error."""
    if not epath.Path(path).is_dir():
        raise FileNotFoundError(f"--init {path!r} does not exist")
    config_path = epath.Path(path) / "config.json"
    if config_path.is_file():
        config = load_json_config(os.fspath(config_path))
        if "model_type" in config:
            return "huggingface"
        if "model" in config and config.get("task", "mlm") == "mlm":
            return "jaxpos"
        if "model" in config:
            raise ValueError(f"--init {path!r} is a jaxpos {config.get('task')!r} run; fine-tuning starts from a "
                             "masked-LM run (jaxpos train --config configs/mlm/...)")
    raise ValueError(f"--init {path!r} is neither a jaxpos masked-LM run (config.json + checkpoints/) nor a Hugging "
                     "Face BERT, ALBERT, DeBERTa or ModernBERT folder (config.json with model_type + "
                     "model.safetensors/pytorch_model.bin)")


def load_pretrained(path: str, weights: bool = True) -> Pretrained:
    """The encoder (and pooler, where there is one) and tokenizer of a jaxpos run (local or a URL) or a Hugging
    Face folder. With weights=False only the config and tokenizer are read (for `evaluate`, whose weights are its
    own)."""
    kind = init_kind(path)
    if kind == "jaxpos":
        run = Run.open(path, "mlm")
        info = dict(kind=kind, path=run.location, tokenizer=os.fspath(run.tokenizer_file))
        encoder = None
        if weights:  # the newest restorable checkpoint, parameters only, the workdir untouched
            info["step"], params = run.params()
            encoder = jax.tree.map(np.asarray, params["bert"])
        return Pretrained(run.model_config, encoder, None, jaxpos_tokenizer(run.tokenizer()), info)

    info = dict(kind=kind, path=os.path.abspath(path))
    encoder = pooler = None
    if weights:
        loaded = load_hf(path)
        cfg, encoder, pooler = loaded.cfg, loaded.params, loaded.pooler  # one read of the weights file
        info["weights"] = loaded.info["weights"]
    else:
        with open(os.path.join(path, "config.json")) as f:
            cfg = hf.config_from_hf(json.load(f))
    return Pretrained(cfg, encoder, pooler, hf_tokenizer(path), info)


# --- prediction and scores ---------------------------------------------------------------------------------------

def scores(spec, logits, losses, labels) -> dict:
    """The task's metrics (the first is its main score) and the mean loss."""
    result = compute_metrics(spec.metrics, predictions_from_logits(logits), labels)
    return dict({k: float(v) for k, v in result.items()}, loss=float(np.mean(losses)))


def chance_scores(spec, labels: np.ndarray) -> dict | None:
    """Scores of always predicting the majority class of `labels` (None for regression)."""
    if spec.num_labels == 1:
        return None
    values, counts = np.unique(labels, return_counts=True)
    constant = np.full(len(labels), values[np.argmax(counts)], np.float32)
    return {k: float(v) for k, v in compute_metrics(spec.metrics, constant, labels).items()}


def load_encoded(dcfg, split: str, tokenizer, spec, need_labels: bool = True, stats: ExampleStats | None = None):
    """(examples, EncodedExamples) of one split, its loading's counters in `stats`; a split without labels is an
    error when they are needed."""
    examples = load_examples(dcfg, split, stats, tokenizer)  # raises for an unknown split or an empty one
    encoded = encode_examples(examples, tokenizer, dcfg.max_length)
    if need_labels and not np.all(np.isfinite(encoded.labels)):
        raise ValueError(f"the {split!r} split of task {spec.name!r} has no labels (GLUE test sets are unlabelled); "
                         f"evaluate on {', '.join(spec.dev_splits)}")
    return examples, encoded


def _write_json(path: str, value) -> None:
    if jax.process_index() == 0:
        write_json_atomically(path, value, indent=2)  # never a half-written file for the sweep to read


def read_evals(workdir: str) -> list[dict]:
    """Every dev evaluation of a fine-tuned run: [{"step": s, "<split>": {metric: value}}, ...] by step."""
    path = os.path.join(workdir, EVALS_FILE)
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return json.load(f)["evals"]


def format_scores(values: dict) -> str:
    """`metric=value ...` with four decimals."""
    return " ".join(f"{k}={v:.4f}" for k, v in values.items())


def left_out_note(task: str, loaded: dict[str, ExampleStats]) -> str:
    """For the bible_order task, the couples each split ({split: its loading's counters}) left out because the
    tokenizer splits their two members into different pieces; '' for the other tasks."""
    if task != "bible_order":
        return ""
    counts = ", ".join(f"{stats.dropped_unequal_pieces} {split}" for split, stats in loaded.items())
    return f"; couples left out as their members tokenize to different pieces: {counts}"


def chance_note(chance: dict | None, metric: str) -> str:
    """The note ' (chance: METRIC VALUE, majority class)' after a score, or '' for regression."""
    return f" (chance: {metric} {chance[metric]:.4f}, majority class)" if chance else ""


# --- the commands ------------------------------------------------------------------------------------------------

def _resolve_model(config, pretrained: Pretrained) -> ModelConfig:
    """The pretrained model's config with config.model's overrides."""
    overrides = config.model.to_dict()
    try:
        return dataclasses.replace(pretrained.cfg, **overrides)
    except TypeError as err:
        raise ValueError(f"config.model may only override fields of the pretrained model's config: {err}") from err


def best_evaluation(history: list[dict], split: str, metric: str) -> dict | None:
    """The evaluation with the highest `metric` on `split` (the earliest of equals), under the protocol's NaN
    policy: a diverged (NaN) evaluation never beats a number. None for no evaluation."""
    return best_of(sorted(history, key=lambda e: e["step"]), lambda e: e[split][metric]) if history else None


def finetune(config: ml_collections.ConfigDict, init: str, workdir: str, log: bool = True) -> dict:
    """Fine-tunes the encoder at INIT on config.data.task (resuming from WORKDIR's checkpoints); evaluates on the
    dev split(s) every train.eval_every steps. Returns the report (also WORKDIR/report.json). A refused run leaves
    WORKDIR as it was; SIGTERM or SIGINT checkpoints and raises RunStopped (jaxpos.training.interrupt)."""
    task_spec(config.data.task)  # an unknown task is refused before the encoder is read
    pretrained = load_pretrained(init)
    # The whole config, once the model is known, before any data is read (0 = fields resolved from the data).
    with started_run(config, "finetune", workdir, model=_resolve_model(config, pretrained)) as (run, admission):
        return _finetune(dataclasses.replace(run, init=pretrained.info), pretrained, init, workdir, admission, log)


def _finetune(run: RunConfig, pretrained: Pretrained, init: str, workdir: str, admission, log: bool):
    dcfg, cfg = run.data, run.model
    spec = task_spec(dcfg.task)
    kind = "regression" if spec.num_labels == 1 else f"{spec.num_labels} classes"
    status(f"jaxpos: fine-tuning on {spec.name} ({kind}, {'sentence pairs' if spec.pair else 'single sentences'}), "
           f"encoder from {init} "
           f"({pretrained.info['kind']}, position={cfg.position.kind}, segments={cfg.position.segment}), "
           f"devices={jax.device_count()}x{jax.devices()[0].device_kind}, workdir={workdir}")

    loaded = {split: ExampleStats() for split in ("train", *spec.dev_splits)}
    _, train = load_encoded(dcfg, "train", pretrained.tokenizer, spec, stats=loaded["train"])
    dev = {split: load_encoded(dcfg, split, pretrained.tokenizer, spec, stats=loaded[split])[1]
           for split in spec.dev_splits}
    run = dataclasses.replace(run, train=run.train.resolved_for_epochs(len(train.labels)))
    tcfg = run.train
    eval_batch_size = tcfg.eval_batch_size or tcfg.batch_size
    epochs = tcfg.num_steps / tcfg.steps_per_epoch(len(train.labels))
    status(f"data ({dcfg.source}): {len(train.labels)} train examples ({train.truncated} cut to {dcfg.max_length} "
           "tokens), " + ", ".join(f"{len(e.labels)} {s}" for s, e in dev.items())
           + f"; {tcfg.num_steps} steps of {tcfg.batch_size} ({epochs:.2f} epochs)"
           + left_out_note(spec.name, loaded))

    main_split = spec.dev_splits[0]
    chance = chance_scores(spec, dev[main_split].labels)
    task = ClassificationTask(BertForSequenceClassification(cfg, spec.num_labels), dcfg.max_length)
    # Refuses a checkpoint of another model and a batch the mesh cannot split.
    trainer = FinetuneTrainer(tcfg, workdir, task, pretrained.encoder, pretrained.pooler, mesh=run.mesh, log=log)

    predict_fn = make_predict_fn(task, trainer)
    evals_path = os.path.join(workdir, EVALS_FILE)
    evals = {e["step"]: e for e in read_evals(workdir)}

    def dev_hook(step, state):
        if step % tcfg.eval_every and step != tcfg.num_steps:
            return None
        entry = {"step": step}
        for split, encoded in dev.items():
            batches = eval_batches(encoded, eval_batch_size, jax.process_index(), jax.process_count())
            entry[split] = scores(spec, *predict(predict_fn, state.params, batches, trainer.global_batch))
        evals[step] = entry  # a re-run of a step after a resume replaces its scores
        _write_json(evals_path, dict(task=spec.name, main_metric=spec.metrics[0], main_split=main_split,
                                     evals=[evals[s] for s in sorted(evals)]))
        return {(k if split == main_split else f"{split}/{k}"): v
                for split in dev for k, v in entry[split].items()}

    data = ClassificationTrainIterator(train, tcfg.batch_size, seed=dcfg.seed,
                                       process_index=jax.process_index(), process_count=jax.process_count())
    try:
        result = trainer.run(data, hooks=[dev_hook], on_start=lambda: admission.admit(run))
    finally:
        trainer.close()

    history = [evals[s] for s in sorted(evals)]
    main = spec.metrics[0]
    best = best_evaluation(history, main_split, main)
    report = dict(task=spec.name, step=int(jax.device_get(result.state.step)), train=result.final_metrics,
                  dev=history[-1] if history else None, best=best, main_metric=main, main_split=main_split,
                  chance=chance, position=cfg.position.kind, init=pretrained.info)
    if spec.name == "bible_order":  # the couples a bag of words could have told apart, left out of each split
        report["couples_left_out"] = {split: stats.dropped_unequal_pieces for split, stats in loaded.items()}
    _write_json(os.path.join(workdir, REPORT_FILE), report)
    if history:
        last = history[-1][main_split]
        status(f"{main_split} at step {history[-1]['step']}: {format_scores(last)}{chance_note(chance, main)}; best "
               f"{main} {best[main_split][main]:.4f} at step {best['step']}")
    status(f"checkpoints: {os.path.join(workdir, 'checkpoints')}  TensorBoard: {os.path.join(workdir, 'tensorboard')}"
           f"  scores: {evals_path}")
    return report


@dataclasses.dataclass
class FinetunedRun:
    config: RunConfig
    spec: Any  # TaskSpec
    task: ClassificationTask
    params: dict
    tokenizer: Any
    step: int
    _predict_fn: Callable | None = dataclasses.field(default=None, repr=False)

    def evaluate(self, examples, batch_size: int | None = None) -> dict:
        """Scores of the run on a list of Examples (e.g. a perturbed dev set)."""
        return scores(self.spec, *self.predict(examples, batch_size))

    def evaluate_encoded(self, encoded, batch_size: int | None = None) -> dict:
        return scores(self.spec, *self.predict_encoded(encoded, batch_size))

    def predict(self, examples, batch_size: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(logits [N, C], losses [N], labels [N]) of the run on a list of N Examples."""
        encoded = encode_examples(examples, self.tokenizer, self.config.data.max_length)
        return self.predict_encoded(encoded, batch_size)

    def predict_encoded(self, encoded, batch_size: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        batch_size = batch_size or self.config.train.eval_batch_size or self.config.train.batch_size
        if self._predict_fn is None:  # one jitted function for every set this run scores
            self._predict_fn = make_predict_fn(self.task)
        return predict(self._predict_fn, self.params, eval_batches(encoded, batch_size))


def load_finetuned(workdir: str, overrides: Iterable[str] = ()) -> FinetunedRun:
    """A fine-tuned run's newest restorable checkpoint (parameters only, onto the CPU), its config and tokenizer.
    `overrides` (--config.data.*) may point the data somewhere else, e.g. another glue_dir."""
    run = Run.open(workdir, "finetune", overrides)
    config = run.config
    spec = task_spec(config.data.task)
    init = config.init or {}
    if not init.get("path") or not epath.Path(init["path"]).is_dir():
        raise FileNotFoundError(f"{run.config_path}: the pretrained model {init.get('path')!r} (needed for its "
                                "tokenizer) is gone")
    pretrained = load_pretrained(init["path"], weights=False)
    task = ClassificationTask(BertForSequenceClassification(run.model_config, spec.num_labels),
                              config.data.max_length)
    step, params = run.params()
    return FinetunedRun(config, spec, task, params, pretrained.tokenizer, step)


@dataclasses.dataclass
class Evaluation:
    task: str
    split: str
    step: int  # the checkpoint evaluated
    examples: int
    scores: dict  # the task's metrics and the mean loss
    chance: dict | None  # the scores of predicting the majority class (None for regression)
    main_metric: str

    def as_dict(self) -> dict:
        """The scores with step, split, examples and chance beside them."""
        return dict(self.scores, step=self.step, split=self.split, examples=self.examples, chance=self.chance)


def evaluate(workdir: str, split: str | None = None, overrides: Iterable[str] = ()) -> Evaluation:
    """Scores of a fine-tuned run's newest checkpoint on a labelled split (default: the task's first dev split)."""
    run = load_finetuned(workdir, overrides)
    split = split or run.spec.dev_splits[0]
    _, encoded = load_encoded(run.config.data, split, run.tokenizer, run.spec)
    result = run.evaluate_encoded(encoded)
    return Evaluation(run.spec.name, split, run.step, len(encoded.labels), result,
                      chance_scores(run.spec, encoded.labels), run.spec.metrics[0])
