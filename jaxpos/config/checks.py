"""Checks of config values and names, one message style each (shown as one line by the CLI): `name=value must be
...` for a value out of range, `unknown config field a.b (did you mean a.c?)` for a misspelt field."""

from __future__ import annotations

import difflib
from typing import Iterable


def unknown_field(block: str, name: str, known: Iterable[str]) -> ValueError:
    """The error for field NAME that config block BLOCK (dotted, e.g. "model.position"; "" at the top) lacks: with
    the closest of its `known` fields where some are close (difflib), else with all of them."""
    prefix = f"{block}." if block else ""
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=2)
    hint = (f" (did you mean {' or '.join(prefix + c for c in close)}?)" if close else
            f"; known here: {', '.join(known)}" if known else "")
    return ValueError(f"unknown config field {prefix}{name}{hint}")


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
