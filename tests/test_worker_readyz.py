"""``/readyz`` of a worker-mode API server checks the database as well as the broker (issue
18): a server whose ledger is not at the shipped schema is not ready.

The broker and listener halves are in tests/test_api_worker_mode.py. On this machine's
RabbitMQ and PostgreSQL; skipped without them unless ``RELAYGRAPH_REQUIRE_RABBITMQ=1`` /
``RELAYGRAPH_REQUIRE_POSTGRES=1`` (CI).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kombu import Connection
from sqlalchemy import create_engine, text

from relaygraph.api import ServiceSettings, create_app
from relaygraph.worker import WorkerSettings

from .conftest import EXAMPLE_RELAY
from .worker_cluster import broker_problem, broker_url

REQUIRE_RABBITMQ_ENV = "RELAYGRAPH_REQUIRE_RABBITMQ"
VERSION_TABLE = "relaygraph_alembic_version"


@pytest.fixture
def worker_settings() -> Iterator[WorkerSettings]:
    url = broker_url()
    problem = broker_problem(url)
    if problem is not None:
        if os.environ.get(REQUIRE_RABBITMQ_ENV) == "1":
            pytest.fail(f"{problem} (and {REQUIRE_RABBITMQ_ENV}=1 requires it)", pytrace=False)
        pytest.skip(f"{problem}; set {REQUIRE_RABBITMQ_ENV}=1 to make this a failure")
    name = f"rg-readyz-test-{uuid.uuid4().hex[:10]}"
    yield WorkerSettings(
        broker_url=url,
        queues=[name],
        control_exchange=f"{name}-ctl",
        events_channel=f"rg_readyz_test_{uuid.uuid4().hex[:12]}",
    )
    with Connection(url) as connection:
        channel = connection.default_channel
        channel.queue_delete(name)
        channel.exchange_delete(name)


def execute(url: str, statement: str) -> None:
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text(statement))
    finally:
        engine.dispose()


def rows(url: str, statement: str) -> list[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return [str(row[0]) for row in connection.execute(text(statement))]
    finally:
        engine.dispose()


async def test_readyz_of_a_worker_mode_server_checks_the_database(
    home: Path, postgres_url: str, worker_settings: WorkerSettings
) -> None:
    settings = ServiceSettings(
        default_model=f"scripted:{EXAMPLE_RELAY}", home=home, database_url=postgres_url
    )
    app = create_app(settings, worker_settings=worker_settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            assert (await client.get("/readyz")).json() == {"status": "ready"}

            # The ledger falls behind the shipped schema (a release rolled out before its
            # migration ran): not ready, saying why; ready again once it is at the head.
            [head] = rows(postgres_url, f"SELECT version_num FROM {VERSION_TABLE}")
            execute(postgres_url, f"UPDATE {VERSION_TABLE} SET version_num = 'older'")
            behind = await client.get("/readyz")
            assert behind.status_code == 503
            assert behind.json()["error"]["code"] == "not_ready"
            assert behind.json()["error"]["message"] == "migrations pending"
            execute(postgres_url, f"UPDATE {VERSION_TABLE} SET version_num = '{head}'")
            assert (await client.get("/readyz")).json() == {"status": "ready"}
