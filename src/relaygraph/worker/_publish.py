"""Publishing the ledger's queued tasks for the workers, fairly between projects.

Both sides of the worker mode publish: an API server when a task is submitted or decided
(:class:`~relaygraph.api._broker.BrokerDispatch`), and a worker when a task starts or ends
there (:class:`~relaygraph.worker.WorkerRuntime`), since either frees a place in the fair
order. Each publish records a new dispatch number in the ledger first
(``Ledger.claim_for_workers``), then sends ``(task_id, dispatch)`` once that has committed;
a worker drops a message whose dispatch is not the task's latest, so publishing one task
twice never runs it twice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from relaygraph.store import LOCAL_PROJECT_ID

if TYPE_CHECKING:
    from relaygraph.store import Ledger

__all__ = ["Publish", "publish_fair"]

Publish = Callable[[str, int], None]
"""Publishes ``(task_id, dispatch)`` for the workers (:func:`relaygraph.worker.publish_run`)."""


def publish_fair(
    ledger: Ledger, publish: Publish, *, publish_ahead: int | None, max_running: int | None
) -> int:
    """Publish queued tasks not yet handed to the workers, in the fair order between
    projects, until ``publish_ahead`` published tasks wait for a worker (None: as many as
    the live workers have free slots); returns how many.

    Of the servers and workers that pick the same task at once, one publishes it
    (``Ledger.claim_for_workers``); the budget may be over by a task or two then.

    Args:
        ledger: The ledger the tasks are in.
        publish: Sends a claimed task's message.
        publish_ahead: Published tasks that may wait for a worker (``WorkerSettings``).
        max_running: A project's running quota unless the operator set its own.
    """
    published = 0
    for task_id in ledger.tasks_to_publish(
        budget=publish_ahead, exclude_project=LOCAL_PROJECT_ID, max_running=max_running
    ):
        dispatch = ledger.claim_for_workers(task_id)
        if dispatch is None:
            continue  # Another server or worker published it just now.
        publish(task_id, dispatch)
        published += 1
    return published
