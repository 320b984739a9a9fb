"""The API server in the worker mode (issue 18): it runs no tasks, it records them and
publishes ``(task_id, dispatch)`` to RabbitMQ; its event streams wake on PostgreSQL notices;
``/readyz`` checks the broker and the listener; ``/metrics`` counts the ledger's tasks.

The app runs in process (httpx.ASGITransport) or, for the event streams, as a real uvicorn
server on loopback. The broker cases use this machine's RabbitMQ, each on a queue of its own
that is deleted afterwards, and read what the server published with kombu; they skip when
RabbitMQ is not reachable, unless ``RELAYGRAPH_REQUIRE_RABBITMQ=1`` (CI) makes that a failure.
The ledger is a fresh PostgreSQL schema per test (``postgres_url``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from kombu import Connection

from relaygraph.api import ServiceSettings, create_app
from relaygraph.api._broker import BrokerDispatch
from relaygraph.api.routes import events as events_route
from relaygraph.api.routes.metrics import metrics_text
from relaygraph.errors import ConfigError
from relaygraph.events import (
    approval_request,
    interrupted_event,
    run_finished_event,
    token_event,
)
from relaygraph.store import Ledger
from relaygraph.worker import RUN_TASK, WorkerSettings

from ._service import auth, in_process
from .conftest import EXAMPLE_RELAY
from .worker_cluster import DEFAULT_BROKER_URL

HUGE = 3600.0
"""A poll interval no test waits out: what arrives sooner was woken by a notice."""


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def service_settings(home: Path, database_url: str | None = None) -> ServiceSettings:
    return ServiceSettings(
        default_model=f"scripted:{EXAMPLE_RELAY}", home=home, database_url=database_url
    )


# No broker needed.


def test_the_worker_mode_refuses_a_sqlite_ledger(home: Path) -> None:
    broker = WorkerSettings(broker_url=f"amqp://guest:guest@127.0.0.1:{closed_port()}//")
    with pytest.raises(ConfigError, match="RELAYGRAPH_DATABASE_URL") as refused:
        create_app(service_settings(home), worker_settings=broker)
    assert "sqlite" in str(refused.value)


def test_the_worker_mode_refuses_server_processes(home: Path) -> None:
    # Its API servers run no tasks: more processes there would be processes doing nothing.
    broker = WorkerSettings(broker_url=f"amqp://guest:guest@127.0.0.1:{closed_port()}//")
    settings = service_settings(home).model_copy(update={"workers": 4, "processes": 2})
    with pytest.raises(ConfigError, match=r"--processes 2: in the worker mode"):
        create_app(settings, worker_settings=broker)


def test_the_broker_url_comes_from_the_environment(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without a broker: the server runs tasks itself, as on a single machine.
    assert not create_app(service_settings(home)).state.service.worker_mode
    monkeypatch.setenv("RELAYGRAPH_BROKER_URL", DEFAULT_BROKER_URL)
    with pytest.raises(ConfigError, match=r"worker mode .* needs the ledger on PostgreSQL"):
        create_app(service_settings(home))


def test_metrics_text_is_prometheus_exposition() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    text = metrics_text({"queued": 3, "running": 1}, now - timedelta(seconds=90), now=now)
    lines = text.splitlines()
    assert "# TYPE relaygraph_tasks gauge" in lines
    assert 'relaygraph_tasks{status="queued"} 3' in lines
    assert 'relaygraph_tasks{status="running"} 1' in lines
    assert 'relaygraph_tasks{status="cancelled"} 0' in lines  # Every status, 0 too.
    assert "# TYPE relaygraph_oldest_queued_task_age_seconds gauge" in lines
    assert "relaygraph_oldest_queued_task_age_seconds 90.000" in lines
    assert text.endswith("\n")
    assert "relaygraph_oldest_queued_task_age_seconds 0.000" in metrics_text({}, None, now=now)


async def test_metrics_answer_loopback_or_the_operators_token(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAYGRAPH_METRICS_TOKEN", "s3cret-metrics")
    app = create_app(service_settings(home))
    async with app.router.lifespan_context(app):

        async def get(client: tuple[str, int], **headers: str) -> httpx.Response:
            transport = httpx.ASGITransport(app=app, client=client)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                return await http.get("/metrics", headers=headers)

        here = await get(("127.0.0.1", 5000))
        assert here.status_code == 200
        assert here.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert 'relaygraph_tasks{status="queued"} 0' in here.text
        # A proxy on this machine connects from loopback: its forwarded requests are not.
        proxied = await get(("127.0.0.1", 5000), **{"X-Forwarded-For": "203.0.113.7"})
        assert proxied.status_code == 403
        assert (await get(("203.0.113.7", 5000))).status_code == 403
        wrong = await get(("203.0.113.7", 5000), Authorization="Bearer nope")
        assert wrong.status_code == 403
        assert wrong.json()["error"]["code"] == "forbidden"
        token = await get(("203.0.113.7", 5000), Authorization="Bearer s3cret-metrics")
        assert token.status_code == 200
        # Not a project's endpoint: not in the OpenAPI document.
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t"
        ) as http:
            assert "/metrics" not in (await http.get("/openapi.json")).json()["paths"]


# On RabbitMQ and PostgreSQL.


@pytest.fixture
def worker_settings(rabbitmq: str) -> Iterator[WorkerSettings]:
    """The worker mode on a queue, a control exchange and a notice channel of the test's
    own; the queue and its exchange are deleted afterwards."""
    name = f"rg-api-test-{uuid.uuid4().hex[:10]}"
    yield WorkerSettings(
        broker_url=rabbitmq,
        queues=[name],
        control_exchange=f"{name}-ctl",
        events_channel=f"rg_api_test_{uuid.uuid4().hex[:12]}",
    )
    with Connection(rabbitmq) as connection:
        channel = connection.default_channel
        channel.queue_delete(name)
        channel.exchange_delete(name)


def published(settings: WorkerSettings) -> list[tuple[str, int]]:
    """Take every message waiting on the test's queue: ``(task_id, dispatch)`` each.

    Publisher confirms make the server answer only once RabbitMQ has the message, so what
    a request published is in the queue when its answer arrives.
    """
    assert settings.broker_url is not None
    taken: list[tuple[str, int]] = []
    with Connection(settings.broker_url) as connection:
        channel = connection.default_channel
        with contextlib.suppress(Exception):  # No queue yet: nothing was ever published.
            while (message := channel.basic_get(settings.queues[0], no_ack=True)) is not None:
                assert message.headers["task"] == RUN_TASK
                args, _, _ = json.loads(message.body)
                taken.append((args[0], args[1]))
    return taken


@dataclass
class BrokerApi:
    app: FastAPI
    client: httpx.AsyncClient
    ledger_url: str
    settings: WorkerSettings

    def key(self, name: str) -> str:
        with Ledger(self.ledger_url) as ledger:
            return ledger.create_project(name)[1]

    async def submitted(self) -> httpx.Response:
        """The answer to a task ("When?") of a new project ``acme``, accepted."""
        key = self.key("acme")
        made = await self.client.post("/v1/tasks", json={"input": "When?"}, headers=auth(key))
        assert made.status_code == 202, made.text
        return made

    def task(self, task_id: str) -> Any:
        with Ledger(self.ledger_url) as ledger:
            project = ledger.task_owner(task_id)
            assert project is not None
            return ledger.get_task(task_id, project_id=project)


@contextlib.asynccontextmanager
async def broker_api(
    home: Path, ledger_url: str, settings: WorkerSettings, **options: Any
) -> AsyncIterator[BrokerApi]:
    app = create_app(service_settings(home, ledger_url), worker_settings=settings, **options)
    async with in_process(app) as client:
        yield BrokerApi(app, client, ledger_url, settings)


@pytest.fixture
async def api(
    home: Path, postgres_url: str, worker_settings: WorkerSettings
) -> AsyncIterator[BrokerApi]:
    async with broker_api(home, postgres_url, worker_settings) as running:
        yield running


async def test_a_submission_publishes_its_id_once_and_runs_nothing(api: BrokerApi) -> None:
    key = api.key("acme")
    made = await api.client.post("/v1/tasks", json={"input": "When?"}, headers=auth(key))
    assert made.status_code == 202, made.text
    task_id = made.json()["id"]
    assert made.json()["status"] == "queued"
    assert published(api.settings) == [(task_id, 1)]
    # Nothing runs it here: no worker pool in the server, no event, still queued.
    assert isinstance(api.app.state.service.dispatch(), BrokerDispatch)
    time.sleep(0.5)
    task = api.task(task_id)
    assert (task.status, task.last_event_seq, task.dispatch) == ("queued", 0, 1)
    got = await api.client.get(f"/v1/tasks/{task_id}", headers=auth(key))
    assert got.json()["status"] == "queued"


async def test_a_decision_publishes_the_next_dispatch(api: BrokerApi) -> None:
    key = api.key("acme")
    made = await api.client.post("/v1/tasks", json={"input": "Run it"}, headers=auth(key))
    task_id = made.json()["id"]
    assert published(api.settings) == [(task_id, 1)]
    # What a worker does with that message until the task pauses for an approval.
    with Ledger(api.ledger_url) as ledger:
        attempt = ledger.begin_attempt(task_id, dispatch=1, worker_id="w1", max_attempts=3)
        assert attempt is not None
        request = approval_request(
            "coder", tool="run_python", args={"code": "print(1)"}, tool_call_id="c1", step=3
        )
        ledger.append_events(
            task_id,
            [interrupted_event({"id": "interrupt-1", **request})],
            attempt=attempt,
        )
        ledger.end_run(task_id, usage={}, status="interrupted", attempt=attempt)
    decided = await api.client.post(
        f"/v1/tasks/{task_id}/approvals/interrupt-1",
        json={"decision": "approve"},
        headers=auth(key),
    )
    assert decided.status_code == 202, decided.text
    assert decided.json()["status"] == "queued"
    assert published(api.settings) == [(task_id, 2)]
    approvals = await api.client.get(f"/v1/tasks/{task_id}/approvals", headers=auth(key))
    assert approvals.json()["approvals"][0]["decision"] == "approve"
    # Decided already: a second decision is refused and publishes nothing.
    again = await api.client.post(
        f"/v1/tasks/{task_id}/approvals/interrupt-1",
        json={"decision": "approve"},
        headers=auth(key),
    )
    assert again.status_code == 409
    assert published(api.settings) == []


async def test_cancel_of_a_queued_task_publishes_the_next_on_its_thread(api: BrokerApi) -> None:
    key = api.key("acme")
    body = {"input": "First", "thread_id": "t-1", "multitask": "enqueue"}
    first = (await api.client.post("/v1/tasks", json=body, headers=auth(key))).json()
    second = (
        await api.client.post("/v1/tasks", json={**body, "input": "Second"}, headers=auth(key))
    ).json()
    # The second waits behind the first: recorded, not published.
    assert published(api.settings) == [(first["id"], 1)]
    cancelled = await api.client.post(f"/v1/tasks/{first['id']}/cancel", headers=auth(key))
    assert cancelled.json()["status"] == "cancelled"
    assert published(api.settings) == [(second["id"], 1)]


async def test_a_publish_failure_is_503_and_the_task_stays_queued(
    home: Path, postgres_url: str, worker_settings: WorkerSettings
) -> None:
    dead = worker_settings.model_copy(
        update={"broker_url": f"amqp://guest:guest@127.0.0.1:{closed_port()}//"}
    )
    headers = {"Idempotency-Key": "submit-1"}
    async with broker_api(home, postgres_url, dead) as down:
        key = down.key("acme")
        headers.update(auth(key))
        refused = await down.client.post("/v1/tasks", json={"input": "When?"}, headers=headers)
        assert refused.status_code == 503, refused.text
        error = refused.json()["error"]
        assert error["code"] == "broker_unavailable"
        with Ledger(postgres_url) as ledger:
            project = ledger.authenticate(key)
            assert project is not None
            [task], _ = ledger.list_tasks(project_id=project.id)
        assert task.id in error["message"]
        assert task.status == "queued"
        # Readiness says why.
        ready = await down.client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["error"]["message"].startswith("broker: ")
    # Another API server, with the broker up: the retry publishes the recorded task.
    async with broker_api(home, postgres_url, worker_settings, start_workers=False) as up:
        retried = await up.client.post("/v1/tasks", json={"input": "When?"}, headers=headers)
        assert retried.status_code == 202, retried.text
        assert retried.json()["id"] == task.id
        assert published(worker_settings) == [(task.id, 2)]


async def test_a_server_that_starts_publishes_again_what_waited_too_long(
    home: Path, postgres_url: str, worker_settings: WorkerSettings
) -> None:
    async with broker_api(home, postgres_url, worker_settings) as api:
        task_id = (await api.submitted()).json()["id"]
        assert published(worker_settings) == [(task_id, 1)]
        broker = api.app.state.service.broker()
        assert broker.republish_stale() == 0  # Queued a moment ago: its message is there.
        later = datetime.now(UTC) + broker.republish_after + timedelta(seconds=1)
        assert broker.republish_stale(now=later) == 1
        assert published(worker_settings) == [(task_id, 2)]


async def test_a_running_server_publishes_again_what_lost_its_message(
    home: Path, postgres_url: str, worker_settings: WorkerSettings
) -> None:
    async with broker_api(home, postgres_url, worker_settings) as api:
        task_id = (await api.submitted()).json()["id"]
        broker = api.app.state.service.broker()
        later = datetime.now(UTC) + broker.republish_after + timedelta(seconds=1)
        # Its message waits in the queue: a task queued that long is only behind others.
        assert broker.queue_depth() == 1
        assert broker.sweep_lost(now=later) == 0
        # The message taken and never run (lost): with the queue empty, it goes out again.
        assert published(worker_settings) == [(task_id, 1)]
        assert broker.queue_depth() == 0
        assert broker.sweep_lost(now=later) == 1
        assert published(worker_settings) == [(task_id, 2)]


async def test_the_sweep_runs_while_the_server_runs(
    home: Path, postgres_url: str, worker_settings: WorkerSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from relaygraph.api import _state

    monkeypatch.setattr(_state, "SWEEP_SECONDS", 0.1)
    async with broker_api(home, postgres_url, worker_settings) as api:
        task_id = (await api.submitted()).json()["id"]
        assert published(worker_settings) == [(task_id, 1)]  # Taken: lost.
        api.app.state.service.broker().republish_after = timedelta(0)
        deadline = time.monotonic() + 60
        again: list[tuple[str, int]] = []
        while not again and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            again = published(worker_settings)
        assert again and all(t == task_id and n >= 2 for t, n in again), again


async def test_readyz_checks_the_broker_and_the_listener(
    home: Path, postgres_url: str, worker_settings: WorkerSettings
) -> None:
    async with broker_api(home, postgres_url, worker_settings) as api:
        assert (await api.client.get("/readyz")).json() == {"status": "ready"}
        api.app.state.service.listener.close()
        down = await api.client.get("/readyz")
        assert down.status_code == 503
        assert "event notices" in down.json()["error"]["message"]
    dead = worker_settings.model_copy(
        update={"broker_url": f"amqp://guest:guest@127.0.0.1:{closed_port()}//"}
    )
    async with broker_api(home, postgres_url, dead) as api:
        started = time.monotonic()
        down = await api.client.get("/readyz")
        assert down.status_code == 503
        assert down.json()["error"]["code"] == "not_ready"
        assert down.json()["error"]["message"].startswith("broker: ")
        assert time.monotonic() - started < 10  # One attempt, not Celery's retry loop.


async def test_metrics_count_the_ledgers_tasks(api: BrokerApi) -> None:
    key = api.key("acme")
    for text in ("One", "Two"):
        await api.client.post("/v1/tasks", json={"input": text}, headers=auth(key))
    metrics = (await api.client.get("/metrics")).text
    assert 'relaygraph_tasks{status="queued"} 2' in metrics
    assert 'relaygraph_tasks{status="running"} 0' in metrics
    age = next(
        float(line.split()[1])
        for line in metrics.splitlines()
        if line.startswith("relaygraph_oldest_queued_task_age_seconds ")
    )
    assert 0 < age < 60


# Event streams on a real server.


class LiveServer:
    """The app served by uvicorn on loopback, in a thread (its lifespan runs there)."""

    def __init__(self, app: FastAPI) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", ws="none"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        # Forced: an open event stream would hold a graceful shutdown.
        self.server.should_exit = self.server.force_exit = True
        self.thread.join(30)
        self.sock.close()


@pytest.fixture
def live(
    home: Path, postgres_url: str, worker_settings: WorkerSettings
) -> Iterator[tuple[LiveServer, FastAPI]]:
    app = create_app(service_settings(home, postgres_url), worker_settings=worker_settings)
    server = LiveServer(app)
    yield server, app
    server.stop()


def soon(call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Call ``call`` on a thread of its own in 0.3 s: once the stream waits for it."""
    threading.Timer(0.3, call, args=args, kwargs=kwargs).start()


