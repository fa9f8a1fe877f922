"""Checks of config values and names, one message style each (shown as one line by the CLI): `name=value must be
...` for a value out of range, `unknown config field a.b (did you mean a.c?)` for a misspelt field."""

from __future__ import annotations

import dataclasses
import difflib
import typing
from typing import Iterable, Mapping


def unknown_field(block: str, name: str, known: Iterable[str]) -> ValueError:
    """The error for field NAME that config block BLOCK (dotted, e.g. "model.position"; "" at the top) lacks: with
    the closest of its `known` fields where some are close (difflib), else with all of them."""
    prefix = f"{block}." if block else ""
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=2)
    hint = (f" (did you mean {' or '.join(prefix + c for c in close)}?)" if close else
            f"; known here: {', '.join(known)}" if known else "")
    return ValueError(f"unknown config field {prefix}{name}{hint}")


# {config class: {field: the block type of its items}} for fields that hold a tuple of blocks
ITEM_TYPES: dict[type, dict[str, type]] = {}


def typed(cls, values, where: str, saved: bool = False):
    """The config dataclass `cls` from a ConfigDict or dict (None: its defaults): the one conversion of a config
    block to its typed form. Nested dataclass fields convert likewise (a block with a `from_values` classmethod,
    such as the position block's tagged union, converts itself); fields left out keep their defaults (older
    config.json files); a list becomes a tuple where the field's default is one; an unknown field is a one-line
    ValueError naming the closest known ones. `where`: the block's dotted name ("model.position"); `saved`: a
    run's own saved config, read as leniently as its block allows."""
    if hasattr(cls, "from_values") and not isinstance(values, cls):
        return cls.from_values(values, where, saved=saved)
    if values is None:
        return cls()
    if isinstance(values, cls):
        return values
    values = values.to_dict() if hasattr(values, "to_dict") else values
    if not isinstance(values, Mapping):
        raise ValueError(f"config block {where} must be a block of fields, got {values!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            raise unknown_field(where, key, fields)
        if dataclasses.is_dataclass(hints[key]):
            value = typed(hints[key], value, f"{where}.{key}" if where else key, saved)
        elif key in ITEM_TYPES.get(cls, {}) and value is not None:  # a tuple of blocks (the plan of layers)
            value = tuple(typed(ITEM_TYPES[cls][key], item, f"{where}.{key}[{i}]", saved)
                          for i, item in enumerate(value))
        elif isinstance(fields[key].default, tuple) and isinstance(value, list):
            value = tuple(value)
        kwargs[key] = value
    return cls(**kwargs)


def check_count(name: str, value, least: int, optional: bool = False) -> None:
    """Raises a ValueError unless `value` is an integer >= least (or None where optional)."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name}={value!r} must be an integer >= {least}" + (" (or None)" if optional else ""))


def check_number(name: str, value, low: float, high: float | None = None, *, open_low: bool = False,
                 open_high: bool = True) -> None:
    """Raises a ValueError unless `value` is a number >= low (> low where open_low) and, with `high`, < high
    (<= high unless open_high). NaN is refused."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and (low < value if open_low else low <= value)
    ok = ok and (high is None or (value < high if open_high else value <= high))
    if not ok:
        need = (f"a number {'>' if open_low else '>='} {low:g}" if high is None else
                f"in {'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}")
        raise ValueError(f"{name}={value!r} must be {need}")
