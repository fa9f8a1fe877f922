"""Masked-LM pretraining as `jaxpos train` runs it: data, model, the shared loop, the end-of-run report and figure."""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Sequence

import jax
import numpy as np
from etils import epath

from jaxpos.config.files import write_run_report
from jaxpos.config.position import config_dict
from jaxpos.config.run import RunConfig
from jaxpos.data.pipeline import build_mlm_data, eval_batches
from jaxpos.models import position_params
from jaxpos.progress import status
from jaxpos.training.checkpoint import check_resumable
from jaxpos.training.loop import SeedRun, Trainer
from jaxpos.training.mlm import MaskedLMTask
from jaxpos.workflows.workdir import started_run


def train_mlm(config, workdir: str):
    """Pretrains a BERT-style model as configured (a ConfigDict, or a checked RunConfig); resumes from WORKDIR's
    checkpoints (local or gs://...). Returns the TrainResult. A refused run (config, data, a checkpoint of another
    model) leaves WORKDIR as it was; SIGTERM or SIGINT checkpoints and raises RunStopped
    (jaxpos.training.interrupt)."""
    return train_mlm_seeds([config], [workdir])[0]


def seed_configs(config, seeds: int) -> list:
    """`seeds` copies of `config` (a ConfigDict), the k-th with train.seed and data.seed raised by k: the seeds of
    one recipe, as `train_mlm_seeds` trains them at once. A train.init_from trained with seeds (its seed_S
    folders) starts each seed from its own."""
    copies = []
    for k in range(seeds):
        copy = config.copy_and_resolve_references()
        copy.train.seed = config.train.seed + k
        copy.data.seed = config.data.seed + k
        source = config.train.get("init_from")
        if source and (epath.Path(source) / f"seed_{copy.train.seed}").is_dir():
            copy.train.init_from = os.path.join(source, f"seed_{copy.train.seed}")
        copies.append(copy)
    return copies


def continued_from(config):
    """`config` (a ConfigDict) with train.init_from checked and its run's tokenizer made the data's: continued
    pretraining keeps the source's vocabulary and mechanism. Unchanged without train.init_from."""
    from jaxpos.run import Run  # lazy: the run loader, which plain training does not need

    source = config.train.get("init_from")
    if not source:
        return config
    run = Run.open(source, "mlm")
    kind, wanted = run.model_config.position.kind, config.model.position.kind
    if kind != wanted:
        raise ValueError(f"train.init_from: {source} trained position.kind={kind!r}, this run's is {wanted!r}; "
                         "continued pretraining keeps the mechanism (its options without parameters may change)")
    config = config.copy_and_resolve_references()
    if not config.data.tokenizer_path:
        path = os.fspath(run.tokenizer_file)
        config.data.tokenizer_path = path if "://" in path else os.path.abspath(path)
    return config


def train_mlm_seeds(configs: Sequence, workdirs: Sequence[str]) -> list:
    """`train_mlm` of several configs that differ only in their seeds (train.seed, data.seed), each in its own
    workdir, trained at once in one program (jaxpos.training.loop.SeedRun): each seed's data, tokenizer,
    checkpoints and report are what it would have alone. Returns their TrainResults in order."""
    if len(configs) != len(workdirs):
        raise ValueError(f"{len(configs)} configs for {len(workdirs)} workdirs")
    configs = [continued_from(config) for config in configs]
    with contextlib.ExitStack() as stack:  # each checked once and claimed before any data is read
        started = [stack.enter_context(started_run(config, "mlm", workdir))
                   for config, workdir in zip(configs, workdirs)]
        runs = [run for run, _ in started]
        check_seed_batch(runs)
        for run, workdir in zip(runs, workdirs):  # another model's checkpoints: refused before the corpus is read
            check_resumable(workdir, config_dict(run.model), pending=("vocab_size",))
        return _train_mlm(runs, list(workdirs), [admission for _, admission in started])


def check_seed_batch(runs: Sequence[RunConfig]) -> None:
    """Raises ValueError when runs trained at once differ in more than their seeds (the first difference named);
    the Trainer refuses a seed given twice (`jaxpos.training.loop.check_seed_runs`)."""
    def without_seeds(run: RunConfig) -> dict:
        out = run.to_dict()
        out["train"].pop("seed")
        out["train"].pop("init_from")  # each seed may continue its own
        out["data"].pop("seed")
        out["data"].pop("tokenizer_path")  # ... with its own tokenizer
        return out

    first = without_seeds(runs[0])
    for run in runs[1:]:
        other = without_seeds(run)
        for block in sorted(first):
            if first[block] != other[block]:
                field = next(k for k in sorted(set(first[block]) | set(other[block]))
                             if first[block].get(k) != other[block].get(k))
                raise ValueError(f"seeds trained at once differ only in train.seed and data.seed; {block}.{field} "
                                 f"is {first[block].get(field)!r} in one and {other[block].get(field)!r} in another")


