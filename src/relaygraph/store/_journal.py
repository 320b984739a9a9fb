"""The tool journal: each tool call that completed, with the result the graph received.

A tool's side effects (code run, a file written, an artifact saved) happen outside the
graph; its result reaches the checkpoint only with its step's writes. The journal closes the
gap: the agents' journal middleware (``relaygraph.agents._journal``) writes a completed
call's record here before the result returns into the graph, and a step re-run after a crash
finds it and answers the call without running the tool again. The ledger keeps the record as
given (a JSON object of the middleware's own shape) and reads nothing in it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import bindparam, insert, select
from sqlalchemy.exc import IntegrityError

from relaygraph.store import _validate as check
from relaygraph.store._core import LedgerCore
from relaygraph.store._errors import AttemptSuperseded, RecordNotFound
from relaygraph.store._models import TaskRow, ToolJournalRow
from relaygraph.store._task_rows import utc_now

__all__ = ["LedgerToolJournal", "ToolJournalRepository"]


class ToolJournalRepository:
    """The tool journal's rows: one per completed call of a task, never changed."""

    def __init__(self, core: LedgerCore) -> None:
        self._core = core

    def journaled_call(self, task_id: str, call_id: str) -> dict[str, Any] | None:
        """The record of the task's call ``call_id``; None if it never completed."""
        # SQLAlchemy Core, statements built once: a read (and a write) on every tool call
        # of a run, on the graph's thread.
        with self._core.read_connection() as connection:
            record = connection.scalar(_RECORD_OF, {"task_id": task_id, "call_id": call_id})
        return dict(record) if record is not None else None

    def check_attempt(self, task_id: str, attempt: int) -> None:
        """Raise unless the task is still on the worker's ``attempt``: asked before each of
        the attempt's tool calls runs, so that a worker that froze and woke after the task
        went on to another attempt changes no file of the task's workspace.

        Raises:
            RecordNotFound: No such task.
            AttemptSuperseded: The task is on another attempt than ``attempt``.
        """
        with self._core.read_connection() as connection:
            current = connection.execute(_ATTEMPTS, {"task_id": task_id}).scalar()
        _refuse_unless_on(task_id, attempt, current)

    def journal_call(
        self,
        task_id: str,
        call_id: str,
        record: Mapping[str, Any],
        *,
        attempt: int | None = None,
    ) -> dict[str, Any]:
        """Record that the task's call ``call_id`` completed, in one committed transaction.

        The first record of a call stays: recording it again (a worker that was only
        frozen finishing the call after another took the task over) changes nothing and
        returns the first one, which the caller then answers with.

        Args:
            task_id: The task the call belongs to.
            call_id: The tool call's id, as the model gave it.
            record: What to keep, a JSON object.
            attempt: The worker's attempt whose call completed: recorded only while the
                task is still on it (see ``Ledger.append_events``). None: unfenced.

        Returns:
            The call's record: ``record``, or the one recorded first.

        Raises:
            ConfigError: A blank or too long call id, or a record that is not a JSON object.
            RecordNotFound: No such task.
            AttemptSuperseded: The task is on another attempt than ``attempt``.
        """
        call = check.text(call_id, "call_id", max_chars=check.MAX_KEY_CHARS)
        kept = check.json_object(record, "record")
        ids = {"task_id": task_id, "call_id": call}
        try:
            with self._core.write_connection() as connection:
                if attempt is not None:
                    # A fenced record locks the task's row, as a new attempt's start does:
                    # the two cannot interleave.
                    current = connection.execute(_ATTEMPTS_LOCKED, {"task_id": task_id}).scalar()
                    _refuse_unless_on(task_id, attempt, current)
                # No read first: the primary key refuses a second record of the call, and
                # unfenced, the task's foreign key says whether it exists (two statements
                # less on every tool call of a run).
                connection.execute(_ADD_RECORD, {**ids, "record": kept, "created_at": utc_now()})
            return kept
        except IntegrityError:
            # The call has a record already (another attempt, or a step that ran again,
            # recorded it first): that one stays. Or there is no such task.
            earlier_record = self.journaled_call(task_id, call)
            if earlier_record is not None:
                return earlier_record
            with self._core.read_connection() as connection:
                if connection.execute(_ATTEMPTS, {"task_id": task_id}).first() is None:
                    raise RecordNotFound("task", task_id) from None
            raise

    @property
    def tool_journal(self) -> LedgerToolJournal:
        """These records as a task's tool journal (``TaskContext.tool_journal``), unfenced: a
        new one at each call, one per run (it keeps what its run recorded)."""
        return LedgerToolJournal(self)

    def attempt_journal(self, attempt: int) -> LedgerToolJournal:
        """These records as the tool journal of a worker's ``attempt``: its records are
        refused (``AttemptSuperseded``) once the task is on another attempt."""
        return LedgerToolJournal(self, attempt)


