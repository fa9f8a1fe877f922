"""Base ConfigDicts that the files under configs/ start from (one place for every default and its meaning)."""

from __future__ import annotations

import dataclasses

import ml_collections

from jaxpos.config import ModelConfig


def model_block(**overrides) -> ml_collections.ConfigDict:
    """`config.model`: every ModelConfig field (see jaxpos/config.py for each one's meaning)."""
    block = ml_collections.ConfigDict(dataclasses.asdict(ModelConfig()))
    block.update(overrides)
    return block


def train_block(**overrides) -> ml_collections.ConfigDict:
    """`config.train`: optimisation, logging and checkpointing."""
    block = ml_collections.ConfigDict(dict(
        num_steps=10_000,
        batch_size=32,  # global batch (all hosts); split evenly over data-parallel devices
        grad_accum_steps=1,  # micro-batches per step, for batches that do not fit
        optimizer="adamw",  # adamw | lamb (large batches) | adam
        learning_rate=1e-4,  # peak
        warmup_fraction=0.01,  # warmup steps as a fraction of num_steps ...
        warmup_steps=None,  # ... unless given as a number
        schedule="linear",  # linear decay to 0 | inverse_sqrt | constant after warmup
        b1=0.9, b2=0.999, eps=1e-6,
        weight_decay=0.01,  # on matrices only
        clip_norm=1.0,  # global gradient-norm clipping; 0 disables
        max_predictions=0,  # MLM: run the output head at most at this many masked positions per row (0 = all)
        label_smoothing=0.0,
        seed=0,
        log_every=50,
        eval_every=1_000,
        eval_batches=20,  # held-out batches per evaluation
        checkpoint_every=1_000,
        keep_checkpoints=3,
        async_checkpoints=True,
    ))
    block.update(overrides)
    return block


def mesh_block(**overrides) -> ml_collections.ConfigDict:
    """`config.mesh`: device mesh sizes; data=-1 takes all devices the other axes leave."""
    block = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
    block.update(overrides)
    return block


def mlm_config() -> ml_collections.ConfigDict:
    """Masked-LM pretraining defaults: BERT-base model, AdamW, the embedded corpus."""
    from jaxpos.data import default_data_config

    config = ml_collections.ConfigDict()
    config.task = "mlm"
    config.model = model_block()
    config.data = default_data_config()
    config.train = train_block()
    config.mesh = mesh_block()
    return config
