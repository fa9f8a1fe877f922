"""`jaxpos train`: a masked-LM or translation config, trained by its task's workflow (which checks it as a whole
before any data is read)."""

from __future__ import annotations

from jaxpos.workflows.mlm import seed_configs, train_mlm, train_mlm_seeds
from jaxpos.workflows.translation import train_translation


def train(config, workdir: str, source: str, seeds: int = 1):
    """Trains `config` in WORKDIR (resuming from its checkpoints): masked-LM pretraining (returns the TrainResult)
    or translation (returns the report dict). `source` names the config file in errors. `seeds` > 1: that many
    seeds of a masked-LM config at once (train.seed and data.seed raised by 0, 1, ...), each in WORKDIR/seed_S
    (a list of TrainResults)."""
    if seeds < 1:
        raise ValueError(f"--seeds {seeds}: need at least one seed")
    if config.task != "mlm" and config.get("train", {}).get("init_from"):
        raise ValueError(f"train.init_from continues masked-LM pretraining; {source} is a {config.task} config")
    if seeds > 1:
        if config.task != "mlm":
            raise ValueError(f"--seeds trains masked-LM configs; {source} is a {config.task} config: train its seeds "
                             "one at a time")
        configs = seed_configs(config, seeds)
        return train_mlm_seeds(configs, [f"{workdir.rstrip('/')}/seed_{c.train.seed}" for c in configs])
    if config.task == "mlm":
        return train_mlm(config, workdir)
    if config.task == "translation":
        return train_translation(config, workdir)
    if config.task == "finetune":
        raise ValueError(f"{source} is a fine-tuning config: run it with `jaxpos finetune --config "
                         f"{source} --init PRETRAINED --workdir DIR`")
    raise ValueError(f"unknown task {config.task!r} in {source}")
