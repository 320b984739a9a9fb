"""Query parameters that several routes take, parsed once, with errors that name them."""

from datetime import UTC, datetime
from typing import Any

from fastapi import Query

from relaygraph.api._errors import ErrorAnswer

__all__ = ["in_utc", "time_query"]


def time_query(description: str) -> Any:
    """A query parameter that takes a time (read it with :func:`in_utc`), documented as
    ``date-time`` in the OpenAPI document, so that schemathesis sends times."""
    return Query(description=description, json_schema_extra={"format": "date-time"})


def in_utc(text: str | None, field: str) -> datetime | None:
    """A query's ISO 8601 time, in UTC; one that is not ISO 8601 (a bare number), has no
    time zone, or is outside what UTC can express is refused naming the field."""
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ErrorAnswer(
            422,
            "invalid_request",
            f"{field} {text[:60]!r} is not an ISO 8601 time, e.g. 2026-01-01T00:00:00Z",
            field,
        ) from None
    if value.tzinfo is None:
        raise ErrorAnswer(
            422,
            "invalid_request",
            f"{field} {value.isoformat()!r} has no time zone; add one, e.g. {value.isoformat()}Z",
            field,
        )
    try:
        return value.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00:00+14:00 is before the first UTC time.
        raise ErrorAnswer(
            422,
            "invalid_request",
            f"{field} {value.isoformat()!r} is outside the times UTC can express",
            field,
        ) from None