def _train_mlm(runs: list[RunConfig], workdirs: list[str], admissions) -> list:
    dcfg, tcfg = runs[0].data, runs[0].train
    main_process = jax.process_index() == 0  # files of the run are written once
    many = len(runs) > 1
    status(f"jaxpos: masked-LM pretraining, position={runs[0].model.position.kind}, "
           f"devices={jax.device_count()}x{jax.devices()[0].device_kind}, "
           + (f"{len(runs)} seeds at once, workdirs={', '.join(workdirs)}" if many else f"workdir={workdirs[0]}"))
    datas = []
    for run, workdir in zip(runs, workdirs):  # each seed's own tokenizer (sampled by data.seed), order and masking
        data = build_mlm_data(run.data, tcfg.batch_size, workdir, eval_rows=tcfg.eval_batches * tcfg.batch_size)
        datas.append(data)
        where = f" (seed {run.data.seed})" if many else ""
        if dcfg.streaming:
            status(f"data ({dcfg.source}){where}: {data.train.describe()}; held-out examples={len(data.eval_examples)}")
        else:
            status(f"data ({dcfg.source}){where}: {data.stats.summary()}; held-out examples="
                   f"{len(data.eval_examples)}")
        status(f"tokenizer: {data.tokenizer.vocab_size} pieces ({data.tokenizer.path})")
    runs = [run.replace_model(vocab_size=data.tokenizer.vocab_size) for run, data in zip(runs, datas)]
    check_seed_batch(runs)  # tokenizers of other sizes cannot share a program
    entropies = ", ".join(f"{data.unigram_entropy:.3f}" for data in datas)
    status(f"baseline: unigram entropy of the {'held-out rows' if dcfg.streaming else 'corpus'} = {entropies} "
           f"nats/token{' (seed by seed)' if many else ''} (the loss of a model that ignores context)")

    task = MaskedLMTask.of(runs[0])
    # Refuses a checkpoint of another model and a batch the mesh cannot split.
    trainer = Trainer(tcfg, [SeedRun(run.train.seed, w, run.train.init_from)
                                   for run, w in zip(runs, workdirs)], task, mesh=runs[0].mesh)

    def held_out(run: RunConfig, data):
        return lambda: eval_batches(data.eval_examples, data.tokenizer, tcfg.batch_size, tcfg.eval_batches,
                                    run.data.seed, dcfg.mask_prob, jax.process_index(), jax.process_count())

    def admit() -> None:  # the state and data position restored: every check passed
        for admission, run in zip(admissions, runs):
            admission.admit(run)

    try:
        results = trainer.run_seeds([data.train for data in datas],
                                    [held_out(run, data) for run, data in zip(runs, datas)], on_start=admit)
    finally:
        trainer.close()
    for result, run, data, workdir in zip(results, runs, datas, workdirs):
        _report(result, run, data, workdir, main_process, f"seed {run.train.seed}: " if many else "")
    return results


def _report(result, run: RunConfig, data, workdir: str, main_process: bool, label: str) -> None:
    """A run's report.json, its final line, and TISA's score figure."""
    step = int(jax.device_get(result.state.step))
    report = dict(train=result.final_metrics, eval=result.eval_metrics, unigram_entropy=data.unigram_entropy,
                  step=step)
    if main_process:
        write_run_report(workdir, report)
    if result.final_metrics:  # a run resumed at its last step trains nothing
        status(f"{label}final: train loss {result.final_metrics['loss']:.3f}, eval loss "
               f"{result.eval_metrics.get('loss', float('nan')):.3f}, eval accuracy "
               f"{result.eval_metrics.get('accuracy', float('nan')):.3f}, vs unigram entropy "
               f"{data.unigram_entropy:.3f}")
    if run.model.position.kind == "tisa" and main_process:
        from jaxpos.analysis.plots import plot_tisa_scores  # lazy: matplotlib costs ~1 s at import; only TISA runs draw

        params = jax.device_get(result.state.params)
        tisa = position_params(params)
        with tempfile.TemporaryDirectory() as scratch:  # matplotlib writes local files; epath copies them anywhere
            local = plot_tisa_scores({k: np.asarray(tisa[k]) for k in "abc"}, run.data.seq_len,
                                     os.path.join(scratch, "tisa_scores.png"), step=step)
            path = epath.Path(workdir) / "tisa_scores.png"
            path.write_bytes(epath.Path(local).read_bytes())
        status(f"{label}wrote {path}")
    status(f"{label}checkpoints: {epath.Path(workdir) / 'checkpoints'}  TensorBoard: "
           f"{epath.Path(workdir) / 'tensorboard'}")
