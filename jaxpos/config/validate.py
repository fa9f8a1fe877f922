"""The one check of a whole run config, made once when a command starts, before any data is read or model traced.

`check_run_config` turns the user's ConfigDict into the typed `RunConfig` (jaxpos/config/run.py), whose blocks
each check their own fields and whose constructor checks the rules across blocks, then checks what depends on
this host: the attention implementation the model names, for training. The workflows call it once, at their
entry; below them, code receives typed blocks. Nothing checks the config inside a forward pass: what the config
alone decides is refused here.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxpos.config.attention import check_attention
from jaxpos.config.model import ModelConfig
from jaxpos.config.run import RunConfig, check_packing, check_train_block, run_config

__all__ = ["check_packing", "check_run_config", "check_train_block", "check_training", "run_config_warnings"]


def check_training(cfg: ModelConfig) -> None:
    """Errors for a model block that evaluates but cannot train here (checked before a training run reads data):
    an attention implementation that cannot compute its attention, attention dropout included."""
    check_attention(cfg, training=True)


def check_run_config(config: Mapping[str, Any] | RunConfig, *, task: str | None = None,
                     model: ModelConfig | None = None) -> RunConfig:
    """The RunConfig of the run config `config` (a ConfigDict, a dict or a RunConfig) for a run of `task` ("mlm",
    "translation", "finetune"; None: the config's own); raises a ValueError naming the first value it cannot
    use. `model`: the typed model where config.model holds overrides only (fine-tuning: the pretrained model's
    config with them applied)."""
    run = config if isinstance(config, RunConfig) else run_config(config, task=task, model=model)
    check_training(run.model)
    return run


def run_config_warnings(run: RunConfig) -> list[str]:
    """What a run config allows but a user most likely did not mean, one line each (the workflows print them):
    a warmup longer than the run, so that the learning rate never reaches its peak."""
    train, warnings = run.train, []
    warmup = train.warmup_steps
    if warmup is not None and 0 < train.num_steps < warmup:
        warnings.append(f"train.warmup_steps={warmup} is more than train.num_steps={train.num_steps}: the learning "
                        f"rate never reaches its peak train.learning_rate={train.learning_rate:g} (it stops at "
                        f"{(train.num_steps - 1) / warmup:.0%} of it); lower train.warmup_steps or set it to None "
                        "to use train.warmup_fraction")
    return warnings
