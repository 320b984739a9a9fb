"""Checks on what callers hand the ledger; each failure names the field and the value."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from relaygraph.errors import ConfigError

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""What a project's or a registered team's name may be."""
MAX_KEY_CHARS = 255
MAX_PAGE = 200
"""The most records one page of a list holds."""
MAX_DEPTH = 64
"""How deeply a caller's JSON object may nest (a run's own events are not limited)."""
NUL = "\x00"
REPLACEMENT = "\ufffd"
LONE_SURROGATE = re.compile("[\ud800-\udfff]")
"""A UTF-16 surrogate on its own: JSON's ``\\udfff`` escape parses to one, but it is not
Unicode text, and neither UTF-8 (SQLite, PostgreSQL) nor a JSON response can carry it."""


def name(value: object, what: str) -> str:
    """The name of a project or a registered team (``what``)."""
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise ConfigError(
            f"{what} name {value!r} is invalid: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return value


def text(value: object, field: str, *, max_chars: int | None = None) -> str:
    """A non-blank string that UTF-8 can hold, without NUL characters (PostgreSQL text
    cannot hold them)."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{field} {value!r} must be a non-empty string")
    problem = unstorable(value)
    if problem is not None:
        raise ConfigError(f"{field} {_short(value)!r} {problem}")
    if max_chars is not None and len(value) > max_chars:
        raise ConfigError(f"{field} {_short(value)!r} is longer than {max_chars} characters")
    return value


def optional_text(value: object, field: str, *, max_chars: int | None = None) -> str | None:
    return None if value is None else text(value, field, max_chars=max_chars)


def json_object(value: object, field: str, *, scrub: bool = False) -> dict[str, Any]:
    """A JSON object given by the caller, as it will read back (tuples become lists);
    ``scrub`` replaces NULs with U+FFFD (for text a run produced)."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{field} {_short(value)!r} must be a JSON object")
    result = _json_copy(value, field, scrub=scrub)
    assert isinstance(result, dict)
    return result


def json_list(value: object, field: str, *, scrub: bool = False) -> list[Any]:
    """A JSON array given by the caller, as it will read back; ``scrub`` replaces NULs."""
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, list | tuple):
        raise ConfigError(f"{field} {_short(value)!r} must be a list")
    result = _json_copy(value, field, scrub=scrub)
    assert isinstance(result, list)
    return result


def whole(value: object, field: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{field} {value!r} must be a whole number of at least {minimum}")
    return value


def page_limit(value: object) -> int:
    """How many records a page of a list is to hold: from 1 to :data:`MAX_PAGE`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PAGE:
        raise ConfigError(f"limit {value!r} must be a whole number from 1 to {MAX_PAGE}")
    return value


def share(value: object, field: str) -> float | None:
    """A fraction from 0 to 1, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ConfigError(f"{field} {value!r} must be a number from 0 to 1, or None")
    return float(value)


def event_data(value: object) -> dict[str, Any]:
    """An event as the ledger stores it.

    NUL characters (which a tool's output may contain) become U+FFFD instead of failing the
    write: PostgreSQL cannot store them, and losing the event would be worse.
    """
    if not isinstance(value, Mapping):
        raise ConfigError(f"event {_short(value)!r} must be a mapping with a 'type'")
    kind = value.get("type")
    if not isinstance(kind, str) or not kind:
        raise ConfigError(f"event 'type' {kind!r} must be a non-empty string")
    copied = _plain_json_copy(value)
    if copied is not None:
        return copied
    result = _json_copy(value, "event", scrub=True)
    assert isinstance(result, dict)
    return result


_ENCODE = json.JSONEncoder(ensure_ascii=False, allow_nan=False, check_circular=False).encode
_DECODE = json.JSONDecoder().decode


def _plain_json_copy(value: Mapping[str, Any]) -> dict[str, Any] | None:
    """``value`` copied through JSON text when nothing in it needs a scrub or an error
    message (the common case: a run's own events), else None for :func:`_json_copy`.

    The encoder and decoder are C code: a relay-3 task's 17 events cost about 600 Python
    calls less than the walk of :func:`_json_copy`. The copy must equal ``value``: a tuple
    (which reads back as a list) or a key that is not a string (which JSON turns into one)
    takes the walk, which keeps the list and refuses the key, naming it.
    """
    try:
        text = _ENCODE(value)
    except (TypeError, ValueError, RecursionError):
        return None  # Something JSON cannot hold, named by the walk.
    if "\\u0000" in text or LONE_SURROGATE.search(text):
        return None  # NUL (JSON escapes it) or a lone surrogate: scrubbed by the walk.
    copied = _DECODE(text)
    return copied if isinstance(copied, dict) and copied == value else None


def aware(value: object, field: str) -> datetime | None:
    """A timezone-aware datetime, in UTC."""
    if value is None:
        return None
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise ConfigError(f"{field} {value!r} must be a timezone-aware datetime")
    try:
        return value.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00+14:00 is before the first UTC datetime.
        raise ConfigError(
            f"{field} {value.isoformat()!r} is outside the datetimes UTC can express "
            "(years 1 to 9999)"
        ) from None


def count(value: object, field: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ConfigError(f"{field} {value!r} must be a non-negative number")
    return int(value)


def amount(value: object, field: str) -> float:
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ConfigError(f"{field} {value!r} must be a non-negative number")
    return float(value)


def unstorable(value: str) -> str | None:
    """What keeps ``value`` out of the ledger (a NUL, a lone surrogate), or None."""
    if NUL in value:
        return "contains a NUL character"
    if LONE_SURROGATE.search(value):
        return "contains a lone UTF-16 surrogate, which is not Unicode text"
    return None


def _scrubbed(value: str) -> str:
    return LONE_SURROGATE.sub(REPLACEMENT, value.replace(NUL, REPLACEMENT))


def _json_copy(value: object, path: str, *, scrub: bool, depth: int = 0) -> object:
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"{path} = {value!r} is not a finite number, which JSON cannot hold")
        return value
    if isinstance(value, str):
        if scrub:
            return _scrubbed(value)
        problem = unstorable(value)
        if problem is not None:
            raise ConfigError(f"{path} {_short(value)!r} {problem}")
        return value
    if not scrub and depth >= MAX_DEPTH:
        raise ConfigError(f"{path} nests deeper than {MAX_DEPTH} levels")
    if isinstance(value, Mapping):
        copy: dict[str, object] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConfigError(f"{path} has the key {key!r}; JSON object keys are strings")
            if scrub:
                key = _scrubbed(key)
            elif (problem := unstorable(key)) is not None:
                raise ConfigError(f"{path} has the key {_short(key)!r}, which {problem}")
            copy[key] = _json_copy(item, f"{path}.{key}", scrub=scrub, depth=depth + 1)
        return copy
    if isinstance(value, list | tuple):
        return [
            _json_copy(item, f"{path}[{i}]", scrub=scrub, depth=depth + 1)
            for i, item in enumerate(value)
        ]
    raise ConfigError(
        f"{path} = {_short(value)!r} is a {type(value).__name__}, which JSON cannot hold"
    )


def _short(value: object, limit: int = 80) -> object:
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + "…"
    return value
