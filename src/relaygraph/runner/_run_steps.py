"""What a run of :class:`~relaygraph.runner.TaskRunner` is asked for (:class:`RunOptions`), and
the steps of a run that its two drivers share (:class:`RunSteps`): ``TaskRunner.run`` takes
them on its thread, ``TaskRunner.arun`` on the running event loop, and neither tests which
mode (in process or a worker's attempt) the run is in."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypedDict

from relaygraph.errors import NoRoomOnDisk
from relaygraph.runner._no_room import UnrecordedFailures, no_room_reason
from relaygraph.runner._run_mode import RunMode
from relaygraph.runner._task_run import INTERRUPTED, EventHandler, StreamEnd, TaskRun
from relaygraph.store import LedgerToolJournal, is_disk_full

if TYPE_CHECKING:
    from relaygraph.runner._result import RunResult
    from relaygraph.store import Ledger, Task
    from relaygraph.team import Team

__all__ = ["RunOptions", "RunSteps"]


class RunOptions(TypedDict, total=False):
    """How ``TaskRunner.run`` (or ``arun``) runs a task; every key may be left out."""

    on_event: EventHandler | None
    """Also called with each event, after the ledger has it."""
    stream_tokens: bool
    """Emit ``token`` events (not stored in the ledger)."""
    cancel: threading.Event | None
    """When set, the run stops at the next step boundary, status ``cancelled``."""
    stop: threading.Event | None
    """When set (the server is shutting down), the run stops at the next step boundary and
    stays ``running``, so that a restarted server continues it
    (:data:`~relaygraph.runner.CONTINUE`); the result's status is then ``running``."""
    identity: Mapping[str, str] | None
    """Who asked (project, user): goes into ``config["configurable"]``, never into graph
    state."""
    callbacks: list[Any] | None
    """LangChain callback handlers added to the graph call (tracing)."""
    team: Team | None
    """The task's team; when None, the team the task records (``TaskRunner.recorded_team``)."""
    models: Mapping[str, Any] | None
    """Each role's model spec or chat model, when the process has objects the task's record
    only names; else the task's ``models``."""
    attempt: int | None
    """A worker's attempt at the task (``Ledger.begin_attempt``), which holds it already: no
    lease is taken; every ledger write of the run (events, usage, status, the tool journal,
    the checkpoints) carries the attempt, and the run stops at once when the task is on
    another attempt. The ledger's cancel flag is watched (the run stops at the next step
    boundary, ``cancelled``). None: the run takes the task's lease (in process)."""
    leased: bool
    """``task`` was just recorded under this runner's lease (``Intake.runner_id``,
    ``SubmittedTask.leased``), and nothing ran it since: the run does not take the lease
    again."""
    only_from: tuple[str, ...] | None
    """The statuses the task may have when the run takes its lease (in process):
    ``("queued",)`` for a task that must not have started yet (a server starting a queued
    task: one take, not a check and a take), and that is its thread's oldest active task
    (see ``Ledger.take_lease``)."""
    interrupt_cancels: bool
    """A ``KeyboardInterrupt`` or ``SystemExit`` that stops the run (the process it runs in
    is being stopped: ``relaygraph run`` stopped twice) ends the task ``cancelled``, saying
    so, instead of leaving it ``running`` with no runner to continue it. In process, on a
    thread (``run``) only."""


class RunSteps:
    """One run's steps around its graph's stream, and what its end must do: shared by
    ``TaskRunner.run`` and ``TaskRunner.arun``, which differ only in how they wait.

    Args:
        task: The ledger's task record.
        options: The run's :class:`RunOptions`.
        mode: How the run holds the task (in process, or a worker's attempt).
        prepare: Takes the task and prepares its run: returns the run and the team's
            compiled graph (``TaskRunner._prepare``).
        ledger: The runner's ledger.
        unrecorded_failures: Where a run stopped by a full disk has its failure written.
    """

    run: TaskRun
    """The prepared run (after :meth:`prepare`)."""
    graph_input: Any
    """What the graph streams from (after :meth:`begin`)."""

    def __init__(
        self,
        task: Task,
        options: RunOptions,
        *,
        mode: RunMode,
        prepare: Callable[[Task, RunMode, RunOptions], tuple[TaskRun, Any]],
        ledger: Ledger,
        unrecorded_failures: UnrecordedFailures,
    ) -> None:
        self.task = task
        self.options = options
        self.tokens = options.get("stream_tokens", False)
        self.mode = mode
        self._prepare = prepare
        self._ledger = ledger
        self._unrecorded_failures = unrecorded_failures
        self.ended = False
        """The run's end is written: nothing is let go."""
        self._interrupted = False
        self._no_room = False
        self._graph_team: Any = None

    def prepare(self) -> None:
        """Take the task and prepare the run: blocking.

        Raises:
            TaskBusy: Another runner holds the task's lease, or a cancel waits on it.
            RelaygraphError: The run could not be prepared; the task failed (recorded).
        """
        self.run, self._graph_team = self._prepare(self.task, self.mode, self.options)
        self.task = self.run.task

    def graph(self, checkpointer: Any) -> Any:
        """The team's compiled graph on the run's ``checkpointer``."""
        return self._graph_team.copy({"checkpointer": checkpointer})

    def begin(self, graph_input: Any) -> None:
        """The run starts from ``graph_input``: its start event is queued."""
        if isinstance(graph_input, Mapping) and "request" in graph_input:
            # The run starts the task from its request: the ledger has no record of its
            # tool calls (see LedgerToolJournal), so the journal reads none.
            journal = self.run.context.tool_journal
            if isinstance(journal, LedgerToolJournal):
                journal.starts_empty(self.task.id)
        self.run.writer.put(self.run.started_event())
        self.graph_input = graph_input

    def result(self, end: StreamEnd) -> RunResult:
        """The run's result, once its graph stopped (nothing of its end written yet).

        Raises:
            AttemptSuperseded: Another attempt has the task.
        """
        self.mode.after_stream(self.task)
        return self.run.result(end)

    def record_end(self, end: StreamEnd, result: RunResult) -> None:
        """Write the run's end (``result``, from :meth:`result`): blocking. From then on
        nothing is let go (:attr:`ended`)."""
        self.run.record_end(end, result)
        self.ended = True

    def failed(self, exc: BaseException) -> None:
        """The run is leaving with ``exc``, its end not written."""
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            self._interrupted = self.mode.cancels_on_interrupt(
                self.options.get("interrupt_cancels", False)
            )
        elif isinstance(exc, Exception):
            self._no_room = is_disk_full(exc)

    def let_go(self) -> None:
        """After the run's last events: a run that failed on the way lets another take the
        task (one stopped by a full disk keeps its lease until its failure is written:
        :meth:`no_room`), and an interrupted one ends ``cancelled`` last."""
        if not self.ended and not self._no_room:
            self.mode.let_go(self.task)
        if self._interrupted:
            self._ledger.request_cancel(self.task.id, reason=INTERRUPTED)

    def no_room(self, exc: Exception) -> NoRoomOnDisk:
        """The disk the ledger writes to is full (``exc``): the run stopped, its end not
        written. Continued once room came back, it would run its step again (the program
        that filled the disk would fill it again): it fails, now or once there is room.
        Returns the error to raise."""
        assert is_disk_full(exc)
        reason = no_room_reason(exc)
        recorded = self._unrecorded_failures.fail(
            self.task.id, attempt=self.mode.attempt, reason=reason
        )
        return NoRoomOnDisk(self.task.id, recorded=recorded, reason=reason)
