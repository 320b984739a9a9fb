"""The in-process hand-off (:class:`~relaygraph.api._dispatch.TaskDispatch`): runs tasks in
the server process on its event loop, up to a number in flight; picks unfinished ones up on
restart.

An event loop (:class:`~relaygraph.runner.TaskLoop`), not a task queue service: the
embedded default needs nothing running beside the server, and a task waiting for its model
holds no thread. The ledger is the queue's source of truth, so a restart loses nothing, and its
leases let several servers share one ledger: each running task is held by one server,
which renews its lease; a task whose server died is continued by another once the lease
lapses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relaygraph.backends.workspace import WorkspaceQuota
from relaygraph.errors import NoRoomOnDisk, RelaygraphError, TaskBusy
from relaygraph.runner import (
    CONTINUE,
    DEFAULT_LEASE_SECONDS,
    DEFAULT_SYNC_THREADS,
    DrainSignal,
    ModelCallRecording,
    TaskLoop,
    TaskRunner,
    resume_input,
)
from relaygraph.store import LOCAL_PROJECT_ID, Ledger, Quotas, Task, is_disk_full

DEFAULT_MAX_ATTEMPTS = 3
"""How many times a task may be started without a run ending before it is failed."""
PULL_IDLE_SECONDS = 0.5
"""How often a pulling server process looks for queued tasks when nothing woke it: the
fallback for a wake that did not come (a process that started late, a lost notice)."""
NO_ROOM_RETRY_SECONDS = 1.0
"""How often the sweep tries again to write the failure of a run that stopped for lack of
room on disk, while one waits."""

log = logging.getLogger("relaygraph.api")


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkersLoad:
    """What a server process's workers hold now (``/metrics``)."""

    in_flight: int
    """Tasks running here."""
    waiting: int
    """Tasks started here that wait for room among the tasks in flight."""
    capacity: int
    """Tasks in flight at most (``--workers``)."""
    loop_lag_seconds: float
    """How late the task loop's timers fire (see
    :class:`~relaygraph.runner.LoopLoad`)."""
    sync_queue: int
    """Sync steps (tools, ledger writes) waiting for a thread."""


