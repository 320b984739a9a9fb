"""The helpers that read and write a task's row and its events inside a transaction the
caller opened: what several of the ledger's repositories share (each repository opens its
own transactions, and no repository calls another)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    and_,
    exists,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.orm import Session, aliased

from relaygraph.errors import ConfigError
from relaygraph.events import run_finished_event
from relaygraph.store._derive import BatchRows, derive, event_agent
from relaygraph.store._errors import AttemptSuperseded, RecordNotFound
from relaygraph.store._models import (
    EventRow,
    TaskRow,
)
from relaygraph.store._records import (
    ACTIVE_STATUSES,
    FINISHED_STATUSES,
    TASK_STATUSES,
    Task,
    snapshot,
)

STATUS_FIELDS = ("answer", "stop_reason")
IDS_PER_STATEMENT = 500
"""The most task ids one statement binds (a batch of lease renewals, of attempt reads): well
under the bound parameters SQLite allows."""


def utc_now() -> datetime:
    """The time the ledger stamps on a row it writes."""
    return datetime.now(UTC)


def no_live_lease(now: datetime) -> ColumnElement[bool]:
    """No runner holds the task, or its lease has lapsed. A worker's attempt holds it with
    a runner id and no end (``lease_until`` NULL): the broker, not a lease, says when that
    worker is gone, so such a hold never lapses here."""
    return or_(TaskRow.runner_id.is_(None), TaskRow.lease_until < now)


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
    number (announce it: ``LedgerCore.announce``)."""
    return add_ledger_event(session, task_id, run_finished_event(status, stop_reason), now)


def add_ledger_event(
    session: Session, task_id: str, event: Mapping[str, Any], now: datetime
) -> int:
    """Record an event the ledger writes itself, after the task's last one, even while a
    runner writes the task's events (the task's row hands out the numbers); returns its
    sequence number (announce it: ``LedgerCore.announce``)."""
    seq = session.scalar(
        update(TaskRow)
        .where(TaskRow.id == task_id)
        .values(last_event_seq=TaskRow.last_event_seq + 1)
        .returning(TaskRow.last_event_seq)
    )
    assert seq is not None
    add_events(session.connection(), task_id, seq, [event], now)
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


def abandoned_end(
    row: TaskRow, *, started: int, max_attempts: int, runner: str
) -> dict[str, Any] | None:
    """How a task ends whose ``runner`` (a server, a worker) stopped without ending it: the
    status values that make it ``cancelled`` when a cancel waits, or ``failed`` once it was
    started ``max_attempts`` times; None when it may run again. The lease sweep and a worker's
    attempt share it, so both end such a task alike."""
    if row.cancel_requested_at is not None:
        return status_values("cancelled", {"stop_reason": "cancelled by request"})
    if started < max_attempts:
        return None
    reason = (
        f"error: the task was started {started} times and its {runner} stopped without "
        f"finishing it each time (attempt limit {max_attempts}, RELAYGRAPH_MAX_ATTEMPTS); "
        "it is not run again"
    )
    return status_values("failed", {"stop_reason": reason})


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
# The earlier task's status and creation time, as terms no index is chosen for: SQLite's
# planner (no statistics) otherwise looks the earlier tasks up by the index on (project,
# status, creation time) and reads every earlier active task of the project for each task
# asked about, not the few of its thread (the index on (project, thread)). The fair queue
# asks about every queued task, so its read grew with the square of the queue.
_EARLIER_STATUS = func.coalesce(_EARLIER.status, _EARLIER.status)
_EARLIER_CREATED_AT = func.coalesce(_EARLIER.created_at, _EARLIER.created_at)
EARLIER_ACTIVE_ON_THREAD = exists().where(
    _EARLIER.project_id == TaskRow.project_id,
    _EARLIER.thread_id == TaskRow.thread_id,
    _EARLIER_STATUS.in_(ACTIVE_STATUSES),
    or_(
        TaskRow.created_at > _EARLIER_CREATED_AT,
        and_(TaskRow.created_at == _EARLIER_CREATED_AT, _EARLIER.id < TaskRow.id),
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
