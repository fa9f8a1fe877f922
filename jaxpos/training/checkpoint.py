"""Orbax checkpoints of the training state, the data iterator position and the model config, saved together.

The latest checkpoint is restored automatically; a corrupt or partial one is reported and the previous one is
used instead, so a crashed run loses at most the steps since its last good checkpoint. Whether a step that does
not restore is corrupt is read off the disk: each finished step records its files and their sizes
(`FILES_MANIFEST`), and a step whose files are no longer all there, at their sizes, is corrupt. Directories are local
paths or URLs that etils.epath and orbax handle (`gs://bucket/run/checkpoints`); every process of a multi-host
run passes the same directory, and a checkpoint restores onto any mesh and process count.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import gc
import inspect
import json
import logging
import os
import sys
import time

import jax
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from jaxpos.config.model import ModelConfig
from jaxpos.config.position import PositionConfig, catalog, config_dict
from jaxpos.progress import status

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """No checkpoint in a workdir could be restored, or one could not be read (nothing was changed)."""


# Reading a step again after an error that a retry can cure (seconds before each new try).
RETRY_DELAYS_S = (1.0, 4.0, 16.0)
# Errors of the storage, not of the files: the same read may succeed later.
TRANSIENT_ERRNOS = frozenset({errno.EIO, errno.EAGAIN, errno.EBUSY, errno.EINTR, errno.ETIMEDOUT, errno.ESTALE,
                              errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED, errno.ENETDOWN,
                              errno.ENETUNREACH, errno.EHOSTUNREACH})
TRANSIENT_WORDS = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "ABORTED:", "Input/output error", "Connection reset",
                   "timed out")
# For steps saved before jaxpos recorded their files: what a missing or partial file, metadata that does not parse,
# or a structure unlike the saved one reads as (tensorstore's status codes, orbax's and the JSON reader's messages).
CORRUPT_WORDS = ("OUT_OF_RANGE", "DATA_LOSS", "NOT_FOUND", "not valid for value of size", "pytree structure error",
                 "was not found in the checkpoint", "Unexpected end", "Truncated")
# Each finished step's files {path relative to the step: size in bytes}, written once the save has finished.
FILES_MANIFEST = "jaxpos_files.json"


def error_chain(err: BaseException) -> list[BaseException]:
    """`err` and the exceptions it was raised from or while handling, outermost first."""
    chain = []
    while err is not None and err not in chain:
        chain.append(err)
        err = err.__cause__ or err.__context__
    return chain


def read_failure(err: BaseException, files: str | None = None) -> str:
    """"transient" (the storage failed to read: retry), "corrupt" (the step's files are missing, partial or do not
    parse: set it aside) or "unknown" (stop and change nothing) for an error raised while restoring a step.
    `files`: what the disk says of the step's files (`step_files`): "missing: ..." makes it corrupt whatever the
    error reads; "whole" leaves transient or unknown; None (a step saved without its list of files) falls back to
    the error's words."""
    if files is not None and files != "whole":
        return "corrupt"
    chain = error_chain(err)
    for e in chain:
        if (isinstance(e, (TimeoutError, ConnectionError)) or
                isinstance(e, OSError) and e.errno in TRANSIENT_ERRNOS or any(w in str(e) for w in TRANSIENT_WORDS)):
            return "transient"
    if files == "whole":  # every file is there at its size: the storage, or something jaxpos cannot tell
        return "unknown"
    for e in chain:
        if isinstance(e, (FileNotFoundError, json.JSONDecodeError)) or any(w in str(e) for w in CORRUPT_WORDS):
            return "corrupt"
    return "unknown"


def listed_files(step_dir: epath.Path) -> dict[str, int]:
    """{path relative to `step_dir`: size} of every file under a step's folder but the manifest itself."""
    out = {}
    for folder, _, names in step_dir.walk():  # a listing a folder (rglob would list a bucket's every object)
        for name in names:
            path = epath.Path(folder) / name
            if path != step_dir / FILES_MANIFEST:
                out[os.fspath(path.relative_to(step_dir))] = path.stat().length
    return out


