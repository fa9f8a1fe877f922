"""One check of a whole run config, made when a run starts, before any data is read or model traced.

`check_run_config` checks every block a run of its task reads: the model block (converted to a `ModelConfig`,
whose constructor refuses what no model can run, then the rules of training and of packed rows), the data
block's ranges, the train block, the decode block (translation) and the mesh sizes. The workflows call it once;
the Trainer calls it again for the callers that build one directly (the same cheap check). Nothing checks the
config inside a forward pass: what the config alone decides is refused here or by `ModelConfig`.
"""

from __future__ import annotations

from jaxpos.config.attention import check_attention
from jaxpos.config.checks import check_count, check_number
from jaxpos.config.data import MLM_SOURCES, TRANSLATION_SOURCES, check_source
from jaxpos.config.decode import decode_config
from jaxpos.config.defaults import FINETUNE_ZERO_DEFAULTS
from jaxpos.config.model import ModelConfig, model_config


def check_training(cfg: ModelConfig) -> None:
    """Errors for a model block that evaluates but cannot train here (checked before a training run reads data):
    an attention implementation that cannot compute its attention, attention dropout included."""
    check_attention(cfg, training=True)


def check_packing(model, packed: bool) -> None:
    """Raises a ValueError when rows that pack several sequences (`packed`) meet Linformer, which mixes them;
    `model`: a ModelConfig or the config.model block it comes from.

    The model cannot tell packed rows from its inputs under jit (piece ids are traced), so the run refuses the
    combination from its config: masked-LM rows always pack, translation rows unless data.pack=False."""
    if packed and model.position.kind == "diet_abs" and model.position.diet_abs.linformer_k:
        raise ValueError("Linformer (position.diet_abs.linformer_k) projects keys and values along the whole row, "
                         "so it mixes the sequences of packed rows; give it rows of one sequence each "
                         "(translation: data.pack=False; masked-LM rows always pack)")


def check_train_block(train, zero_means_default: tuple[str, ...] = ()) -> None:
    """Raises a ValueError naming the first `config.train` value out of its range (counts, rates, intervals).
    `zero_means_default`: fields that may still be 0 (fine-tuning resolves them from the data: `finetune_config`)."""
    def given(name):
        return (name in train and (name != "warmup_steps" or train.warmup_steps is not None)
                and not (name in zero_means_default and train[name] == 0))

    for name, least in (("batch_size", 1), ("grad_accum_steps", 1), ("log_every", 1), ("eval_every", 1),
                        ("checkpoint_every", 1), ("keep_checkpoints", 1), ("num_steps", 0), ("max_predictions", 0),
                        ("eval_batches", 0), ("eval_batch_size", 0), ("warmup_steps", 0), ("bleu_every", 0),
                        ("bleu_sentences", 0), ("test_sentences", 0)):
        if given(name):
            check_count(f"train.{name}", train[name], least)
    for name, low, high, open_low, open_high in (
            ("learning_rate", 0.0, None, True, True), ("eps", 0.0, None, True, True),
            ("weight_decay", 0.0, None, False, True), ("clip_norm", 0.0, None, False, True),
            ("warmup_fraction", 0.0, 1.0, False, False), ("b1", 0.0, 1.0, False, True),
            ("b2", 0.0, 1.0, False, True), ("label_smoothing", 0.0, 1.0, False, True)):
        if given(name):
            check_number(f"train.{name}", train[name], low, high, open_low=open_low, open_high=open_high)


def check_mlm_data_block(data) -> None:
    """Raises a ValueError naming the first masked-LM `config.data` value out of its range."""
    if "source" in data:
        check_source(data.source, MLM_SOURCES)
    if "mask_prob" in data:
        check_number("data.mask_prob", data.mask_prob, 0.0, 1.0, open_low=True, open_high=False)
    if "eval_fraction" in data:
        check_number("data.eval_fraction", data.eval_fraction, 0.0, 1.0)
    for name, least in (("max_documents", 0), ("shuffle_window", 1), ("tokenizer_max_sentences", 1)):
        if name in data:
            check_count(f"data.{name}", data[name], least)