_RECORD_OF = select(ToolJournalRow.record).where(
    ToolJournalRow.task_id == bindparam("task_id"), ToolJournalRow.call_id == bindparam("call_id")
)
_ATTEMPTS = select(TaskRow.attempts).where(TaskRow.id == bindparam("task_id"))
_ATTEMPTS_LOCKED = _ATTEMPTS.with_for_update()
_ADD_RECORD = insert(ToolJournalRow)


def _refuse_unless_on(task_id: str, attempt: int, current: int | None) -> None:
    """Raise unless the task (whose attempt is ``current``, None: no such task) is on
    ``attempt``: ``RecordNotFound`` or ``AttemptSuperseded``."""
    if current is None:
        raise RecordNotFound("task", task_id)
    if current != attempt:
        raise AttemptSuperseded(task_id, attempt, current)


class LedgerToolJournal:
    """The ledger seen through ``relaygraph.agents.ToolJournal``'s two methods, for one run.

    A run that starts its task from the request (:meth:`starts_empty`) knows the ledger
    holds no record of the task's calls: a record follows the checkpoint of the step that
    made the call (the runner writes checkpoints before the next step, ``durability="sync"``),
    and such a run found none of the task's. Its reads are then answered from the records
    this journal made (a step LangGraph runs again within the run finds them), not from the
    ledger, so the graph's thread does not wait for the ledger on every read.
    A stale attempt that wakes cannot add records meanwhile: its writes are fenced.

    A worker's attempt's journal (``attempt``) also asks the ledger at each :meth:`get`,
    which the journal middleware makes before the call runs, whether the task is still on
    the attempt (:meth:`ToolJournalRepository.check_attempt`): a stale attempt's tool never
    runs, and the workspace it would change is the new attempt's. A call already running
    when the task moved on is not stopped by this; its record is refused.
    """

    __slots__ = ("_made", "attempt", "records")

    def __init__(self, records: ToolJournalRepository, attempt: int | None = None) -> None:
        self.records = records
        """The ledger's journal rows this journal reads and adds to."""
        self.attempt = attempt
        """The worker's attempt whose records these are (the fence); None: unfenced."""
        self._made: dict[str, dict[str, dict[str, Any]]] = {}
        """Per task that :meth:`starts_empty`: the records made since, by call id."""

    def starts_empty(self, task_id: str) -> None:
        """The run starts ``task_id`` from its request: no record of it is in the ledger."""
        self._made.setdefault(task_id, {})

    def get(self, task_id: str, call_id: str) -> dict[str, Any] | None:
        if self.attempt is not None:
            self.records.check_attempt(task_id, self.attempt)
        made = self._made.get(task_id)
        if made is not None:
            return made.get(call_id)
        return self.records.journaled_call(task_id, call_id)

    def put(self, task_id: str, call_id: str, record: Mapping[str, Any]) -> dict[str, Any]:
        kept = self.records.journal_call(task_id, call_id, record, attempt=self.attempt)
        made = self._made.get(task_id)
        if made is not None:
            made[call_id] = kept
        return kept
