"""The generic parsers of setting values; a room's own value types (tokens, rules, receivers) parse in the room.

A parser turns the raw value (a string from the environment, any TOML value from the file) into the
typed value, raising ValueError with a short "expected ..." phrase; the caller adds where the value
came from.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

Parser = Callable[[Any], Any]


class ConfigError(ValueError):
    """A setting has a bad value; the message quotes where it came from and the value."""


def parse_int(minimum: int, maximum: int | None = None) -> Parser:
    """An integer of at least ``minimum`` (and at most ``maximum``).

    >>> parse_int(1)("250"), parse_int(0, 65535)(8321)
    (250, 8321)
    """
    shape = f"an integer {minimum}-{maximum}" if maximum is not None else f"an integer >= {minimum}"

    def parse(raw: Any) -> int:
        if isinstance(raw, bool):
            raise ValueError("expected an integer")
        try:
            value = int(raw)
        except (TypeError, ValueError):
            raise ValueError("expected an integer") from None
        if isinstance(raw, float) and raw != value:
            raise ValueError("expected an integer")
        if value < minimum or (maximum is not None and value > maximum):
            raise ValueError(f"expected {shape}")
        return value

    return parse


def _number(raw: Any, expected: str) -> float:
    if isinstance(raw, bool):
        raise ValueError(f"expected {expected}")
    try:
        return float(raw)
    except (TypeError, ValueError):
        raise ValueError(f"expected {expected}") from None


def parse_seconds(raw: Any) -> float:
    value = _number(raw, "a number of seconds")
    if not value >= 0 or value == float("inf"):
        raise ValueError("expected a finite, non-negative number of seconds")
    return value


def parse_fraction(raw: Any) -> float:
    """A number strictly between 0 and 1 (a level, an absolute floor)."""
    value = _number(raw, "a number between 0 and 1")
    if not 0 < value < 1:
        raise ValueError("expected a number between 0 and 1")
    return value


def parse_share(raw: Any) -> float:
    """A share of requests, 0 and 1 included."""
    value = _number(raw, "a share between 0 and 1")
    if not 0 <= value <= 1:
        raise ValueError("expected a share between 0 and 1")
    return value


def parse_ratio(raw: Any) -> float:
    """A positive, finite relative change (0.10 = 10 %).

    >>> parse_ratio("0.25")
    0.25
    """
    value = _number(raw, "a relative change such as 0.10")
    if not 0 < value < float("inf"):
        raise ValueError("expected a positive relative change such as 0.10")
    return value


def parse_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def parse_str(raw: Any) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError("expected a non-empty string")
    return raw.strip()


def parse_path(raw: Any) -> Path:
    return Path(parse_str(raw)).expanduser()


def parse_choice(choices: tuple[str, ...]) -> Parser:
    def parse(raw: Any) -> str:
        if raw not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return str(raw)

    return parse


def parse_names(raw: Any) -> tuple[str, ...]:
    """Names, comma-separated or a list (label names, host names), blanks dropped.

    >>> parse_names("workload, pair"), parse_names(["a", " "])
    (('workload', 'pair'), ('a',))
    """
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise ValueError("expected names, comma-separated or a list")
    return tuple(item.strip() for item in items if item.strip())


_DURATION_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(raw: Any) -> timedelta:
    """``15m``, ``6h``, ``7d``, ``90s``, ``2w`` (or a number of seconds) as a positive timedelta.

    >>> parse_duration("6h"), parse_duration("90")
    (datetime.timedelta(seconds=21600), datetime.timedelta(seconds=90))
    """
    text = str(raw).strip().lower()
    unit = text[-1:] if text[-1:] in _DURATION_UNITS else "s"
    number = text[:-1] if text[-1:] in _DURATION_UNITS else text
    try:
        value = float(number) * _DURATION_UNITS[unit]
    except ValueError:
        raise ValueError("expected a duration like 15m, 6h or 7d") from None
    if not 0 < value < 10 * 365 * 86400:
        raise ValueError("expected a positive duration like 15m, 6h or 7d")
    return timedelta(seconds=value)


def format_duration(value: timedelta) -> str:
    """The largest whole unit that reads ``value`` exactly: the inverse of :func:`parse_duration`.

    >>> format_duration(timedelta(hours=2)), format_duration(timedelta(seconds=90))
    ('2h', '90s')
    """
    seconds = int(value.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def parse_tables(raw: Any, what: str) -> list[Any]:
    """A list of tables: TOML's ``[[name]]`` arrives as a list, the environment's as a JSON string.

    >>> parse_tables('[{"url": "http://h"}]', "{url, kind} objects"), parse_tables("", "x")
    ([{'url': 'http://h'}], [])
    """
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else []
        except json.JSONDecodeError:
            raise ValueError(f"expected a JSON list of {what}") from None
        except RecursionError:  # json.loads recurses once a level; no real list of tables nests that deep
            raise ValueError(f"expected a JSON list of {what}, not nested thousands deep") from None
    if not isinstance(raw, list):
        raise ValueError(f"expected a list of {what}")
    return raw
