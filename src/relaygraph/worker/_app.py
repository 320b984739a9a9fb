"""The Celery application of the worker mode: one task, ``relaygraph.run_task``.

API servers publish only a task's id (and the ledger's dispatch number) to RabbitMQ; a
``relaygraph worker`` process takes it and runs the task from the ledger. Everything a run
produces goes to the ledger and the checkpointer, so there is no result backend.

What each Celery setting is for is said where it is set (:func:`celery_config`); the
numbers behind them were measured on RabbitMQ 3.10 (docs/deploy.md).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from typing import Any

from celery import Celery
from kombu import Exchange, Queue

from relaygraph.errors import ConfigError
from relaygraph.store import DATABASE_RETRY_SECONDS, is_database_unavailable
from relaygraph.worker._settings import WorkerSettings

__all__ = [
    "NO_ROOM_RETRY_SECONDS",
    "RECORD_NO_ROOM",
    "RUN_TASK",
    "RecordHook",
    "RunHook",
    "celery_config",
    "create_celery_app",
    "default_node_name",
    "publish_no_room",
    "publish_run",
    "record_ledger_failure",
    "run_ledger_task",
    "worker_argv",
]

RUN_TASK = "relaygraph.run_task"
"""The name of the one task the workers run (API servers publish it by name)."""

RunHook = Callable[[str, int], None]
"""What ``relaygraph.run_task`` calls: ``run(task_id, dispatch)``."""
RECORD_NO_ROOM = "relaygraph.record_no_room"
"""The task that writes the failure of a run stopped on a full disk, once the ledger takes
it: ``(task_id, attempt, reason)``."""
RecordHook = Callable[[str, int, str], bool]
"""What ``relaygraph.record_no_room`` calls: ``record(task_id, attempt, reason)``, False
while the ledger has no room."""
NO_ROOM_RETRY_SECONDS = 2.0
"""How soon a failure the ledger refused for lack of room is tried again."""

log = logging.getLogger(__name__)


def record_ledger_failure(task_id: str, attempt: int, reason: str) -> bool:
    """Write the failure of the task's ``attempt``, which stopped on a full disk, in this
    worker process's ledger; False while it still has no room (see
    :meth:`~relaygraph.worker.WorkerRuntime.record_no_room`)."""
    from relaygraph.worker._runtime import worker_runtime

    return worker_runtime().record_no_room(task_id, attempt, reason)


def run_ledger_task(task_id: str, dispatch: int) -> None:
    """Run (or continue) the ledger's task ``task_id`` in this worker process.

    The one place where the worker mode meets the runner: it takes the next attempt from
    the ledger for this dispatch (its fencing number; a redelivered message carries the same
    arguments, so the number cannot come from the message), runs the task with the same
    ``TaskRunner`` as ``serve``, passing that attempt to every ledger write, and returns when
    the task finished, paused for a person or was cancelled (the message is then
    acknowledged: a paused task holds no worker), or when another attempt took the task
    over. The process's ledger and runner are made in the process, after the fork
    (:func:`~relaygraph.worker.worker_runtime`).

    Args:
        task_id: The ledger's task.
        dispatch: The ledger's count of times the task was handed to the workers (its
            submission, then each decision that continues it); a message whose dispatch is
            not the task's current one is stale, and dropped.
    """
    from relaygraph.worker._runtime import worker_runtime

    worker_runtime().run(task_id, dispatch)


def celery_config(settings: WorkerSettings) -> dict[str, Any]:
    """The Celery configuration of the worker mode, from ``settings``."""
    timeout_ms = int(settings.consumer_timeout_seconds * 1000)
    queues = [
        Queue(
            name,
            Exchange(name, type="direct"),
            routing_key=name,
            durable=True,
            # RabbitMQ >= 3.12 closes the channel of a consumer that holds a message longer
            # than this (a stuck worker); older brokers ignore it (measured on 3.10.8: no
            # effect, no error) and apply their global consumer_timeout instead.
            consumer_arguments={"x-consumer-timeout": timeout_ms},
        )
        for name in settings.queues
    ]
    first = settings.queues[0]
    return {
        # Acknowledge a task's message when its run returns, not when a worker receives it:
        # a worker that dies mid-run leaves the message unacknowledged and RabbitMQ gives it
        # to another worker at once (measured: 6-13 ms after kill -9 of the worker).
        "task_acks_late": True,
        # A prefork child killed under its task (OOM killer, a segfault in native code)
        # requeues the message instead of acknowledging it as failed (measured: redelivered
        # 0.05-4.4 s after the child's kill -9, when the pool notices). The ledger's attempt
        # count ends a task that kills its child every time.
        "task_reject_on_worker_lost": True,
        # A run that raised has been ended in the ledger by the runner (failed, with its
        # reason); redelivering it would only fail it again.
        "task_acks_on_failure_or_timeout": True,
        # Each child reserves one message at a time: a waiting task is never held by a busy
        # worker while another worker is idle, and a worker that dies holds only what it runs.
        "worker_prefetch_multiplier": 1,
        # A worker that was frozen (SIGSTOP, a paused VM) loses its connection after missed
        # heartbeats and its task goes to another worker; when it resumes, kill the child
        # still running the old attempt instead of letting it run to the end. The threads
        # pool of tasks in flight cannot kill one run (Celery's threads pool refuses to):
        # there the old attempt's watch (AttemptWatch) and its fenced writes stop it at its
        # next step boundary, or at its next write.
        "worker_cancel_long_running_tasks_on_connection_loss": settings.tasks_in_flight is None,
        "broker_url": settings.broker_url,
        "broker_heartbeat": settings.broker_heartbeat,
        "broker_connection_retry_on_startup": True,
        # Publisher confirms: publish_run returns only once RabbitMQ has the message, so an
        # API server that answered 202 has really queued the task.
        "broker_transport_options": {"confirm_publish": True},
        "task_queues": queues,
        "task_default_queue": first,
        "task_default_exchange": first,
        "task_default_routing_key": first,
        "task_routes": {RUN_TASK: {"queue": first}, RECORD_NO_ROOM: {"queue": first}},
        "control_exchange": settings.control_exchange,
        # The ledger holds every result: no result backend, nothing stored per task.
        "task_ignore_result": True,
        "result_backend": None,
        # JSON only: a message cannot carry code (pickle), and a worker running as root
        # does not have to refuse it.
        "task_serializer": "json",
        "accept_content": ["json"],
        "worker_hijack_root_logger": False,
    }


def create_celery_app(
    settings: WorkerSettings,
    *,
    run: RunHook = run_ledger_task,
    record: RecordHook = record_ledger_failure,
) -> Celery:
    """The worker mode's Celery application, whose ``relaygraph.run_task`` calls ``run``
    and ``relaygraph.record_no_room`` calls ``record``.

    Args:
        settings: The broker, queues and timings (:class:`WorkerSettings`).
        run: What a worker does with a task id and its dispatch number (tests give their
            own; the workers run :func:`run_ledger_task`).
        record: What writes a failure for lack of room that the ledger refused at the end
            of its run (:func:`record_ledger_failure`).

    Raises:
        ConfigError: ``settings`` names no broker.
    """
    if settings.broker_url is None:
        raise ConfigError(
            "the worker mode needs a broker: set RELAYGRAPH_BROKER_URL (amqp://user:password@host:5672/)"
        )
    app = Celery("relaygraph", set_as_current=False)
    app.conf.update(celery_config(settings))

    # shared=False: a shared task (Celery's default) is added to every app finalized later
    # in the process, so a second app would run the first app's hook.
    @app.task(name=RUN_TASK, shared=False, bind=True, max_retries=None)
    def run_task(self: Any, task_id: str, dispatch: int) -> None:
        """Run the ledger's task ``task_id`` for its dispatch ``dispatch`` (see ``run``);
        again later, as a new message, while the database cannot begin it."""
        try:
            run(task_id, dispatch)
        except Exception as exc:
            # The run itself records its failures; what comes out is its start (the ledger's
            # begin_attempt). Acknowledged as failed, the message would leave the task queued
            # and published until an API server found it stale with the queue empty.
            if not is_database_unavailable(exc):
                raise
            log.warning("task %s: the database is unavailable, tried again later: %s", task_id, exc)
            raise self.retry(countdown=DATABASE_RETRY_SECONDS) from exc

    # The message is acknowledged once written (late acknowledgement): a worker that dies
    # before leaves it to another. Each retry is a new message, with its countdown.
    @app.task(name=RECORD_NO_ROOM, shared=False, bind=True, max_retries=None)
    def record_no_room(self: Any, task_id: str, attempt: int, reason: str) -> None:
        """Write the failure of the task's ``attempt``; again later while there is no room."""
        if not record(task_id, attempt, reason):
            raise self.retry(countdown=NO_ROOM_RETRY_SECONDS)

    if run is run_ledger_task:
        _prepare_children(app, in_flight=settings.tasks_in_flight is not None)
    return app


