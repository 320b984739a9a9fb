"""What the ledger's parts share: the session base class and the helpers several parts call."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import fields
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Self, TypeVar

from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    and_,
    bindparam,
    exists,
    func,
    insert,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.orm import Session, aliased, sessionmaker

from relaygraph.errors import ConfigError
from relaygraph.events import run_finished_event
from relaygraph.store._derive import BatchRows, derive, event_agent
from relaygraph.store._engine import database_url, display_url, make_engine
from relaygraph.store._errors import AttemptSuperseded, RecordNotFound
from relaygraph.store._migrate import current_revision, head_revision, upgrade_engine
from relaygraph.store._models import (
    EventRow,
    TaskRow,
)
from relaygraph.store._notices import EventNotice
from relaygraph.store._records import (
    ACTIVE_STATUSES,
    FINISHED_STATUSES,
    TASK_STATUSES,
    Task,
    snapshot,
)

KEY_PREFIX = "rg_"
KEY_DISPLAY_CHARS = 10
MAX_PAGE = 200
STATUS_FIELDS = ("answer", "stop_reason")
DECISIONS = ("approve", "reject", "edit")
R = TypeVar("R")


def utc_now() -> datetime:
    return datetime.now(UTC)


def hash_key(key: str) -> str:
    """The SHA-256 hex digest the ledger stores in place of an API key."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class LedgerBase:
    """The engine and the two kinds of session every part of the ledger uses."""

    def __init__(self, url: str | None = None, *, notify_channel: str | None = None) -> None:
        self._url = database_url(url)
        self.notify_channel = notify_channel
        """The PostgreSQL ``NOTIFY`` channel on which each write of a task's events is
        announced (:class:`~relaygraph.store.EventNotice`); None: none is sent. SQLite has
        no notices: the setting is ignored there."""
        self._engine = make_engine(self._url)
        self._reader = sessionmaker(self._engine, expire_on_commit=False)
        # On SQLite, writes begin with BEGIN IMMEDIATE: an engine (and pool) of their own.
        self._write_engine = (
            make_engine(self._url, immediate=True) if self.dialect == "sqlite" else self._engine
        )
        self._writer = sessionmaker(self._write_engine, expire_on_commit=False)

    def __repr__(self) -> str:
        return f"Ledger({display_url(self._url)!r})"

    @property
    def url(self) -> str:
        """The database URL, password hidden."""
        return display_url(self._url)

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self._engine.dialect.name

    @property
    def database_file(self) -> Path | None:
        """The SQLite database's file; None on PostgreSQL or for an in-memory database."""
        if self.dialect != "sqlite":
            return None
        name = self._engine.url.database
        return Path(name) if name and name != ":memory:" else None

    def close(self) -> None:
        """Close the connection pool; the ledger opens new connections if used again."""
        self._engine.dispose()
        self._write_engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def upgrade(self, revision: str = "head") -> None:
        """Apply the shipped migrations up to ``revision``; does nothing when current."""
        upgrade_engine(self._write_engine, revision)

    def is_current(self) -> bool:
        """Whether the database has every shipped migration (a readiness check)."""
        return current_revision(self._engine) == head_revision()

    @contextmanager
    def _write(self) -> Iterator[Session]:
        with self._writer() as session, session.begin():
            yield session

    @contextmanager
    def _read(self) -> Iterator[Session]:
        with self._reader() as session, session.begin():
            yield session

    @contextmanager
    def _write_connection(self) -> Iterator[Connection]:
        """A write transaction in SQLAlchemy Core (no ORM session): for the hot paths."""
        with self._write_engine.begin() as connection:
            yield connection

    @contextmanager
    def _read_connection(self) -> Iterator[Connection]:
        """A read transaction in SQLAlchemy Core (no ORM session): for the hot paths."""
        with self._engine.begin() as connection:
            yield connection

    def _snapshots(self, record: type[R], query: Select[Any]) -> list[R]:
        with self._read() as session:
            return [snapshot(record, row) for row in session.scalars(query)]

    def _announce(self, session: Session | Connection, task_id: str, last_seq: int) -> None:
        """Tell every listener, when ``session`` commits, that the task has events up to
        ``last_seq`` (nothing is sent if it rolls back, or without a channel)."""
        if self.notify_channel is None or self._engine.dialect.name != "postgresql":
            return
        payload = EventNotice(task_id=task_id, seq=last_seq).payload()
        session.execute(_NOTIFY, {"channel": self.notify_channel, "payload": payload})


_NOTIFY = select(func.pg_notify(bindparam("channel"), bindparam("payload")))


def no_live_lease(now: datetime) -> ColumnElement[bool]:
    """No runner holds the task, or its lease has lapsed. A worker's attempt holds it with
    a runner id and no end (``lease_until`` NULL): the broker, not a lease, says when that
    worker is gone, so such a hold never lapses here."""
    return or_(TaskRow.runner_id.is_(None), TaskRow.lease_until < now)


