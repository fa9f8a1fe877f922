"""`jaxpos train`: a masked-LM or translation config checked as a whole, then trained by its task's workflow."""

from __future__ import annotations

from jaxpos.config import model_config
from jaxpos.config.defaults import check_train_block
from jaxpos.config.model import check_training


def train(config, workdir: str, source: str):
    """Trains `config` in WORKDIR (resuming from its checkpoints): masked-LM pretraining (returns the TrainResult)
    or translation (returns the report dict). `source` names the config file in errors. The model, train and
    decode blocks are refused before any data is read."""
    check_training(model_config(config.model))
    check_train_block(config.train)
    if "decode" in config:  # translation: the beam search's settings too
        from jaxpos.config.decode import decode_config

        decode_config(config.decode)
    if config.task == "mlm":
        from jaxpos.workflows.mlm import train_mlm

        return train_mlm(config, workdir)
    if config.task == "translation":
        from jaxpos.workflows.translation import train_translation

        return train_translation(config, workdir)
    if config.task == "finetune":
        raise ValueError(f"{source} is a fine-tuning config: run it with `jaxpos finetune --config "
                         f"{source} --init PRETRAINED --workdir DIR`")
    raise ValueError(f"unknown task {config.task!r} in {source}")
