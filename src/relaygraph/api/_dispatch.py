"""Where the API hands a task on once the ledger has it: to the server's own task loop
(:class:`~relaygraph.api._in_process.InProcessDispatch`; with ``serve --processes``,
:class:`~relaygraph.api._processes.TaskProcesses`, which adds the server's task processes),
or in the worker mode to RabbitMQ (:class:`~relaygraph.api._broker.BrokerDispatch`), for a
``relaygraph worker`` to run.

Each answers the same three calls, so the routes and the dashboard submit, decide and
cancel the same way in either mode.
"""

from __future__ import annotations

from typing import Protocol

from relaygraph.runner import Answers
from relaygraph.store import Task

__all__ = ["TaskDispatch"]


class TaskDispatch(Protocol):
    """What the API does with a task once the ledger has recorded or changed it."""

    def enqueue(self, task: Task) -> None:
        """Run the recorded ``queued`` task when a worker is free
        (:func:`~relaygraph.runner.submit_task`'s hand-off)."""

    def resume(self, task_id: str, answers: Answers) -> bool:
        """Continue the decided task ``task_id`` with ``answers``; False when it no longer
        waits (:func:`~relaygraph.runner.decide_task`'s hand-off)."""

    def cancel(self, task_id: str, *, by: str | None = None, via: str = "api") -> Task:
        """Cancel the task wherever it is; returns it as it is now. ``by`` (a project's
        name) and ``via`` (``api``, ``dashboard``) say who asked: the ledger records them
        (:meth:`~relaygraph.store.Ledger.request_cancel`)."""
