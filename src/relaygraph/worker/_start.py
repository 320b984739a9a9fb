"""Starting a ``relaygraph worker``: what it checks before Celery starts, and how a start that
fails anyway becomes one line and a non-zero exit code.

Celery alone does neither. With ``broker_connection_retry_on_startup`` it retries an
unreachable broker forever, and a worker that cannot start (the broker refuses its login, or
another worker of the same node name holds its control queue) logs a traceback and returns
from ``worker_main`` as if it had stopped cleanly, exit code 0. A supervisor (systemd, a
shell script, Kubernetes) must see such a worker fail.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from relaygraph.errors import ConfigError, RelaygraphError

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["BROKER_START_TRIES", "WorkerStartError", "check_broker", "start_worker"]

BROKER_START_TRIES = 4
"""Connection attempts to the broker before a worker gives up starting (about 10 s in all):
enough for a broker that is still starting beside it, short enough that a wrong URL is
reported while someone is watching."""


class WorkerStartError(RelaygraphError):
    """A worker could not start: the broker or the ledger refused it, or its node name is in
    use. The message names the cause."""


def check_broker(app: Celery, node_name: str) -> None:
    """Connect to ``app``'s broker and check that no running worker holds ``node_name``.

    Args:
        app: The worker mode's Celery application (its broker URL and control exchange).
        node_name: The node name the worker will take (``name@host``).

    Raises:
        ConfigError: The broker cannot be reached or refuses the login (the URL is named
            without its password), or another worker holds ``node_name``.
    """
    from amqp.exceptions import NotFound, ResourceLocked
    from kombu.exceptions import OperationalError

    with app.connection_for_read() as connection:
        shown = connection.as_uri()  # kombu masks the password.
        try:
            connection.ensure_connection(
                max_retries=BROKER_START_TRIES - 1, interval_start=1, interval_step=2
            )
        except (OperationalError, OSError) as exc:
            raise ConfigError(f"cannot reach the broker at {shown}: {_one_line(exc)}") from None
        except Exception as exc:  # amqp's AccessRefused and the like: the broker said no.
            raise ConfigError(
                f"the broker at {shown} refused the worker: {_one_line(exc)}"
            ) from None
        # Celery's remote-control queue of a node is exclusive to the connection of the worker
        # that runs it: asking for it passively tells a free name (404) from one in use (405)
        # without declaring anything.
        queue = f"{node_name}.{app.conf.control_exchange}.pidbox"
        channel = connection.channel()
        try:
            channel.queue_declare(queue=queue, passive=True)
        except NotFound:
            return
        except ResourceLocked:
            raise ConfigError(
                f"another worker runs as {node_name!r} on the broker at {shown}; give this one "
                "another --hostname (name@host), or leave it out for relaygraph-<pid>@<host>"
            ) from None
        finally:
            if channel.is_open:
                channel.close()


def start_worker(app: Celery, argv: list[str]) -> None:
    """Run the Celery worker ``argv`` until it stops.

    Raises:
        WorkerStartError: Celery stopped with a failure (an unrecoverable error while it
            started, or a cold shutdown); the message is its cause, in one line.
    """
    from celery.signals import worker_shutdown
    from celery.utils.log import worker_logger

    failure = _FailureLine()
    exit_codes: list[int | None] = []

    def stopped(sender: Any, **_: Any) -> None:
        exit_codes.append(getattr(sender, "exitcode", None))

    # `app.start` drops the exit code of Celery's command line (it returns it only from an
    # `Exit` that click, run with standalone_mode=False, has already turned into a return
    # value): the worker's own `exitcode`, sent with `worker_shutdown`, is the one to trust.
    worker_shutdown.connect(stopped, weak=False)
    worker_logger.addFilter(failure)
    try:
        app.start(argv)
    finally:
        worker_logger.removeFilter(failure)
        worker_shutdown.disconnect(stopped)
    code = next((code for code in exit_codes if code), None)
    if code or failure.cause:
        cause = failure.cause or f"Celery's worker exited with status {code}"
        raise WorkerStartError(f"the worker stopped: {cause}")


class _FailureLine(logging.Filter):
    """Turns Celery's "Unrecoverable error" record (logged with its traceback) into one line,
    and keeps its cause for the exit message."""

    def __init__(self) -> None:
        super().__init__()
        self.cause: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            self.cause = _one_line(record.exc_info[1])
            record.msg, record.args = "%s: %s", (record.getMessage().split(":")[0], self.cause)
            record.exc_info = record.exc_text = None
        return True


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())