def fenced_by(attempt: int | None) -> ColumnElement[bool]:
    """The condition a fenced write adds to its UPDATE: the task is still on ``attempt``
    (always true for an unfenced write, ``attempt`` None)."""
    return true() if attempt is None else TaskRow.attempts == attempt


def check_attempt(row: TaskRow, attempt: int | None) -> None:
    """Refuse a write of ``attempt`` to a task (its row locked) that is on another attempt.

    Raises:
        AttemptSuperseded: ``attempt`` is not the task's latest.
    """
    if attempt is not None and row.attempts != attempt:
        raise AttemptSuperseded(row.id, attempt, row.attempts)


def attempt_refusal(session: Session | Connection, task_id: str, attempt: int | None) -> Exception:
    """Why a fenced UPDATE of the task matched no row: no such task, or another attempt."""
    current = session.scalar(select(TaskRow.attempts).where(TaskRow.id == task_id))
    if current is None or attempt is None:
        return RecordNotFound("task", task_id)
    return AttemptSuperseded(task_id, attempt, current)


_ADD_EVENTS = insert(EventRow)


def add_events(
    connection: Connection,
    task_id: str,
    first: int,
    batch: Sequence[Mapping[str, Any]],
    now: datetime,
) -> None:
    """Add the event rows numbered from ``first``, and the rows derived from them."""
    # One multi-row INSERT in SQLAlchemy Core (no ORM objects): every batch of a run's
    # events goes through here, on the thread that shares the interpreter with the graph.
    connection.execute(
        _ADD_EVENTS,
        [
            {
                "task_id": task_id,
                "seq": seq,
                "type": data["type"][:32],
                "agent": event_agent(data),
                "data": data,
                "created_at": now,
            }
            for seq, data in enumerate(batch, start=first)
        ],
    )
    rows = BatchRows(connection, task_id, now)
    for seq, data in enumerate(batch, start=first):
        derive(rows, seq, data)
    rows.flush()


def add_finish_event(
    session: Session, task_id: str, status: str, stop_reason: str | None, now: datetime
) -> int:
    """Record the ``run_finished`` event of a task the ledger ended itself (a cancel of a
    task no runner holds, a task abandoned or started too often); returns its sequence
    number (announce it: ``LedgerBase._announce``)."""
    seq = session.scalar(
        update(TaskRow)
        .where(TaskRow.id == task_id)
        .values(last_event_seq=TaskRow.last_event_seq + 1)
        .returning(TaskRow.last_event_seq)
    )
    assert seq is not None
    add_events(session.connection(), task_id, seq, [run_finished_event(status, stop_reason)], now)
    return seq


def status_values(status: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    if status not in TASK_STATUSES:
        raise ConfigError(f"status {status!r} is not one of {', '.join(TASK_STATUSES)}")
    unknown = [name for name in fields if name not in STATUS_FIELDS]
    if unknown:
        raise ConfigError(
            f"set_status got unknown field(s) {', '.join(map(repr, unknown))}; "
            f"it takes {', '.join(STATUS_FIELDS)}"
        )
    for name, value in fields.items():
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{name} {value!r} must be a string or None")
    return {"status": status, "updated_at": utc_now(), **fields}


def apply_status(row: TaskRow | SimpleNamespace, values: Mapping[str, Any]) -> None:
    for name, value in values.items():
        setattr(row, name, value)
    if row.status == "running" and row.started_at is None:
        row.started_at = values["updated_at"]
    if row.status in FINISHED_STATUSES:
        row.finished_at = values["updated_at"]


def task_of_row(row: TaskRow) -> Task:
    return snapshot(Task, row, metadata=row.meta)


_EARLIER = aliased(TaskRow)
EARLIER_ACTIVE_ON_THREAD = exists().where(
    _EARLIER.project_id == TaskRow.project_id,
    _EARLIER.thread_id == TaskRow.thread_id,
    _EARLIER.status.in_(ACTIVE_STATUSES),
    or_(
        _EARLIER.created_at < TaskRow.created_at,
        and_(_EARLIER.created_at == TaskRow.created_at, _EARLIER.id < TaskRow.id),
    ),
)
"""The task row has an earlier active task on its thread (created before it; the id breaks
a tie), in the order ``active_task_on_thread`` reads: it may not start yet."""

TASK_COLUMNS = tuple(TaskRow.__table__.c[f.name] for f in fields(Task))
"""The task table's columns a :class:`Task` holds (its ``metadata`` is the column's name),
for the statements in SQLAlchemy Core that return a task."""


def task_of_mapping(row: Mapping[Any, Any]) -> Task:
    """The task in a Core row of :data:`TASK_COLUMNS` (``row._mapping``)."""
    return Task(**{column.name: row[column.name] for column in TASK_COLUMNS})
