"""The worker mode: API servers queue task ids on RabbitMQ, a pool of Celery workers runs them.

``relaygraph serve`` with ``RELAYGRAPH_BROKER_URL`` runs no graphs: it writes the task to the
ledger and publishes its id (:func:`publish_run`); ``relaygraph worker`` is a Celery worker
(:func:`create_celery_app`, :func:`worker_argv`) that runs it from the ledger. Event streams on
any API server learn of new events through PostgreSQL ``NOTIFY`` (:class:`EventListener`).
Without a broker none of this is used: ``serve`` runs tasks in its own process, as on a single
machine. How to deploy it: docs/deploy.md.
"""

from relaygraph.worker._app import (
    RECORD_NO_ROOM,
    RUN_TASK,
    RecordHook,
    RunHook,
    celery_config,
    create_celery_app,
    default_node_name,
    publish_no_room,
    publish_run,
    record_ledger_failure,
    run_ledger_task,
    worker_argv,
)
from relaygraph.worker._notify import (
    DEFAULT_CHANNEL,
    EventListener,
    EventNotice,
    TaskWatch,
    libpq_url,
    notify,
)
from relaygraph.worker._publish import Publish, publish_fair
from relaygraph.worker._runtime import (
    WorkerRuntime,
    close_worker_runtime,
    prepare_worker,
    worker_runtime,
)
from relaygraph.worker._settings import DEFAULT_QUEUE, WorkerSettings, load_worker_settings
from relaygraph.worker._start import (
    BROKER_START_TRIES,
    WorkerStartError,
    check_broker,
    start_worker,
)

__all__ = [
    "BROKER_START_TRIES",
    "DEFAULT_CHANNEL",
    "DEFAULT_QUEUE",
    "RECORD_NO_ROOM",
    "RUN_TASK",
    "EventListener",
    "EventNotice",
    "Publish",
    "RecordHook",
    "RunHook",
    "TaskWatch",
    "WorkerRuntime",
    "WorkerSettings",
    "WorkerStartError",
    "celery_config",
    "check_broker",
    "close_worker_runtime",
    "create_celery_app",
    "default_node_name",
    "libpq_url",
    "load_worker_settings",
    "notify",
    "prepare_worker",
    "publish_fair",
    "publish_no_room",
    "publish_run",
    "record_ledger_failure",
    "run_ledger_task",
    "start_worker",
    "worker_argv",
    "worker_runtime",
]
