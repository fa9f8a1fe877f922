"""The modern encoder recipes: the tiny one trains through `jaxpos train` (its layers scanned in groups, resumed
unscanned), and `--config.model.position.kind` swaps the modern block's positional mechanism like any other."""

import os

import numpy as np
import pytest

from tests.helpers import ROOT, SMALL_MLM, one_device_training

MODERN_TINY = os.path.join(ROOT, "configs", "mlm", "modern_tiny.py")
# SMALL_MLM's sizes with three layers, a window shorter than the rows and a global layer every other one
SMALL_MODERN = [*SMALL_MLM, "--config.model.num_layers=3", "--config.model.local_window=8",
                "--config.model.global_every=2", "--config.train.max_predictions=12", "--config.train.log_every=1"]


def test_the_tiny_modern_recipe_trains_scanned_and_resumes_unscanned(tmp_path):
    from jaxpos import cli
    from jaxpos.run import Run

    workdir = str(tmp_path / "modern")
    flags = [*SMALL_MODERN, "--config.train.checkpoint_every=2", "--config.train.eval_every=2"]
    with one_device_training():
        assert cli.main(["train", "--config", MODERN_TINY, "--workdir", workdir, *flags,
                         "--config.train.num_steps=2", "--config.model.scan_layers=True",
                         "--config.model.remat=save_projections"]) == 0
        assert cli.main(["train", "--config", MODERN_TINY, "--workdir", workdir, *flags,
                         "--config.train.num_steps=3"]) == 0
    run = Run.open(workdir)
    model = run.model_config
    assert (model.mlp, model.local_window, model.first_layer_attention_norm) == ("geglu", 8, False)
    step, params = run.params()
    assert step == 3 and {"layer_0", "layer_1", "layer_2", "final_norm"} <= set(params["bert"]["encoder"])


@pytest.mark.parametrize("kind", ["alibi", "t5", "tisa", "none", "rope"])
def test_the_modern_block_takes_any_positional_mechanism(kind, tmp_path):
    from jaxpos.config.files import apply_overrides, load_config
    from jaxpos.workflows.mlm import train_mlm

    config = load_config(MODERN_TINY)
    apply_overrides(config, [*SMALL_MODERN, f"--config.model.position.kind={kind}", "--config.train.num_steps=1",
                             "--config.train.eval_every=1", "--config.train.checkpoint_every=1"])
    with one_device_training():
        result = train_mlm(config, str(tmp_path / kind))
    assert np.isfinite(result.final_metrics["loss"]) and np.isfinite(result.eval_metrics["loss"])
    model = result.state.params["bert"]["encoder"]
    assert "final_norm" in model and "self_attention_norm" not in model["layer_0"]
    assert ("position" in model) == (kind in ("t5", "tisa"))  # the learned mechanisms' parameters
