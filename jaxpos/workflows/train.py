"""`jaxpos train`: a masked-LM or translation config, trained by its task's workflow (which checks it as a whole
before any data is read)."""

from __future__ import annotations

from jaxpos.workflows.mlm import train_mlm
from jaxpos.workflows.translation import train_translation


def train(config, workdir: str, source: str):
    """Trains `config` in WORKDIR (resuming from its checkpoints): masked-LM pretraining (returns the TrainResult)
    or translation (returns the report dict). `source` names the config file in errors."""
    if config.task == "mlm":
        return train_mlm(config, workdir)
    if config.task == "translation":
        return train_translation(config, workdir)
    if config.task == "finetune":
        raise ValueError(f"{source} is a fine-tuning config: run it with `jaxpos finetune --config "
                         f"{source} --init PRETRAINED --workdir DIR`")
    raise ValueError(f"unknown task {config.task!r} in {source}")
