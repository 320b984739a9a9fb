"""The worker mode's settings, from ``RELAYGRAPH_*`` environment variables (pydantic-settings).

Both roles of the worker mode read them: ``relaygraph serve`` to publish task ids to the
broker, ``relaygraph worker`` to consume them. The ledger's own settings
(``RELAYGRAPH_DATABASE_URL``, ``RELAYGRAPH_MAX_ATTEMPTS``) are the ones ``serve`` reads.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["DEFAULT_QUEUE", "WorkerSettings", "load_worker_settings"]

DEFAULT_QUEUE = "relaygraph"
"""The queue API servers publish task ids to and workers consume, unless told otherwise."""

_FLAGS = {
    "concurrency": "--concurrency",
    "queues": "--queues",
    "tasks_in_flight": "--tasks-in-flight",
}
# RabbitMQ takes any UTF-8 name up to 255 bytes; we keep to names that read well in
# `rabbitmqctl list_queues` and in a shell.
_QUEUE = re.compile(r"[A-Za-z0-9_.:-]{1,200}")
# A PostgreSQL identifier (LISTEN takes one), at most 63 bytes.
_CHANNEL = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class WorkerSettings(BaseSettings):
    """How the worker mode reaches its broker and how a worker runs tasks.

    Every field is also ``RELAYGRAPH_<FIELD>`` in the environment.
    """

    model_config = SettingsConfigDict(env_prefix="RELAYGRAPH_", extra="ignore", frozen=True)

    broker_url: str | None = None
    """The RabbitMQ broker (``amqp://user:password@host:5672/vhost``). None (the default):
    no worker mode; ``serve`` runs tasks in its own process, as on a single machine."""
    queues: list[str] = Field(default_factory=lambda: [DEFAULT_QUEUE], min_length=1)
    """The queues a worker consumes (``worker --queues``); API servers publish to the first.
    Durable, so queued task ids survive a broker restart."""
    concurrency: int = Field(default=2, ge=1, le=64)
    """Tasks one worker runs at once: prefork child processes, one task each (``worker
    --concurrency``). A graph run is mostly waiting on models, but a child per task keeps a
    crash (the embedded model, a tool's native code) to that one task. Ignored when
    ``tasks_in_flight`` is set."""
    tasks_in_flight: int | None = Field(default=None, ge=1, le=10_000)
    """Tasks one worker process holds in flight at once (``worker --tasks-in-flight``): its
    runs are coroutines on one event loop (``TaskRunner.arun``), each message's run handed
    to it by a thread of Celery's ``threads`` pool that waits for it (so that the message is
    acknowledged when its run returns, as in the prefork pool). A run holds no thread or
    process while it waits for a model, so one process holds hundreds; a crash of the
    process (the OOM killer, native code) then gives every task it held to another worker.
    The process reports this many slots to the publishers. None (the default): the prefork
    pool of ``concurrency`` processes, one task each."""
    broker_heartbeat: float = Field(default=10.0, ge=2.0, le=60.0)
    """AMQP heartbeat in seconds. It decides how soon RabbitMQ gives a *frozen* worker's task
    (SIGSTOP, a stalled VM) to another: measured on RabbitMQ 3.10, about 2.9 times this value
    (10 s: 29 s). A worker that dies is noticed at once (its socket closes), whatever this
    says. Lower values notice sooner but close connections of workers that are only slow to
    run their event loop."""
    consumer_timeout_seconds: float = Field(default=6 * 3600.0, ge=60.0)
    """How long a worker may hold one task unacknowledged before RabbitMQ closes its channel
    and gives the task to another: the backstop for a worker that is alive but stuck. It must
    be above the longest run (a paused task acknowledges and holds nothing). Sent as the
    consumer argument ``x-consumer-timeout``, which RabbitMQ 3.12 and later honour; older
    brokers (3.10, 3.11) ignore it and use their global ``consumer_timeout`` (30 minutes by
    default; set it in rabbitmq.conf, see docs/deploy.md)."""
    control_exchange: str = "relaygraph"
    """The name of Celery's broadcast exchange for remote control (``<name>.pidbox``): apart
    from any other Celery application on the same vhost, so their ``revoke``, ``ping`` or
    ``shutdown`` never reach relaygraph's workers."""
    events_channel: str = "relaygraph_events"
    """The PostgreSQL ``NOTIFY`` channel on which "task X has events up to seq N" reaches
    every API server's event streams (:mod:`relaygraph.worker._notify`)."""
    publish_ahead: int | None = Field(default=None, ge=1, le=10_000)
    """Published tasks that may wait in RabbitMQ for a worker. The rest of the queued tasks
    wait in the ledger, and the next to publish is picked there fairly between projects
    (``Ledger.tasks_to_publish``) whenever a task starts or ends: so a project's task waits
    behind at most this many others' in RabbitMQ, not behind another project's whole flood.
    None (the default): automatic, the free slots of the live workers (each pool process
    reports itself in the ledger, ``worker_slots``); a number overrides it."""

    @field_validator("queues")
    @classmethod
    def _queue_names(cls, value: list[str]) -> list[str]:
        return [_named(name, _QUEUE, "a queue name (letters, digits, _ . : -)") for name in value]

    @field_validator("control_exchange")
    @classmethod
    def _exchange_name(cls, value: str) -> str:
        return _named(value, _QUEUE, "an exchange name (letters, digits, _ . : -)")

    @field_validator("events_channel")
    @classmethod
    def _channel_name(cls, value: str) -> str:
        return _named(
            value, _CHANNEL, "a PostgreSQL channel name (lower case, digits, _; 63 at most)"
        )


def _named(value: str, pattern: re.Pattern[str], what: str) -> str:
    """``value``, if ``pattern`` matches it whole.

    Raises:
        ValueError: It does not; the message says ``what`` the value is not.
    """
    if not pattern.fullmatch(value):
        raise ValueError(f"{value!r} is not {what}")
    return value


def load_worker_settings(**overrides: Any) -> WorkerSettings:
    """The worker mode's settings: ``overrides`` (command-line flags) over the environment.

    Raises:
        ConfigError: A setting is invalid; the message names its variable (and flag) and
            the value.
    """
    from relaygraph.runner import read_settings

    return read_settings(
        WorkerSettings,
        overrides,
        role="worker",
        flags=_FLAGS,
        list_example=f"""'["{DEFAULT_QUEUE}"]'""",
    )
