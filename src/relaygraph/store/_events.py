"""Events and the rows they imply (handoffs, tool calls, approvals), read back in order."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import bindparam, select, update

from relaygraph.store import _validate as check
from relaygraph.store._core import LedgerCore
from relaygraph.store._models import (
    ApprovalRow,
    EventRow,
    HandoffRow,
    TaskRow,
    ToolCallRow,
)
from relaygraph.store._records import (
    Approval,
    Event,
    HandoffEntry,
    ToolCall,
    snapshot,
)
from relaygraph.store._task_rows import add_events, attempt_refusal, utc_now
from relaygraph.store._usage_records import RunEnd, end_run_in

_NEXT_SEQS = (
    update(TaskRow)
    .where(TaskRow.id == bindparam("row_id"))
    .values(last_event_seq=TaskRow.last_event_seq + bindparam("count"), updated_at=bindparam("now"))
    .returning(TaskRow.last_event_seq)
)
_NEXT_SEQS_FENCED = _NEXT_SEQS.where(TaskRow.attempts == bindparam("attempt"))


class EventRepository:
    """Events and the rows they imply (handoffs, tool calls, approvals), read back in order."""

    def __init__(self, core: LedgerCore) -> None:
        self._core = core

    def append_event(
        self, task_id: str, event: Mapping[str, Any], *, attempt: int | None = None
    ) -> int:
        """Record the task's next event and the rows it implies; returns its sequence number.

        A ``route`` or ``handoff`` adds a handoff row; ``tool_call`` and ``tool_result`` a
        tool-call row; an ``interrupted`` event an approval request and ``approval`` its
        outcome; ``agent_finished`` adds the visit's usage to the agent's total.

        Raises:
            ConfigError: The event is not a JSON object with a ``type``.
            RecordNotFound: No such task.
            AttemptSuperseded: See :meth:`append_events`.
        """
        return self.append_events(task_id, [event], attempt=attempt)[0]

    def append_events(
        self,
        task_id: str,
        events: Sequence[Mapping[str, Any]],
        *,
        attempt: int | None = None,
        end: RunEnd | None = None,
        also: Callable[[Any], None] | None = None,
    ) -> list[int]:
        """Record the task's next events, in order, in one transaction (see
        :meth:`append_event`); returns their sequence numbers.

        A running task's events are written in batches: one transaction per batch instead
        of one per event is most of what the ledger costs a run. With a notice channel
        (``Ledger(notify_channel=...)``) on PostgreSQL, the same transaction announces the
        task's last sequence number to every listener when it commits.

        Args:
            attempt: The worker's attempt that writes (its fencing number): the events are
                written only while the task is still on that attempt. None: unfenced (the
                in-process runner, which holds a lease instead).
            end: The run's end, written in the same transaction after the events (as
                :meth:`end_run` with these arguments): a run's last batch and its end
                commit together, one transaction less per run.
            also: More of the same transaction, after the events and the end: called with
                the transaction's DBAPI connection (psycopg's, on PostgreSQL), whose
                statements commit or roll back with the events (a worker's step saves its
                checkpoint so: ``runner._fenced_saver``). Called with no events too. What
                it raises rolls the transaction back and is raised here.

        Raises:
            ConfigError: An event is not a JSON object with a ``type``, or ``end`` is not
                valid; nothing is written.
            RecordNotFound: No such task.
            AttemptSuperseded: The task is on another attempt than ``attempt``; nothing is
                written.
        """
        batch = [check.event_data(event) for event in events]
        values = None if end is None or end.status is None else end.status_values()
        if not batch and end is None and also is None:
            return []
        now = utc_now()
        # SQLAlchemy Core, statements built once (see store/_derive.py): the writer's thread
        # takes the interpreter's lock from the graph's for as long as a batch takes.
        with self._core.write_connection() as connection:
            # The update locks the task's row until commit, so concurrent appends to one
            # task take their sequence numbers (and commit) strictly one after another; the
            # attempt is checked on the row it locks, so a new attempt that begins
            # meanwhile waits for this write, or this write is refused.
            if not batch:
                seqs: list[int] = []
            else:
                params = {"row_id": task_id, "count": len(batch), "now": now}
                if attempt is None:
                    last = connection.execute(_NEXT_SEQS, params).scalar()
                else:
                    last = connection.execute(
                        _NEXT_SEQS_FENCED, {**params, "attempt": attempt}
                    ).scalar()
                if last is None:
                    raise attempt_refusal(connection, task_id, attempt)
                first = last - len(batch) + 1
                add_events(connection, task_id, first, batch, now)
                seqs = list(range(first, last + 1))
            if end is not None:
                end_run_in(
                    connection,
                    task_id,
                    usage=end.usage,
                    runner_id=end.runner_id,
                    values=values,
                    attempt=attempt,
                    now=now,
                )
            if seqs:
                self._core.announce(connection, task_id, seqs[-1])
            if also is not None:
                also(connection.connection.driver_connection)
        return seqs

    def events_after(
        self, task_id: str, after_seq: int = 0, *, limit: int | None = None
    ) -> list[Event]:
        """The task's events with a sequence number above ``after_seq``, in order."""
        query = (
            select(EventRow)
            .where(EventRow.task_id == task_id, EventRow.seq > after_seq)
            .order_by(EventRow.seq)
        )
        if limit is not None:
            query = query.limit(limit)
        with self._core.read() as session:
            return [snapshot(Event, row) for row in session.scalars(query)]

    def handoffs(self, task_id: str) -> list[HandoffEntry]:
        """Every transfer of work in the task, in order."""
        query = select(HandoffRow).where(HandoffRow.task_id == task_id).order_by(HandoffRow.seq)
        return self._core.snapshots(HandoffEntry, query)

    def tool_calls(self, task_id: str) -> list[ToolCall]:
        """The task's tool calls, in the order they were made."""
        query = select(ToolCallRow).where(ToolCallRow.task_id == task_id)
        return self._core.snapshots(ToolCall, query.order_by(ToolCallRow.id))

    def approvals(self, task_id: str) -> list[Approval]:
        """The task's pauses for a person, oldest first, decided or not."""
        query = select(ApprovalRow).where(ApprovalRow.task_id == task_id)
        return self._core.snapshots(Approval, query.order_by(ApprovalRow.id))
