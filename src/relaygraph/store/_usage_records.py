"""Usage per role per task, and the end of a run (usage, status, lease: one transaction)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from sqlalchemy import Connection, bindparam, select, update

from relaygraph.errors import ConfigError
from relaygraph.store import _usage
from relaygraph.store import _validate as check
from relaygraph.store._core import LedgerCore
from relaygraph.store._errors import AttemptSuperseded, RecordNotFound
from relaygraph.store._models import (
    TaskRow,
    UsageRow,
)
from relaygraph.store._records import (
    FINISHED_STATUSES,
    AgentUsage,
)
from relaygraph.store._task_rows import (
    apply_status,
    status_values,
    utc_now,
)


@dataclass(frozen=True, kw_only=True, slots=True)
class RunEnd:
    """What a run writes when it ends, given to ``Ledger.append_events(end=...)`` with the
    run's last events (the arguments of :meth:`UsageRepository.end_run`, which says what each
    does; the attempt is the batch's)."""

    usage: Sequence[Mapping[str, Any]] = ()
    runner_id: str | None = None
    status: str | None = None
    answer: str | None = None
    stop_reason: str | None = None

    def status_values(self) -> dict[str, Any]:
        """The task's columns the status sets (ConfigError when not valid)."""
        assert self.status is not None
        return status_values(self.status, {"answer": self.answer, "stop_reason": self.stop_reason})


class UsageRepository:
    """Usage per role per task, and the end of a run (usage, status, lease: one transaction)."""

    def __init__(self, core: LedgerCore) -> None:
        self._core = core

    def usage(self, task_id: str) -> list[AgentUsage]:
        """The task's usage, one entry per role."""
        query = select(UsageRow).where(UsageRow.task_id == task_id).order_by(UsageRow.agent)
        return self._core.snapshots(AgentUsage, query)

    def record_usage(
        self,
        task_id: str,
        records: Iterable[Mapping[str, Any]],
        *,
        attempt: int | None = None,
    ) -> None:
        """Store usage records (:class:`relaygraph.events.Usage`) of the task, each in its
        role's row in place of the record of the same id.

        The runner stores the records its events carry as they come (``append_events``);
        this is for the others: what a visit in progress spent when its run stopped (the
        visit's own record replaces it once it finishes), or records made outside a run.

        Args:
            attempt: The worker's attempt that writes: the records are stored only while
                the task is still on it (see ``append_events``). None: unfenced.

        Raises:
            ConfigError: A record that is not a mapping, names no role, or whose figures
                are not numbers.
            RecordNotFound: No such task.
            AttemptSuperseded: The task is on another attempt than ``attempt``.
        """
        now = utc_now()
        with self._core.write_connection() as connection:
            # The update locks the task's row (rolled back on a refusal).
            current = connection.execute(_LOCK_TASK, {"row_id": task_id, "now": now}).scalar()
            if current is None:
                raise RecordNotFound("task", task_id)
            if attempt is not None and current != attempt:
                raise AttemptSuperseded(task_id, attempt, current)
            _store_records(connection, task_id, records, now)

    def end_run(
        self,
        task_id: str,
        *,
        usage: Iterable[Mapping[str, Any]] = (),
        runner_id: str | None = None,
        status: str | None = None,
        attempt: int | None = None,
        **fields: str | None,
    ) -> None:
        """What a run writes when it ends, in one transaction: the usage records of the
        visits still in progress (as :meth:`record_usage`; the finished nodes' came with
        their events), the task's ``status`` with its ``answer`` or ``stop_reason``
        (as :meth:`set_status`; None leaves it, as for a run that was suspended), and
        ``runner_id``'s lease given up (as :meth:`release_lease`).

        Args:
            attempt: The worker's attempt whose run ended: nothing is written unless the
                task is still on it; the worker's hold on the task ends with it. None:
                unfenced (the in-process runner, whose lease ``runner_id`` names).

        Raises:
            ConfigError: An unknown status or field, or a usage record that is not valid.
            RecordNotFound: No such task.
            AttemptSuperseded: The task is on another attempt than ``attempt``; nothing is
                written.
        """
        values = status_values(status, fields) if status is not None else None
        # SQLAlchemy Core, statements built once: every run ends here, on a thread that
        # shares the interpreter with the graphs.
        with self._core.write_connection() as connection:
            end_run_in(
                connection,
                task_id,
                usage=usage,
                runner_id=runner_id,
                values=values,
                attempt=attempt,
                now=utc_now(),
            )

    def usage_for_project(
        self, project_id: str, since: datetime | None = None, until: datetime | None = None
    ) -> dict[str, Any]:
        """What the project's tasks created in ``[since, until)`` used, per role and in total.

        Returns:
            ``{"project_id", "since", "until", "tasks", "total": {...}, "agents": {role: {...}}}``
            where each usage entry has model and tool calls, input and output tokens,
            ``cost_usd``, ``seconds`` and ``estimated``; times are ISO 8601 or None.

        Raises:
            ConfigError: ``since`` or ``until`` has no time zone, or ``since`` is later.
        """
        start = check.aware(since, "since")
        end = check.aware(until, "until")
        if start is not None and end is not None and start > end:
            raise ConfigError(f"since {start.isoformat()!r} is after until {end.isoformat()!r}")
        with self._core.read() as session:
            usage = _usage.project_usage(session, project_id, start, end)
        return {
            "project_id": project_id,
            "since": start.astimezone(UTC).isoformat() if start else None,
            "until": end.astimezone(UTC).isoformat() if end else None,
            **usage,
        }


