"""The typed run configuration: the user's ConfigDicts become one RunConfig at a workflow's entry, checked once per
command; below the workflows no code sees a ConfigDict; derived values never reach the user's config; saved
config.json files of older runs still load."""

import ast
import dataclasses
import json
import os

import pytest

from jaxpos import cli
from jaxpos.config.defaults import finetune_config, mlm_config, translation_config
from jaxpos.config.run import (FinetuneDataConfig, MeshConfig, MLMDataConfig, TrainConfig, TranslationDataConfig,
                               run_config)
from tests.helpers import one_device_training

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "jaxpos")
ABOVE_TYPED = ("workflows", "cli", "reproduction", "config")  # the layers that hold the user's ConfigDicts
TINY = os.path.join(ROOT, "configs", "mlm", "tiny.py")


def modules_below_the_workflows():
    for folder, _, files in os.walk(PACKAGE):
        relative = os.path.relpath(folder, PACKAGE)
        if relative.split(os.sep)[0] in ABOVE_TYPED:
            continue
        yield from (os.path.join(folder, name) for name in files if name.endswith(".py"))


def test_no_configdict_below_the_workflows():
    offenders = []
    for path in modules_below_the_workflows():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else
                     [node.attr] if isinstance(node, ast.Attribute) else
                     [node.id] if isinstance(node, ast.Name) else [])
            if any(n.split(".")[0] == "ml_collections" or n == "ConfigDict" for n in names):
                offenders.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}")
    assert len(list(modules_below_the_workflows())) > 50 and not offenders, offenders


def test_each_task_converts_to_its_typed_blocks_and_back():
    for config, data in ((mlm_config(), MLMDataConfig), (translation_config(), TranslationDataConfig)):
        run = run_config(config)
        assert isinstance(run.data, data) and isinstance(run.train, TrainConfig) and isinstance(run.mesh, MeshConfig)
        assert run_config(json.loads(json.dumps(run.to_dict()))) == run  # config.json reads back as written
    assert run.decode.beam_size == 10
    with pytest.raises(ValueError, match=r"unknown config field data.sauce \(did you mean data.source\?\)"):
        run_config(dict(mlm_config().to_dict(), data=dict(sauce="x")))
    with pytest.raises(ValueError, match="unknown config field model.widht"):
        run_config(dict(mlm_config().to_dict(), model=dict(widht=3)))


def test_a_saved_config_of_an_older_run_still_loads():
    """A config.json from before the translation run's test-decoding fields and the typed blocks: the fields it
    lacks take their defaults."""
    old = translation_config().to_dict()
    for field in ("test_bleu", "test_sentences", "num_epochs", "eval_batch_size"):
        del old["train"][field]
    del old["data"]["pack"]
    run = run_config(json.loads(json.dumps(old)))
    assert (run.train.test_bleu, run.train.test_sentences, run.data.pack) == (True, 0, True)


def test_derived_values_are_set_on_a_new_config_never_on_the_users():
    config = finetune_config()
    run = run_config(config, model=run_config(mlm_config()).model)
    resolved = dataclasses.replace(run, train=run.train.resolved_for_epochs(100))
    assert (resolved.train.num_steps, resolved.train.eval_every, resolved.train.checkpoint_every) == (12, 4, 4)
    assert (config.train.num_steps, config.train.eval_every) == (0, 0)  # the user's ConfigDict as given
    assert isinstance(run.data, FinetuneDataConfig) and run.replace_model(vocab_size=7).model.vocab_size == 7
    assert run.model.vocab_size != 7
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.train.num_steps = 3


def test_the_run_check_runs_once_per_command(tmp_path, monkeypatch, capsys):
    from jaxpos.training import validate

    calls = []
    original = validate.check_run_config

    def counted(*args, **kwargs):
        calls.append(kwargs.get("task"))
        return original(*args, **kwargs)

    for module in ("jaxpos.workflows.workdir", "jaxpos.training.validate"):
        monkeypatch.setattr(f"{module}.check_run_config", counted)
    with one_device_training():
        assert cli.main(["train", "--config", TINY, "--workdir", str(tmp_path / "run"), "--config.model.d_model=32",
                         "--config.model.num_layers=1", "--config.model.mlp_dim=48", "--config.data.vocab_size=300",
                         "--config.data.max_documents=20", "--config.train.batch_size=8",
                         "--config.train.num_steps=2", "--config.train.eval_batches=1"]) == 0
    assert calls == ["mlm"]
    assert json.load(open(tmp_path / "run" / "config.json"))["model"]["vocab_size"] == 300  # resolved, then saved
