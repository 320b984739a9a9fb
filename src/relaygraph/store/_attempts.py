"""The worker mode's attempts at a task, and the dispatch numbers that start them.

An API server hands a task to the workers (:meth:`AttemptRepository.queue_for_workers`,
then it publishes the task's id and dispatch number); a worker that receives the message
begins an attempt (:meth:`AttemptRepository.begin_attempt`), whose number fences every
write of its run (``attempt=`` of ``append_events``, ``end_run``, ``set_status``,
``record_usage`` and the tool journal): once another attempt began, the old one's writes
are refused, so a worker that was only frozen cannot overwrite the new attempt's work.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import bindparam, func, select, update

from relaygraph.store._core import LedgerCore
from relaygraph.store._errors import RecordNotFound
from relaygraph.store._models import TaskRow
from relaygraph.store._records import FINISHED_STATUSES, Attempt
from relaygraph.store._task_rows import (
    IDS_PER_STATEMENT,
    TASK_COLUMNS,
    abandoned_end,
    add_finish_event,
    apply_status,
    status_values,
    task_of_mapping,
    task_of_row,
    utc_now,
)

__all__ = ["AttemptRepository"]

_ATTEMPT_STATES = select(TaskRow.id, TaskRow.attempts, TaskRow.cancel_requested_at).where(
    TaskRow.id.in_(bindparam("row_ids", expanding=True))
)
STARTABLE = ("queued", "running")
"""Statuses a worker's attempt may begin from: queued, or running (a message redelivered
after the worker that ran it died or froze)."""

_START_ATTEMPT = (
    update(TaskRow)
    .where(
        TaskRow.id == bindparam("row_id"),
        TaskRow.dispatch == bindparam("for_dispatch"),
        TaskRow.status.in_(STARTABLE),
        TaskRow.cancel_requested_at.is_(None),
        TaskRow.dispatch_attempts < bindparam("max_attempts"),
    )
    .values(
        attempts=TaskRow.attempts + 1,
        dispatch_attempts=TaskRow.dispatch_attempts + 1,
        runner_id=bindparam("runner"),
        lease_until=None,
        status="running",
        started_at=func.coalesce(TaskRow.started_at, bindparam("now")),
        updated_at=bindparam("now"),
        stop_reason=None,  # Why it stopped last (awaiting approval) is over: it runs.
    )
    .returning(*TASK_COLUMNS)
)
"""The attempt begun, as every worker's run begins: one statement in SQLAlchemy Core, built
once, and one round trip to the server instead of a locked read, an update and a flush."""


_CLAIM = (
    update(TaskRow)
    .where(TaskRow.id == bindparam("row_id"), TaskRow.status == "queued", TaskRow.dispatch == 0)
    .values(dispatch=1, dispatch_attempts=0, updated_at=bindparam("now"))
    .returning(TaskRow.dispatch)
)
"""A never-published task's first dispatch, taken by one publisher only."""


