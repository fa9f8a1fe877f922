"""Every shipped config parses, converts to a typed ModelConfig and builds a model; overrides work."""

import glob
import os

import jax
import pytest

from jaxpos.config import model_config
from jaxpos.config.files import apply_overrides, load_config
from jaxpos.models import BertForMaskedLM, EncoderDecoder

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "**", "*.py"), recursive=True))
# run configs (a task each); configs/reproduce/ holds the reproduction's profiles (tests/reproduction read them)
RUN_CONFIGS = [path for path in CONFIGS if os.sep + "reproduce" + os.sep not in path]


def test_there_are_configs():
    assert any(p.endswith("mlm/tiny.py") for p in CONFIGS)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: os.path.relpath(p, ROOT))
def test_config_builds_its_model(path):
    config = load_config(path)
    cfg = model_config(config.model)
    assert cfg.max_length >= config.data.get("seq_len", config.data.get("max_length"))
    model = EncoderDecoder(cfg) if cfg.num_decoder_layers else BertForMaskedLM(cfg)
    ids = jax.ShapeDtypeStruct((1, 8), "int32")
    args = (ids, ids) if cfg.num_decoder_layers else (ids,)
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), *args)
    assert shapes["params"]


def test_overrides_are_typed_and_checked():
    config = load_config(os.path.join(ROOT, "configs", "mlm", "tiny.py"))
    apply_overrides(config, ["--config.model.position.kind=diet_rel", "--config.train.num_steps=7",
                             "--config.model.position.diet_rel.max_distance=12", "--config.train.async_checkpoints=false"])
    assert config.model.position.kind == "diet_rel" and config.train.num_steps == 7
    assert config.model.position.diet_rel.max_distance == 12 and config.train.async_checkpoints is False
    with pytest.raises(ValueError, match=r"unknown config field train.num_step \(did you mean train.num_steps"):
        apply_overrides(config, ["--config.train.num_step=3"])
    with pytest.raises(ValueError, match="unknown position mechanism 'rotary'"):
        model_config(apply_overrides(config, ["--config.model.position.kind=rotary"]).model)


@pytest.mark.parametrize("override, message", [
    ("--config.model.positon.kind=x", "unknown config field model.positon (did you mean model.position?)"),
    ("--config.model.position.kindd=x", "unknown config field model.position.kindd (did you mean "
                                        "model.position.kind?)"),
    ("--config.modle.dropout=0", "unknown config field modle (did you mean model?)"),
    ("--config.data.zzz=1", "unknown config field data.zzz; known here: "),  # nothing close: every field of data
    ("--config.model.dropout.rate=0", "--config.model.dropout.rate=0: config field model.dropout is a value (0.1), "
                                      "not a block of fields"),
])
def test_an_unknown_field_reads_the_same_at_any_depth_and_names_the_closest(override, message):
    config = load_config(os.path.join(ROOT, "configs", "mlm", "tiny.py"))
    with pytest.raises(ValueError) as error:
        apply_overrides(config, [override])
    assert str(error.value).startswith(message)


def test_typed_blocks_name_the_closest_field_as_overrides_do():
    config = load_config(os.path.join(ROOT, "configs", "mlm", "tiny.py")).model.to_dict()
    with pytest.raises(ValueError, match=r"^unknown config field model.position.kindd \(did you mean "
                                         r"model.position.kind\?\)$"):
        model_config(dict(config, position=dict(config["position"], kindd="tisa")))


@pytest.mark.parametrize("max_distance", [8, 6])  # NaN everywhere | buckets of the other direction
def test_t5_max_distance_at_or_below_the_exact_buckets_is_refused(max_distance):
    encoder = dict(vocab_size=61, d_model=32, num_layers=2, num_heads=4, mlp_dim=48, max_length=16)
    t5 = dict(kind="t5", t5=dict(num_buckets=32, max_distance=max_distance))
    with pytest.raises(ValueError, match=rf"max_distance={max_distance} must be greater than 8, the number of exact "
                                         r"buckets \(num_buckets/4\) of the bidirectional stack"):
        model_config(dict(encoder, position=t5))


