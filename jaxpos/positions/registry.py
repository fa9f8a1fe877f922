"""The registry of positional mechanisms by `model.position.kind`: one `Mechanism` record each, registered by the
module that implements it, in this package or in a researcher's own.

A mechanism is one module: its options block (a `MechanismOptions` dataclass with its checks), its Flax module
(a `PositionMechanism` that returns its attention terms) and its record here (description, traits, the README's
options text, where it comes from), registered with `register`. jaxpos registers its own when `jaxpos.positions`
is imported; a researcher's module registers the same way when it is imported: through the entry point group
`jaxpos.mechanisms` of an installed package (read on the first kind the registry does not know), or by name with
every command's `--import MODULE` (`import_mechanisms`). The registry is what the config layer parses position
blocks with (`jaxpos.config.position.Catalog`), installed when this module is imported.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import os
import sys
from typing import Callable, Sequence

from jaxpos.config.model import ModelConfig
from jaxpos.config.position import MechanismOptions, NoOptions, install_catalog

ENTRY_POINTS = "jaxpos.mechanisms"  # the entry point group a package's mechanisms register through
# Modules `--import` named, for the processes a command starts (pool workers, array tasks read it from the plan)
IMPORT_VARIABLE = "JAXPOS_IMPORT"


@dataclasses.dataclass(frozen=True)
class When:
    """A trait that holds under some options only: `text` as the README and error messages say it; `holds` reads
    the mechanism's options block."""

    text: str
    holds: Callable[[MechanismOptions], bool]


@dataclasses.dataclass(frozen=True)
class Mechanism:
    """One positional mechanism: its kind, module, options and record. `bool | When` traits are read through
    `is_inductive` and `is_learned`."""

    kind: str  # the value of model.position.kind
    module: type  # its PositionMechanism (jaxpos.positions.base)
    label: str  # short name in reports, for the default options
    description: str  # the term it adds, in one line (the README's "mechanism" column)
    inductive: bool | When  # works at any sequence length: no learned table over model.max_length positions
    learned: bool | When  # has learned positional parameters
    options: type[MechanismOptions] = NoOptions  # its block, model.position.<kind>
    options_text: str = ""  # the README's "options" column (markdown)
    reference: str = ""  # where it comes from: the paper, in a few words
    input_only: bool = False  # its positional signal, if any, enters with the input embeddings: no logit term
    no_position_only_term: str | None = None  # why position_only is undefined (positions act through q's content)
    no_randomized_positions: str | None = None  # why position.randomized_max_length does not apply
    check: Callable[[ModelConfig], None] | None = None  # the model checks beyond its options' own
    # (std, multiplier) of the token embeddings beside its input positions, or None (the model's own): sinusoidal
    # positions at the scale of their source
    token_scale: Callable[[ModelConfig], tuple[float, float] | None] | None = None
    source: str = ""  # the module that registered it (set by `register`)

    def is_inductive(self, options: MechanismOptions) -> bool:
        """Whether it works at any length under `options` (its options block)."""
        return _holds(self.inductive, options)

    def is_learned(self, options: MechanismOptions) -> bool:
        """Whether it has learned positional parameters under `options`."""
        return _holds(self.learned, options)


def _holds(trait: bool | When, options: MechanismOptions) -> bool:
    return trait.holds(options) if isinstance(trait, When) else trait


def trait_text(trait: bool | When) -> str:
    """"yes", "no" or the rule of a trait, as the README's table says it (without its backticks)."""
    return trait.text if isinstance(trait, When) else ("yes" if trait else "no")


MECHANISMS: dict[str, Mechanism] = {}
_ENTRY_POINTS_READ: list[bool] = []


def register(mechanism: Mechanism) -> Mechanism:
    """Adds `mechanism` under its kind; returns it. A kind registered by another module is refused (one line
    naming both), the same module registering again (a reload) replaces its record."""
    source = mechanism.module.__module__
    known = MECHANISMS.get(mechanism.kind)
    if known is not None and known.source != source:
        raise ValueError(f"position kind {mechanism.kind!r} is registered by {known.source} already; {source} "
                         "must name its mechanism another kind")
    if not (mechanism.kind.isidentifier() and mechanism.kind.islower()):
        raise ValueError(f"position kind {mechanism.kind!r} must be a lower-case Python identifier (it names "
                         "the config block model.position.<kind>)")
    mechanism = dataclasses.replace(mechanism, source=source)
    MECHANISMS[mechanism.kind] = mechanism
    return mechanism


