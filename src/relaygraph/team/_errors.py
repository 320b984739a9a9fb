"""The error a team file's mistake raises, located by table and key."""

from __future__ import annotations

from relaygraph.errors import ConfigError

__all__ = ["TeamFileError"]


class TeamFileError(ConfigError):
    """A mistake in a team file (or a registered team's definition).

    The message names the file, the table and the key; the same place is on the error as
    fields, so that a caller (the HTTP API naming the body field) need not read the message.

    Attributes:
        table: The table the mistake is in, dotted as in the file's header: ``agents.reviewer``,
            ``mcp.lint``, ``policy``, ``supervisor``; None for the file's top level (or when
            the mistake is in no one table).
        key: The key in that table, dotted where it goes deeper (``tools``, ``url``,
            ``env.TOKEN``, ``tools.0`` for an array's first item); None for the table as a
            whole.
    """

    def __init__(self, message: str, *, table: str | None = None, key: str | None = None) -> None:
        self.table = table
        self.key = key
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        # The keyword fields are not in ``args``: keep them across pickling (a worker process).
        return (type(self), self.args, {"table": self.table, "key": self.key})