def step_files(step_dir: epath.Path) -> str | None:
    """What the disk says of a step's files against its manifest: "whole", a line naming the first file missing or
    of another size than when saved, or None where the step has no manifest (saved by an older jaxpos)."""
    manifest = step_dir / FILES_MANIFEST
    try:
        saved = json.loads(manifest.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return f"its list of files {manifest.name} does not read"
    for name, size in sorted(saved.items()):
        path = step_dir / name
        if not path.exists():
            return f"{name} is missing"
        if path.stat().length != size:
            return f"{name} is {path.stat().length} bytes, {size} when saved"
    return "whole"


def error_line(err: BaseException) -> str:
    """"Type: message" of the first error in the chain with a readable one-line message (orbax wraps tensorstore's
    errors in a message that embeds a repr)."""
    chain = error_chain(err)
    for e in chain:
        text = (str(e).splitlines() or [""])[0].strip("'\" ")
        if text and "<bound method" not in text and "pybind11" not in text:
            return f"{type(e).__name__}: {text[:200]}"
    return type(chain[-1]).__name__


# Model-config fields that change how the model is computed or regularised, not its parameters: a run may resume
# with other values.
# scan_layers: the Trainer converts a checkpoint of the other layout as it restores it.
RESUMABLE_MODEL_FIELDS = frozenset({"attention_impl", "dtype", "dropout", "attention_dropout", "remat",
                                    "scan_layers"})


@functools.cache
def _model_defaults(kind: str) -> dict:
    """Flattened ModelConfig defaults with position.kind `kind` (its options block's defaults), for checkpoints
    saved before a field existed (built on the first resume)."""
    return _flatten(json.loads(json.dumps(config_dict(ModelConfig(position=PositionConfig(kind=kind))))))


def _own_position_block(flat: dict) -> dict:
    """A flattened model config without the options blocks of kinds other than its own (older jaxpos saved every
    kind's block): a resume compares the options of the run's own mechanism only."""
    kind = flat.get("position.kind", "absolute")
    others = tuple(f"position.{k}." for k in catalog().kinds() if k != kind)
    return {key: value for key, value in flat.items() if not key.startswith(others)}


def _orbax_noise(unraisable) -> bool:
    """Whether an unraisable error is the echo of a failed orbax read: its coroutines collected unawaited, or
    tensorstore answering the read after orbax closed its event loop ("Event loop is closed", dozens of tracebacks
    for one unreadable step, some of them after the command has said what went wrong)."""
    error = unraisable.exc_value
    return inspect.iscoroutine(unraisable.object) or "coroutine" in repr(unraisable.object) or (
        isinstance(error, RuntimeError) and str(error) == "Event loop is closed")


@contextlib.contextmanager
def quiet_orbax():
    """A block whose failed checkpoint reads stay silent, then and for the rest of the process (`_orbax_noise`, and
    asyncio's log of the futures they leave); other unraisable errors are reported as usual."""
    if not getattr(sys.unraisablehook, "drops_orbax_noise", False):
        previous = sys.unraisablehook

        def hook(unraisable):
            if not _orbax_noise(unraisable):
                previous(unraisable)

        hook.drops_orbax_noise = True
        sys.unraisablehook = hook
        # the reads orbax left running end in futures nobody awaits: asyncio logs each with its traceback
        logging.getLogger("asyncio").addFilter(
            lambda record: " exception was never retrieved" not in str(record.msg))
    try:
        yield
    finally:
        gc.collect()  # a failed read's coroutines go now


def checkpoint_path(directory) -> epath.Path:
    """A local directory made absolute (as before); a URL (`gs://...`, `s3://...`) kept as it is."""
    text = os.fspath(directory)
    return epath.Path(text if "://" in text else os.path.abspath(text))


class Checkpointer:
    def __init__(self, directory: str, *, keep: int = 3, async_save: bool = True, read_only: bool = False,
                 set_aside: bool | None = None):
        """`read_only`: reads and restores only, leaving the directory exactly as it found it (analysis, evaluation,
        export; a training run until every check passed: `writable` then makes the folder and clears unfinished
        saves). `set_aside`: a step known to be corrupt is moved to checkpoints_corrupt/ (default: not read_only;
        a training run sets it while still read-only); otherwise it is skipped, said in one line, and left."""
        self.directory = checkpoint_path(directory)
        self.keep, self.async_save, self.read_only = keep, async_save, read_only
        self.set_aside = not read_only if set_aside is None else set_aside
        self.unrecorded: set[int] = set()  # steps this checkpointer saved whose files are not recorded yet
        self.manager = self._manager(read_only)

    def _manager(self, read_only: bool) -> ocp.CheckpointManager:
        absl = logging.getLogger("absl")
        level = absl.level
        absl.setLevel(logging.ERROR)  # orbax warns that a read-only manager will not save: that is the point
        try:
            options = ocp.CheckpointManagerOptions(
                max_to_keep=self.keep, enable_async_checkpointing=self.async_save, create=not read_only,
                cleanup_tmp_directories=not read_only, read_only=read_only)
            return ocp.CheckpointManager(self.directory, options=options, item_names=("state", "data", "model"))
        finally:
            absl.setLevel(level)

    def writable(self) -> None:
        """From now on saves (the directory made, the temporary folders of unfinished saves cleared)."""
        if self.read_only:
            self.manager.close()
            self.manager, self.read_only = self._manager(read_only=False), False

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(self, step: int, state, data_state: dict, model_config: dict | None = None) -> None:
        """Saves the state, the data position and (if given) the model config (a JSON-ready dict) as `step`; the
        steps saved before it get their list of files (`record_files`), as orbax finishes them first anyway."""
        self.wait()
        items = dict(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state))
        if model_config is not None:
            items["model"] = ocp.args.JsonSave(model_config)
        self.manager.save(step, args=ocp.args.Composite(**items), force=True)
        self.unrecorded.add(step)

    def saved_model_config(self) -> tuple[int, dict] | None:
        """(step, model config) of the newest checkpoint that saved one (older jaxpos did not), or None."""
        for step in reversed(self.steps()):
            if not (self.directory / str(step) / "model").exists():
                continue
            try:
                restored = self.manager.restore(step, args=ocp.args.Composite(model=ocp.args.JsonRestore()))
            except Exception:  # noqa: BLE001 - unreadable: restore_latest reports and skips this step
                continue
            return step, restored["model"]
        return None

    def check_model_config(self, model_config: dict, pending: tuple[str, ...] = ()) -> None:
        """Raises ValueError, naming the fields and both values, when the newest checkpoint's model config differs
        from `model_config` (fields in RESUMABLE_MODEL_FIELDS may differ; `pending`: fields not known yet, such as
        a vocabulary size that the data decides, are left for a later check). Reads JSON only: nothing compiles."""
        saved = self.saved_model_config()
        if saved is None:
            return
        step, old = saved
        old = _own_position_block(_flatten(json.loads(json.dumps(old))))
        new = _own_position_block(_flatten(json.loads(json.dumps(model_config))))
        # a field the checkpoint's config lacks came to jaxpos after it was saved: its default, as in config.json
        defaults = _model_defaults(old.get("position.kind", "absolute"))
        old = {**{k: v for k, v in defaults.items() if k in new and k not in old}, **old}
        if old.get("position.kind") != new.get("position.kind"):  # another mechanism: its kind says it all
            old, new = ({k: v for k, v in flat.items() if not k.startswith(f"position.{flat.get('position.kind')}.")}
                        for flat in (old, new))
        skipped = RESUMABLE_MODEL_FIELDS | set(pending)
        differ = [k for k in sorted(set(old) | set(new))
                  if k.split(".")[0] not in skipped and old.get(k, "<absent>") != new.get(k, "<absent>")]
        if differ:
            fields = "; ".join(f"model.{k}: {old.get(k, '<absent>')!r} in the checkpoint, "
                               f"{new.get(k, '<absent>')!r} in this run" for k in differ)
            raise ValueError(f"checkpoint step {step} in {self.directory} was saved for another model ({fields}); "
                             "resume with the checkpoint's model config or use a new workdir")

    def wait(self) -> None:
        """Waits for the saves in progress, then records the files of every finished step (`record_files`)."""
        self.manager.wait_until_finished()
        self.record_files()

    def record_files(self) -> None:
        """Writes FILES_MANIFEST into each finished step this checkpointer saved (process 0; steps found on disk are
        never listed afterwards, when their files may already be damaged): what `step_files` compares the disk
        with when a step does not restore."""
        finished = self.unrecorded & set(self.steps())
        self.unrecorded -= finished
        if self.read_only or jax.process_index() != 0:
            return
        for step in sorted(finished):
            step_dir = self.directory / str(step)
            (step_dir / FILES_MANIFEST).write_text(json.dumps(listed_files(step_dir), indent=0, sort_keys=True))

    def restore_latest(self, abstract_state):
        """(step, state, data_state) of the newest checkpoint that restores, or None if there is none. A step
        known to be corrupt is moved aside (`restore_good`) and the one before tried; one that cannot be read
        stops the run with a CheckpointError, changing nothing.

        `abstract_state` holds jax.ShapeDtypeStruct leaves with the target shardings (any mesh shape).
        """
        failures = []
        for step in reversed(self.steps()):
            restored = self.restore_good(step, abstract_state)
            if restored is not None:
                return (step, *restored)
            failures.append(step)
        if failures:
            raise CheckpointError(f"no checkpoint in {self.directory} could be restored (tried steps {failures}); "
                                  "move the directory away to start afresh")
        return None

    def restore_good(self, step: int, abstract_state):
        """(state, data_state) of `step`, read again after a transient error (RETRY_DELAYS_S); None when the step
        is known to be corrupt (`read_failure` with what the disk says of its files), which is then moved aside
        (or, without `set_aside`, skipped and left in place) with one line. Raises CheckpointError when the step
        cannot be read for another reason (nothing moved), and ValueError when it holds another model's state
        (`check_state`: left in place)."""
        for delay in (*RETRY_DELAYS_S, None):
            try:
                with quiet_orbax():
                    return self.restore(step, abstract_state)
            except Exception as err:  # noqa: BLE001 - classified below: retried, set aside or reported
                files = step_files(self.directory / str(step))
                kind = read_failure(err, files)
                if kind == "transient" and delay is not None:
                    log.info("reading checkpoint step %d failed (%s); trying again in %g s", step, error_line(err),
                             delay)
                    time.sleep(delay)
                    continue
                if kind != "corrupt":
                    tries = f" after {len(RETRY_DELAYS_S) + 1} tries" if kind == "transient" else ""
                    raise CheckpointError(f"could not read checkpoint step {step} in {self.directory}{tries} "
                                          f"({error_line(err)}); nothing was moved or deleted: run the same command "
                                          "again once the storage reads") from err
                self.check_state(abstract_state, step)  # whole, but not this run's: refused, and left in place
                why = files if files not in (None, "whole") else error_line(err)
                older = [s for s in self.steps() if s < step]
                then = f"trying step {older[-1]}" if older else "no older step is left"
                if self.set_aside:
                    aside = self._move_aside(step)
                    status(f"WARNING: checkpoint step {step} in {self.directory} is corrupt or partial ({why}); "
                           f"moved it to {aside}; {then}")
                else:
                    status(f"WARNING: checkpoint step {step} in {self.directory} is corrupt or partial ({why}); "
                           f"skipped it and left it in place; {then}")
                return None

    def restore(self, step: int, abstract_state):
        """(state, data_state) of checkpoint `step`; `abstract_state` as `restore_latest` takes it."""
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
        return restored["state"], restored["data"]

    def check_state(self, abstract_state, step: int | None = None, other_layout=None) -> bool:
        """Raises ValueError, naming the first difference, when checkpoint `step` (default: the newest) holds a
        state of other paths or shapes than `abstract_state` and than `other_layout` (the same state in the other
        layer layout, jaxpos.models.layout). Returns whether it holds `other_layout`. Reads the metadata only; a
        step whose metadata does not read passes (restoring it then fails, and it is moved aside as corrupt)."""
        steps = self.steps()
        step = steps[-1] if step is None and steps else step
        other_model = None if step is None else self.state_mismatch(step, abstract_state)
        if other_model and other_layout is not None and self.state_mismatch(step, other_layout) is None:
            return True
        if other_model:
            raise ValueError(f"checkpoint step {step} in {self.directory} was saved for another model "
                             f"({other_model}); resume with the checkpoint's config or use a new workdir")
        return False

    def state_mismatch(self, step: int, abstract_state, only: str = "") -> str | None:
        """The first difference between the state saved as `step` (its metadata: paths and shapes) and
        `abstract_state`, in words; None when they agree or the metadata does not read (a corrupt step). `only`:
        compare the paths that start with it."""
        try:
            saved = _shapes(ocp.PyTreeCheckpointHandler().metadata(self.directory / str(step) / "state"))
        except Exception:  # noqa: BLE001 - no readable metadata: the caller treats the step as corrupt
            return None
        if not saved:
            return None
        wanted = _shapes(abstract_state)
        for path in sorted(p for p in set(saved) | set(wanted) if p.startswith(only)):
            there, here = saved.get(path, "absent"), wanted.get(path, "absent")
            if there != here:
                return f"{path} is {there} in the checkpoint, {here} in this run"
        return None

    def params_mismatch(self, step: int, abstract_params) -> str | None:
        """The first difference between the parameters saved as `step` and `abstract_params` (paths and shapes),
        in words; None when they agree."""
        return self.state_mismatch(step, {"params": abstract_params}, only="params/")

    def restore_params(self, step: int, abstract_params):
        """`state.params` of checkpoint `step` (no optimiser state, no data position); `abstract_params` holds
        jax.ShapeDtypeStruct leaves with target shardings, and may be a subtree of the saved parameters."""
        target = {"params": abstract_params}
        restored = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
            item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True)))
        return restored["state"]["params"]

    def restore_latest_params(self, abstract_params):
        """(step, params) of the newest checkpoint whose parameters restore (`restore_params`), or None if there is
        none. A step that does not restore is skipped, one line each saying so, and never moved."""
        steps = self.steps()
        for index in range(len(steps) - 1, -1, -1):
            step = steps[index]
            try:
                with quiet_orbax():
                    return step, self.restore_params(step, abstract_params)
            except Exception as err:  # noqa: BLE001 - any failure means this checkpoint is unusable
                files = step_files(self.directory / str(step))
                why = files if files not in (None, "whole") else error_line(err)
                then = f"reading step {steps[index - 1]}" if index else "no older step is left"
                status(f"WARNING: checkpoint step {step} in {self.directory} does not restore ({why}); skipped it "
                       f"and left it in place; {then}")
        return None

    def _move_aside(self, step: int) -> epath.Path:
        """Moves an unreadable step out of the manager's way (kept for inspection, never overwritten)."""
        aside = self.directory.parent / "checkpoints_corrupt" / f"{step}-{int(time.time())}"
        if jax.process_index() == 0:  # one process moves it; the others wait for it
            aside.parent.mkdir(parents=True, exist_ok=True)
            (self.directory / str(step)).rename(aside)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"jaxpos checkpoint {step} moved aside")
        self.manager.reload()
        return aside

    def close(self) -> None:
        self.wait()
        self.manager.close()


