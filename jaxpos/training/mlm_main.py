"""`jaxpos train` for masked-LM configs: data, model, the shared loop, and the end-of-run report."""

from __future__ import annotations

import json
import os

import jax
import numpy as np

from jaxpos.config import model_config
from jaxpos.data.pipeline import build_mlm_data, eval_batches
from jaxpos.models import BertForMaskedLM
from jaxpos.training.loop import Trainer
from jaxpos.training.mlm import MaskedLMTask


def train_mlm(config, workdir: str):
    """Pretrains a BERT-style model as configured; resumes from WORKDIR's checkpoints. Returns the TrainResult."""
    os.makedirs(workdir, exist_ok=True)
    dcfg, tcfg = config.data, config.train
    print(f"jaxpos: masked-LM pretraining, position={config.model.position.kind}, "
          f"devices={jax.device_count()}x{jax.devices()[0].device_kind}, workdir={workdir}", flush=True)
    data = build_mlm_data(dcfg, tcfg.batch_size, workdir)
    print(f"data ({dcfg.source}): {data.stats.summary()}; held-out examples={len(data.eval_examples.tokens)}")
    print(f"tokenizer: {data.tokenizer.vocab_size} pieces ({data.tokenizer.path})")
    if config.model.vocab_size != data.tokenizer.vocab_size:
        config.model.vocab_size = data.tokenizer.vocab_size  # the embedding table follows the tokenizer
    if config.model.max_length < dcfg.seq_len:
        raise ValueError(f"model.max_length={config.model.max_length} is shorter than data.seq_len={dcfg.seq_len}")
    with open(os.path.join(workdir, "config.json"), "w") as f:
        f.write(config.to_json_best_effort(indent=2))
    print(f"baseline: unigram entropy of the corpus = {data.unigram_entropy:.3f} nats/token "
          "(the loss of a model that ignores context)", flush=True)

    cfg = model_config(config.model)
    task = MaskedLMTask(BertForMaskedLM(cfg), dcfg.seq_len, tcfg.max_predictions)
    trainer = Trainer(config, workdir, task)
    try:
        result = trainer.run(
            data.train,
            eval_batches=lambda: eval_batches(data.eval_examples, data.tokenizer, tcfg.batch_size,
                                              tcfg.eval_batches, dcfg.seed, dcfg.mask_prob,
                                              jax.process_index(), jax.process_count()))
    finally:
        trainer.close()
    report = dict(train=result.final_metrics, eval=result.eval_metrics, unigram_entropy=data.unigram_entropy,
                  step=int(jax.device_get(result.state.step)))
    with open(os.path.join(workdir, "report.json"), "w") as f:
        json.dump(report, f, indent=2)
    train_loss, eval_loss = result.final_metrics.get("loss"), result.eval_metrics.get("loss")
    if train_loss is not None:
        print(f"final: train loss {train_loss:.3f}, eval loss {eval_loss:.3f}, eval accuracy "
              f"{result.eval_metrics.get('accuracy', float('nan')):.3f}, vs unigram entropy "
              f"{data.unigram_entropy:.3f}")
    if cfg.position.kind == "tisa" and jax.process_index() == 0:
        from jaxpos.analysis.plots import plot_tisa_scores

        params = jax.device_get(result.state.params)
        tisa = params["bert"]["encoder"]["position"]
        path = plot_tisa_scores({k: np.asarray(tisa[k]) for k in "abc"}, dcfg.seq_len,
                                os.path.join(workdir, "tisa_scores.png"))
        print(f"wrote {path}")
    print(f"checkpoints: {os.path.join(workdir, 'checkpoints')}  TensorBoard: {os.path.join(workdir, 'tensorboard')}")
    return result
