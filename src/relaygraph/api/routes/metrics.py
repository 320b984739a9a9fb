"""``GET /metrics``: the ledger's numbers for Prometheus, for operators (no project key).

The Prometheus text format is written here rather than with ``prometheus_client``: two
gauges read from the ledger on each scrape need no registry, and the single-machine server
keeps its dependencies as they are.

Every project's tasks are counted, so a project's key does not open it: it answers requests
from this machine's loopback that no proxy forwarded, and anyone who sends the operator's
token (``RELAYGRAPH_METRICS_TOKEN``).
"""

import hmac
import ipaddress
from datetime import UTC, datetime

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from relaygraph.api._errors import error_body
from relaygraph.api._in_process import WorkersLoad
from relaygraph.api._state import ServiceState
from relaygraph.store import TASK_STATUSES

__all__ = ["CONTENT_TYPE", "MetricsSettings", "metrics_router", "metrics_text"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""Prometheus' text exposition format."""
FORWARDED_HEADERS = ("forwarded", "x-forwarded-for", "x-real-ip")
"""Headers a reverse proxy adds: a request carrying one came from elsewhere, whatever its
peer address says (a proxy on the same machine connects from loopback)."""


class MetricsSettings(BaseSettings):
    """Who may read ``/metrics``. Every field is also ``RELAYGRAPH_METRICS_<FIELD>`` in the env."""

    model_config = SettingsConfigDict(env_prefix="RELAYGRAPH_METRICS_", extra="ignore", frozen=True)

    token: SecretStr | None = None
    """The operator's token: a scrape that sends ``Authorization: Bearer <token>`` is
    answered from anywhere. None (the default): only from loopback, unproxied."""


def metrics_router(state: ServiceState, settings: MetricsSettings | None = None) -> APIRouter:
    """``GET /metrics`` (left out of the OpenAPI document: it is not the projects' API).

    Args:
        state: The app's state (its ledger).
        settings: Who may read it; from ``RELAYGRAPH_METRICS_*`` when None.
    """
    settings = settings or MetricsSettings()
    router = APIRouter(include_in_schema=False)

    @router.get("/metrics")
    def metrics(request: Request) -> Response:
        """Tasks by status and the age of the oldest queued one, in Prometheus' format."""
        if not _may_read(request, settings):
            return JSONResponse(
                error_body(
                    "forbidden",
                    "/metrics answers this machine's loopback, or a request with "
                    "'Authorization: Bearer <RELAYGRAPH_METRICS_TOKEN>'",
                ),
                status_code=403,
            )
        ledger = state.ledger()
        text = metrics_text(
            ledger.count_tasks_by_status(),
            ledger.oldest_queued_at(),
            now=datetime.now(UTC),
            load=state.workers_load(),
        )
        return Response(text, media_type=CONTENT_TYPE)

    return router


def metrics_text(
    counts: dict[str, int],
    oldest_queued_at: datetime | None,
    *,
    now: datetime,
    load: WorkersLoad | None = None,
) -> str:
    """The metrics in Prometheus' text format.

    Args:
        counts: Tasks per status (a status missing counts 0).
        oldest_queued_at: When the oldest ``queued`` task was queued; None when none is.
        now: The time of the scrape.
        load: What this server process's workers hold (None in the worker mode, where the
            API server runs no tasks).
    """
    age = 0.0 if oldest_queued_at is None else max(0.0, (now - oldest_queued_at).total_seconds())
    lines = [
        "# HELP relaygraph_tasks Tasks in the ledger by status, every project's.",
        "# TYPE relaygraph_tasks gauge",
        *(f'relaygraph_tasks{{status="{s}"}} {counts.get(s, 0)}' for s in TASK_STATUSES),
        "# HELP relaygraph_oldest_queued_task_age_seconds How long the oldest queued task "
        "has waited (0 when none waits).",
        "# TYPE relaygraph_oldest_queued_task_age_seconds gauge",
        f"relaygraph_oldest_queued_task_age_seconds {age:.3f}",
    ]
    if load is not None:
        lines += _load_lines(load)
    return "\n".join(lines) + "\n"


def _load_lines(load: WorkersLoad) -> list[str]:
    """This process's tasks in flight, the ones waiting for room, and its task loop's lag."""
    gauges = (
        ("tasks_in_flight", "Tasks running in this server process.", load.in_flight),
        (
            "tasks_in_flight_max",
            "Tasks this server process runs at once at most (--workers, its share).",
            load.capacity,
        ),
        (
            "tasks_waiting",
            "Tasks taken by this server process that wait for room among those in flight.",
            load.waiting,
        ),
        (
            "event_loop_lag_seconds",
            "How late the task loop's timers fire: how long a ready task waits for the loop.",
            round(load.loop_lag_seconds, 4),
        ),
        (
            "sync_steps_waiting",
            "Sync steps of running tasks (tools, ledger writes) waiting for a thread.",
            load.sync_queue,
        ),
    )
    lines: list[str] = []
    for name, help_text, value in gauges:
        lines += [
            f"# HELP relaygraph_{name} {help_text}",
            f"# TYPE relaygraph_{name} gauge",
            f"relaygraph_{name} {value}",
        ]
    return lines


def _may_read(request: Request, settings: MetricsSettings) -> bool:
    expected = settings.token.get_secret_value() if settings.token is not None else ""
    if expected:
        scheme, _, sent = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(
            sent.strip().encode(), expected.encode()
        ):
            return True
    if any(name in request.headers for name in FORWARDED_HEADERS):
        return False
    return request.client is not None and _loopback(request.client.host)


def _loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # Not an address (a test client's name, a Unix socket).
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback  # ::ffff:127.0.0.1 from a dual-stack socket
    return address.is_loopback
