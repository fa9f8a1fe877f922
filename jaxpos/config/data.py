"""The `config.data` blocks of each task as ConfigDicts, for config files (every field's default and meaning is in
the typed blocks of jaxpos/config/run.py: `MLMDataConfig`, `TranslationDataConfig`, `FinetuneDataConfig`)."""

from __future__ import annotations

import dataclasses

import ml_collections

from jaxpos.config.run import FinetuneDataConfig, MLMDataConfig, TranslationDataConfig


def default_data_config() -> ml_collections.ConfigDict:
    """`config.data` for masked-LM pretraining (`MLMDataConfig`'s fields and defaults)."""
    return ml_collections.ConfigDict(dataclasses.asdict(MLMDataConfig()))


def default_translation_data_config() -> ml_collections.ConfigDict:
    """`config.data` for translation (`TranslationDataConfig`'s fields and defaults)."""
    return ml_collections.ConfigDict(dataclasses.asdict(TranslationDataConfig()))


def default_finetune_data_config() -> ml_collections.ConfigDict:
    """`config.data` for fine-tuning (`FinetuneDataConfig`'s fields and defaults)."""
    return ml_collections.ConfigDict(dataclasses.asdict(FinetuneDataConfig()))
