"""Base ConfigDicts that the files under configs/ start from: each block's fields and defaults come from its typed
block (jaxpos/config/model.py, run.py, decode.py), each task's settings are here."""

from __future__ import annotations

import dataclasses

import ml_collections

from jaxpos.config.data import default_data_config, default_finetune_data_config, default_translation_data_config
from jaxpos.config.decode import DecodeConfig
from jaxpos.config.model import ModelConfig
from jaxpos.config.run import MeshConfig, TrainConfig


def _defaults(cls) -> dict:
    """The defaults of a config dataclass's fields as the user's format holds them, read off the class (no
    instance: a config file builds its blocks before any mechanism is registered). The position block's default
    kind, `absolute`, has no options block."""
    out = {}
    for field in dataclasses.fields(cls):
        if field.name == "options":
            continue
        if field.default_factory is not dataclasses.MISSING:  # a block of its own: the position block
            out[field.name] = _defaults(field.default_factory)
        else:
            out[field.name] = field.default
    return out


def model_block(**overrides) -> ml_collections.ConfigDict:
    """`config.model`: every ModelConfig field (see jaxpos/config/model.py for each one's meaning); the position
    block holds its kind's options only (`--config.model.position.<kind>.<field>=...` makes another kind's block
    when the kind changes)."""
    block = ml_collections.ConfigDict(_defaults(ModelConfig))
    block.update(overrides)
    return block


def set_position(model: ml_collections.ConfigDict, kind: str, **options) -> ml_collections.ConfigDict:
    """`model` (a `config.model`) with position.kind set to `kind` and the given options of it (the fields left out
    keep their defaults); the blocks of other kinds are dropped. Returns `model`."""
    position = model.position
    for key in [k for k in position.keys() if isinstance(position[k], ml_collections.ConfigDict)]:
        del position[key]
    position.kind = kind
    if options:
        position[kind] = ml_collections.ConfigDict(options)
    return model


def modern_block(model: ml_collections.ConfigDict, **overrides) -> ml_collections.ConfigDict:
    """`model` (a `config.model`) set to ModernBERT's block (Warner et al., 2024): pre-LN with a final norm,
    LayerNorms without a shift (eps 1e-5), no biases in the dense layers, a GeGLU MLP, the first layer's attention
    norm an identity (the embeddings are normalised once), no token types, local layers (128 tokens, every layer
    but each third global) and RoPE at 160,000 in global and 10,000 in local layers; then `overrides`."""
    model.update(layer_norm="pre", layer_norm_eps=1e-5, norm_bias=False, use_bias=False, mlp="geglu",
                 activation="gelu", first_layer_attention_norm=False, embed_layer_norm=True, local_window=128,
                 global_every=3, dropout=0.0, attention_dropout=0.0)
    set_position(model, "rope", base=160_000.0, local_base=10_000.0)
    model.position.segment = "none"
    model.update(overrides)
    return model


def train_block(**overrides) -> ml_collections.ConfigDict:
    """`config.train`: optimisation, logging, evaluation and checkpoints (`TrainConfig`'s fields and defaults)."""
    block = ml_collections.ConfigDict(dataclasses.asdict(TrainConfig()))
    block.update(overrides)
    return block


def mesh_block(**overrides) -> ml_collections.ConfigDict:
    """`config.mesh`: device mesh sizes (`MeshConfig`); data=-1 takes all devices the other axes leave."""
    block = ml_collections.ConfigDict(dataclasses.asdict(MeshConfig()))
    block.update(overrides)
    return block


def mlm_config() -> ml_collections.ConfigDict:
    """Masked-LM pretraining defaults: BERT-base model, AdamW, the embedded corpus."""
    config = ml_collections.ConfigDict()
    config.task = "mlm"
    config.model = model_block()
    config.data = default_data_config()
    config.train = train_block()
    config.mesh = mesh_block()
    return config


def decode_block(**overrides) -> ml_collections.ConfigDict:
    """`config.decode`: beam search for translation (see jaxpos/config/decode.py)."""
    block = ml_collections.ConfigDict(dataclasses.asdict(DecodeConfig()))
    block.update(overrides)
    return block


def translation_config() -> ml_collections.ConfigDict:
    """Encoder-decoder translation defaults: Vaswani base, Adam with inverse-square-root warmup, label smoothing
    0.1, the offline Bible corpus (de -> en); BLEU on dev during training and on test at the end."""
    config = ml_collections.ConfigDict()
    config.task = "translation"
    config.model = model_block(
        vocab_size=8000, d_model=512, num_layers=6, num_decoder_layers=6, num_heads=8, mlp_dim=2048,
        max_length=256, dropout=0.1, attention_dropout=0.1, activation="relu", layer_norm_eps=1e-6,
        embed_layer_norm=False, scale_embeddings=True, tie_embeddings=True, init_std=0.02)
    config.model.position.segment = "none"
    config.data = default_translation_data_config()
    config.train = train_block(
        optimizer="adam", learning_rate=7e-4, b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.0, warmup_steps=4000,
        schedule="inverse_sqrt", label_smoothing=0.1, num_steps=250_000, batch_size=256, clip_norm=0.0)
    config.train.bleu_every = 10_000  # decode the dev set and report SacreBLEU every this many steps
    config.decode = decode_block(beam_size=10, alpha=0.6)  # DIET section 4.3
    config.mesh = mesh_block()
    return config


def finetune_config() -> ml_collections.ConfigDict:
    """Fine-tuning defaults (BERT's GLUE recipe): AdamW at 2e-5, batch 32, 3 epochs, 10% warmup then linear decay,
    dropout 0.1, sequences of 128 tokens; dev scores at every evaluation. The architecture comes from --init."""
    config = ml_collections.ConfigDict()
    config.task = "finetune"
    # Overrides of the pretrained model's config; its architecture comes from --init. On accelerators,
    # --config.model.dtype=bfloat16 (configs/finetune/glue.py); "auto" picks the attention path per call.
    # pooling: what the classifier's pooler reads ([CLS] as BERT; mean or max over the tokens).
    config.model = ml_collections.ConfigDict(dict(dropout=0.1, attention_dropout=0.1, attention_impl="auto",
                                                  dtype="float32", pooling="cls"))
    config.data = default_finetune_data_config()
    config.train = train_block(
        num_steps=0,  # 0: num_epochs passes over the training set
        num_epochs=3.0,
        batch_size=32, learning_rate=2e-5, warmup_fraction=0.1, weight_decay=0.01, log_every=50,
        eval_every=0,  # steps between dev evaluations (every one is kept in WORKDIR/evals.json); 0 = once an epoch
        checkpoint_every=0,  # 0 = at every evaluation
        eval_batch_size=0,  # 0 = batch_size
        keep_checkpoints=1)
    config.mesh = mesh_block()
    return config
