"""Query parameters that several routes take, parsed once, with errors that name them."""

from datetime import UTC, datetime

from relaygraph.api._errors import ErrorAnswer

__all__ = ["in_utc"]


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
