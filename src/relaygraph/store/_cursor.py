"""Page cursors for listing tasks: an opaque position (creation time and id), not an offset."""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime

from relaygraph.errors import ConfigError


def encode(created_at: datetime, task_id: str) -> str:
    raw = json.dumps([created_at.isoformat(), task_id]).encode("utf-8")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode(cursor: str) -> tuple[datetime, str]:
    """The position a cursor from :func:`encode` marks.

    Raises:
        ConfigError: The cursor was not made by :func:`encode`.
    """
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created, task_id = json.loads(raw)
        when = datetime.fromisoformat(created)
        if when.tzinfo is None or not isinstance(task_id, str):
            raise ValueError(cursor)
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError):
        raise ConfigError(
            f"cursor {cursor!r} is not one this ledger returned; start again without it"
        ) from None
    return when, task_id
