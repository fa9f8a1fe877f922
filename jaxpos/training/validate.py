"""The one check of a whole run config, made once when a command starts, before any data is read or model traced.

`check_run_config` turns the user's ConfigDict into the typed `RunConfig` (jaxpos/config/run.py), whose blocks
each check their own fields and whose constructor checks the rules across blocks, then checks what depends on
this host: the attention implementation the model names, for training, against the kinds of terms its mechanism
gives its layers. A command calls it once, where the config enters (the CLI, or a workflow given a ConfigDict);
below them, code receives typed blocks. Nothing checks the config inside a forward pass: what the config
alone decides is refused here.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxpos.attention.registry import Call, check_attention, model_call
from jaxpos.config.model import ModelConfig
from jaxpos.config.run import RunConfig, check_packing, check_train_block, run_config
from jaxpos.models.layers import attention_terms

__all__ = ["check_model_attention", "check_packing", "check_run_config", "check_train_block", "check_training",
           "model_facts", "run_config_warnings"]


def model_facts(cfg: ModelConfig, *, training: bool, **platform) -> Call:
    """The facts every attention call of the model `cfg` shares (jaxpos.attention.registry.model_call), with the
    kinds of terms its layers receive."""
    return model_call(cfg, attention_terms(cfg), training=training, **platform)


def check_model_attention(cfg: ModelConfig, *, training: bool, **platform) -> None:
    """`jaxpos.attention.registry.check_attention` of the model `cfg`, with the kinds of terms its layers receive
    (`platform`: given facts of a host, or this one's)."""
    check_attention(cfg, attention_terms(cfg), training=training, **platform)


def check_training(cfg: ModelConfig) -> None:
    """Errors for a model block that evaluates but cannot train here (checked before a training run reads data):
    an attention implementation that cannot compute its attention (the kinds of terms its layers receive),
    attention dropout included."""
    if cfg.attention_impl != "auto":
        check_model_attention(cfg, training=True)


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