def test_t5_bounds_hold_for_every_stack_of_the_model():
    base = dict(vocab_size=61, d_model=32, num_layers=2, num_heads=4, mlp_dim=48, max_length=16)

    def build(num_buckets, max_distance, **model):
        return model_config(dict(base, position=dict(kind="t5", t5=dict(num_buckets=num_buckets,
                                                                       max_distance=max_distance)), **model))

    build(32, 9)  # the smallest accepted values: one above the exact-bucket count
    build(32, 17, causal=True)
    build(32, 17, num_decoder_layers=2)
    build(2, 2, causal=True)
    with pytest.raises(ValueError, match=r"max_distance=16 must be greater than 16.*num_buckets/2.*causal stack"):
        build(32, 16, causal=True)
    # An encoder-decoder has a bidirectional encoder (fine at 12 > 8) and a causal decoder (12 <= 16).
    with pytest.raises(ValueError, match=r"max_distance=12 must be greater than 16.*causal decoder"):
        build(32, 12, num_decoder_layers=2)
    for num_buckets in (31, 2):
        with pytest.raises(ValueError, match=rf"num_buckets={num_buckets} must be even and >= 4 .*bidirectional"):
            build(num_buckets, 128)
    with pytest.raises(ValueError, match=r"num_buckets=1 must be >= 2 for the causal stack"):
        build(1, 128, causal=True)
    # another kind's options would do nothing: refused in one line (a saved config of an older run is read as it was)
    with pytest.raises(ValueError, match=r"model\.position\.t5: options of 't5', but model\.position\.kind is 'tisa'"):
        model_config(dict(base, position=dict(kind="tisa", t5=dict(max_distance=1))))
    saved = model_config(dict(base, position=dict(kind="tisa", t5=dict(max_distance=1))), saved=True)
    assert saved.position.kind == "tisa" and saved.position.label() == "tisa"


def test_attenuated_abs_offset_needs_symmetry():
    base = dict(vocab_size=61, d_model=32, num_layers=2, num_heads=4, mlp_dim=48, max_length=16)
    with pytest.raises(ValueError, match=r"abs_offset.*\|j - i\|.*needs s=1 \(got s=0.5\)"):
        model_config(dict(base, position=dict(kind="attenuated", attenuated=dict(form="abs_offset", s=0.5))))