def _prepare_children(app: Celery, *, in_flight: bool) -> None:
    """Make each prefork child's ledger and runner as the child starts, after the fork (or,
    with tasks ``in_flight``, the worker process's own once it is ready), and let its runs
    publish the task queued next on their thread through ``app``."""
    from celery.signals import (
        worker_process_init,
        worker_process_shutdown,
        worker_ready,
        worker_shutdown,
    )

    from relaygraph.worker._runtime import close_worker_runtime, worker_runtime

    def start(**_: Any) -> None:
        from relaygraph.runner import settle_long_lived

        runtime = worker_runtime(
            publish=lambda task_id, dispatch: publish_run(app, task_id, dispatch),
            record_later=lambda task_id, attempt, reason: publish_no_room(
                app, task_id, attempt, reason
            ),
        )
        settle_long_lived()  # before the child's first task, as the server's workers do
        # Its slot counts for the publishers from now on. Started last: the pool's parent
        # kills a child that is not up within a few seconds, and the reports' queries
        # must not compete with the imports of its start on a loaded machine.
        runtime.start_reporting()

    def stop(**_: Any) -> None:
        close_worker_runtime()

    if in_flight:  # One process, no pool of children: no fork to wait for.
        worker_ready.connect(start, weak=False)
        worker_shutdown.connect(stop, weak=False)
    else:
        worker_process_init.connect(start, weak=False)
        worker_process_shutdown.connect(stop, weak=False)


