"""Masked-LM pretraining as `jaxpos train` runs it: data, model, the shared loop, the end-of-run report and figure."""

from __future__ import annotations

import os
import tempfile

import jax
import numpy as np
from etils import epath

from jaxpos.config.files import write_run_report
from jaxpos.config.run import RunConfig
from jaxpos.data.pipeline import build_mlm_data, eval_batches
from jaxpos.models import BertForMaskedLM
from jaxpos.progress import status
from jaxpos.training.loop import Trainer
from jaxpos.training.mlm import MaskedLMTask
from jaxpos.workflows.workdir import started_run


def train_mlm(config, workdir: str):
    """Pretrains a BERT-style model as configured (a ConfigDict, or a checked RunConfig); resumes from WORKDIR's
    checkpoints (local or gs://...). Returns the TrainResult. A refused run (config, data, a checkpoint of another
    model) leaves WORKDIR as it was; SIGTERM or SIGINT checkpoints and raises RunStopped
    (jaxpos.training.interrupt)."""
    with started_run(config, "mlm", workdir) as (run, admission):  # checked once, before any data is read
        return _train_mlm(run, workdir, admission)


def _train_mlm(run: RunConfig, workdir: str, admission):
    dcfg, tcfg = run.data, run.train
    main_process = jax.process_index() == 0  # files of the run are written once
    status(f"jaxpos: masked-LM pretraining, position={run.model.position.kind}, "
           f"devices={jax.device_count()}x{jax.devices()[0].device_kind}, workdir={workdir}")
    data = build_mlm_data(dcfg, tcfg.batch_size, workdir, eval_rows=tcfg.eval_batches * tcfg.batch_size)
    streaming = dcfg.streaming
    if streaming:
        status(f"data ({dcfg.source}): {data.train.describe()}; held-out examples={len(data.eval_examples)}")
    else:
        status(f"data ({dcfg.source}): {data.stats.summary()}; held-out examples={len(data.eval_examples)}")
    status(f"tokenizer: {data.tokenizer.vocab_size} pieces ({data.tokenizer.path})")
    run = run.replace_model(vocab_size=data.tokenizer.vocab_size)  # the embedding table follows the tokenizer
    status(f"baseline: unigram entropy of the {'held-out rows' if streaming else 'corpus'} = "
           f"{data.unigram_entropy:.3f} nats/token (the loss of a model that ignores context)")

    cfg = run.model
    task = MaskedLMTask(BertForMaskedLM(cfg), dcfg.seq_len, tcfg.max_predictions)
    # Refuses a checkpoint of another model and a batch the mesh cannot split.
    trainer = Trainer(tcfg, workdir, task, mesh=run.mesh)
    try:
        result = trainer.run(
            data.train,
            eval_batches=lambda: eval_batches(data.eval_examples, data.tokenizer, tcfg.batch_size,
                                              tcfg.eval_batches, dcfg.seed, dcfg.mask_prob,
                                              jax.process_index(), jax.process_count()),
            on_start=lambda: admission.admit(run))  # the state and data position restored: every check passed
    finally:
        trainer.close()
    report = dict(train=result.final_metrics, eval=result.eval_metrics, unigram_entropy=data.unigram_entropy,
                  step=int(jax.device_get(result.state.step)))
    if main_process:
        write_run_report(workdir, report)
    if result.final_metrics:  # a run resumed at its last step trains nothing
        status(f"final: train loss {result.final_metrics['loss']:.3f}, eval loss "
               f"{result.eval_metrics.get('loss', float('nan')):.3f}, eval accuracy "
               f"{result.eval_metrics.get('accuracy', float('nan')):.3f}, vs unigram entropy "
               f"{data.unigram_entropy:.3f}")
    if cfg.position.kind == "tisa" and main_process:
        from jaxpos.analysis.plots import plot_tisa_scores  # lazy: matplotlib costs ~1 s at import; only TISA runs draw

        params = jax.device_get(result.state.params)
        tisa = params["bert"]["encoder"]["position"]
        with tempfile.TemporaryDirectory() as scratch:  # matplotlib writes local files; epath copies them anywhere
            local = plot_tisa_scores({k: np.asarray(tisa[k]) for k in "abc"}, dcfg.seq_len,
                                     os.path.join(scratch, "tisa_scores.png"),
                                     step=int(jax.device_get(result.state.step)))
            path = epath.Path(workdir) / "tisa_scores.png"
            path.write_bytes(epath.Path(local).read_bytes())
        status(f"wrote {path}")
    status(f"checkpoints: {epath.Path(workdir) / 'checkpoints'}  TensorBoard: {epath.Path(workdir) / 'tensorboard'}")
    return result