_RUN_END = (
    "status",
    "answer",
    "stop_reason",
    "attempts",
    "runner_id",
    "lease_until",
    "cancel_requested_at",
    "started_at",
    "finished_at",
    "updated_at",
)
"""The task's columns that the end of a run may change."""
_RUN_END_STATE = (
    select(*(getattr(TaskRow, name) for name in _RUN_END))
    .where(TaskRow.id == bindparam("row_id"))
    .with_for_update()
)
_END_RUN = (
    update(TaskRow)
    .where(TaskRow.id == bindparam("row_id"))
    .values({name: bindparam(name) for name in _RUN_END})
)
_LOCK_TASK = (
    update(TaskRow)
    .where(TaskRow.id == bindparam("row_id"))
    .values(updated_at=bindparam("now"))
    .returning(TaskRow.attempts)
)


def _store_records(
    connection: Connection, task_id: str, records: Iterable[Mapping[str, Any]], now: datetime
) -> None:
    rows = _usage.UsageRows(connection, task_id)
    for i, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise ConfigError(f"usage[{i}] {record!r} must be a usage record (a mapping)")
        rows.add_record(record, where=f"usage[{i}]")
    rows.write(now)


def _not_this_runners(row: Any, runner_id: str) -> bool:
    """Whether the task moved on from ``runner_id``'s run: another runner holds it, or it
    already ended (the sweeper settled it abandoned, a cancel ended it while no lease was
    held)."""
    held_by_another = row.runner_id is not None and row.runner_id != runner_id
    return held_by_another or row.status in FINISHED_STATUSES


def end_run_in(
    connection: Connection,
    task_id: str,
    *,
    usage: Iterable[Mapping[str, Any]],
    runner_id: str | None,
    values: Mapping[str, Any] | None,
    attempt: int | None,
    now: datetime,
) -> None:
    """:meth:`UsageRepository.end_run` in ``connection``'s transaction; ``values`` are the
    status's (``status_values``), None to leave the status as it is."""
    found = connection.execute(_RUN_END_STATE, {"row_id": task_id}).first()
    if found is None:
        raise RecordNotFound("task", task_id)
    if attempt is not None and found.attempts != attempt:
        raise AttemptSuperseded(task_id, attempt, found.attempts)
    _store_records(connection, task_id, usage, now)
    row = SimpleNamespace(**found._mapping)
    row.updated_at = now
    stale = attempt is None and runner_id is not None and _not_this_runners(row, runner_id)
    if stale:
        # A run whose lease lapsed while it went on (a long stall): the task went on
        # without it. Its usage was spent and is recorded; its end is not the task's.
        values = None
    if values is not None:
        apply_status(row, values)
    if attempt is not None or (runner_id is not None and row.runner_id == runner_id):
        row.runner_id = row.lease_until = None
    if attempt is None and not stale:
        # The run ended on its own (finished, paused or stopped cleanly): the next start
        # is not a retry after a crash. (A worker's attempt number is its fencing number
        # and never goes back: the next dispatch counts its starts in dispatch_attempts.)
        row.attempts = 0
    if row.cancel_requested_at is not None and row.status == "interrupted":
        # A cancel asked for while the run went on to a pause: it is not waited on.
        apply_status(row, status_values("cancelled", {"stop_reason": "cancelled by request"}))
    if row.status in FINISHED_STATUSES:
        row.cancel_requested_at = None
    connection.execute(
        _END_RUN, {"row_id": task_id, **{name: getattr(row, name) for name in _RUN_END}}
    )
