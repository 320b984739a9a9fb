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
    """Starts queued tasks, one run per thread at a time, and cancels running ones."""

    def __init__(self, ledger: Ledger, *, home: Path, workers: int) -> None:
        self.ledger = ledger
        self.runner = TaskRunner(ledger=ledger, home=home)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="relaygraph-task")
        self._cancel: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._futures: set[Future[Any]] = set()

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
        """Start again what was queued or running when the server stopped. Returns how many."""
        tasks = self.ledger.unfinished_tasks()
        for task in tasks:
            self.start(task, CONTINUE if task.status == "running" else None, team=task.team_id)
        return len(tasks)

    def _run(self, task: Task, graph_input: Any, team: str) -> None:
        try:
            if graph_input is None:
                if self.ledger.claim(task.id, "running", only_from=("queued",)) is None:
                    return  # Cancelled while queued, or another worker has it.
                graph_input = {"request": task.input}
            self.runner.run(
                task,
                graph_input,
                cancel=self._cancel[task.id],
                identity={"team": team},
            )
        except Exception:  # The runner reports task failures itself; this is a bug guard.
            log.exception("task %s crashed its worker", task.id)
            self.ledger.set_status(task.id, "failed", stop_reason="error: worker crashed")
        finally:
            with self._lock:
                self._cancel.pop(task.id, None)
            self._start_next_on_thread(task.thread_id)

    def _start_next_on_thread(self, thread_id: str) -> None:
        """A task enqueued behind this one on the same thread may start now."""
        waiting = self.ledger.active_task_on_thread(thread_id)
        if waiting is not None and waiting.status == "queued":
            self.start(waiting, team=waiting.team_id)

    def shutdown(self, *, wait: bool = True) -> None:
        with self._lock:
            for event in self._cancel.values():
                event.set()
        self._pool.shutdown(wait=wait, cancel_futures=True)
