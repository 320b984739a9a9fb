"""The two ways a :class:`~relaygraph.runner.TaskRunner` holds a task while it runs it.

- :class:`InProcessRun`: the runner takes the task's lease and renews it
  (:class:`LeaseKeeper`); the run shares the process's checkpointer; a run that fails on
  the way lets the lease go, so that another runner may take the task.
- :class:`WorkerAttempt`: a worker's attempt at the task (``Ledger.begin_attempt``), which
  holds it already (:class:`AttemptWatch`); every ledger write carries the attempt, the
  checkpointer is the run's own, fenced by the attempt and checked at each step, and a run
  whose attempt was superseded writes nothing of its end.

A run takes one or the other from its ``attempt`` option (``RunSteps``) and asks it at each
point where the two differ (:class:`RunMode`), so that no step of the run tests which it is:
on a thread (``TaskRunner.run``) or on an event loop (``TaskRunner.arun``) alike.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from relaygraph.errors import TaskBusy
from relaygraph.runner._checkpoint import async_checkpointer, open_checkpointer
from relaygraph.runner._fence import CheckpointFence
from relaygraph.runner._lease import AttemptWatch, LeaseKeeper, RunHold
from relaygraph.store import AttemptSuperseded

SaveWith = Callable[[Callable[[Any], None]], Awaitable[None]]
"""``EventWriter.asave_with``: writes a run's events so far with more of their transaction
(called with its DBAPI connection)."""

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

    from relaygraph.store import Ledger, LedgerToolJournal, Task

__all__ = ["InProcessRun", "RunMode", "WorkerAttempt"]


class RunMode(Protocol):
    """What differs between a run in process and a worker's attempt, one run at a time."""

    attempt: int | None
    """The fencing number every ledger write of the run carries; None in process."""
    flushes_before_stream: bool
    """Whether the run's start is written before its graph runs a step."""

    def take(self, task: Task, *, leased: bool) -> Task:
        """Make the task this run's (``leased``: it is already). Returns it as taken.

        Raises:
            TaskBusy: Another runner holds the task's lease, or a cancel waits on it.
        """

    def keep(self, task: Task, cancel: threading.Event) -> RunHold:
        """Start looking after the run's hold on ``task``, which sets ``cancel`` when the
        ledger asks for one."""

    def tool_journal(self) -> LedgerToolJournal:
        """The ledger's tool journal for the run (a worker's fenced by its attempt)."""

    def checkpointer(self, home: Path, *, flush: Callable[[], None]) -> AbstractContextManager[Any]:
        """The run's checkpointer; ``flush`` writes the run's events so far."""

    def acheckpointer(
        self,
        home: Path,
        *,
        flush: Callable[[], Awaitable[None]],
        save_with: SaveWith | None = None,
    ) -> AbstractAsyncContextManager[Any]:
        """The run's checkpointer for a run on the running event loop (its async methods);
        ``flush`` writes the run's events so far; ``save_with`` (``EventWriter.asave_with``),
        where given, writes them with more of the same transaction (a worker's step saves
        its checkpoint so)."""

    def on_write_error(self, error: BaseException) -> None:
        """A ledger write of the run failed with ``error``."""

    def after_stream(self, task: Task) -> None:
        """Called once the graph stopped, before anything of the run's end is written.

        Raises:
            AttemptSuperseded: Another attempt has the task.
        """

    def let_go(self, task: Task) -> None:
        """The run failed on the way (its end not written): leave the task to another."""

    def cancels_on_interrupt(self, asked: bool) -> bool:
        """Whether a ``KeyboardInterrupt``/``SystemExit`` ends the task ``cancelled``
        (``asked``: the caller's ``interrupt_cancels``)."""


