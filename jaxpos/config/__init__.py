"""Configuration, one concern a file; the layer below every other, which only parses and checks values.

- `model.py`: the typed, frozen model config (`ModelConfig`) that the model code sees, with its plan of layers;
- `position.py`: the position block, a tagged union of the registered mechanisms' options (jaxpos.positions
  registers them);
- `run.py`: the typed run config (`RunConfig`: model, data, train, mesh, decode blocks), every default in one place;
- `defaults.py`, `data.py`: the base ConfigDicts (the user's format) that files in configs/ extend;
- `decode.py`: the typed decode block of translation;
- `rng.py`: the named random streams that keep data order, masking, sampling and dropout apart;
- `files.py`: loading `configs/*.py` and saved `config.json` files, and `--config.a.b=value` overrides.
"""

from jaxpos.config.model import LayerPlan, ModelConfig, model_config
from jaxpos.config.position import SEGMENT_MODES, SHARING_MODES, MechanismOptions, NoOptions, PositionConfig

__all__ = ["LayerPlan", "MechanismOptions", "ModelConfig", "NoOptions", "PositionConfig", "SEGMENT_MODES",
           "SHARING_MODES", "model_config"]
