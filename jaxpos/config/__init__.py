"""Configuration, one concern a file.

- `model.py`: the typed, frozen model config (`ModelConfig`) that the model code sees, converted from ConfigDicts;
- `run.py`: the typed run config (`RunConfig`: model, data, train, mesh, decode blocks), every default in one place;
- `mechanisms.py`: the registry of positional mechanisms (`MECHANISMS`), the kinds `model.position.kind` accepts;
- `attention.py`: the registry of attention implementations (`IMPLEMENTATIONS`), what `model.attention_impl` names;
- `defaults.py`, `data.py`: the base ConfigDicts (the user's format) that files in configs/ extend;
- `decode.py`: the typed decode block of translation;
- `validate.py`: the one check of a whole run config (`check_run_config`), made once when a command starts;
- `rng.py`: the named random streams that keep data order, masking, sampling and dropout apart;
- `files.py`: loading `configs/*.py` and saved `config.json` files, and `--config.a.b=value` overrides.
"""

from jaxpos.config.mechanisms import MECHANISMS, Mechanism
from jaxpos.config.model import (
    SEGMENT_MODES,
    SHARING_MODES,
    ModelConfig,
    PositionConfig,
    model_config,
    position_config,
    position_defaults,
)

__all__ = ["MECHANISMS", "SEGMENT_MODES", "SHARING_MODES", "Mechanism", "ModelConfig", "PositionConfig",
           "model_config", "position_config", "position_defaults"]