# One value out of range per case: each must be refused by name when the config is read, not fail (or train
# something meaningless) later.
MODEL_RANGES = [
    (dict(num_heads=0), "num_heads=0 must be an integer >= 1"),
    (dict(d_model=-32), "d_model=-32 must be an integer >= 1"),
    (dict(num_layers=0), "num_layers=0 must be an integer >= 1"),
    (dict(num_decoder_layers=-1), "num_decoder_layers=-1 must be an integer >= 0"),
    (dict(vocab_size=0), "vocab_size=0 must be an integer >= 1"),
    (dict(mlp_dim=0), "mlp_dim=0 must be an integer >= 1"),
    (dict(max_length=0), "max_length=0 must be an integer >= 1"),
    (dict(type_vocab_size=0), "type_vocab_size=0 must be an integer >= 1"),
    (dict(embedding_dim=0), r"embedding_dim=0 must be an integer >= 1 \(or None\)"),
    (dict(layer_norm_eps=-1e-6), "layer_norm_eps=-1e-06 must be a number > 0"),
    (dict(init_std=0.0), "init_std=0.0 must be a number > 0"),
    (dict(dtype="float31"), "dtype='float31'; choose one of float32, bfloat16, float16"),
    (dict(param_dtype="int8"), "param_dtype='int8'; choose one of"),
    (dict(position=dict(kind="rope"), d_model=36), "RoPE .* even head dimension, got d_model / num_heads = 36 / 4"),
    (dict(position=dict(kind="rope", rope=dict(base=0.0))), "position.rope.base=0.0 must be a number > 0"),
    (dict(position=dict(kind="rope", rope=dict(scaling="ntk_aware"))),
     "^position.rope.scaling='ntk_aware'; choose one of none, linear, ntk, dynamic, yarn, llama3$"),
    (dict(position=dict(kind="rope", rope=dict(factor=0.5))), r"position.rope.factor=0.5 must be a number >= 1$"),
    (dict(position=dict(kind="rope", rope=dict(fraction=0.0))), r"position.rope.fraction=0.0 must be in \(0, 1\]$"),
    (dict(position=dict(kind="rope", rope=dict(fraction=1.5))), r"position.rope.fraction=1.5 must be in \(0, 1\]$"),
    (dict(position=dict(kind="rope", rope=dict(fraction=0.2))),  # head dimension 8: 0.2 · 4 pairs rounds to none
     r"position.rope.fraction=0.2 rotates no channel pair of a head of 8 dimensions: it needs at least 2 / 8 = "
     r"0.25$"),
    (dict(position=dict(kind="rope", rope=dict(scaling="llama3", low_freq_factor=4.0, high_freq_factor=4.0))),
     r"position.rope.low_freq_factor=4.0 must be less than high_freq_factor=4.0 \(llama3's bands"),
    (dict(position=dict(kind="rope", rope=dict(scaling="yarn", beta_fast=1.0))),
     r"position.rope.beta_fast=1.0 must be greater than beta_slow=1.0"),
    (dict(position=dict(kind="rope", rope=dict(original_max_length=0))),
     r"position.rope.original_max_length=0 must be an integer >= 1 \(or None\)"),
    (dict(position=dict(kind="tisa", tisa=dict(num_kernels=0))), "position.tisa.num_kernels=0 must be"),
    (dict(position=dict(kind="diet_abs", diet_abs=dict(rank=0))), "position.diet_abs.rank=0 must be"),
    (dict(position=dict(kind="diet_abs", diet_abs=dict(linformer_k=0))), "position.diet_abs.linformer_k=0 must"),
    (dict(position=dict(kind="diet_rel", diet_rel=dict(max_distance=-3))), "position.diet_rel.max_distance=-3"),
    (dict(position=dict(kind="shaw", shaw=dict(clip=0))), "position.shaw.clip=0 must be an integer >= 1"),
    (dict(position=dict(kind="deberta", deberta=dict(position_buckets=-1))),
     r"position.deberta.position_buckets=-1 must be 0 \(no buckets\) or an integer >= 2"),
    (dict(position=dict(kind="deberta", deberta=dict(max_relative_positions=0))),
     "position.deberta.max_relative_positions=0 must be an integer >= 1"),
    (dict(position=dict(kind="deberta", deberta=dict(position_buckets=256, max_relative_positions=129))),
     "position.deberta.max_relative_positions=129 must be greater than position_buckets/2 \\+ 1 = 129"),
    (dict(position=dict(kind="absolute", num_segments=0)), "position.num_segments=0 must be an integer >= 1"),
    (dict(position=dict(kind="attenuated", attenuated=dict(w=-0.05))), "position.attenuated.w=-0.05 must be"),
    (dict(position=dict(kind="attenuated", attenuated=dict(s=-1.0))),
     "position.attenuated.s=-1.0 must be a number >= 0"),
]


@pytest.mark.parametrize("overrides, message", MODEL_RANGES,
                         ids=[m.split("=")[0].split(" ")[0] for _, m in MODEL_RANGES])
def test_model_values_out_of_range_are_refused(overrides, message):
    base = dict(vocab_size=61, d_model=32, num_layers=2, num_heads=4, mlp_dim=48, max_length=16)
    model_config(base)
    with pytest.raises(ValueError, match=message):
        model_config(dict(base, **overrides))