class InProcessRun:
    """A run under this runner's lease on the task, renewed while it runs."""

    attempt: int | None = None
    flushes_before_stream = False
    hold: RunHold

    def __init__(
        self,
        ledger: Ledger,
        runner_id: str,
        *,
        lease_seconds: float,
        only_from: tuple[str, ...] | None = None,
    ) -> None:
        """
        Args:
            only_from: The statuses the task may have when the run takes its lease (see
                ``TaskRunner.run``).
        """
        self.ledger = ledger
        self.runner_id = runner_id
        self.lease_seconds = lease_seconds
        self.only_from = only_from

    def take(self, task: Task, *, leased: bool) -> Task:
        # A task just recorded under this runner's lease is not taken again.
        return task if leased else self._take(task)

    def keep(self, task: Task, cancel: threading.Event) -> RunHold:
        self.hold = LeaseKeeper(
            self.ledger, task.id, self.runner_id, seconds=self.lease_seconds, cancel=cancel
        )
        return self.hold

    def _take(self, task: Task) -> Task:
        only_from = self.only_from
        statuses = {} if only_from is None else {"only_from": only_from}
        taken = self.ledger.take_lease(
            task.id, self.runner_id, seconds=self.lease_seconds, **statuses
        )
        if taken is None:
            if self.ledger.cancel_requested(task.id):
                raise TaskBusy(task.id, "a cancel waits on it")
            holder, until = self.ledger.lease_of(task.id)
            if holder is None and only_from == ("queued",):
                first = self.ledger.active_task_on_thread(
                    task.thread_id, project_id=task.project_id
                )
                if first is not None and first.id != task.id:
                    raise TaskBusy(task.id, f"task {first.id} of its thread runs first")
            if holder is None:
                wanted = " or ".join(only_from) if only_from else "unfinished"
                raise TaskBusy(task.id, f"it is not {wanted} any more")
            raise TaskBusy(task.id, f"runner {holder} holds it until {until}")
        return taken

    def tool_journal(self) -> LedgerToolJournal:
        return self.ledger.tool_journal

    def checkpointer(self, home: Path, *, flush: Callable[[], None]) -> AbstractContextManager[Any]:
        # The process's open checkpointer: the lease keeps the task to this run.
        return open_checkpointer(home, shared=True)

    def acheckpointer(
        self,
        home: Path,
        *,
        flush: Callable[[], Awaitable[None]],
        save_with: SaveWith | None = None,
    ) -> AbstractAsyncContextManager[Any]:
        # The loop's open checkpointer, as on a thread.
        return async_checkpointer(home)

    def on_write_error(self, error: BaseException) -> None:
        pass

    def after_stream(self, task: Task) -> None:
        pass

    def let_go(self, task: Task) -> None:
        self.ledger.release_lease(task.id, self.runner_id)

    def cancels_on_interrupt(self, asked: bool) -> bool:
        return asked


class WorkerAttempt:
    """A worker's attempt at the task, which the worker began (``Ledger.begin_attempt``):
    no lease is taken, and the run stops at once when the task goes on to another attempt."""

    hold: AttemptWatch
    flushes_before_stream = True
    """A worker whose attempt was superseded already (it froze before it began) learns it
    when its start is written, before its graph runs a step."""

    def __init__(self, ledger: Ledger, attempt: int) -> None:
        self.ledger = ledger
        self.attempt: int | None = attempt
        self.number = attempt

    def take(self, task: Task, *, leased: bool) -> Task:
        return task

    def keep(self, task: Task, cancel: threading.Event) -> RunHold:
        self.hold = AttemptWatch(self.ledger, task.id, self.number, cancel=cancel)
        return self.hold

    def tool_journal(self) -> LedgerToolJournal:
        return self.ledger.attempt_journal(self.number)

    def _fence(self) -> CheckpointFence:
        hold = self.hold
        return CheckpointFence(
            task_id=hold.task_id,
            attempt=hold.attempt,
            on_cancel=hold.cancelled,
            on_superseded=hold.supersede,
        )

    @contextmanager
    def _checkpointer(self, home: Path, flush: Callable[[], None]) -> Iterator[Any]:
        # The run's own checkpointer, fenced by its attempt (on PostgreSQL each write
        # checks it in its own transaction) and checked at each step.
        with open_checkpointer(home, shared=False, fence=self._fence()) as checkpointer:
            _check_at_each_step(checkpointer, self.hold, flush=flush)
            yield checkpointer
            from relaygraph.runner._fenced_saver import FencedPostgresSaver

            if isinstance(checkpointer, FencedPostgresSaver):
                checkpointer.save_kept()  # As on the loop (see _acheckpointer).

    def checkpointer(self, home: Path, *, flush: Callable[[], None]) -> AbstractContextManager[Any]:
        return self._checkpointer(home, flush)

    @asynccontextmanager
    async def _acheckpointer(
        self, home: Path, flush: Callable[[], Awaitable[None]], save_with: SaveWith | None
    ) -> AsyncIterator[Any]:
        # A saver of the run's own on the loop's shared connections, fenced by its attempt
        # (on PostgreSQL each write checks it in its own transaction, on a connection of the
        # pool held for that write only; a step's checkpoint in its events' transaction) and
        # checked at each step.
        async with async_checkpointer(home) as shared:
            checkpointer = _fenced_on_loop(shared, self._fence())
            _acheck_at_each_step(checkpointer, self.hold, flush=flush, save_with=save_with)
            yield checkpointer
            from relaygraph.runner._fenced_saver import AsyncFencedPostgresSaver

            if isinstance(checkpointer, AsyncFencedPostgresSaver):
                # What the run's last step kept and nothing read since (its state at the
                # end reads, and saves them first).
                await checkpointer.asave_kept()

    def acheckpointer(
        self,
        home: Path,
        *,
        flush: Callable[[], Awaitable[None]],
        save_with: SaveWith | None = None,
    ) -> AbstractAsyncContextManager[Any]:
        return self._acheckpointer(home, flush, save_with)

    def on_write_error(self, error: BaseException) -> None:
        # A write the ledger refused for a superseded attempt stops the run at once.
        if isinstance(error, AttemptSuperseded):
            self.hold.supersede(error.current)

    def after_stream(self, task: Task) -> None:
        if self.hold.lost.is_set():
            # Another attempt has the task: nothing of this one's end is written.
            raise AttemptSuperseded(task.id, self.hold.attempt, self.hold.current)

    def let_go(self, task: Task) -> None:
        # The attempt is the worker's: its broker gives the task to the next one.
        pass

    def cancels_on_interrupt(self, asked: bool) -> bool:
        return False


