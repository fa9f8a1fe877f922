"""`jaxpos tokenizer`: a config's tokenizer trained once, before a multi-process run reads it."""

from __future__ import annotations

from jaxpos.config.run import run_config, tokenizer_algorithm
from jaxpos.data.parallel import SPLITS, TranslationStats, load_parallel
from jaxpos.data.pipeline import train_tokenizer
from jaxpos.data.tokenizer import (TRANSLATION_SPECIAL_TOKENS, Tokenizer, tokenizer_prefix, tokenizer_settings,
                                   train_tokenizer_file)


def train_config_tokenizer(config, out: str, source: str) -> Tokenizer:
    """Trains the tokenizer a run of `config` would train (masked-LM or translation: same sentences, settings and
    model) and writes OUT.model and OUT.vocab (data.tokenizer=tokenizers: OUT.tokenizer.json), then OUT.json (`out`
    may end in the model's suffix; local or a URL), so that every process of a multi-process run reads it
    (data.tokenizer_path=the model). `source` names the config in errors."""
    if config.task not in ("mlm", "translation"):
        raise ValueError(f"{source} is a {config.task!r} config; `jaxpos tokenizer` trains the tokenizer of a "
                         "masked-LM or translation config (fine-tuning reuses the pretrained model's)")
    dcfg = run_config(config).data  # the data block alone: no attention check of this machine, no backend started
    if config.task == "mlm":
        return train_tokenizer(dcfg, out)
    train = load_parallel(dcfg, {s: TranslationStats() for s in SPLITS}, splits_wanted=("train",))["train"]
    sample, settings = tokenizer_settings(
        (sentence for pair in zip(train.sources, train.targets) for sentence in pair), dcfg.vocab_size,
        special_tokens=TRANSLATION_SPECIAL_TOKENS, model_type=tokenizer_algorithm(dcfg.tokenizer, dcfg.tokenizer_model_type),
        max_sentences=dcfg.tokenizer_max_sentences, seed=dcfg.seed, library=dcfg.tokenizer)
    return train_tokenizer_file(sample, settings, tokenizer_prefix(out))