def check_resumable(workdir: str, model_config: dict, pending: tuple[str, ...] = ()) -> None:
    """`Checkpointer.check_model_config` of WORKDIR/checkpoints, if any, read-only: a resume under another model is
    refused before the data is read (`pending`: the fields the data decides, checked when the Trainer is built)."""
    directory = checkpoint_path(workdir) / "checkpoints"
    if not directory.is_dir():
        return
    checkpointer = Checkpointer(directory, read_only=True)
    try:
        checkpointer.check_model_config(model_config, pending)
    finally:
        checkpointer.close()


def _flatten(tree: dict, prefix: str = "") -> dict:
    """{"position": {"kind": "tisa"}} -> {"position.kind": "tisa"}."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _shapes(tree) -> dict[str, str]:
    """{"params/bert/...": "shape (4, 8)"} of a state's array leaves (orbax metadata or ShapeDtypeStructs), keyed
    alike for dicts, dataclasses and named tuples."""
    def name(key) -> str:
        for attribute in ("key", "name", "idx"):
            if hasattr(key, attribute):
                return str(getattr(key, attribute))
        return str(key)

    return {"/".join(name(k) for k in path): f"shape {tuple(leaf.shape)}"
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0] if hasattr(leaf, "shape")}


def abstract_like(tree, shardings):
    """ShapeDtypeStructs carrying target shardings, the restore target for any mesh."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def saved_steps(workdir: str) -> list[int]:
    """The steps of WORKDIR/checkpoints (finished orbax checkpoints are folders named by their step), sorted, from
    the listing alone (local or a URL). Raises FileNotFoundError when there is none."""
    directory = checkpoint_path(workdir) / "checkpoints"
    steps = sorted(int(d.name) for d in directory.iterdir() if d.name.isdigit()) if directory.is_dir() else []
    if not steps:
        raise FileNotFoundError(f"{directory} holds no checkpoint; train first (jaxpos train ... --workdir {workdir})")
    return steps