def _check_at_each_step(
    checkpointer: Any, hold: AttemptWatch, *, flush: Callable[[], None]
) -> None:
    """Make ``checkpointer`` (this run's own) write each step's events first and stop at an
    attempt that was superseded or a cancel, at each step's checkpoint, which under sync
    durability is the step boundary, before the next step starts (in the team graph and in
    each agent's subgraph alike): a cancel drains the run right there, and an attempt that
    was superseded saves nothing more and stops.

    The step's events are written first (``flush``): a checkpoint saved before its step's
    events would, if the worker died in between, let the next attempt go on past a step
    whose events the ledger never got (a tool call left pending for good).

    A fenced checkpointer (PostgreSQL, ``FencedPostgresSaver``) reads the task's attempt
    and cancel flag in each write's own transaction and tells ``hold`` of a cancel (its
    fence's ``on_cancel``), so no read is made here: a worker's run made one per step (13
    per relay task, about a tenth of a pool process's CPU). Any other asks ``hold`` first.
    """
    from relaygraph.runner._fenced_saver import FencedPostgresSaver

    save = checkpointer.put
    fenced = isinstance(checkpointer, FencedPostgresSaver)

    def put(config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        flush()
        if not fenced and not hold.check():
            raise AttemptSuperseded(hold.task_id, hold.attempt, hold.current)
        return save(config, checkpoint, metadata, new_versions)

    checkpointer.put = put


def _fenced_on_loop(shared: Any, fence: CheckpointFence) -> Any:
    """A saver of one attempt's own on the connections of the loop's ``shared`` saver: on
    PostgreSQL an ``AsyncFencedPostgresSaver`` on its pool; else (SQLite, where nothing is
    fenced) a saver of the same kind on the same connection and lock, whose ``aput`` the
    run may wrap without touching the other runs' saver."""
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    from relaygraph.runner._fenced_saver import AsyncFencedPostgresSaver

    if isinstance(shared, AsyncPostgresSaver):
        # The loop's savers are made on a pool (checkpoint._open_async_postgres).
        return AsyncFencedPostgresSaver(cast("AsyncConnectionPool[Any]", shared.conn), fence=fence)
    own = type(shared)(shared.conn)
    own.lock = shared.lock
    own.is_setup = True
    return own


def _acheck_at_each_step(
    checkpointer: Any,
    hold: AttemptWatch,
    *,
    flush: Callable[[], Awaitable[None]],
    save_with: SaveWith | None = None,
) -> None:
    """:func:`_check_at_each_step` for a run on the event loop (the saver's ``aput``); an
    unfenced saver's check reads the ledger off the loop.

    A fenced saver with ``save_with`` saves each step's checkpoint in the transaction of
    the step's events (``AsyncFencedPostgresSaver.put_in``), on the ledger's write thread:
    one fenced commit a step where there were two, and the events are as sure to be written
    before their checkpoint as when flushed first. A save that fails for its values (one
    that does not serialize), not for the database, leaves the events to commit and is
    raised here, as the saver's own ``aput`` would raise it."""
    from relaygraph.runner._fenced_saver import AsyncFencedPostgresSaver

    save = checkpointer.aput
    fenced = isinstance(checkpointer, AsyncFencedPostgresSaver)
    if fenced and save_with is not None:
        import psycopg

        async def aput_with_events(
            config: Any, checkpoint: Any, metadata: Any, new_versions: Any
        ) -> Any:
            saved: dict[str, Any] = {}

            def also(connection: Any) -> None:
                try:
                    saved["config"] = checkpointer.put_in(
                        connection, config, checkpoint, metadata, new_versions
                    )
                except (AttemptSuperseded, psycopg.Error):
                    raise  # The transaction's: the events are not written either.
                except Exception as exc:
                    saved["error"] = exc

            await save_with(also)
            if "error" in saved:
                raise saved["error"]
            return saved["config"]

        checkpointer.aput = aput_with_events
        return

    async def aput(config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        await flush()
        if not fenced and not await asyncio.to_thread(hold.check):
            raise AttemptSuperseded(hold.task_id, hold.attempt, hold.current)
        return await save(config, checkpoint, metadata, new_versions)

    checkpointer.aput = aput
