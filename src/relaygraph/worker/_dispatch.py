"""How an API server in the worker mode hands the ledger's tasks to the workers.

:class:`WorkerDispatch` has the same hand-off points as the in-process workers: a submission
(``submit_task(enqueue=dispatch.enqueue)``), a decision (``decide_task(resume=dispatch.resume)``)
and the next task of a thread (``start_next``). Each records a new dispatch in the ledger
(``Ledger.queue_for_workers``), then publishes ``(task_id, dispatch)`` once that has
committed. Two dispatches of one task are harmless: a worker drops a message whose dispatch
is not the task's latest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from relaygraph.worker._app import publish_run

if TYPE_CHECKING:
    from celery import Celery

    from relaygraph.store import Ledger, Task

__all__ = ["WorkerDispatch", "next_on_thread"]


class WorkerDispatch:
    """Queues the ledger's tasks for the workers of ``app`` (an API server's side).

    Args:
        app: The worker mode's Celery app (:func:`~relaygraph.worker.create_celery_app`).
        ledger: The ledger the tasks are in.
    """

    def __init__(self, app: Celery, ledger: Ledger) -> None:
        self.app = app
        self.ledger = ledger

    def dispatch(self, task_id: str) -> int:
        """Queue the task for the workers and publish it; returns its dispatch number.

        Raises:
            RecordNotFound: No such task.
        """
        dispatch = self.ledger.queue_for_workers(task_id)
        publish_run(self.app, task_id, dispatch)
        return dispatch

    def enqueue(self, task: Task) -> None:
        """A submission's hand-off (``submit_task(enqueue=...)``): the new task to the workers."""
        self.dispatch(task.id)

    def resume(self, task_id: str, answers: Mapping[str, Mapping[str, Any]]) -> bool:
        """A decision's hand-off (``decide_task(resume=...)``): the decided task to the
        workers, which continue it from its checkpoint with the decisions the ledger recorded
        (``answers`` are those decisions; the message carries only the task's id).

        Returns:
            False when the task no longer waits for a person (another decision took it on,
            or it was cancelled).
        """
        project_id = self.ledger.task_owner(task_id)
        task = None if project_id is None else self.ledger.get_task(task_id, project_id=project_id)
        if task is None or task.status != "interrupted":
            return False
        self.dispatch(task_id)
        return True

    def start_next(self, thread_id: str, *, project_id: str) -> None:
        """Hand the project's task queued next on the thread to the workers, if its turn has
        come (the thread's task before it ended: finished, or cancelled while it waited)."""
        waiting = next_on_thread(self.ledger, thread_id, project_id=project_id)
        if waiting is not None:
            self.dispatch(waiting)


def next_on_thread(ledger: Ledger, thread_id: str, *, project_id: str) -> str | None:
    """The task queued on the project's thread whose turn has come and that no one handed
    to the workers yet (a task queued behind a busy thread is recorded, not dispatched);
    None when there is none, or the thread is still busy."""
    waiting = ledger.active_task_on_thread(thread_id, project_id=project_id)
    if waiting is not None and waiting.status == "queued" and waiting.dispatch == 0:
        return waiting.id
    return None