def publish_run(app: Celery, task_id: str, dispatch: int) -> None:
    """Queue the ledger's task ``task_id`` for a worker; returns once RabbitMQ has it.

    Call it after the transaction that made the task ``queued`` (with this ``dispatch``)
    has committed, so no worker can take the message before the ledger shows the task.
    """
    app.send_task(RUN_TASK, args=(task_id, dispatch))


def publish_no_room(app: Celery, task_id: str, attempt: int, reason: str) -> None:
    """Hand the failure of the task's ``attempt``, stopped on a full disk, to a worker
    (``relaygraph.record_no_room``); returns once RabbitMQ has it."""
    app.send_task(RECORD_NO_ROOM, args=(task_id, attempt, reason), countdown=NO_ROOM_RETRY_SECONDS)


def default_node_name(pid: int | None = None) -> str:
    """The node name of a ``relaygraph worker`` not given ``--hostname``:
    ``relaygraph-<pid>@<host>``, unique per process on a host.

    Celery's own default, ``celery@<host>``, is the same for every worker of a host, and
    RabbitMQ lets only one connection hold a node's exclusive control queue
    (``<name>.<exchange>.pidbox``): a second worker started the same way failed to start.
    """
    return f"relaygraph-{os.getpid() if pid is None else pid}@{socket.gethostname()}"


def worker_argv(settings: WorkerSettings, *, hostname: str | None = None) -> list[str]:
    """The arguments of ``app.start`` for a ``relaygraph worker`` process.

    Args:
        settings: Its queues and concurrency (prefork children, or threads each waiting for
            a task in flight: ``tasks_in_flight``).
        hostname: The worker's node name (``name@host``); two workers on one host need
            different names. :func:`default_node_name` when None.
    """
    in_flight = settings.tasks_in_flight
    pool = ["--pool=prefork", f"--concurrency={settings.concurrency}"]
    if in_flight is not None:
        # With prefetch 1, the worker reserves as many messages as its pool has threads.
        pool = ["--pool=threads", f"--concurrency={in_flight}"]
    argv = [
        "worker",
        *pool,
        f"--queues={','.join(settings.queues)}",
        # Mingle (revoked ids from the other workers at start) and gossip (events between
        # workers) serve Celery's revoke and clock sync; the ledger carries cancels, and
        # without them a worker is ready in under a second.
        "--without-mingle",
        "--without-gossip",
        "--loglevel=INFO",
    ]
    argv.append(f"--hostname={hostname if hostname is not None else default_node_name()}")
    return argv