class AttemptRepository:
    """The worker mode's attempts at each task and their fencing numbers, and the dispatch
    numbers (one per publish to the workers' queue) that start them."""

    def __init__(self, core: LedgerCore) -> None:
        self._core = core

    def queue_for_workers(self, task_id: str) -> int:
        """Hand the task to the workers: ``queued`` (unless it is finished), its dispatch
        number one higher, and no start of this dispatch counted yet.

        Publish ``(task_id, dispatch)`` only after this returns (its transaction committed),
        so that no worker takes the message before the ledger shows the task queued.

        Returns:
            The task's new dispatch number, for the message.

        Raises:
            RecordNotFound: No such task.
        """
        now = utc_now()
        with self._core.write() as session:
            row = session.get(TaskRow, task_id, with_for_update=True)
            if row is None:
                raise RecordNotFound("task", task_id)
            row.dispatch += 1
            row.dispatch_attempts = 0
            row.updated_at = now
            if row.status not in FINISHED_STATUSES:
                row.status = "queued"
            return row.dispatch

    def claim_for_workers(self, task_id: str) -> int | None:
        """Hand a task never published to the workers (``queued``, dispatch 0), as
        :meth:`queue_for_workers` does, unless another process has just done so: of the
        servers and workers that pick the same task in the fair order at once
        (``tasks_to_publish``), one publishes it and the others leave it.

        Returns:
            Its dispatch number (1), for the message; None when it was handed over already
            (or is no longer queued).
        """
        with self._core.write_connection() as connection:
            return connection.execute(
                _CLAIM, {"row_id": task_id, "now": utc_now()}
            ).scalar_one_or_none()

    def begin_attempt(
        self, task_id: str, *, dispatch: int, worker_id: str, max_attempts: int
    ) -> int | None:
        """:meth:`start_attempt`'s attempt number, or None."""
        started = self.start_attempt(
            task_id, dispatch=dispatch, worker_id=worker_id, max_attempts=max_attempts
        )
        return None if started is None else started.number

    def start_attempt(
        self, task_id: str, *, dispatch: int, worker_id: str, max_attempts: int
    ) -> Attempt | None:
        """Begin a worker's attempt at the task for the message of dispatch ``dispatch``, in
        one transaction, and return it with the task as it left it (no read after).

        Args:
            task_id: The task the message names.
            dispatch: The dispatch the message was published for.
            worker_id: Who runs the attempt (the worker process), recorded as the task's
                runner. Its hold has no end: the broker says when a worker is gone, so no
                sweeper takes the task and a cancel waits for the worker (at its next step
                boundary) instead of ending the task at once.
            max_attempts: Starts of one dispatch after which the task is failed instead of
                started again (its workers died on it each time: ``RELAYGRAPH_MAX_ATTEMPTS``).

        Returns:
            The attempt (its number fences every write of its run), the task now
            ``running``. None when the message must be acknowledged and dropped: no such
            task, the task is finished or waits for a person, the message is of an earlier
            dispatch, a cancel waited on the task (now ``cancelled``), or the dispatch was
            started ``max_attempts`` times already (now ``failed``, saying so).
        """
        now = utc_now()
        with self._core.write_connection() as connection:
            begun = connection.execute(
                _START_ATTEMPT,
                {
                    "row_id": task_id,
                    "for_dispatch": dispatch,
                    "max_attempts": max_attempts,
                    "runner": worker_id[:64],
                    "now": now,
                },
            ).first()
        if begun is not None:
            task = task_of_mapping(begun._mapping)
            # Stamped now, so the task had not run before (``started_at`` is set once).
            return Attempt(number=task.attempts, task=task, fresh=task.started_at == now)
        # Not begun as usual: the locked read below says why (and ends the task where it
        # must), in a transaction of its own, as if the statement above had not run.
        with self._core.write() as session:
            row = session.get(TaskRow, task_id, with_for_update=True)
            if row is None or row.dispatch != dispatch or row.status not in STARTABLE:
                return None
            values = abandoned_end(
                row, started=row.dispatch_attempts, max_attempts=max_attempts, runner="worker"
            )
            if values is None:
                fresh = row.started_at is None  # stamped the first time the task runs
                row.attempts += 1
                row.dispatch_attempts += 1
                row.runner_id, row.lease_until = worker_id[:64], None
                apply_status(row, status_values("running", {"stop_reason": None}))
                return Attempt(number=row.attempts, task=task_of_row(row), fresh=fresh)
            apply_status(row, values)
            row.runner_id = row.lease_until = row.cancel_requested_at = None
            seq = add_finish_event(session, task_id, values["status"], values["stop_reason"], now)
            self._core.announce(session, task_id, seq)
            return None

    def attempt_state(self, task_id: str) -> tuple[int, bool] | None:
        """The task's latest attempt, and whether a cancel waits on it; None when there is no
        such task. What a worker's run watches (one indexed read)."""
        return self.attempt_states([task_id]).get(task_id)

    def attempt_states(self, task_ids: Iterable[str]) -> dict[str, tuple[int, bool]]:
        """:meth:`attempt_state` of each task, in one read for every
        :data:`~relaygraph.store._task_rows.IDS_PER_STATEMENT` of them (a task that is gone is
        left out): a worker holding hundreds of attempts watches all that fall due together
        in one read (``runner._lease``)."""
        ids = list(dict.fromkeys(task_ids))
        states: dict[str, tuple[int, bool]] = {}
        with self._core.read_connection() as connection:
            for start in range(0, len(ids), IDS_PER_STATEMENT):
                rows = connection.execute(
                    _ATTEMPT_STATES, {"row_ids": ids[start : start + IDS_PER_STATEMENT]}
                )
                states.update((row[0], (int(row[1]), row[2] is not None)) for row in rows)
        return states