def frames(lines: Iterator[str]) -> Iterator[tuple[int, str]]:
    """``(id, event)`` of each Server-Sent Event, as it arrives."""
    seq, kind = None, None
    for line in lines:
        if line.startswith("id: "):
            seq = int(line[4:])
        elif line.startswith("event: "):
            kind = line[7:]
        elif not line and seq is not None and kind is not None:
            yield seq, kind
            seq, kind = None, None


def submit(url: str, key: str) -> str:
    made = httpx.post(f"{url}/v1/tasks", json={"input": "When?"}, headers=auth(key), timeout=10)
    assert made.status_code == 202, made.text
    return str(made.json()["id"])


def test_a_stream_wakes_on_a_notice_and_replays_from_the_ledger(
    live: tuple[LiveServer, FastAPI],
    postgres_url: str,
    worker_settings: WorkerSettings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(events_route, "SSE_NOTICE_TIMEOUT_SECONDS", HUGE)
    monkeypatch.setattr(events_route, "SSE_FALLBACK_POLL_SECONDS", HUGE)
    server, _ = live
    with Ledger(postgres_url) as setup:
        key = setup.create_project("acme")[1]
    task_id = submit(server.url, key)
    # The worker: another process's ledger, whose writes notify the channel.
    with Ledger(postgres_url, notify_channel=worker_settings.events_channel) as worker:
        attempt = worker.begin_attempt(task_id, dispatch=1, worker_id="w1", max_attempts=3)
        worker.append_events(task_id, [token_event("supervisor", "one")], attempt=attempt)
        url = f"{server.url}/v1/tasks/{task_id}/events"
        with httpx.stream("GET", url, headers=auth(key), timeout=10) as stream:
            arriving = frames(stream.iter_lines())
            assert next(arriving) == (1, "token")
            written = time.monotonic()
            soon(worker.append_events, task_id, [token_event("supervisor", "two")], attempt=attempt)
            assert next(arriving) == (2, "token")
            assert time.monotonic() - written < 5  # Woken, not polled (the poll is an hour).

            def finish() -> None:
                worker.append_events(
                    task_id, [run_finished_event("succeeded", None)], attempt=attempt
                )
                worker.end_run(task_id, usage={}, status="succeeded", attempt=attempt)

            soon(finish)
            assert list(arriving) == [(3, "run_finished")]  # And the stream closes.
    # A reconnect replays exactly what came after its Last-Event-ID, from the ledger.
    again = httpx.get(url, headers={**auth(key), "Last-Event-ID": "1"}, timeout=10)
    assert list(frames(iter(again.text.splitlines()))) == [(2, "token"), (3, "run_finished")]


def test_a_stream_polls_while_the_listener_is_down(
    live: tuple[LiveServer, FastAPI], postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events_route, "SSE_NOTICE_TIMEOUT_SECONDS", HUGE)
    monkeypatch.setattr(events_route, "SSE_FALLBACK_POLL_SECONDS", 0.2)
    server, app = live
    app.state.service.listener.close()
    with Ledger(postgres_url) as ledger:
        key = ledger.create_project("acme")[1]
        task_id = submit(server.url, key)
        attempt = ledger.begin_attempt(task_id, dispatch=1, worker_id="w1", max_attempts=3)
        url = f"{server.url}/v1/tasks/{task_id}/events"
        with httpx.stream("GET", url, headers=auth(key), timeout=10) as stream:
            arriving = frames(stream.iter_lines())
            # Written without a notice: only polling finds it.
            soon(ledger.append_events, task_id, [token_event("supervisor", "one")], attempt=attempt)
            assert next(arriving) == (1, "token")