def test_train_values_out_of_range_are_refused():
    from jaxpos.config.defaults import finetune_config, translation_config
    from jaxpos.training.validate import check_train_block

    for path in RUN_CONFIGS:  # the shipped configs pass (fine-tuning's 0 = default fields resolved as it does)
        train = load_config(path).train
        if load_config(path).task == "finetune":
            train.update(eval_every=10, checkpoint_every=10)
        check_train_block(train)
    check_train_block(translation_config().train)
    train = finetune_config().train
    for name, value, message in [
            ("batch_size", 0, "an integer >= 1"), ("grad_accum_steps", 0, "an integer >= 1"),
            ("log_every", 0, "an integer >= 1"), ("eval_every", -1, "an integer >= 1"),
            ("keep_checkpoints", 0, "an integer >= 1"), ("num_steps", -1, "an integer >= 0"),
            ("eval_batch_size", -1, "an integer >= 0"),
            ("warmup_steps", -5, "an integer >= 0"), ("learning_rate", 0.0, "a number > 0"),
            ("warmup_fraction", 1.5, r"in \[0, 1\]"), ("b2", 1.0, r"in \[0, 1\)"), ("eps", 0.0, "a number > 0"),
            ("weight_decay", -0.01, "a number >= 0"), ("clip_norm", -1.0, "a number >= 0"),
            ("label_smoothing", 1.0, r"in \[0, 1\)")]:
        bad = train.copy_and_resolve_references()
        bad.update(eval_every=10, checkpoint_every=10)  # fine-tuning's 0 = default, resolved before training
        check_train_block(bad)
        with bad.unlocked():
            bad[name] = value
        with pytest.raises(ValueError, match=f"train.{name}={value!r} must be {message}"):
            check_train_block(bad)


TINY_ENCODER = dict(vocab_size=61, d_model=32, num_layers=2, num_heads=4, mlp_dim=48, max_length=16)


@pytest.mark.parametrize("path", RUN_CONFIGS, ids=lambda p: os.path.relpath(p, ROOT))
def test_shipped_configs_pass_the_run_check(path):
    from jaxpos.training.validate import check_run_config

    config = load_config(path)
    model = model_config(dict(TINY_ENCODER, **config.model.to_dict())) if config.task == "finetune" else None
    check_run_config(config, task=config.task, model=model)


@pytest.mark.parametrize("task, overrides, message", [
    ("mlm", ["--config.model.max_length=16", "--config.data.seq_len=32"],
     "model.max_length=16 is shorter than data.seq_len=32"),
    ("mlm", ["--config.mesh.fsdp=0"], r"config.mesh sizes must be positive \(data may be -1\)"),
    ("translation", ["--config.model.num_decoder_layers=0"], "needs model.num_decoder_layers >= 1"),
    ("translation", ["--config.data.max_length=1"], "data.max_length=1 must be an integer >= 2"),
    ("translation", ["--config.decode.alpha=-1.0"], "decode.alpha=-1.0 must be a number >= 0"),
    ("finetune", ["--config.train.num_epochs=0.0"], "train.num_epochs=0.0 must be a number > 0"),
    ("finetune", ["--config.model.attention_impl=jax"], "attention dropout needs attention_impl="),
])
def test_the_run_check_refuses_each_block(task, overrides, message):
    from jaxpos.config.defaults import finetune_config, mlm_config, translation_config
    from jaxpos.training.validate import check_run_config

    config = apply_overrides(dict(mlm=mlm_config, translation=translation_config, finetune=finetune_config)[task](),
                             overrides)
    model = model_config(dict(TINY_ENCODER, **config.model.to_dict())) if task == "finetune" else None
    with pytest.raises(ValueError, match=message):
        check_run_config(config, task=task, model=model)


def test_linformer_runs_only_on_rows_of_one_sequence():
    """Linformer mixes the sequences of a packed row, which the model cannot see under jit: the run refuses it."""
    from jaxpos.config.defaults import mlm_config, translation_config
    from jaxpos.training.validate import check_run_config

    linformer = ["--config.model.position.kind=diet_abs", "--config.model.position.diet_abs.linformer_k=4"]
    with pytest.raises(ValueError, match="Linformer .*packed rows"):
        check_run_config(apply_overrides(mlm_config(), linformer), task="mlm")  # masked-LM rows always pack
    with pytest.raises(ValueError, match="Linformer .*packed rows"):
        check_run_config(apply_overrides(translation_config(), linformer), task="translation")
    unpacked = apply_overrides(translation_config(), linformer + ["--config.data.pack=false"])
    with pytest.raises(ValueError, match="cannot be causal"):  # then the decoder, causal, refuses it
        check_run_config(unpacked, task="translation")
