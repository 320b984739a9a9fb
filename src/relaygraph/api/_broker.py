"""The worker mode's hand-off (:class:`~relaygraph.api._dispatch.TaskDispatch`): the ledger
makes a task ``queued`` with its next dispatch number, then only its id and that number go
to RabbitMQ, for a ``relaygraph worker``.

Imported only when the server runs in the worker mode: Celery is the ``workers`` extra, and
a single-machine ``serve`` needs none of it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, TypeVar

from amqp.exceptions import AMQPError, MessageNacked
from kombu.exceptions import KombuError

from relaygraph.api._errors import ErrorAnswer
from relaygraph.runner import Answers
from relaygraph.store import LOCAL_PROJECT_ID, Ledger, Task
from relaygraph.worker import publish_fair, publish_run

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["DEFAULT_REPUBLISH_AFTER", "BrokerDispatch"]

DEFAULT_REPUBLISH_AFTER = timedelta(minutes=10)
"""How long a task may stay ``queued`` before it is published again (by an API server that
starts, or by the running servers' sweep while the queue is empty)."""
BROKER_CHECK_SECONDS = 3.0
"""The longest a readiness check waits for the broker to accept a connection."""
PUBLISH_ERRORS = (KombuError, AMQPError, MessageNacked, OSError)
"""What a publish that RabbitMQ did not confirm raises (no connection, a closed channel, a
refused or nacked message); the ledger's own errors are none of these."""

T = TypeVar("T")

log = logging.getLogger("relaygraph.api")


@dataclass(eq=False)
class BrokerDispatch:
    """The worker mode's hand-off: the ledger makes the task ``queued`` with its next dispatch
    number, then only its id and that number go to RabbitMQ.

    The ledger is the truth, and RabbitMQ carries only "run task X for dispatch N": a message
    whose dispatch is no longer the task's is stale and a worker drops it, so publishing a
    task again (after a failed publish, or when it waited too long) never runs it twice.
    """

    ledger: Ledger
    """The ledger every API server and worker shares (PostgreSQL)."""
    celery: Celery
    """The worker mode's Celery app (:func:`relaygraph.worker.create_celery_app`), used only
    to publish."""
    _: KW_ONLY
    republish_after: timedelta = DEFAULT_REPUBLISH_AFTER
    """See :meth:`republish_stale`."""
    publish_ahead: int | None = None
    """Published tasks that may wait for a worker; the others wait in the ledger and are
    published fairly between projects (``WorkerSettings``)."""
    max_running: int | None = None
    """A project's running quota unless the operator set its own."""

    def enqueue(self, task: Task) -> None:
        """Publish what may be published now, fairly between projects: the new task, or
        another project's that waited, while the workers have enough waiting for them
        (``publish_ahead``); the rest wait in the ledger, ``queued``, for a task to start
        or end (:func:`~relaygraph.worker.publish_fair`).

        Raises:
            ErrorAnswer: 503 ``broker_unavailable``: RabbitMQ did not take the message. The
                task stays ``queued`` and is published again (:meth:`republish_stale`, or a
                retry with the same ``Idempotency-Key``).
        """
        self._published(f"task {task.id}", self._publish_fair)

    def publish_held(self) -> int:
        """Publish, fairly, the queued tasks that wait in the ledger while the workers have
        room (:func:`~relaygraph.worker.publish_fair`): a sweep's backstop for a task whose
        trigger (a start, an end, a submission) was lost with its process. Returns how many."""
        return self._published("queued tasks", self._publish_fair)

    def resume(self, task_id: str, answers: Answers) -> bool:
        """Queue the decided task for the workers, to continue from its checkpoint.

        ``answers`` are in the ledger already (each decision is recorded before this is
        called); the worker that takes the message reads them from there.

        Returns:
            False when the task no longer waits for a person.

        Raises:
            ErrorAnswer: 503 ``broker_unavailable`` (the decision is recorded and the task
                ``queued``; it is published again by :meth:`republish_stale`).
        """
        return self._published(f"task {task_id}", lambda: self._resume(task_id))

    def _resume(self, task_id: str) -> bool:
        """Queue the task for the workers again if it waits for a person; False when it
        no longer does (another decision took it on, or it was cancelled)."""
        project_id = self.ledger.task_owner(task_id)
        task = None if project_id is None else self.ledger.get_task(task_id, project_id=project_id)
        if task is None or task.status != "interrupted":
            return False
        self._publish_again(task_id)
        return True

    def cancel(self, task_id: str, *, by: str | None = None, via: str = "api") -> Task:
        """Cancel the task through the ledger (:meth:`Ledger.request_cancel`, which records
        who asked): at once when no worker runs it, else the worker stops it at its next
        step boundary. When it is cancelled at once, the task queued next on its thread is
        published."""
        task = self.ledger.request_cancel(task_id, by=by, via=via)
        if task.status == "cancelled":
            self.queue_next(task)
        return task

    def queue_next(self, ended: Task) -> None:
        """Publish the task queued next on ``ended``'s thread, if its turn has come.

        A failure to publish is logged, not raised: the cancel that called this is done,
        and the waiting task is published again when it has waited too long.
        """
        try:
            self._published(f"the task queued after {ended.id}", self._publish_fair)
        except ErrorAnswer as exc:
            log.warning("the task after %s stays queued: %s", ended.id, exc.message)

    def republish(self, task: Task) -> bool:
        """Publish ``task`` again if it is ``queued`` and first on its thread (a retry of a
        submission whose publish failed). Its earlier message, if any, becomes stale.

        Returns:
            Whether it was published.

        Raises:
            ErrorAnswer: 503 ``broker_unavailable``.
        """
        first = self.ledger.active_task_on_thread(task.thread_id, project_id=task.project_id)
        if first is None or first.id != task.id or first.status != "queued":
            return False
        if first.dispatch == 0:
            # Never published: it waits its fair turn in the ledger, not a place ahead.
            return self._published(f"task {task.id}", self._publish_fair) > 0
        self._published(f"task {task.id}", lambda: self._publish_again(task.id))
        return True

    def republish_stale(self, *, now: datetime | None = None) -> int:
        """Publish again every task still ``queued`` (and first on its thread) whose status
        has not changed for :attr:`republish_after`: its message was lost, or its publish
        failed. Called when an API server starts, and by :meth:`sweep_lost`.

        A task that only waited behind others that long goes to the back of the queue: its
        earlier message is stale, so it still runs once.

        Returns:
            How many were published; it stops at the first failure to publish (the broker
            is away, and the next server start tries again).
        """
        now = now or datetime.now(UTC)
        published = 0
        for task in self.ledger.unfinished_tasks(exclude_project=LOCAL_PROJECT_ID):
            if task.status != "queued" or now - task.updated_at < self.republish_after:
                continue
            if task.dispatch == 0:
                continue  # Never published: waits its fair turn (publish_held).
            try:
                if self.republish(task):
                    published += 1
            except ErrorAnswer as exc:
                log.warning("publishing queued tasks again stopped: %s", exc.message)
                break
        if published:
            log.info("published %d task(s) that waited queued again", published)
        return published

    def queue_depth(self) -> int | None:
        """How many messages wait in the queue the tasks are published to (not counting
        those a worker holds unacknowledged); None when the broker cannot say."""
        queue = self.celery.conf.task_default_queue
        try:
            with self.celery.connection_for_write(connect_timeout=BROKER_CHECK_SECONDS) as conn:
                declared = conn.default_channel.queue_declare(queue=queue, passive=True)
        except Exception as exc:  # No broker, or no queue yet: nothing to say.
            log.info("queue %r depth unknown: %s: %s", queue, type(exc).__name__, exc)
            return None
        return int(declared.message_count)

    def sweep_lost(self, *, now: datetime | None = None) -> int:
        """Publish again the tasks whose message was lost (a publish that failed after the
        decision or cancel it followed was recorded, a message dropped by the broker), while
        the server runs: :meth:`republish_stale`, but only when the queue is empty.

        With messages waiting, a task queued for long may only be behind them: publishing
        it again would send it to the back of the queue, and under a backlog longer than
        :attr:`republish_after` it would never run. With the queue empty, a task that waited
        ``queued`` that long has no message anywhere (a worker holding one has made it
        ``running``). Several API servers sweeping at once publish a task more than once;
        each publish is a new dispatch, so only the latest message runs it.

        Returns:
            How many were published.
        """
        if self.queue_depth() != 0:
            return 0
        return self.republish_stale(now=now)

    def broker_problem(self) -> str | None:
        """Why the broker cannot take messages now (a readiness check), or None when it can:
        one connection attempt, no retry loop."""
        try:
            with self.celery.connection_for_write(connect_timeout=BROKER_CHECK_SECONDS) as conn:
                conn.ensure_connection(
                    max_retries=1, interval_start=0, timeout=BROKER_CHECK_SECONDS
                )
        except Exception as exc:  # Whatever stops a connection means not ready.
            return f"{type(exc).__name__}: {exc}"
        return None

    def close(self) -> None:
        """Close the connections the publishing app holds."""
        self.celery.close()

    def _publish_fair(self) -> int:
        """Publish what may be published now, fairly between projects; returns how many."""
        return publish_fair(
            self.ledger,
            lambda task_id, dispatch: publish_run(self.celery, task_id, dispatch),
            publish_ahead=self.publish_ahead,
            max_running=self.max_running,
        )

    def _publish_again(self, task_id: str) -> int:
        """Queue the task for the workers with its next dispatch number and publish it (its
        earlier message, if any, becomes stale); returns the dispatch number.

        Raises:
            RecordNotFound: No such task.
        """
        dispatch = self.ledger.queue_for_workers(task_id)
        publish_run(self.celery, task_id, dispatch)
        return dispatch

    def _published(self, what: str, publish: Callable[[], T]) -> T:
        """``publish()`` (a dispatch in the ledger, then its message), with a publish that
        RabbitMQ did not confirm answered as 503 (``what`` names the task)."""
        try:
            return publish()
        except PUBLISH_ERRORS as exc:
            log.warning("%s not published: %s: %s", what, type(exc).__name__, exc)
            raise ErrorAnswer(
                503,
                "broker_unavailable",
                f"{what} is recorded `queued`, but the broker did not take it "
                f"({type(exc).__name__}: {exc}): it is published again once it has waited "
                "too long (an API server's sweep, or its start), and at once when its "
                "submission is retried with the same Idempotency-Key",
            ) from None
