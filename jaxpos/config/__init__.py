"""Configuration, one concern a file.

- `model.py`: the typed, frozen model config (`ModelConfig`) that the model code sees, converted from ConfigDicts;
- `mechanisms.py`: the registry of positional mechanisms (`MECHANISMS`), the kinds `model.position.kind` accepts;
- `defaults.py`: the base ConfigDicts (`config.model`, `.train`, `.mesh`, `.decode`) that files in configs/ extend;
- `data.py`, `decode.py`: the data blocks of each task, and the typed decode block;
- `validate.py`: the one check of a whole run config (`check_run_config`), made before a run reads data;
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
