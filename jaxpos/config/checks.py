"""Range checks for config values, one message style: `name=value must be ...` (shown as one line by the CLI)."""

from __future__ import annotations


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
