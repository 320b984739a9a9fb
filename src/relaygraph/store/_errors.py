"""Errors the ledger raises beyond plain bad input (``ConfigError``)."""

from __future__ import annotations

from relaygraph.errors import ConfigError


class RecordNotFound(ConfigError):
    """The ledger has no such record (the HTTP API answers 404).

    Attributes:
        kind: What was looked for: ``task``, ``project``, ``team``, ``approval`` or ``api key``.
        key: The id it was looked for by.
    """

    def __init__(self, kind: str, key: str) -> None:
        self.kind = kind
        self.key = key
        super().__init__(f"no {kind} {key!r} in the ledger")


class RecordConflict(ConfigError):
    """The write contradicts a record that exists (the HTTP API answers 409).

    Attributes:
        kind: The kind of record: ``project``, ``team``, ``task`` or ``approval``.
        key: The record's name or id.
    """

    def __init__(self, kind: str, key: str, problem: str) -> None:
        self.kind = kind
        self.key = key
        self.problem = problem
        super().__init__(f"{kind} {key!r}: {problem}")
