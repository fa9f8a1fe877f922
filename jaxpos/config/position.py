"""The position block of a model config, `model.position`: a tagged union. `kind` names a registered positional
mechanism, and the block holds that mechanism's own options under its kind (`position.rope.base`) beside the fields
every mechanism shares (segments, the analysis switches, randomized positions).

The config layer only parses. Which options a kind has, and the checks that need its record, belong to the
mechanism: its module (under jaxpos/positions/, or in a researcher's own package) declares a `MechanismOptions`
block and registers it, and `jaxpos.positions` installs the registry here as the `Catalog` that parsing and the model
checks consult (`install_catalog`). A block of another kind's options is refused when a config is given (it would do
nothing), and ignored in a run's saved config.json (older jaxpos saved every kind's block).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping, Protocol

from jaxpos.config.checks import check_count, typed, unknown_field

SEGMENT_MODES = ("input", "per_head", "none")
# none: a set per head and layer | head: one set per layer, shared by that layer's heads |
# layer: one set per head, shared by all layers of the stack
SHARING_MODES = ("none", "head", "layer")


@dataclasses.dataclass(frozen=True)
class MechanismOptions:
    """Base of every mechanism's options block (a frozen dataclass): its fields are `model.position.<kind>.*`."""

    # Fields that change no parameter, so that a trained run may be evaluated under other values of them
    # (RoPE's length rules): `jaxpos evaluate` takes overrides of these alone.
    evaluation_fields: ClassVar[tuple[str, ...]] = ()
    # Values that a saved config without a field reads it as, where the field's default changed after runs were
    # saved without it (so that an old run computes as it trained).
    saved_defaults: ClassVar[Mapping[str, Any]] = {}

    def check(self, model) -> None:
        """Raises a one-line ValueError for options out of range, or for a model block (`ModelConfig`) that these
        options cannot run with. Field names in messages: `position.<kind>.<field>`."""

    def evaluation_rule(self, model) -> str:
        """The rule its `evaluation_fields` set, in a few words ("" for the defaults): how a run was scored."""
        return ""

    def evaluation_tag(self) -> str:
        """A file-name tag of its `evaluation_fields` away from their defaults ("yarn_x4")."""
        changed = self.changed()
        return "_".join(f"{k}{_short(v)}" for k, v in changed.items() if k in self.evaluation_fields) or "default"

    def evaluation_record(self, model) -> dict:
        """What a length evaluation records of these options (every field, resolved against the model)."""
        return config_dict(self)

    def changed(self) -> dict[str, Any]:
        """{field: value} of the fields set away from their defaults, in declaration order."""
        defaults = type(self)()
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(defaults, f.name)}


@dataclasses.dataclass(frozen=True)
class NoOptions(MechanismOptions):
    """The options block of a mechanism without options."""


class Catalog(Protocol):
    """What the config layer asks of the registered mechanisms (jaxpos.positions.registry implements it)."""

    def options_class(self, kind: str) -> type[MechanismOptions]:
        """The options block of `kind`; a one-line ValueError naming the registered kinds for an unknown one."""

    def kinds(self) -> tuple[str, ...]:
        """The registered kinds, in registration order."""

    def check_model(self, model) -> None:
        """The registered checks of a whole model block (its mechanism's, and those of the layers above)."""


_CATALOG: list[Catalog] = []


def install_catalog(catalog: Catalog) -> None:
    """Makes `catalog` the registry that position blocks are parsed and models checked with (jaxpos.positions
    installs its registry when it is imported)."""
    _CATALOG[:] = [catalog]


def catalog() -> Catalog:
    """The installed registry of mechanisms."""
    if not _CATALOG:
        raise RuntimeError("no positional mechanisms are registered: import jaxpos.positions (any model, workflow or "
                           "command does) before building a model config")
    return _CATALOG[0]


