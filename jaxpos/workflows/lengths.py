"""`jaxpos evaluate --lengths`: masked-LM runs and Hugging Face masked-LM folders scored at several lengths
(jaxpos.evaluation.lengths), each one's numbers in WORKDIR/lengths.json (a folder's: FOLDER/lengths.json) and every
loss against length in one figure. A model may be scored under other values of its mechanism's options that change
no parameter (RoPE's length rules: `evaluation_run`); its numbers and figure then go to files named by the rule."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from typing import Sequence

import ml_collections
from etils import epath

from jaxpos.config import ModelConfig
from jaxpos.config.checks import typed
from jaxpos.config.files import apply_overrides, write_run_file
from jaxpos.config.position import PositionConfig, config_dict
from jaxpos.evaluation.lengths import ScoredModel, check_lengths, evaluate_lengths, folder_model, score_lengths
from jaxpos.run import Run

LENGTHS_FILE = "lengths.json"


def evaluation_run(run: Run, overrides: Sequence[str]) -> Run:
    """RUN with options of its mechanism that change no parameter set by `overrides`
    (`--config.model.position.<kind>.FIELD=value`, FIELD one of the options' `evaluation_fields`: RoPE's length
    rules). Raises ValueError for any other field, or for a mechanism without such options."""
    if not overrides:
        return run
    position = evaluated_position(run.config.model.position, overrides, f"{run.workdir} is a")
    return dataclasses.replace(run, config=run.config.replace_model(position=position))


def evaluated_position(position: PositionConfig, overrides: Sequence[str], whose: str = "this is a") -> PositionConfig:
    """`position` (a trained model's block) with `overrides` of its kind's `evaluation_fields`; anything else is a
    one-line ValueError (a trained run is scored as it trained). `whose` begins the message of a kind without such
    fields ("RUN is a")."""
    kind, fields = position.kind, type(position.options).evaluation_fields
    allowed = tuple(f"config.model.position.{kind}.{field}" for field in fields)
    bad = [o for o in overrides if o.lstrip("-").partition("=")[0] not in allowed]
    if bad and not fields:
        raise ValueError(f"{whose} {kind!r} run, whose options all change its parameters: a trained run is scored "
                         f"as it trained (got {' '.join(bad)})")
    if bad:
        raise ValueError(f"a trained run is scored as it trained, except for the options of its mechanism that change "
                         f"no parameter: --config.model.position.{kind}.{{{','.join(fields)}}}=VALUE only, got "
                         f"{' '.join(bad)}")
    # Typed from the run's own values (a config.json older than these fields lacks them); a float field written
    # as an integer still takes a fraction.
    values = config_dict(position.options)
    values.update({f.name: float(values[f.name]) for f in dataclasses.fields(position.options)
                   if f.type == "float" and values[f.name] is not None})
    block = ml_collections.ConfigDict({"model": {"position": {"kind": kind, "segment": position.segment,
                                                              kind: values}}})
    changed = apply_overrides(block, list(overrides)).model.position[kind].to_dict()
    return dataclasses.replace(position, options=typed(type(position.options), changed, f"model.position.{kind}"))


def positions_text(cfg: ModelConfig) -> str:
    """The mechanism, and its evaluation rule where it has one: "tisa", "rope", "rope, yarn ×4, L₀ 512"."""
    rule = cfg.position.options.evaluation_rule(cfg)
    return cfg.position.kind if not rule else f"{cfg.position.kind}, {rule}"


def lengths_file(cfg: ModelConfig, overrides: Sequence[str], suffix: str = ".json") -> str:
    """lengths.json for a run as it trained; under a rule given at evaluation, named by it
    (lengths_<rule tag>.json; RoPE's: lengths_yarn_x4.json). `suffix`: ".png" names its figure the same way."""
    return f"lengths_{cfg.position.options.evaluation_tag()}{suffix}" if overrides else f"lengths{suffix}"


def length_generalisation(workdirs: Sequence[str], lengths: Sequence[int], figure: str | None = None,
                          batch_size: int = 8, max_tokens: int = 0, overrides: Sequence[str] = (),
                          folders: Sequence[str] = (), train_length: int | None = None) -> dict[str, dict]:
    """{name: score_lengths's dict} of each masked-LM run in WORKDIRS and each local Hugging Face masked-LM folder
    in FOLDERS (its numbers written beside its checkpoints or weights, `lengths_file`), and the figure of every
    model's loss against length at `figure` (default: the first one's folder/lengths.png). `overrides`: RoPE's
    length rule for every model (`evaluated_position`); each result names the positions it was scored with
    ("positions"; RoPE models' whole block under "rope"). `train_length`: the folders' (`folder_model`)."""
    from jaxpos.analysis.plots import plot_lengths  # lazy: matplotlib, for the figure only

    check_lengths(lengths)
    if train_length is not None and (train_length < 3 or not folders):
        raise ValueError(f"--train-length {train_length}: give a length of at least 3 tokens, with --hf")
    # every run and folder refused before any work; a run's weights are read when it is scored
    subjects = [(w, evaluation_run(Run.open(w, "mlm"), overrides)) for w in workdirs]
    subjects += [(f, evaluated_folder(f, overrides, train_length)) for f in folders]
    if not subjects:
        raise ValueError("--lengths needs a --workdir of a masked-LM run or an --hf folder")
    results, configs = {}, []
    for path, subject in subjects:
        if isinstance(subject, Run):
            cfg, name, location = subject.model_config, subject.name, subject.location
            result = evaluate_lengths(subject, lengths, batch_size, max_tokens)
        else:
            cfg, name, location = subject.cfg, os.path.basename(os.path.normpath(path)), path
            result = score_lengths(subject, lengths, batch_size, max_tokens)
        configs.append(cfg)
        result["positions"] = positions_text(cfg)
        result[cfg.position.kind] = cfg.position.options.evaluation_record(cfg)
        file = lengths_file(cfg, overrides)
        write_run_file(path, file, json.dumps(result, indent=1))
        results[name if name not in results else location] = dict(result, workdir=path, mechanism=cfg.position.kind,
                                                                  file=file)
    # named by the rule where one was given at evaluation, so that the run's own figure is kept
    target = epath.Path(figure or epath.Path(subjects[0][0]) / lengths_file(configs[0], overrides, ".png"))
    with tempfile.TemporaryDirectory() as scratch:  # matplotlib writes local files; epath copies them anywhere
        local = plot_lengths(results, os.path.join(scratch, "lengths.png"))
        target.write_bytes(epath.Path(local).read_bytes())
    for result in results.values():
        result["figure"] = os.fspath(target)
    return results


def evaluated_folder(folder: str, overrides: Sequence[str], train_length: int | None = None) -> ScoredModel:
    """A Hugging Face masked-LM folder ready to score (`folder_model`), with RoPE's length rule `overrides` where
    given (`evaluated_position`)."""
    model = folder_model(folder, train_length)
    if not overrides:
        return model
    position = evaluated_position(model.cfg.position, overrides, f"{folder} is a")
    return dataclasses.replace(model, cfg=dataclasses.replace(model.cfg, position=position))


def lengths_table(results: dict[str, dict]) -> str:
    """A markdown table: a row per run with the positions it was scored with (RoPE's length rule), a column per
    length, `loss / accuracy` or the reason it did not run."""
    lengths = sorted({e["length"] for r in results.values() for e in r["lengths"]})
    lines = ["| run | positions | trained at | " + " | ".join(f"{n} tokens" for n in lengths) + " |",
             "|---|---|---|" + "---|" * len(lengths)]
    notes = []
    for name, result in results.items():
        by_length = {e["length"]: e for e in result["lengths"]}
        cells = []
        for n in lengths:
            entry = by_length.get(n)
            if entry is None:
                cells.append("")
            elif "skipped" in entry:
                cells.append("cannot run")
                if f"{name}: {entry['skipped']}" not in notes:
                    notes.append(f"{name}: {entry['skipped']}")
            else:
                cells.append(f"{entry['loss']:.3f} / {entry['accuracy']:.3f}")
        lines.append(f"| {name} | {result['positions']} | {result['train_length']} | " + " | ".join(cells) + " |")
    lines += ["", "loss / accuracy of the held-out masked tokens; the loss by position within the row: "
              "`by_position` in each run's lengths JSON and the figure's right panel", *notes]
    return "\n".join(lines + passkey_table(results, lengths)) + "\n"


def passkey_table(results: dict[str, dict], lengths: Sequence[int]) -> list[str]:
    """Lines of a markdown table of the passkey probe: a row per run and depth, the share of keys retrieved whole
    at each length (empty where the rows cannot hold one or the run cannot run), with the random-guess floor."""
    probes = [e["passkey"] for r in results.values() for e in r["lengths"] if "depths" in e.get("passkey", {})]
    if not probes:
        return []
    first = next(iter(probes[0]["depths"].values()))
    lines = ["", f"passkey (zero-shot): keys of digits retrieved whole, {first['examples']} a length and depth; a "
             f"uniform guess among the digits retrieves {first['floor']:.2g} (a digit: {first['digit_floor']:.2g})",
             "", "| run | depth | " + " | ".join(f"{n} tokens" for n in lengths) + " |",
             "|---|---|" + "---|" * len(lengths)]
    for name, result in results.items():
        by_length = {e["length"]: e.get("passkey", {}).get("depths", {}) for e in result["lengths"]}
        for depth in probes[0]["depths"]:
            cells = [f"{by_length[n][depth]['accuracy']:.3f}" if depth in by_length.get(n, {}) else ""
                     for n in lengths]
            lines.append(f"| {name} | {depth} | " + " | ".join(cells) + " |")
    return lines
