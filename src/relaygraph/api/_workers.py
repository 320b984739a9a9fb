"""Runs tasks in the server process on a bounded pool; picks unfinished ones up on restart.

A thread pool, not a task queue service: the embedded default needs nothing running beside
the server. The ledger is the queue's source of truth, so a restart loses nothing.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from relaygraph.run import CONTINUE, TaskRunner
from relaygraph.store import Ledger, Task

log = logging.getLogger("relaygraph.api")


class TaskWorkers:
    """Starts queued tasks, one run per thread at a time, and cancels running ones.

    Shutting down is not cancelling: running tasks stop at their next step boundary and
    stay ``running`` in the ledger, and :meth:`recover` continues them on the next start.
    """

    def __init__(self, ledger: Ledger, *, home: Path, workers: int) -> None:
        self.ledger = ledger
        self.runner = TaskRunner(ledger=ledger, home=home)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="relaygraph-task")
        self._cancel: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._futures: set[Future[Any]] = set()
        self._stopping = threading.Event()

    def start(self, task: Task, graph_input: Any = None, *, team: str) -> None:
        """Run ``task`` (queued, or interrupted with a decision) when a worker is free."""
        with self._lock:
            self._cancel.setdefault(task.id, threading.Event())
            future = self._pool.submit(self._run, task, graph_input, team)
            self._futures.add(future)
            future.add_done_callback(self._futures.discard)

    def cancel(self, task_id: str) -> bool:
        """Ask a running task to stop at its next step boundary; False if it is not running."""
        with self._lock:
            event = self._cancel.get(task_id)
        if event is None:
            return False
        event.set()
        return True

    def recover(self) -> int:
        """Start again what was queued or running when the server stopped. Returns how many.

        Only the oldest active task of each thread starts; tasks enqueued behind it start
        when it ends, as they would have without the restart.
        """
        started = 0
        for task in self.ledger.unfinished_tasks():
            first = self.ledger.active_task_on_thread(task.thread_id)
            if first is None or first.id != task.id:
                continue
            self.start(task, CONTINUE if task.status == "running" else None, team=task.team_id)
            started += 1
        return started

    def _run(self, task: Task, graph_input: Any, team: str) -> None:
        ran = False
        try:
            if graph_input is None:
                if self._stopping.is_set():
                    return  # Stays queued for the next start.
                first = self.ledger.active_task_on_thread(task.thread_id)
                if first is not None and first.id != task.id:
                    return  # Its thread is busy (a race at submission): it starts next.
                if self.ledger.claim(task.id, "running", only_from=("queued",)) is None:
                    return  # Cancelled while queued, or another worker has it.
                graph_input = {"request": task.input}
            ran = True
            self.runner.run(
                task,
                graph_input,
                cancel=self._cancel[task.id],
                stop=self._stopping,
                identity={"team": team},
            )
        except Exception:  # The runner reports task failures itself; this is a bug guard.
            log.exception("task %s crashed its worker", task.id)
            self.ledger.set_status(task.id, "failed", stop_reason="error: worker crashed")
        finally:
            if ran:  # A duplicate start that found the task taken leaves its cancel alone.
                with self._lock:
                    self._cancel.pop(task.id, None)
            self.start_next(task.thread_id)

    def start_next(self, thread_id: str) -> None:
        """Start the task enqueued next on the thread, if its turn has come."""
        if self._stopping.is_set():
            return
        waiting = self.ledger.active_task_on_thread(thread_id)
        if waiting is not None and waiting.status == "queued":
            self.start(waiting, team=waiting.team_id)

    def shutdown(self, *, wait: bool = True) -> None:
        """Stop: running tasks stop at their next step boundary and stay ``running``;
        queued ones stay ``queued``. Both are picked up by :meth:`recover` on the next start.

        Args:
            wait: Return only when the running tasks have stopped.
        """
        self._stopping.set()
        self._pool.shutdown(wait=wait, cancel_futures=True)