@dataclasses.dataclass(frozen=True)
class PositionConfig:
    """`model.position`: the mechanism `kind` with its `options` block, and the fields every mechanism shares.
    `options` None takes the kind's defaults. `position.<kind>` reads as the options (`cfg.position.rope.base`);
    another kind's name is an error that says which kind the block is."""

    kind: str = "absolute"
    segment: str = "input"  # input embeddings | per-head segment attention (DIET) | none
    num_segments: int = 2
    content_only: bool = False  # analysis switch: drop the positional logit terms
    position_only: bool = False  # analysis switch: drop the content term q.k
    # Randomized positions (Ruoss et al.): N > model.max_length; each forward pass places a row's T tokens at a
    # sorted sample of T distinct positions of [0, N), one sample for the whole batch (None: positions 0..T-1)
    randomized_max_length: int | None = None
    options: MechanismOptions | None = None

    def __post_init__(self):
        options_class = catalog().options_class(self.kind)
        if self.options is None:
            object.__setattr__(self, "options", options_class())
        elif type(self.options) is not options_class:
            raise ValueError(f"model.position.kind={self.kind!r} takes {options_class.__name__} options, got "
                             f"{type(self.options).__name__}")
        if self.segment not in SEGMENT_MODES:
            raise ValueError(f"unknown segment mode {self.segment!r}; choose one of {SEGMENT_MODES}")
        for name in ("content_only", "position_only"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"position.{name}={getattr(self, name)!r} must be true or false")
        if self.content_only and self.position_only:
            raise ValueError("content_only and position_only cannot both be set")
        check_count("position.num_segments", self.num_segments, 1)
        check_count("position.randomized_max_length", self.randomized_max_length, 2, optional=True)

    def __getattr__(self, name: str):
        # Only reached for names that are not fields: the kind's own options block by its name.
        if name.startswith("_") or name == "options":
            raise AttributeError(name)
        if name == self.__dict__.get("kind"):
            return self.__dict__["options"]
        if _CATALOG and name in catalog().kinds():
            raise AttributeError(f"model.position.{name}: options of {name!r}, but this model's position.kind is "
                                 f"{self.__dict__.get('kind')!r}")
        raise AttributeError(f"PositionConfig has no field {name!r}")

    def replace_options(self, **changes) -> PositionConfig:
        """This block with fields of its kind's options changed."""
        return dataclasses.replace(self, options=dataclasses.replace(self.options, **changes))

    def to_dict(self) -> dict:
        """The block as config files and config.json hold it: the shared fields, and the kind's options under its
        name (where it has any)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "options"}
        if dataclasses.fields(self.options):
            out[self.kind] = config_dict(self.options)
        return out

    @classmethod
    def from_values(cls, values, where: str = "model.position", saved: bool = False) -> PositionConfig:
        """The block of a ConfigDict or dict: the kind's options typed from `values[kind]`, the shared fields as
        given. A block of another registered kind is refused (it would change nothing) unless `saved` (a run's
        config.json: older jaxpos saved every kind's block), where it is ignored."""
        if values is None:
            return cls()
        if isinstance(values, cls):
            return values
        values = values.to_dict() if hasattr(values, "to_dict") else dict(values)
        kind = values.get("kind", "absolute")
        options_class = catalog().options_class(kind)
        shared = {f.name for f in dataclasses.fields(cls)} - {"options"}
        kinds = catalog().kinds()
        kwargs = {}
        for key, value in values.items():
            if key in shared:
                kwargs[key] = value
            elif key == kind:
                kwargs["options"] = typed(options_class, _with_saved_defaults(options_class, value, saved),
                                          f"{where}.{kind}")
            elif key in kinds:
                if not saved and value not in (None, {}):
                    raise ValueError(f"{where}.{key}: options of {key!r}, but {where}.kind is {kind!r}, which does "
                                     f"not read them; set {where}.kind={key} or leave the {key} block out")
            else:
                raise unknown_field(where, key, [*shared, *([kind] if dataclasses.fields(options_class) else [])])
        if "options" not in kwargs and saved:
            kwargs["options"] = typed(options_class, _with_saved_defaults(options_class, {}, saved),
                                      f"{where}.{kind}")
        return cls(**kwargs)

    def label(self) -> str:
        """The kind with every option set away from its default, e.g. "rope (scaling=yarn, factor=4)",
        "alibi (randomized_max_length=512)": what a run's report names it by."""
        shared_defaults = PositionConfig(kind=self.kind)
        parts = [f"{k}={_short(v)}" for k, v in self.options.changed().items()]
        parts += [f"{f.name}={_short(getattr(self, f.name))}" for f in dataclasses.fields(self)
                  if f.name not in ("kind", "options") and getattr(self, f.name) != getattr(shared_defaults, f.name)]
        return self.kind + (f" ({', '.join(parts)})" if parts else "")


def _short(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _with_saved_defaults(options_class: type[MechanismOptions], values, saved: bool):
    """A saved block's values with the fields it lacks read as `saved_defaults` says (an older run's meaning)."""
    if not saved or not options_class.saved_defaults:
        return values
    values = dict(values.to_dict() if hasattr(values, "to_dict") else values or {})
    return {**options_class.saved_defaults, **values}


def config_dict(value):
    """A config dataclass (or a tree of them) as the JSON-ready dicts config files hold: `to_dict()` where a block
    defines one (the position block's tagged union), fields otherwise; tuples stay tuples."""
    if hasattr(value, "to_dict") and dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: config_dict(v) for k, v in value.to_dict().items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: config_dict(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: config_dict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(config_dict(v) for v in value)
    return value
