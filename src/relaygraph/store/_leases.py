"""Leases (a task never runs in two places at once), cancel, and abandoned tasks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, bindparam, case, func, or_, select, update
from sqlalchemy.orm import Session

from relaygraph.errors import ConfigError
from relaygraph.events import cancel_requested_event
from relaygraph.store._core import LedgerCore
from relaygraph.store._errors import RecordNotFound
from relaygraph.store._models import (
    TaskRow,
)
from relaygraph.store._records import (
    ACTIVE_STATUSES,
    TASK_STATUSES,
    Task,
)
from relaygraph.store._task_rows import (
    EARLIER_ACTIVE_ON_THREAD,
    IDS_PER_STATEMENT,
    TASK_COLUMNS,
    abandoned_end,
    add_finish_event,
    add_ledger_event,
    apply_status,
    no_live_lease,
    status_values,
    task_of_mapping,
    task_of_row,
    utc_now,
)

_TAKE_LEASE = (
    update(TaskRow)
    .where(
        TaskRow.id == bindparam("row_id"),
        TaskRow.status.in_(bindparam("allowed", expanding=True)),
        TaskRow.cancel_requested_at.is_(None),
        # The runner's own lease, or none that is live (see no_live_lease).
        or_(
            TaskRow.runner_id == bindparam("runner"),
            TaskRow.runner_id.is_(None),
            TaskRow.lease_until < bindparam("now"),
        ),
    )
    .values(
        status="running",
        # The SET expressions read the row as it was: a runner that takes its own task
        # again counts no new attempt.
        attempts=case(
            (TaskRow.runner_id == bindparam("runner"), TaskRow.attempts),
            else_=TaskRow.attempts + 1,
        ),
        runner_id=bindparam("runner"),
        lease_until=bindparam("until"),
        started_at=func.coalesce(TaskRow.started_at, bindparam("now")),
        updated_at=bindparam("now"),
        # Why it stopped last (awaiting approval, its server stopping) is over: it runs.
        stop_reason=None,
    )
    .returning(*TASK_COLUMNS)
)
_HELD_BY_RUNNER = and_(
    TaskRow.id.in_(bindparam("row_ids", expanding=True)), TaskRow.runner_id == bindparam("runner")
)
_RENEW_LEASES = (
    update(TaskRow)
    .where(_HELD_BY_RUNNER)
    .values(lease_until=bindparam("until"))
    .returning(TaskRow.id, TaskRow.cancel_requested_at)
)
_RENEW_UNLOCKED_LEASES = (
    update(TaskRow)
    # On PostgreSQL a row another transaction holds locked is passed over, not waited for:
    # one such row must not hold up the renewal of every other lease of the statement.
    # (SQLite has no row locks: the clause is left out there.)
    .where(
        TaskRow.id.in_(select(TaskRow.id).where(_HELD_BY_RUNNER).with_for_update(skip_locked=True))
    )
    .values(lease_until=bindparam("until"))
    .returning(TaskRow.id, TaskRow.cancel_requested_at)
)
_STILL_HELD = select(TaskRow.id).where(_HELD_BY_RUNNER)

_CANCEL_REQUESTED_AT = select(TaskRow.cancel_requested_at).where(TaskRow.id == bindparam("row_id"))
_TAKE_QUEUED = _TAKE_LEASE.where(
    # A queued task starts only as its thread's oldest active task: one enqueued behind
    # another waits for it (and two submitted at once on a new thread do not both start).
    # In the take itself, not a read before it: one statement for every served run's start.
    ~EARLIER_ACTIVE_ON_THREAD
)


class LeaseRepository:
    """Leases (a task never runs in two places at once), cancel, and abandoned tasks."""

    def __init__(self, core: LedgerCore) -> None:
        self._core = core

    def claim(
        self, task_id: str, status: str = "running", *, only_from: Iterable[str] = ("queued",)
    ) -> Task | None:
        """Move a task to ``status`` only if its status is one of ``only_from``, atomically.

        Two workers that claim the same task cannot both win: use it to start a queued task
        or to mark a running one ``cancelled``.

        Returns:
            The updated task, or None when its status was not in ``only_from`` (or there is
            no such task).
        """
        values = status_values(status, {})
        allowed = tuple(only_from)
        for each in allowed:
            if each not in TASK_STATUSES:
                raise ConfigError(f"only_from status {each!r} is not a task status")
        with self._core.write() as session:
            claimed = session.scalar(
                update(TaskRow)
                .where(TaskRow.id == task_id, TaskRow.status.in_(allowed))
                .values(status=status, updated_at=values["updated_at"])
                .returning(TaskRow.id)
            )
            return None if claimed is None else _updated(session, task_id, values)

    def take_lease(
        self,
        task_id: str,
        runner_id: str,
        *,
        seconds: float,
        only_from: Iterable[str] = ACTIVE_STATUSES,
    ) -> Task | None:
        """Make ``runner_id`` the one that runs the task, for ``seconds``, and mark it running.

        Atomic: it succeeds only if the task's status is one of ``only_from``, no other
        runner holds a lease that has not lapsed yet (a runner may take its own again), and
        no cancel waits on it. A server that took over a task whose runner died, and the
        runner still alive, cannot both hold it. A runner that takes a task it did not hold
        counts one more attempt (:meth:`settle_abandoned` fails a task after too many).

        A task taken only from ``queued`` (``only_from=("queued",)``: a start) is taken
        only while it is its thread's oldest active task (:meth:`active_task_on_thread`):
        one queued behind another waits for it to end.

        Returns:
            The task, now ``running``; None when another runner holds it, or its status is
            not one of ``only_from``, or a cancel waits on it, or there is no such task, or
            (taken from ``queued``) an earlier task of its thread is still active.
        """
        allowed = tuple(only_from)
        for each in allowed:
            if each not in TASK_STATUSES:
                raise ConfigError(f"only_from status {each!r} is not a task status")
        now = utc_now()
        # One statement in SQLAlchemy Core, built once, that returns the task (no second
        # read): every run in process starts here.
        with self._core.write_connection() as connection:
            taken = connection.execute(
                _TAKE_QUEUED if allowed == ("queued",) else _TAKE_LEASE,
                {
                    "row_id": task_id,
                    "allowed": allowed,
                    "runner": runner_id,
                    "now": now,
                    "until": now + timedelta(seconds=seconds),
                },
            ).first()
        return None if taken is None else task_of_mapping(taken._mapping)

    def renew_lease(self, task_id: str, runner_id: str, *, seconds: float) -> bool:
        """Extend ``runner_id``'s lease on the task; False if it no longer holds it."""
        return task_id in self.renew_leases([task_id], runner_id, seconds=seconds, wait=True)

    def renew_leases(
        self, task_ids: Iterable[str], runner_id: str, *, seconds: float, wait: bool = False
    ) -> dict[str, bool | None]:
        """Extend ``runner_id``'s leases on the tasks, in one statement for every
        :data:`IDS_PER_STATEMENT` of them. Each task whose lease it still holds maps to
        whether a cancel waits on it (read in the same statement); a task it no longer
        holds is left out. Unless ``wait``, a task whose row another transaction holds
        locked (PostgreSQL) is not waited for: it maps to None, not renewed, for the caller
        to renew on its own (``wait=True``).

        A server holding hundreds of tasks in flight renews all the leases that fall due
        together at once (``runner._lease``): one write per round, not two statements per
        task, so the renewals keep up however many tasks run."""
        ids = list(dict.fromkeys(task_ids))
        until = utc_now() + timedelta(seconds=seconds)
        statement = _RENEW_LEASES if wait else _RENEW_UNLOCKED_LEASES
        held: dict[str, bool | None] = {}
        with self._core.write_connection() as connection:
            for start in range(0, len(ids), IDS_PER_STATEMENT):
                batch = ids[start : start + IDS_PER_STATEMENT]
                values = {"row_ids": batch, "runner": runner_id, "until": until}
                held.update(
                    (row[0], row[1] is not None) for row in connection.execute(statement, values)
                )
                passed = [task_id for task_id in batch if task_id not in held]
                if passed and not wait:
                    # Passed over: no longer this runner's, or locked (still its own).
                    rows = connection.execute(_STILL_HELD, {"row_ids": passed, "runner": runner_id})
                    held.update((row[0], None) for row in rows)
        return held

    def release_lease(self, task_id: str, runner_id: str) -> None:
        """Give up ``runner_id``'s lease on the task (if it holds it): another runner may
        take the task at once (a server that stopped mid-run, for the next to continue)."""
        with self._core.write() as session:
            session.execute(
                update(TaskRow)
                .where(TaskRow.id == task_id, TaskRow.runner_id == runner_id)
                .values(runner_id=None, lease_until=None)
            )

    def cancel_requested(self, task_id: str) -> bool:
        """Whether a cancel waits for the task's runner to act on it (read with each lease
        renewal: Core, built once, as :meth:`renew_lease`)."""
        with self._core.read_connection() as connection:
            at = connection.execute(_CANCEL_REQUESTED_AT, {"row_id": task_id}).scalar()
        return at is not None

    def request_cancel(
        self,
        task_id: str,
        *,
        reason: str = "cancelled by request",
        by: str | None = None,
        via: str = "api",
    ) -> Task:
        """Cancel the task: at once if no live runner holds it (queued, waiting for a
        person, or running under a lease that lapsed: its runner died); otherwise ask its
        runner, which sees the request at its next lease renewal and stops at the next step
        boundary. A task whose runner dies before then is cancelled by
        :meth:`settle_abandoned` once its lease lapses, never run again.

        Args:
            task_id: The task.
            reason: Its stop reason when it is cancelled at once.
            by: Who asked (a project's name): recorded as a ``cancel_requested`` event
                when the request is new (not for a task already finished or already
                asked to stop). None: the runner itself stops it (no person asked).
            via: Where the request came from (``api``, ``dashboard``, ``cli``).

        Returns:
            The task as it is now: ``cancelled``, or still running with
            ``cancel_requested_at`` set, or finished already (unchanged).

        Raises:
            RecordNotFound: No such task.
        """
        values = status_values("cancelled", {"stop_reason": reason})
        now = values["updated_at"]
        with self._core.write() as session:
            cancelled = session.scalar(
                update(TaskRow)
                .where(
                    TaskRow.id == task_id,
                    or_(
                        TaskRow.status.in_(("queued", "interrupted")),
                        and_(TaskRow.status == "running", no_live_lease(now)),
                    ),
                )
                .values(
                    status="cancelled",
                    stop_reason=values["stop_reason"],
                    runner_id=None,
                    lease_until=None,
                    updated_at=now,
                )
                .returning(TaskRow.id)
            )
            if cancelled is not None:
                if by is not None:
                    add_ledger_event(session, task_id, cancel_requested_event(by=by, via=via), now)
                # Its event history ends like any run's, so a stream or an audit sees why.
                seq = add_finish_event(session, task_id, "cancelled", values["stop_reason"], now)
                self._core.announce(session, task_id, seq)
                return _updated(session, task_id, values)
            row = session.get(TaskRow, task_id, with_for_update=True)
            if row is None:
                raise RecordNotFound("task", task_id)
            if row.status == "running" and row.cancel_requested_at is None:
                row.cancel_requested_at = now
                if by is not None:
                    event = cancel_requested_event(by=by, via=via)
                    self._core.announce(
                        session, task_id, add_ledger_event(session, task_id, event, now)
                    )
            return task_of_row(row)

    def settle_abandoned(self, task_id: str, *, max_attempts: int) -> Task | None:
        """End a ``running`` task that no live runner holds, if it must not run again:
        ``cancelled`` when a cancel waited on it, ``failed`` when runners already started it
        ``max_attempts`` times without a run ending (each of them died on it: a task that
        crashes its runner must not take down every server that picks it up).

        Returns:
            The task, now ``cancelled`` or ``failed``; None when it may run again (or is not
            running, or a live runner holds it).
        """
        now = utc_now()
        with self._core.write() as session:
            row = session.get(TaskRow, task_id, with_for_update=True)
            if row is None or row.status != "running":
                return None
            if row.runner_id is not None and (row.lease_until is None or row.lease_until >= now):
                return None  # A live lease, or a worker's attempt (which never lapses here).
            values = abandoned_end(
                row, started=row.attempts, max_attempts=max_attempts, runner="runner"
            )
            if values is None:
                return None
            apply_status(row, values)
            row.runner_id = row.lease_until = None
            row.updated_at = values["updated_at"]
            seq = add_finish_event(session, task_id, values["status"], values["stop_reason"], now)
            self._core.announce(session, task_id, seq)
            session.refresh(row)
            return task_of_row(row)

    def abandoned_tasks(self, *, exclude_project: str | None = None) -> list[Task]:
        """``running`` tasks that no live runner holds (their runner's lease lapsed, or none
        holds them), of every project but ``exclude_project``, oldest first: what a server
        whose workers pull their queued tasks (``TaskWorkers.recover``) picks up from time to
        time. Unlike ``unfinished_tasks`` it reads no queued task: a server holding hundreds
        of tasks in flight may have thousands queued."""
        query = select(*TASK_COLUMNS).where(TaskRow.status == "running", no_live_lease(utc_now()))
        if exclude_project is not None:
            query = query.where(TaskRow.project_id != exclude_project)
        with self._core.read_connection() as connection:
            rows = connection.execute(query.order_by(TaskRow.created_at, TaskRow.id))
            return [task_of_mapping(row._mapping) for row in rows]

    def lease_of(self, task_id: str) -> tuple[str | None, datetime | None]:
        """Who holds the task's lease and until when: ``(runner_id, lease_until)``."""
        with self._core.read() as session:
            row = session.get(TaskRow, task_id)
            if row is None:
                raise RecordNotFound("task", task_id)
            return row.runner_id, row.lease_until


def _updated(session: Session, task_id: str, values: Mapping[str, Any]) -> Task:
    """The task row an UPDATE just changed, read again, with ``values`` applied (the times
    a status stamps)."""
    row = session.get(TaskRow, task_id, populate_existing=True)
    assert row is not None
    apply_status(row, values)
    return task_of_row(row)
