"""The error a team file's mistake raises, located by table and key."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from relaygraph.errors import ConfigError

__all__ = ["TeamFileError", "located", "location_of"]


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


@contextmanager
def located(where: str, *, table: str | None = None, key: str | None = None) -> Iterator[None]:
    """Report a :class:`ConfigError` of a part that knows no team file (an MCP server, a
    topology, a policy) as a mistake at ``table`` and ``key`` of the file ``where`` names."""
    try:
        yield
    except TeamFileError:
        raise
    except ConfigError as exc:
        raise TeamFileError(f"{where}: {exc}", table=table, key=key) from None


def location_of(
    loc: tuple[int | str, ...], data: Mapping[str, Any]
) -> tuple[str | None, str | None]:
    """The table and key a validation error's ``loc`` points at in ``data``.

    The part of ``loc`` that names no key of ``data`` (the member of a union pydantic tried,
    ``kb.list[str]``, ``policy.str``) is left out.
    """
    parts: list[str] = []
    node: Any = data
    for part in loc:
        if isinstance(node, Mapping):
            node = node.get(part)
        elif isinstance(node, list | tuple) and isinstance(part, int):
            node = node[part] if 0 <= part < len(node) else None
        else:
            break
        parts.append(str(part))
    if len(parts) >= 2 and parts[0] in ("agents", "mcp"):
        table, rest = ".".join(parts[:2]), parts[2:]
    elif parts[:1] == ["supervisor"] or (
        parts[:1] == ["policy"] and isinstance(data.get("policy"), Mapping)
    ):
        table, rest = parts[0], parts[1:]
    else:
        table, rest = None, parts
    return table, ".".join(rest) or None