def read_entry_points() -> None:
    """Imports every module of the entry point group `jaxpos.mechanisms` (once): installed packages' mechanisms;
    and those that $JAXPOS_IMPORT names (comma-separated), as a command's `--import` passes them to the processes
    it starts."""
    if _ENTRY_POINTS_READ:
        return
    _ENTRY_POINTS_READ.append(True)
    named = [m for m in os.environ.get(IMPORT_VARIABLE, "").split(",") if m]
    if named:
        import_mechanisms(named)
    for entry in importlib.metadata.entry_points(group=ENTRY_POINTS):
        try:
            entry.load()
        except Exception as error:  # noqa: BLE001 - named in one line: the package's own error
            raise ValueError(f"the mechanism {entry.name!r} of entry point group {ENTRY_POINTS} ({entry.value}) "
                             f"does not import: {type(error).__name__}: {error}") from error


def import_mechanisms(modules: Sequence[str]) -> list[str]:
    """Imports the modules named (`--import MODULE`, dotted names on sys.path, the working folder first), whose
    mechanisms register as they load; returns the kinds they added. A module that does not import is a one-line
    ValueError."""
    if "" not in sys.path:
        sys.path.insert(0, "")
    before = set(MECHANISMS)
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as error:
            raise ValueError(f"--import {name}: {error}") from error
    known = [m for m in os.environ.get(IMPORT_VARIABLE, "").split(",") if m]
    os.environ[IMPORT_VARIABLE] = ",".join(dict.fromkeys([*known, *modules]))  # for the processes this one starts
    return [kind for kind in MECHANISMS if kind not in before]


def mechanism(kind: str) -> Mechanism:
    """The record of `kind`; an installed package's mechanisms are read on the first unknown kind. Unknown: a
    one-line ValueError naming the registered kinds and how to register one."""
    if kind not in MECHANISMS:
        read_entry_points()
    if kind not in MECHANISMS:
        raise ValueError(f"unknown position mechanism {kind!r}; choose one of {', '.join(MECHANISMS)} (a mechanism "
                         f"of your own registers when its module is imported: --import MODULE, or the entry point "
                         f"group {ENTRY_POINTS})")
    return MECHANISMS[kind]


def token_embedding_scale(cfg: ModelConfig) -> tuple[float, float]:
    """(std at initialisation, multiplier) of an encoder's token embeddings: its mechanism's (`token_scale`), else
    the model's (init_std, and sqrt(d_model) with model.scale_embeddings)."""
    record = mechanism(cfg.position.kind)
    own = record.token_scale(cfg) if record.token_scale is not None else None
    if own is not None:
        return own
    return cfg.init_std, cfg.d_model ** 0.5 if cfg.scale_embeddings else 1.0


def inductive_summary() -> str:
    """The mechanisms that work at any length, with their conditions: "none, sinusoidal, tisa (without ...), ..."."""
    return ", ".join(m.kind if m.inductive is True else f"{m.kind} ({m.inductive.text})"
                     for m in MECHANISMS.values() if m.inductive is not False)


class _Catalog:
    """The registry as the config layer asks of it (jaxpos.config.position.Catalog)."""

    def options_class(self, kind: str) -> type[MechanismOptions]:
        return mechanism(kind).options

    def kinds(self) -> tuple[str, ...]:
        read_entry_points()
        return tuple(MECHANISMS)

    def check_model(self, cfg: ModelConfig) -> None:
        pcfg = cfg.position
        record = mechanism(pcfg.kind)
        if pcfg.position_only and record.input_only:
            raise ValueError(f"position_only needs a positional logit term; {pcfg.kind!r} adds positions at the "
                             "input only")
        if pcfg.position_only and record.no_position_only_term:
            raise ValueError(f"position_only is not defined for {pcfg.kind!r}: {record.no_position_only_term}")
        if pcfg.randomized_max_length is not None and record.no_randomized_positions:
            raise ValueError(f"position.randomized_max_length does not apply to {pcfg.kind!r}: "
                             f"{record.no_randomized_positions}")
        pcfg.options.check(cfg)
        if record.check is not None:
            record.check(cfg)


install_catalog(_Catalog())
