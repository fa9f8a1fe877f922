"""Configuration, one concern in three files.

- `model.py`: the typed, frozen model config (`ModelConfig`) that the model code sees, converted from ConfigDicts;
- `defaults.py`: the base ConfigDicts (`config.model`, `.train`, `.mesh`, `.decode`) that files in configs/ extend;
- `files.py`: loading `configs/*.py` and saved `config.json` files, and `--config.a.b=value` overrides.
"""

from jaxpos.config.model import (
    POSITION_KINDS,
    SEGMENT_MODES,
    SHARING_MODES,
    ModelConfig,
    PositionConfig,
    model_config,
    position_defaults,
)

__all__ = ["POSITION_KINDS", "SEGMENT_MODES", "SHARING_MODES", "ModelConfig", "PositionConfig", "model_config",
           "position_defaults"]
