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

from relaygraph.store import LOCAL_PROJECT_ID
from relaygraph.worker._app import publish_run

if TYPE_CHECKING:
    from celery import Celery

    from relaygraph.store import Ledger, Task

__all__ = ["WorkerDispatch"]


class WorkerDispatch:
    """Queues the ledger's tasks for the workers of ``app`` (an API server's side).

    Args:
        app: The worker mode's Celery app (:func:`~relaygraph.worker.create_celery_app`).
        ledger: The ledger the tasks are in.
        publish_ahead: Published tasks that may wait for a worker (``WorkerSettings``); None:
            the live workers' free slots.
        max_running: A project's running quota unless the operator set its own.
    """

    def __init__(
        self,
        app: Celery,
        ledger: Ledger,
        *,
        publish_ahead: int | None = None,
        max_running: int | None = None,
    ) -> None:
        self.app = app
        self.ledger = ledger
        self.publish_ahead = publish_ahead
        self.max_running = max_running

    def dispatch(self, task_id: str) -> int:
        """Queue the task for the workers and publish it; returns its dispatch number.

        Raises:
            RecordNotFound: No such task.
        """
        dispatch = self.ledger.queue_for_workers(task_id)
        publish_run(self.app, task_id, dispatch)
        return dispatch

    def enqueue(self, task: Task) -> None:
        """A submission's hand-off (``submit_task(enqueue=...)``): the new task is in the
        ledger; publish what may be published now, fairly (:meth:`publish_fair`)."""
        self.publish_fair()

    def publish_fair(self) -> int:
        """Publish queued tasks not yet handed to the workers, in the fair order between
        projects, until :attr:`publish_ahead` published tasks wait for a worker (None: as
        many as the live workers have free slots); returns how
        many. Of the servers and workers that pick the same task at once, one publishes it
        (``Ledger.claim_for_workers``); the budget may be over by a task or two then."""
        published = 0
        for task_id in self.ledger.tasks_to_publish(
            budget=self.publish_ahead,
            exclude_project=LOCAL_PROJECT_ID,
            max_running=self.max_running,
        ):
            dispatch = self.ledger.claim_for_workers(task_id)
            if dispatch is None:
                continue  # Another server or worker published it just now.
            publish_run(self.app, task_id, dispatch)
            published += 1
        return published

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
        """A task ended (finished, or cancelled while it waited): the task queued next on
        its thread may start, and a worker may be free: publish fairly."""
        self.publish_fair()