def read_run_params(workdir: str, abstract_params, step: int | None = None):
    """(step, params) of WORKDIR/checkpoints read-only: the newest checkpoint whose parameters restore, or
    `step`'s. `abstract_params`: ShapeDtypeStructs with shardings (a subtree of the saved parameters is fine)."""
    saved_steps(workdir)  # names a missing or empty checkpoint folder before orbax is asked
    directory = checkpoint_path(workdir) / "checkpoints"
    checkpointer = Checkpointer(directory, read_only=True)
    try:
        if step is None:
            restored = checkpointer.restore_latest_params(abstract_params)
            if restored is None:
                raise CheckpointError(f"no checkpoint in {directory} restores (steps {checkpointer.steps()}) for the "
                                      f"model in {os.path.join(workdir, 'config.json')}; the folder was left as it is")
            return restored
        if step not in checkpointer.steps():
            raise ValueError(f"{directory} has no checkpoint of step {step} (it has "
                             f"{', '.join(map(str, checkpointer.steps()))})")
        try:
            with quiet_orbax():
                return step, checkpointer.restore_params(step, abstract_params)
        except Exception as err:  # noqa: BLE001 - corrupt, partial, or saved for another model
            files = step_files(directory / str(step))
            why = files if files not in (None, "whole") else error_line(err)
            raise CheckpointError(f"checkpoint step {step} in {directory} does not restore for the model in "
                                  f"{os.path.join(workdir, 'config.json')} ({why}); the folder was left as it "
                                  "is") from err
    finally:
        checkpointer.close()

