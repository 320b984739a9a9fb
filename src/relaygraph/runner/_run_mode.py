"""The two ways a :class:`~relaygraph.runner.TaskRunner` holds a task while it runs it.

- :class:`InProcessRun`: the runner takes the task's lease and renews it
  (:class:`LeaseKeeper`); the run shares the process's checkpointer; a run that fails on
  the way lets the lease go, so that another runner may take the task.
- :class:`WorkerAttempt`: a worker's attempt at the task (``Ledger.begin_attempt``), which
  holds it already (:class:`AttemptWatch`); every ledger write carries the attempt, the
  checkpointer is the run's own, fenced by the attempt and checked at each step, and a run
  whose attempt was superseded writes nothing of its end.

``TaskRunner.run`` takes one or the other from its ``attempt`` argument and asks it at each
point where the two differ (:class:`RunMode`), so that no step of the run tests which it is.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from relaygraph.errors import TaskBusy
from relaygraph.runner._checkpoint import open_checkpointer
from relaygraph.runner._fence import CheckpointFence
from relaygraph.runner._lease import AttemptWatch, LeaseKeeper, RunHold
from relaygraph.store import AttemptSuperseded

if TYPE_CHECKING:
    from relaygraph.store import Ledger, LedgerToolJournal, Task

__all__ = ["InProcessRun", "RunMode", "WorkerAttempt"]


class RunMode(Protocol):
    """What differs between a run in process and a worker's attempt, one run at a time."""

    attempt: int | None
    """The fencing number every ledger write of the run carries; None in process."""

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

    def on_write_error(self, error: BaseException) -> None:
        """A ledger write of the run failed with ``error``."""

    def before_stream(self, flush: Callable[[], None]) -> None:
        """Called once the run's start is queued, before its graph runs a step."""

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

    def on_write_error(self, error: BaseException) -> None:
        pass

    def before_stream(self, flush: Callable[[], None]) -> None:
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

    @contextmanager
    def _checkpointer(self, home: Path, flush: Callable[[], None]) -> Iterator[Any]:
        # The run's own checkpointer, fenced by its attempt (on PostgreSQL each write
        # checks it in its own transaction) and checked at each step.
        hold = self.hold
        fence = CheckpointFence(
            task_id=hold.task_id, attempt=hold.attempt, on_cancel=hold.cancelled
        )
        with open_checkpointer(home, shared=False, fence=fence) as checkpointer:
            _check_at_each_step(checkpointer, hold, flush=flush)
            yield checkpointer

    def checkpointer(self, home: Path, *, flush: Callable[[], None]) -> AbstractContextManager[Any]:
        return self._checkpointer(home, flush)

    def on_write_error(self, error: BaseException) -> None:
        # A write the ledger refused for a superseded attempt stops the run at once.
        if isinstance(error, AttemptSuperseded):
            self.hold.supersede(error.current)

    def before_stream(self, flush: Callable[[], None]) -> None:
        # A worker whose attempt was superseded already (it froze before it began) learns
        # it here, before its graph runs a step.
        flush()

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
