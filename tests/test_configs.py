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
