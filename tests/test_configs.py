"""Every shipped config parses, converts to a typed ModelConfig and builds a model; overrides work."""

import glob
import os

import jax
import pytest

from jaxpos.config import model_config
from jaxpos.config.files import apply_overrides, load_config
from jaxpos.models import BertForMaskedLM, EncoderDecoder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "**", "*.py"), recursive=True))


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
    with pytest.raises(ValueError, match="unknown config field 'config.train.num_step'"):
        apply_overrides(config, ["--config.train.num_step=3"])
    with pytest.raises(ValueError, match="unknown position mechanism 'rotary'"):
        model_config(apply_overrides(config, ["--config.model.position.kind=rotary"]).model)


@pytest.mark.parametrize("max_distance", [8, 6])  # NaN everywhere | buckets of the other direction (the issue)
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
    model_config(dict(base, position=dict(kind="tisa", t5=dict(max_distance=1))))  # unused by tisa: not checked


def test_attenuated_abs_offset_needs_symmetry():
    base = dict(vocab_size=61, d_model=32, num_layers=2, num_heads=4, mlp_dim=48, max_length=16)
    with pytest.raises(ValueError, match=r"abs_offset.*\|j - i\|.*needs s=1 \(got s=0.5\)"):
        model_config(dict(base, position=dict(kind="attenuated", attenuated=dict(form="abs_offset", s=0.5))))