class InProcessDispatch:
    """Where a server without a broker hands its tasks: starts queued tasks, up to
    ``workers`` runs in flight on the process's task loop, and cancels running ones.

    Shutting down is not cancelling: running tasks stop at their next step boundary and
    stay ``running`` in the ledger, and :meth:`recover` continues them on the next start.
    """

    def __init__(
        self,
        ledger: Ledger,
        *,
        home: Path,
        workers: int,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        sandbox_isolation_required: bool = True,
        teams: Callable[[Task], Any] | None = None,
        policies: Callable[[Task, Any], Any] | None = None,
        pull: bool = False,
        workspace_quota: WorkspaceQuota | None = None,
        quotas: Quotas | None = None,
        sync_threads: int = DEFAULT_SYNC_THREADS,
        model_calls: ModelCallRecording | None = None,
    ) -> None:
        """
        Args:
            ledger: The ledger whose tasks this server runs.
            home: The data directory.
            workers: Tasks in flight at once (runs on the task loop, each holding no
                thread while it waits for its model).
            lease_seconds: See :class:`~relaygraph.runner.TaskRunner`.
            max_attempts: Starts of a task without a run ending (its runner died each
                time) before it is failed instead of started again.
            sandbox_isolation_required: Refuse tenants' ``run_python`` where the host
                offers no filesystem isolation (``serve --unsafe-sandbox`` turns it off).
            teams: Finds the team a task records (the server's registered teams); see
                :class:`~relaygraph.runner.TaskRunner`.
            policies: The policy a task runs under (the operator's ceiling over the one
                it recorded); see :class:`~relaygraph.runner.TaskRunner`.
            pull: Take queued tasks from the ledger only when a worker is free
                (:meth:`pull`), as one of several processes that share the ledger's queue
                (``serve --processes``), and in the order of fair shares between
                projects (``Ledger.queued_tasks``), instead of queueing every task handed
                over here first in, first out.
            workspace_quota: What each task's files may hold (see
                :class:`~relaygraph.runner.TaskRunner`).
            quotas: The server's quotas of every project (``RunnerSettings.quotas``; a
                project's own, set by the operator, over them): the running quota is
                obeyed by :meth:`pull`, the daily budget by each run. None: none.
            sync_threads: Threads for the runs' sync steps (tools, ledger writes), shared
                by every task in flight of the process (the first ``InProcessDispatch`` of
                the process sets it: see :meth:`TaskLoop.shared`).
            model_calls: How much of each model call the ledger keeps (see
                :class:`~relaygraph.runner.TaskRunner`).
        """
        self.ledger = ledger
        self.workers = workers
        self.pulling = pull
        self.max_running = None if quotas is None else quotas.max_running
        self.max_attempts = max_attempts
        self.runner = TaskRunner(
            ledger=ledger,
            home=home,
            runner_id=f"server-{uuid.uuid4().hex[:12]}",
            lease_seconds=lease_seconds,
            sandbox_isolation_required=sandbox_isolation_required,
            teams=teams,
            policies=policies,
            workspace_quota=workspace_quota,
            quotas=quotas,
            model_calls=model_calls,
        )
        self._loop = TaskLoop.shared(sync_threads=sync_threads)
        self._slots = asyncio.Semaphore(workers)
        """Room for the tasks in flight (bound to the task loop by its first use)."""
        self._running = 0
        self._cancel: dict[str, DrainSignal] = {}
        """Each task's cancel, which drains its run as it is set."""
        self._starts: dict[str, int] = {}
        """Each task's starts handed to the pool and not yet over: its cancel entry lives as
        long as one of them (a refused start included), and no longer, so that a task none
        of them runs is this server's to pick up again (:meth:`recover`)."""
        self._lock = threading.Lock()
        self._futures: set[Future[Any]] = set()
        self._held: set[str] = set()
        """Tasks this server took (:meth:`pull`, :meth:`resume`) whose run has not begun:
        a decided task may wait here for a worker longer than a lease, so the sweeper
        renews their leases (:meth:`renew_held`) until their runs' keepers take over."""
        self._stopping = DrainSignal()
        """Set on shutdown: drains every run here at its next step boundary."""
        self._sweeper: threading.Thread | None = None
        self._wake = threading.Event()
        self._puller: threading.Thread | None = None

    def take(self, task_id: str, *, only_from: tuple[str, ...]) -> Task | None:
        """Mark the task running under this server's lease, if its status is in ``only_from``
        and no other runner holds it."""
        return self.ledger.take_lease(
            task_id, self.runner.runner_id, seconds=self.runner.lease_seconds, only_from=only_from
        )

    def sweep(self) -> None:
        """From now on, every half lease, pick up what no runner holds (:meth:`recover`):
        the tasks of a server that died, once their leases lapse."""

        def loop() -> None:
            while not self._stopping.wait(self._sweep_seconds()):
                try:
                    self.renew_held()
                    self.record_failures()
                    self.recover()
                except Exception as exc:  # The database may be away for a moment.
                    if is_disk_full(exc):  # Said once, by the run that stopped on it.
                        continue
                    log.warning("picking up unfinished tasks failed", exc_info=True)

        self._sweeper = threading.Thread(target=loop, name="relaygraph-sweep", daemon=True)
        self._sweeper.start()

    def _sweep_seconds(self) -> float:
        """Half a lease; at most :data:`NO_ROOM_RETRY_SECONDS` while a failure waits for
        room on disk to be written."""
        half = self.runner.lease_seconds / 2
        return min(half, NO_ROOM_RETRY_SECONDS) if self.runner.unrecorded_failures else half

    def record_failures(self) -> int:
        """Write the failures of runs that stopped for lack of room on disk, once the
        ledger takes writes again, and meanwhile keep their tasks' leases; returns how
        many were written. Their tasks are never started again (:meth:`recover`)."""
        failures = self.runner.unrecorded_failures
        if not failures:
            return 0
        failures.renew_leases(self.runner.lease_seconds)
        return failures.record()

    def start(
        self, task: Task, graph_input: Any = None, *, project: str, taken: bool = False
    ) -> None:
        """Run ``task`` (queued, or interrupted with a decision) when a worker is free;
        ``taken``: this server took its lease already (:meth:`pull`, :meth:`resume`)."""
        with self._lock:
            self._cancel.setdefault(task.id, DrainSignal())
            self._starts[task.id] = self._starts.get(task.id, 0) + 1
            if taken:
                self._held.add(task.id)
            future = self._loop.submit(self._run(task, graph_input, project, taken))
            self._futures.add(future)
            future.add_done_callback(self._finished)

    def renew_held(self) -> None:
        """Renew the leases of the tasks taken here that wait for a worker (``_held``)."""
        with self._lock:
            held = list(self._held)
        for task_id in held:
            self.ledger.renew_lease(
                task_id, self.runner.runner_id, seconds=self.runner.lease_seconds
            )

    def _finished(self, future: Future[Any]) -> None:
        with self._lock:
            self._futures.discard(future)
        if self.pulling:
            self._wake.set()  # A worker is free: take the next queued task.

    def enqueue(self, task: Task) -> None:
        """Start the queued ``task`` when a worker is free: the submission's hand-off
        (:func:`~relaygraph.runner.submit_task`), with the task as it recorded it (whose
        status the run's take checks again). Pulling, the task waits in the ledger for
        whichever process has a worker free."""
        if self.pulling:
            self.wake()
            return
        self.start(task, project=task.project_id)

    def wake(self) -> None:
        """Look for queued tasks now (pulling): one may have been queued or freed."""
        self._wake.set()

    def pull(self) -> int:
        """Take queued tasks for the workers that are free, in the order of fair shares
        between projects (the project with the fewest running first, round the projects
        with queued work, none past its running quota); returns how many.

        Each is taken under this process's lease before it is handed to a worker, and only
        when a worker is free, so it starts at once (its lease cannot lapse while it waits)
        and two processes sharing the ledger never both run it: the one whose take fails
        leaves it. Only the oldest active task of a thread is taken, as :meth:`recover` does;
        the ledger reads no others (``Ledger.queued_tasks``), so the tasks queued behind a
        paused thread never keep another thread's task from a free worker.
        """
        if self._stopping.is_set():
            return 0
        with self._lock:
            free = self.workers - len(self._futures)
        if free <= 0:
            return 0
        started = 0
        for task_id in self.ledger.queued_tasks(
            limit=free + self.workers,
            exclude_project=LOCAL_PROJECT_ID,
            max_running=self.max_running,
        ):
            if started == free:
                break
            task = self.take(task_id, only_from=("queued",))
            if task is None:
                continue  # Another process took it first, or it was cancelled.
            self.start(task, {"request": task.input}, project=task.project_id, taken=True)
            started += 1
        return started

    def start_pulling(self) -> None:
        """From now on, take queued tasks whenever a worker is free or :meth:`wake` is
        called, and every :data:`PULL_IDLE_SECONDS` besides."""

        def loop() -> None:
            while not self._stopping.is_set():
                self._wake.wait(PULL_IDLE_SECONDS)
                self._wake.clear()  # Before the read: a wake during it is not lost.
                try:
                    self.pull()
                except Exception:  # The database may be away for a moment; try again.
                    log.warning("taking queued tasks failed", exc_info=True)

        self._puller = threading.Thread(target=loop, name="relaygraph-pull", daemon=True)
        self._puller.start()

    def cancel_here(self, task_id: str) -> None:
        """Stop ``task_id`` at its next step boundary if it runs in this process (its cancel
        is already in the ledger: another process of the server recorded it)."""
        with self._lock:
            event = self._cancel.get(task_id)
        if event is not None:
            event.set()  # Its run drains now, in this thread (see DrainSignal).

    def resume(self, task_id: str, answers: Mapping[str, Mapping[str, Any]]) -> bool:
        """Continue the decided task ``task_id`` with ``answers`` when a worker is free: the
        decision's hand-off (:func:`~relaygraph.runner.decide_task`).

        The task is taken with this server's lease first, so that no other server starts
        it meanwhile.

        Returns:
            False when the task no longer waits (another runner took it).
        """
        task = self.take(task_id, only_from=("interrupted",))
        if task is None:
            return False
        self.start(task, resume_input(answers), project=task.project_id, taken=True)
        return True

    def cancel(self, task_id: str, *, by: str | None = None, via: str = "api") -> Task:
        """Cancel a task wherever it is (:meth:`Ledger.request_cancel`, which records ``by``
        and ``via``: who asked, and where): at once when no live
        runner holds it, else at its runner's next step boundary (here at once; on another
        server when that server next renews its lease). The task enqueued next on its
        thread starts when this one is cancelled.

        Returns:
            The task as it is now.
        """
        task = self.ledger.request_cancel(task_id, by=by, via=via)
        with self._lock:
            held = task_id in self._held
        if held and task.status != "cancelled":
            # Taken here and waiting for a worker: no run of it has begun, so let its lease
            # go and the cancel ends it now (else it would wait for a worker to free up).
            # A run that begins meanwhile finds the cancel at its take and runs nothing.
            self.ledger.release_lease(task_id, self.runner.runner_id)
            # Who asked is recorded already, by the request above.
            task = self.ledger.request_cancel(task_id)
        if task.status == "cancelled":
            self.start_next(task.thread_id, project_id=task.project_id)
            return task
        self.cancel_here(task_id)
        return task

    def recover(self) -> int:
        """Start again what was queued or running when the server stopped. Returns how many.

        Only the oldest active task of each thread starts; tasks enqueued behind it start
        when it ends, as they would have without the restart.
        """
        started = 0
        # The CLI's own tasks (`relaygraph run`) are its process's, not the server's. Pulling,
        # the queued ones are taken by whichever process has a worker free (pull): only the
        # running ones no runner holds are read, not every queued task at every sweep.
        unfinished = self.ledger.abandoned_tasks if self.pulling else self.ledger.unfinished_tasks
        for task in unfinished(exclude_project=LOCAL_PROJECT_ID):
            with self._lock:
                if task.id in self._cancel:
                    continue  # Already started here.
            if task.id in self.runner.unrecorded_failures:
                continue  # It failed for lack of room on disk: its failure waits for room.
            if task.status == "running":
                # A task no live runner holds that must not run again (cancelled meanwhile,
                # or its runner died on it too often) ends here instead.
                settled = self.ledger.settle_abandoned(task.id, max_attempts=self.max_attempts)
                if settled is not None:
                    log.warning("task %s: %s", task.id, settled.stop_reason)
                    self.start_next(task.thread_id, project_id=task.project_id)
                    continue
            first = self.ledger.active_task_on_thread(task.thread_id, project_id=task.project_id)
            if first is None or first.id != task.id:
                continue
            self.start(
                task, CONTINUE if task.status == "running" else None, project=task.project_id
            )
            started += 1
        if self.pulling:
            self.wake()
        return started

    def load(self) -> WorkersLoad:
        """The tasks in flight here, those waiting for room, and the loop's lag."""
        with self._lock:
            started = len(self._futures)
        loop = self._loop.load()
        return WorkersLoad(
            in_flight=self._running,
            waiting=max(0, started - self._running),
            capacity=self.workers,
            loop_lag_seconds=loop.lag_seconds,
            sync_queue=loop.sync_queue,
        )

    async def _run(self, task: Task, graph_input: Any, project: str, taken: bool) -> None:
        async with self._slots:
            if self._stopping.is_set():
                # Not begun when the server began to stop: it stays as it is (queued, or
                # running under a lease that lapses) for the next start to pick up.
                self._forget_start(task)
                return
            self._running += 1
            try:
                await self._run_in_slot(task, graph_input, project, taken)
            finally:
                self._running -= 1

    def _forget_start(self, task: Task) -> None:
        with self._lock:
            left = self._starts[task.id] - 1
            if left:
                self._starts[task.id] = left
            else:
                del self._starts[task.id]
                self._cancel.pop(task.id, None)

    async def _run_in_slot(self, task: Task, graph_input: Any, project: str, taken: bool) -> None:
        only_from: tuple[str, ...] | None = None
        if taken:
            with self._lock:
                self._held.discard(task.id)
            # Taken here, so running: a start that finds it otherwise (another server
            # continued it after this lease lapsed, and it paused or ended there) runs
            # nothing, rather than answer a pause it was not meant for.
            only_from = ("running",)
        try:
            if graph_input is None:
                if self._stopping.is_set():
                    return  # Stays queued for the next start.
                graph_input = {"request": task.input}
                # The run takes the lease only if the task is still queued and its thread's
                # oldest active task (else its thread is busy, a race at submission, and it
                # starts next): one write, where a read, a take here and the run's own take
                # were three statements.
                only_from = ("queued",)
            await self.runner.arun(
                task,
                graph_input,
                cancel=self._cancel[task.id],
                stop=self._stopping,
                identity={"project": project},
                only_from=only_from,
            )
        except TaskBusy as exc:
            await asyncio.to_thread(self._refused, task, taken, exc)
        except NoRoomOnDisk as exc:  # The run stopped on a full disk: it fails, once.
            log.warning("%s", exc)
        except RelaygraphError as exc:  # Recorded by the runner: the task failed to start.
            log.warning("task %s could not start: %s", task.id, exc)
        except Exception as exc:
            if is_disk_full(exc):
                # Its run did not begin (its take found no room): it stays as it was, and
                # starts when there is room again (recover).
                log.warning("task %s could not start: no room on disk: %s", task.id, exc)
                return
            # The runner reports task failures itself; this is a bug guard.
            log.exception("task %s crashed its worker", task.id)
            await asyncio.to_thread(
                self.ledger.set_status, task.id, "failed", stop_reason="error: worker crashed"
            )
        finally:
            # The last of the task's starts here forgets it: a duplicate start (refused at
            # its take) leaves the cancel of a run of it that goes on, and a refused start
            # that was the only one leaves the task to a later sweep.
            self._forget_start(task)
            await asyncio.to_thread(self.start_next, task.thread_id, project_id=task.project_id)

    def _refused(self, task: Task, taken: bool, exc: TaskBusy) -> None:
        """A start refused at its take (see :meth:`_run_in_slot`)."""
        if taken and self.ledger.cancel_requested(task.id):
            # What refused the run is a cancel asked for after the take: give the lease up,
            # and the cancel ends the task at once (else it would stay `running` until the
            # lease lapsed). Should another runner hold the task now, the cancel is asked
            # of it.
            self.ledger.release_lease(task.id, self.runner.runner_id)
            self.ledger.request_cancel(task.id)
            log.info("task %s cancelled before its run began", task.id)
        else:  # Cancelled while queued, or another worker or server took it first (or,
            # taken here, continued it once its lease lapsed).
            log.info("%s", exc)

    def start_next(self, thread_id: str, *, project_id: str) -> None:
        """Start the task enqueued next on the project's thread, if its turn has come."""
        if self._stopping.is_set():
            return
        if self.pulling:
            self.wake()  # It is the thread's oldest active task now: pull takes it.
            return
        waiting = self.ledger.active_task_on_thread(thread_id, project_id=project_id)
        if waiting is not None and waiting.status == "queued":
            self.start(waiting, project=waiting.project_id)

    def shutdown(self, *, wait: bool = True) -> None:
        """Stop: running tasks stop at their next step boundary and stay ``running``;
        queued ones stay ``queued``. Both are picked up by :meth:`recover` on the next start.

        Args:
            wait: Return only when the running tasks have stopped.
        """
        self._stopping.set()
        self._wake.set()
        if self._sweeper is not None:
            self._sweeper.join()
        if self._puller is not None:
            self._puller.join()
        if wait:
            with self._lock:
                futures = list(self._futures)
            for future in futures:
                with contextlib.suppress(Exception):  # Logged by the run itself.
                    future.result()
