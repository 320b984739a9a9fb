"""Runs tasks in the server process on a bounded pool; picks unfinished ones up on restart.

A thread pool, not a task queue service: the embedded default needs nothing running beside
the server. The ledger is the queue's source of truth, so a restart loses nothing, and its
leases let several servers share one ledger: each running task is held by one server,
which renews its lease; a task whose server died is continued by another once the lease
lapses.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from relaygraph.errors import RelaygraphError, TaskBusy
from relaygraph.runner import CONTINUE, DEFAULT_LEASE_SECONDS, TaskRunner, resume_input
from relaygraph.store import LOCAL_PROJECT_ID, Ledger, Task

DEFAULT_MAX_ATTEMPTS = 3
"""How many times a task may be started without a run ending before it is failed."""

log = logging.getLogger("relaygraph.api")


class TaskWorkers:
    """Starts queued tasks, one run per thread at a time, and cancels running ones.

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
    ) -> None:
        """
        Args:
            ledger: The ledger whose tasks this server runs.
            home: The data directory.
            workers: Tasks run at once.
            lease_seconds: See :class:`~relaygraph.runner.TaskRunner`.
            max_attempts: Starts of a task without a run ending (its runner died each
                time) before it is failed instead of started again.
            sandbox_isolation_required: Refuse tenants' ``run_python`` where the host
                offers no filesystem isolation (``serve --unsafe-sandbox`` turns it off).
            teams: Finds the team a task records (the server's registered teams); see
                :class:`~relaygraph.runner.TaskRunner`.
        """
        self.ledger = ledger
        self.max_attempts = max_attempts
        self.runner = TaskRunner(
            ledger=ledger,
            home=home,
            runner_id=f"server-{uuid.uuid4().hex[:12]}",
            lease_seconds=lease_seconds,
            sandbox_isolation_required=sandbox_isolation_required,
            teams=teams,
        )
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="relaygraph-task")
        self._cancel: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._futures: set[Future[Any]] = set()
        self._stopping = threading.Event()
        self._sweeper: threading.Thread | None = None

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
            while not self._stopping.wait(self.runner.lease_seconds / 2):
                try:
                    self.recover()
                except Exception:  # The database may be away for a moment; try again later.
                    log.warning("picking up unfinished tasks failed", exc_info=True)

        self._sweeper = threading.Thread(target=loop, name="relaygraph-sweep", daemon=True)
        self._sweeper.start()

    def start(self, task: Task, graph_input: Any = None, *, project: str) -> None:
        """Run ``task`` (queued, or interrupted with a decision) when a worker is free."""
        with self._lock:
            self._cancel.setdefault(task.id, threading.Event())
            future = self._pool.submit(self._run, task, graph_input, project)
            self._futures.add(future)
            future.add_done_callback(self._futures.discard)

    def enqueue(self, task_id: str) -> None:
        """Start the queued task ``task_id`` when a worker is free: the submission's hand-off
        (:func:`~relaygraph.runner.submit_task`), by id, as a task queue would take it."""
        task = self._task(task_id)
        if task is not None:
            self.start(task, project=task.project_id)

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
        self.start(task, resume_input(answers), project=task.project_id)
        return True

    def _task(self, task_id: str) -> Task | None:
        project_id = self.ledger.task_owner(task_id)
        return None if project_id is None else self.ledger.get_task(task_id, project_id=project_id)

    def cancel(self, task_id: str) -> Task:
        """Cancel a task wherever it is (:meth:`Ledger.request_cancel`): at once when no live
        runner holds it, else at its runner's next step boundary (here at once; on another
        server when that server next renews its lease). The task enqueued next on its
        thread starts when this one is cancelled.

        Returns:
            The task as it is now.
        """
        task = self.ledger.request_cancel(task_id)
        if task.status == "cancelled":
            self.start_next(task.thread_id, project_id=task.project_id)
            return task
        with self._lock:
            event = self._cancel.get(task_id)
        if event is not None:
            event.set()
        return task

    def recover(self) -> int:
        """Start again what was queued or running when the server stopped. Returns how many.

        Only the oldest active task of each thread starts; tasks enqueued behind it start
        when it ends, as they would have without the restart.
        """
        started = 0
        # The CLI's own tasks (`relaygraph run`) are its process's, not the server's.
        for task in self.ledger.unfinished_tasks(exclude_project=LOCAL_PROJECT_ID):
            with self._lock:
                if task.id in self._cancel:
                    continue  # Already started here.
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
        return started

    def _run(self, task: Task, graph_input: Any, project: str) -> None:
        ran = False
        try:
            if graph_input is None:
                if self._stopping.is_set():
                    return  # Stays queued for the next start.
                first = self.ledger.active_task_on_thread(
                    task.thread_id, project_id=task.project_id
                )
                if first is not None and first.id != task.id:
                    return  # Its thread is busy (a race at submission): it starts next.
                if self.take(task.id, only_from=("queued",)) is None:
                    return  # Cancelled while queued, or another worker or server has it.
                graph_input = {"request": task.input}
            ran = True
            self.runner.run(
                task,
                graph_input,
                cancel=self._cancel[task.id],
                stop=self._stopping,
                # `relaygraph_team` is the project's id under its name from before
                # projects, deprecated: it goes in the next release.
                identity={"project": project, "team": project},
            )
        except TaskBusy as exc:  # Another server took it first: it is that server's.
            log.info("%s", exc)
        except RelaygraphError as exc:  # Recorded by the runner: the task failed to start.
            log.warning("task %s could not start: %s", task.id, exc)
        except Exception:  # The runner reports task failures itself; this is a bug guard.
            log.exception("task %s crashed its worker", task.id)
            self.ledger.set_status(task.id, "failed", stop_reason="error: worker crashed")
        finally:
            if ran:  # A duplicate start that found the task taken leaves its cancel alone.
                with self._lock:
                    self._cancel.pop(task.id, None)
            self.start_next(task.thread_id, project_id=task.project_id)

    def start_next(self, thread_id: str, *, project_id: str) -> None:
        """Start the task enqueued next on the project's thread, if its turn has come."""
        if self._stopping.is_set():
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
        if self._sweeper is not None:
            self._sweeper.join()
        self._pool.shutdown(wait=wait, cancel_futures=True)
