"""Errors the ledger raises beyond plain bad input (``ConfigError``), and the refusal of a
superseded attempt's write (``AttemptSuperseded``)."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from dataclasses import dataclass

from relaygraph.errors import ConfigError, RunError


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


@dataclass(eq=False, repr=False)
class RecordConflict(ConfigError):
    """The write contradicts a record that exists (the HTTP API answers 409).

    Attributes:
        kind: The kind of record: ``project``, ``team``, ``task`` or ``approval``.
        key: The record's name or id.
        problem: How the write contradicts it.
    """

    kind: str
    key: str
    problem: str

    def __post_init__(self) -> None:
        super().__init__(f"{self.kind} {self.key!r}: {self.problem}")


class AttemptSuperseded(RunError):
    """A write of an attempt that is no longer the task's latest was refused (fencing).

    A worker that was frozen (SIGSTOP, a paused VM) while the broker gave its task to
    another worker must not overwrite the new attempt's work when it comes back: every
    write of a worker's run carries its attempt number, and the ledger takes it only while
    that number is still the task's.

    Attributes:
        task_id: The task written to.
        attempt: The attempt that tried to write.
        current: The task's attempt now (None: the task no longer exists).
    """

    def __init__(self, task_id: str, attempt: int, current: int | None) -> None:
        self.task_id = task_id
        self.attempt = attempt
        self.current = current
        now = "the task is gone" if current is None else f"the task is on attempt {current}"
        super().__init__(
            f"task {task_id}: attempt {attempt} may no longer write ({now}); its write was refused"
        )


_SQLITE_FULL = 13
"""SQLite's result code for a write that found no room (``database or disk is full``)."""
_POSTGRES_DISK_FULL = "53100"
"""PostgreSQL's SQLSTATE ``disk_full``."""
_NO_ROOM_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every error it was raised from: the driver's (``orig``), the cause and
    the context, each once."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        error = pending.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        yield error
        pending += [getattr(error, "orig", None), error.__cause__, error.__context__]


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc``, or an error it was raised from, says the disk had no room: SQLite's
    ``SQLITE_FULL``, PostgreSQL's ``disk_full``, or an ``OSError`` with ``ENOSPC`` (a full
    disk), ``EDQUOT`` (a user's disk quota) or ``EFBIG`` (a file-size limit)."""
    for error in _causes(exc):
        if isinstance(error, OSError) and error.errno in _NO_ROOM_ERRNOS:
            return True
        if getattr(error, "sqlite_errorcode", None) == _SQLITE_FULL:
            return True
        if getattr(error, "sqlstate", None) == _POSTGRES_DISK_FULL:
            return True
        if "database or disk is full" in str(error):
            return True  # SQLite's message, from a driver that does not give its code.
    return False


_SQLITE_BUSY = 5
"""SQLite's result code for a lock that another process held past the busy timeout."""
_POSTGRES_UNAVAILABLE = ("08", "53300", "57P01", "57P02", "57P03")
"""PostgreSQL's SQLSTATEs (a class, or one code) of a server that cannot serve a connection
now: ``connection_exception``, ``too_many_connections``, ``admin_shutdown``,
``crash_shutdown``, ``cannot_connect_now``."""


DATABASE_RETRY_SECONDS = 5
"""How long to wait before trying again what the database could not serve now
(:func:`is_database_unavailable`): the API's ``Retry-After``, a worker's next try of a task's
message."""


def is_database_unavailable(exc: BaseException) -> bool:
    """Whether ``exc``, or an error it was raised from, says the database cannot serve the
    request now, though the request itself was fine: no connection could be opened (the
    server is down, restarting, or at its ``max_connections``), the process's pool had none
    free in time, or SQLite's lock stayed taken past the busy timeout. Trying again later
    may succeed (a connection lost mid-commit leaves unsaid whether the write was kept)."""
    import psycopg
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    for error in _causes(exc):
        if isinstance(error, PoolTimeout) or type(error).__name__ == "PoolTimeout":
            return True  # SQLAlchemy's pool, or psycopg_pool's (the checkpoints').
        if getattr(error, "sqlite_errorcode", None) == _SQLITE_BUSY:
            return True
        if isinstance(error, psycopg.OperationalError):
            state = getattr(error, "sqlstate", None)
            # No SQLSTATE: the client's own failure to connect (refused, or the server's
            # FATAL before a session began).
            if state is None or state.startswith(_POSTGRES_UNAVAILABLE):
                return True
    return False