def check_translation_data_block(data) -> None:
    """Raises a ValueError naming the first translation `config.data` value out of its range."""
    if "source" in data:
        check_source(data.source, TRANSLATION_SOURCES)
    for name, least in (("max_length", 2), ("eval_max_length", 2), ("max_pairs", 0), ("tokenizer_max_sentences", 1)):
        if name in data:  # a side needs a token and EOS (BOS is the decoder's start)
            check_count(f"data.{name}", data[name], least)


def check_mesh_sizes(data, fsdp, tensor) -> None:
    """Raises a ValueError unless the mesh sizes are positive integers (data may be -1: every device left)."""
    sizes = (data, fsdp, tensor)
    if (any(isinstance(s, bool) or not isinstance(s, int) for s in sizes)
            or min(data if data != -1 else 1, fsdp, tensor) < 1):
        raise ValueError(f"config.mesh sizes must be positive (data may be -1): data={data}, fsdp={fsdp}, "
                         f"tensor={tensor}")


def check_run_config(config, *, task: str | None, model: ModelConfig | None = None) -> ModelConfig | None:
    """Raises a ValueError naming the first value of the run config `config` that a run of `task` ("mlm",
    "translation", "finetune"; None: a config without a task, e.g. one a Trainer is built from directly, whose
    train and mesh blocks and model are checked) cannot use. `model`: the typed model config where config.model
    is not a whole one (fine-tuning: the pretrained model's with config.model's overrides); None converts
    config.model (fine-tuning: no model is checked). Returns the model config checked, if any."""
    if task not in ("mlm", "translation", "finetune", None):
        raise ValueError(f"unknown task {task!r}")
    # Masked-LM rows pack sentences of several documents; translation rows pack pairs unless data.pack=False.
    packed = task == "mlm" or (task == "translation" and config.data.get("pack", True))
    if model is None and task != "finetune" and "model" in config:
        check_packing(config.model, packed)  # before ModelConfig's own checks: a packed run hears of packing first
        model = model_config(config.model)
    elif model is not None:
        check_packing(model, packed)
    if model is not None:
        check_training(model)
    if task == "mlm":
        check_mlm_data_block(config.data)
        if model.max_length < config.data.seq_len:
            raise ValueError(f"model.max_length={model.max_length} is shorter than data.seq_len={config.data.seq_len}")
    elif task == "translation":
        if model.num_decoder_layers < 1:
            raise ValueError("a translation config needs model.num_decoder_layers >= 1")
        check_translation_data_block(config.data)
        decode_config(config.decode)
    check_train_block(config.train, zero_means_default=FINETUNE_ZERO_DEFAULTS if task == "finetune" else ())
    if task == "finetune" and not config.train.num_steps:
        check_number("train.num_epochs", config.train.num_epochs, 0.0, open_low=True)
    if "mesh" in config:
        mesh = config.mesh
        check_mesh_sizes(mesh.get("data", -1), mesh.get("fsdp", 1), mesh.get("tensor", 1))
    return model


def run_config_warnings(config) -> list[str]:
    """What a run config allows but a user most likely did not mean, one line each (the workflows print them):
    a warmup longer than the run, so that the learning rate never reaches its peak."""
    train, warnings = config.train, []
    warmup = train.get("warmup_steps")
    if warmup is not None and 0 < train.num_steps < warmup:
        warnings.append(f"train.warmup_steps={warmup} is more than train.num_steps={train.num_steps}: the learning "
                        f"rate never reaches its peak train.learning_rate={train.learning_rate:g} (it stops at "
                        f"{(train.num_steps - 1) / warmup:.0%} of it); lower train.warmup_steps or set it to None "
                        "to use train.warmup_fraction")
    return warnings
