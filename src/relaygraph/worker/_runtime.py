"""What one worker process runs tasks with, and how it runs one message's task.

A prefork child builds its :class:`WorkerRuntime` after the fork (Celery's
``worker_process_init``; else at its first task): its own ledger connections, its own
``TaskRunner``, its own compiled teams. Nothing of it is made before the fork, where
connections and threads would be shared by every child. A worker with tasks in flight
(``--tasks-in-flight``) has no children: its one process builds the runtime once ready, and
runs every message's task as a coroutine on its task loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from relaygraph.errors import NoRoomOnDisk, RelaygraphError
from relaygraph.events import run_finished_event
from relaygraph.store import WORKER_REPORT_SECONDS, AttemptSuperseded, Ledger
from relaygraph.worker._publish import Publish, publish_fair

if TYPE_CHECKING:
    from relaygraph.runner import RunnerSettings, RunOptions, RunResult, TaskLoop, TaskRunner
    from relaygraph.store import Task
    from relaygraph.worker._settings import WorkerSettings

__all__ = [
    "Publish",
    "WorkerRuntime",
    "close_worker_runtime",
    "prepare_worker",
    "worker_runtime",
]

log = logging.getLogger("relaygraph.worker")

WORKER_START_SECONDS = 1.0
"""How long after its start a pool process first reports its slot."""

RecordLater = Callable[[str, int, str], None]
"""Hands ``(task_id, attempt, reason)``, the failure of a run stopped on a full disk that
the ledger did not take, to the broker, to be written when it does
(:func:`relaygraph.worker.publish_no_room`)."""


class WorkerRuntime:
    """One worker process's ledger and runner, and the run of each message's task.

    Args:
        settings: The runner settings (teams, data directory, ledger, attempt limit).
        worker: The worker settings (the events' notice channel).
        publish: Publishes the queued tasks to publish next, fairly between projects
            (``Ledger.tasks_to_publish``), when a task starts or ends here; None: nobody
            does here (the API servers' dispatch does it, or no one).
        worker_id: Who this process is as the runner of its tasks; made from the host and
            the process id when None.
        record_later: Hands a failure for lack of room that the ledger refused to the
            broker (see :data:`RecordLater`); None: it is only logged.
    """

    def __init__(
        self,
        settings: RunnerSettings,
        worker: WorkerSettings,
        *,
        publish: Publish | None = None,
        worker_id: str | None = None,
        record_later: RecordLater | None = None,
    ) -> None:
        from relaygraph._home import data_home
        from relaygraph.runner import ServiceTeams, TaskRunner

        home = data_home(settings.home)
        self.pid = os.getpid()
        self.worker_id = worker_id or (
            f"worker-{socket.gethostname()[:30]}-{self.pid}-{uuid.uuid4().hex[:6]}"
        )
        self.max_attempts = settings.max_attempts
        self.publish = publish
        self.record_later = record_later
        self.publish_ahead = worker.publish_ahead
        self.max_running = settings.project_max_running
        self.ledger = Ledger(settings.database_url, notify_channel=worker.events_channel)
        self.slots = worker.tasks_in_flight or 1
        """The tasks this process runs at once, as it reports them to the publishers."""
        self.loop: TaskLoop | None = None
        """The loop its runs are coroutines on, with tasks in flight; None: each message's
        run takes the thread that runs the message (a prefork child's)."""
        if worker.tasks_in_flight is not None:
            from relaygraph.runner import TaskLoop

            self.loop = TaskLoop.shared()
        self._reporter: threading.Thread | None = None
        self._stop_reporting = threading.Event()
        self._publishing = threading.Lock()
        """Held while this process publishes: one publish at a time (:meth:`_publish_fair`)."""
        self._publish_asked = threading.Event()
        """A publish was asked for while one ran: that one goes round once more."""
        if not self.ledger.is_current():  # As serve does: a first start needs no set-up step.
            self.ledger.upgrade()
        self.teams = ServiceTeams(ledger=self.ledger, settings=settings, home=home)
        self.runner: TaskRunner = TaskRunner(
            ledger=self.ledger,
            home=home,
            runner_id=self.worker_id,
            sandbox_isolation_required=not settings.unsafe_sandbox,
            teams=self.teams.resolve,
            policies=self.teams.policy_for,
            workspace_quota=settings.workspace_quota(),
            quotas=settings.quotas,
            model_calls=settings.model_call_recording(),
        )

    def close(self) -> None:
        if self._reporter is not None:
            self._stop_reporting.set()
            self._reporter.join(timeout=WORKER_REPORT_SECONDS)
            try:
                self.ledger.forget_worker_slots(self.worker_id)
            except Exception:  # The row lapses by itself (WORKER_GONE_SECONDS).
                log.warning("could not withdraw this worker's slot", exc_info=True)
        self.ledger.close()

    def start_reporting(self) -> None:
        """Report this pool process's slot in the ledger every
        :data:`~relaygraph.store.WORKER_REPORT_SECONDS` until :meth:`close`, so that the
        publishers keep as many tasks waiting in the broker as the live workers can take
        (``Ledger.tasks_to_publish``); each report also publishes what the free slots can
        take now (a slot new since the last submission or end, or a publish lost with its
        process). A prefork pool's main process does not report: each child runs one task;
        a process with tasks in flight reports them all (:attr:`slots`)."""
        if self._reporter is not None:
            return

        def report() -> None:
            # The first report a moment after the process is up (see _prepare_children).
            if self._stop_reporting.wait(WORKER_START_SECONDS):
                return
            while True:
                try:
                    self.ledger.report_worker_slots(self.worker_id, slots=self.slots)
                except Exception:  # The database may be away for a moment.
                    log.warning("could not report this worker's slot", exc_info=True)
                else:
                    self._publish_fair("its slot's report")
                if self._stop_reporting.wait(WORKER_REPORT_SECONDS):
                    return

        self._reporter = threading.Thread(target=report, name="relaygraph-worker-slot", daemon=True)
        self._reporter.start()

    def run(self, task_id: str, dispatch: int) -> RunResult | None:
        """Run the task of the message ``(task_id, dispatch)``: begin the next attempt, then
        run the task with it from where the ledger and its checkpoints say, until it ends,
        pauses for a person or is cancelled. With tasks in flight the run is a coroutine on
        :attr:`loop`, and the caller's thread (the message's) waits for it.

        The task starts from its request when it has no checkpoint of its own, continues
        from its last checkpoint when an earlier attempt was cut short (a worker that died),
        and resumes a pause with the decisions the ledger recorded.

        Returns:
            The run's result; None when the message was dropped (stale, or the task must
            not run: see ``Ledger.begin_attempt``) or the attempt was superseded.
        """
        if self.loop is not None:
            return self.loop.submit(self.arun(task_id, dispatch)).result()
        begun = self._begin(task_id, dispatch)
        if begun is None:
            return None
        task, attempt, graph_input, options = begun
        try:
            return self.runner.run(task, graph_input, **options)
        except Exception as exc:
            self._run_failed(task, attempt, exc)
            return None
        finally:
            self._publish_fair(f"task {task_id}")

    async def arun(self, task_id: str, dispatch: int) -> RunResult | None:
        """:meth:`run` on the running event loop: many of them hold one process's tasks in
        flight."""
        begun = await asyncio.to_thread(self._begin, task_id, dispatch)
        if begun is None:
            return None
        task, attempt, graph_input, options = begun
        try:
            return await self.runner.arun(task, graph_input, **options)
        except Exception as exc:
            await asyncio.to_thread(self._run_failed, task, attempt, exc)
            return None
        finally:
            await asyncio.to_thread(self._publish_fair, f"task {task_id}")

    def _begin(self, task_id: str, dispatch: int) -> tuple[Task, int, Any, RunOptions] | None:
        """Begin the message's attempt (see :meth:`run`); returns the task, the attempt, the
        graph's input and the run's options, or None when the message is dropped."""
        from relaygraph.runner import CONTINUE

        begun = self.ledger.start_attempt(
            task_id, dispatch=dispatch, worker_id=self.worker_id, max_attempts=self.max_attempts
        )
        if begun is None:
            log.info("task %s: message of dispatch %s dropped: nothing to run", task_id, dispatch)
            self._publish_fair(f"task {task_id}")
            return None
        task, attempt = begun.task, begun.number
        log.info("task %s: attempt %s (dispatch %s) starts", task_id, attempt, dispatch)
        # It no longer waits for a worker: the next may be published in its place.
        self._publish_fair(f"task {task_id}")
        # The runner fences the run's ledger writes and checkpoints by the attempt. A task
        # that never ran starts from its request: it has no checkpoint to go on from, and
        # asking the thread's checkpoints (CONTINUE) cost a read of them.
        graph_input = {"request": task.input} if begun.fresh else CONTINUE
        options: RunOptions = {
            "attempt": attempt,
            "identity": {"project": task.project_id},
        }
        return task, attempt, graph_input, options

    def _run_failed(self, task: Task, attempt: int, exc: Exception) -> None:
        """The run of the task's ``attempt`` left with ``exc``: say so, and fail the task
        where the runner could not have (a bug guard)."""
        if isinstance(exc, AttemptSuperseded):
            log.warning("%s", exc)
        elif isinstance(exc, NoRoomOnDisk):  # The run stopped on a full disk: it fails, once.
            log.warning("%s", exc)
            if not exc.recorded:
                self._record_later(exc, attempt)
        elif isinstance(exc, RelaygraphError):  # Recorded by the runner: it failed to start.
            log.warning("task %s could not start: %s", task.id, exc)
        else:  # The runner reports task failures itself.
            log.error("task %s crashed its worker", task.id, exc_info=exc)
            self._fail(task, attempt, f"error: worker crashed: {type(exc).__name__}: {exc}")

    def _record_later(self, stopped: NoRoomOnDisk, attempt: int) -> None:
        """The ledger's disk is full: its failure goes to the broker, which keeps it (across
        this worker's end too) until a worker writes it (:meth:`record_no_room`). The run's
        message is acknowledged meanwhile: the task is never run again."""
        if self.record_later is None:
            log.error("task %s: its failure waits in this process only", stopped.task_id)
            return
        try:
            self.record_later(stopped.task_id, attempt, stopped.reason)
        except Exception:
            log.exception("task %s: its failure waits in this process only", stopped.task_id)

    def record_no_room(self, task_id: str, attempt: int, reason: str) -> bool:
        """Write the failure of the task's ``attempt``, stopped on a full disk; returns
        False when the ledger still has no room (to be tried again)."""
        return self.runner.unrecorded_failures.fail(task_id, attempt=attempt, reason=reason)

    def _fail(self, task: Task, attempt: int, reason: str) -> None:
        try:
            event = dict(run_finished_event("failed", reason))
            self.ledger.append_event(task.id, event, attempt=attempt)
            self.ledger.end_run(
                task.id, usage={}, status="failed", attempt=attempt, stop_reason=reason
            )
        except AttemptSuperseded:
            pass  # Another attempt has the task: its end is that attempt's to write.

    def _publish_fair(self, after: str) -> None:
        """Publish the queued tasks to publish now, fairly between projects, up to
        :attr:`publish_ahead` waiting for a worker (None: the live workers' free slots;
        ``Ledger.tasks_to_publish``).

        One publish at a time per process: one asked for while another runs here is left
        to that one, which goes round once more when it is done, reading the queue after
        every change that asked for it. A worker with hundreds of tasks in flight starts
        and ends many a second, each asking; publishing for each, at once, read the fair
        queue many times over for the same answer."""
        if self.publish is None:
            return
        self._publish_asked.set()
        while self._publish_asked.is_set() and self._publishing.acquire(blocking=False):
            try:
                self._publish_asked.clear()  # Before the read: a change during it asks again.
                publish_fair(
                    self.ledger,
                    self.publish,
                    publish_ahead=self.publish_ahead,
                    max_running=self.max_running,
                )
            except Exception:
                log.warning("could not publish the next tasks after %s", after, exc_info=True)
            finally:
                self._publishing.release()


_RUNTIME: WorkerRuntime | None = None
_RUNTIME_KEY: tuple[int, tuple[tuple[str, str], ...]] | None = None
_RUNTIME_LOCK = threading.Lock()
_SETTINGS_PREFIX = "RELAYGRAPH_"
"""The environment variables the runner's and the worker's settings are read from (the
names in any case, as pydantic-settings matches them)."""


def _settings_environment() -> tuple[tuple[str, str], ...]:
    """The variables the runtime's settings come from, as they are now."""
    return tuple(
        sorted((k, v) for k, v in os.environ.items() if k.upper().startswith(_SETTINGS_PREFIX))
    )


def worker_runtime(
    *, publish: Publish | None = None, record_later: RecordLater | None = None
) -> WorkerRuntime:
    """This process's runtime, built from the environment's settings on first use in the
    process (so never before a fork), and again when the settings change.

    Args:
        publish: Given to the runtime if it has none (see :class:`WorkerRuntime`).
        record_later: Likewise.

    Raises:
        ConfigError: A setting is invalid.
    """
    from relaygraph.runner import load_runner_settings
    from relaygraph.worker._settings import load_worker_settings

    global _RUNTIME, _RUNTIME_KEY
    # Both settings are read from the RELAYGRAPH_* variables alone: the runtime is kept
    # while they are unchanged, without reading and validating them again for every
    # message (about 2 ms of CPU per task).
    key = (os.getpid(), _settings_environment())
    with _RUNTIME_LOCK:
        if _RUNTIME is not None and key == _RUNTIME_KEY:
            if _RUNTIME.publish is None:
                _RUNTIME.publish = publish
            if _RUNTIME.record_later is None:
                _RUNTIME.record_later = record_later
            return _RUNTIME
        settings, worker = load_runner_settings(), load_worker_settings()
        if _RUNTIME is not None and _RUNTIME.pid == os.getpid():
            _RUNTIME.close()
        # A runtime inherited over a fork is dropped, not closed: its connections are the
        # parent's.
        _RUNTIME = WorkerRuntime(settings, worker, publish=publish, record_later=record_later)
        _RUNTIME_KEY = key
        return _RUNTIME


def close_worker_runtime() -> None:
    """Close this process's runtime, if it made one (a child that stops)."""
    global _RUNTIME, _RUNTIME_KEY
    with _RUNTIME_LOCK:
        if _RUNTIME is not None and _RUNTIME.pid == os.getpid():
            _RUNTIME.close()
        _RUNTIME = _RUNTIME_KEY = None


def prepare_worker(**overrides: Any) -> WorkerSettings:
    """Check what ``relaygraph worker`` needs before it starts its processes, and bring the
    ledger's schema up to date (once, in the main process; it keeps no connection).

    Args:
        overrides: Command-line values of :class:`~relaygraph.worker.WorkerSettings`
            (``concurrency``, ``queues``).

    Returns:
        The worker's settings.

    Raises:
        ConfigError: No broker (``RELAYGRAPH_BROKER_URL``), a ledger that is not on
            PostgreSQL (``RELAYGRAPH_DATABASE_URL``), or an invalid setting.
    """
    from relaygraph.errors import ConfigError
    from relaygraph.runner import load_runner_settings
    from relaygraph.store import database_url
    from relaygraph.worker._settings import load_worker_settings

    settings = load_worker_settings(**overrides)
    if settings.broker_url is None:
        raise ConfigError(
            "relaygraph worker needs a broker: set RELAYGRAPH_BROKER_URL "
            "(amqp://user:password@host:5672/vhost)"
        )
    runner = load_runner_settings()
    url = database_url(runner.database_url)
    if not url.startswith("postgresql"):  # SQLite: a URL without a password to hide.
        raise ConfigError(
            "relaygraph worker needs the ledger on PostgreSQL, shared with the API servers: "
            "set RELAYGRAPH_DATABASE_URL (postgresql+psycopg://user:password@host:5432/db), "
            f"not {url!r}"
        )
    with Ledger(url) as ledger:
        ledger.upgrade()
    return settings
