"""Loading config files (`path.py` or `path.py:arg`, each with `get_config(arg)`) and command-line overrides
(`--config.model.position.kind=diet_rel`)."""

from __future__ import annotations

import ast
import importlib.util
import json
import os

import ml_collections
from etils import epath

from jaxpos.config.checks import unknown_field
from jaxpos.config.position import catalog, config_dict


def load_config(spec: str) -> ml_collections.ConfigDict:
    """Runs `get_config(arg)` of a config file given as `path.py` or `path.py:arg`."""
    path, _, arg = spec.partition(":")
    if not os.path.exists(path):
        raise FileNotFoundError(f"config file {path!r} does not exist")
    module_spec = importlib.util.spec_from_file_location(f"jaxpos_config_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise ValueError(f"config file {path!r} defines no get_config()")
    return module.get_config(arg) if arg else module.get_config()


def _parse(text: str, current):
    if isinstance(current, bool):
        if text.lower() in ("true", "1", "yes"):
            return True
        if text.lower() in ("false", "0", "no"):
            return False
        raise ValueError(f"expected a boolean, got {text!r}")
    if isinstance(current, int):
        return int(text)
    if isinstance(current, float):
        return float(text)
    if isinstance(current, str):
        return text
    try:  # None or containers: a Python literal, else the plain string
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def apply_overrides(config: ml_collections.ConfigDict, overrides: list[str]) -> ml_collections.ConfigDict:
    """Applies `config.a.b=value` items (the leading `--` optional) in order; unknown fields are errors.

    A position block is a tagged union (jaxpos/config/position.py): an override of its `kind` comes first and
    drops the blocks of every other kind that the config file set (they are that kind's options, which the new
    kind does not read), and `position.<kind>.<field>` of a registered kind makes the block from its defaults
    where it is missing. Options of a kind other than the block's own are refused when the config is typed."""
    items = [_split(item) for item in overrides]
    for item, (parents, leaf, text) in sorted(enumerate(items), key=lambda e: not _is_kind(e[1])):
        node = _node(config, parents, overrides[item], leaf)
        try:
            value = _parse(text, node[leaf])
        except ValueError as error:
            raise ValueError(f"--config.{'.'.join([*parents, leaf])}={text}: {error}") from None
        with node.ignore_type():
            node[leaf] = value
        if _is_kind((parents, leaf, text)) and _is_position_block(node):
            for other in [k for k in node.keys() if k in _kinds() and k != value]:
                del node[other]
    return config


def _split(item: str) -> tuple[list[str], str, str]:
    key, sep, text = item.lstrip("-").partition("=")
    if not sep or not key.startswith("config."):
        raise ValueError(f"override {item!r} is not of the form --config.field=value")
    *parents, leaf = key.split(".")[1:]
    return parents, leaf, text


def _is_kind(split) -> bool:
    parents, leaf, _ = split
    return leaf == "kind" and bool(parents) and parents[-1] == "position"


def _kinds() -> tuple[str, ...]:
    return catalog().kinds()


def _is_position_block(node) -> bool:
    return isinstance(node, ml_collections.ConfigDict) and "kind" in node and "segment" in node


def _node(config: ml_collections.ConfigDict, parents: list[str], item: str, leaf: str) -> ml_collections.ConfigDict:
    """The block that holds `leaf`, following `parents` from `config`; a registered kind's options block is made
    from its defaults where a position block lacks it."""
    node = config
    for depth, name in enumerate([*parents, leaf]):
        block = ".".join(parents[:depth])
        if not isinstance(node, ml_collections.ConfigDict):  # e.g. --config.model.dropout.x=1
            raise ValueError(f"{item}: config field {block} is a value ({node!r}), not a block of fields")
        if depth < len(parents) and _is_position_block(node) and name in _kinds():  # the block, complete
            defaults = config_dict(catalog().options_class(name)())
            with node.ignore_type():
                node[name] = ml_collections.ConfigDict({**defaults, **(node[name].to_dict() if name in node and
                                                                        node[name] is not None else {})})
        if name not in node:
            raise unknown_field(block, name, node.keys())
        if depth < len(parents):
            node = node[name]
    return node


def load_json_config(path: str) -> ml_collections.ConfigDict:
    """The config a run saved as WORKDIR/config.json (a local path or a URL: etils.epath)."""
    try:
        return ml_collections.ConfigDict(json.loads(epath.Path(path).read_text()))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not a valid JSON config: {error}") from error


def write_run_file(workdir: str, name: str, text: str) -> str:
    """Writes WORKDIR/name (a local folder or a URL that etils.epath handles, e.g. gs://); returns its path."""
    path = epath.Path(workdir) / name
    path.write_text(text)
    return str(path)


def write_json_atomically(path: str, value, **dump_options) -> None:
    """Writes `value` as JSON to the local file `path` through a temporary file and a rename: a reader (a resumed
    command, a report step) never sees half a file. `dump_options` go to json.dump (indent, allow_nan)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, **dump_options)
    os.replace(tmp, path)


def write_run_report(workdir: str, report: dict) -> dict:
    """Writes WORKDIR/report.json; a field this invocation left empty (a run resumed at its last step trains and
    evaluates nothing) keeps what the report on disk held. Returns the report written."""
    path = epath.Path(workdir) / "report.json"
    if path.exists():
        kept = json.loads(path.read_text())
        report = {**kept, **{k: v for k, v in report.items() if v not in ({}, None)}}
    write_run_file(workdir, "report.json", json.dumps(report, indent=2))
    return report


def load_run_config(workdir: str, task: str | None = None) -> ml_collections.ConfigDict:
    """WORKDIR/config.json of a `jaxpos train` run (local or a URL), checked to be a run of `task`
    (mlm | translation | finetune; None: any)."""
    folder = epath.Path(workdir)
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"workdir {workdir!r} is a file, not a run's folder")
    if not folder.is_dir():
        raise FileNotFoundError(f"workdir {workdir!r} does not exist")
    path = folder / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: is {workdir!r} the workdir of a `jaxpos train` run?")
    config = load_json_config(os.fspath(path))
    if task is None and "model" not in config:
        raise ValueError(f"{path} has no model block: it is not the config of a jaxpos run")
    if task is not None and (config.get("task", "mlm") != task or "model" not in config):
        raise ValueError(f"{path}: a {config.get('task', 'mlm')!r} run; this command reads {task!r} runs")
    return config
