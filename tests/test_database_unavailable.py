"""A database that cannot serve now (down, restarting, at its connection limit, or every
connection of the process's pool busy) is a state, not a bug: the API answers 503
``database_unavailable`` with ``Retry-After`` instead of a 500, a worker tries the task's
message again later instead of dropping it, and each process opens at most the connections
``RELAYGRAPH_DATABASE_POOL_SIZE`` gives it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest
from psycopg_pool import ConnectionPool
from sqlalchemy import create_engine, text

from relaygraph.errors import ConfigError
from relaygraph.store import (
    DATABASE_POOL_ENV,
    database_pool_size,
    is_database_unavailable,
    is_disk_full,
)
from relaygraph.store._engine import DEFAULT_DATABASE_POOL_SIZE, make_engine
from relaygraph.worker import WorkerSettings, create_celery_app
from relaygraph.worker._app import RUN_TASK

from ._service import auth, free_port, in_process_service
from .worker_cluster import fresh_database


def _refused_connection() -> psycopg.OperationalError:
    try:
        psycopg.connect(f"host=127.0.0.1 port={free_port()} dbname=x connect_timeout=5")
    except psycopg.OperationalError as exc:
        return exc
    raise AssertionError("a connection to a closed port was opened")


def test_a_refused_connection_is_unavailable_and_a_bad_statement_is_not(
    postgres_server: str,
) -> None:
    refused = _refused_connection()
    assert is_database_unavailable(refused)
    engine = create_engine(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x")
    with pytest.raises(Exception) as wrapped:  # SQLAlchemy's OperationalError, from psycopg's.
        engine.connect()
    assert is_database_unavailable(wrapped.value)
    with (
        psycopg.connect(postgres_server.replace("+psycopg", "")) as connection,
        pytest.raises(psycopg.Error) as division,
    ):
        connection.execute("SELECT 1 / 0")
    assert not is_database_unavailable(division.value)
    assert not is_disk_full(refused)


def test_a_pool_with_no_connection_free_in_time_is_unavailable(postgres_server: str) -> None:
    engine = create_engine(postgres_server, pool_size=1, max_overflow=0, pool_timeout=0.05)
    with engine.connect(), pytest.raises(Exception) as sqlalchemy_pool:
        engine.connect()
    assert is_database_unavailable(sqlalchemy_pool.value)
    engine.dispose()
    conninfo = postgres_server.replace("+psycopg", "")
    with (
        ConnectionPool(conninfo, min_size=0, max_size=1, open=True) as pool,
        pool.connection(),
        pytest.raises(Exception) as psycopg_pool,
        pool.connection(timeout=0.05),
    ):
        pass
    assert is_database_unavailable(psycopg_pool.value)


def test_a_sqlite_lock_held_past_the_busy_timeout_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN IMMEDIATE")
    waiter = sqlite3.connect(path, timeout=0, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError) as locked:
        waiter.execute("BEGIN IMMEDIATE")
    assert is_database_unavailable(locked.value)
    holder.close()
    waiter.close()


def test_the_pool_size_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, postgres_server: str
) -> None:
    monkeypatch.delenv(DATABASE_POOL_ENV, raising=False)
    assert database_pool_size() == DEFAULT_DATABASE_POOL_SIZE
    monkeypatch.setenv(DATABASE_POOL_ENV, "3")
    assert database_pool_size() == 3
    engine = make_engine(postgres_server)
    assert (engine.pool.size(), engine.pool._max_overflow) == (3, 0)  # type: ignore[attr-defined]
    engine.dispose()
    from relaygraph.runner._checkpoint import _pool_options

    assert _pool_options(ConnectionPool, "x")["max_size"] == 3


@pytest.mark.parametrize("bad", ["0", "-2", "many", "1.5", "1001"])
def test_a_bad_pool_size_names_its_variable_and_value(
    monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    monkeypatch.setenv(DATABASE_POOL_ENV, bad)
    with pytest.raises(ConfigError, match=rf"{DATABASE_POOL_ENV}={bad!r}"):
        database_pool_size()


async def test_the_api_answers_503_while_the_database_refuses_connections(
    tmp_path: Path, postgres_server: str
) -> None:
    """The database stops taking connections (as at its ``max_connections``, or while it
    restarts): requests get 503 ``database_unavailable`` with ``Retry-After``, not a 500;
    once it takes them again, the same request succeeds."""
    admin = create_engine(postgres_server, isolation_level="AUTOCOMMIT")
    with fresh_database(postgres_server, prefix="relaygraph_unavailable") as url:
        name = url.rsplit("/", 1)[1].split("?")[0]
        async with in_process_service(tmp_path, database_url=url) as service:
            key = service.key("p")
            ok = await service.client.get("/v1/tasks", headers=auth(key))
            assert ok.status_code == 200, ok.text
            with admin.connect() as connection:
                connection.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
                ended = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"
                connection.execute(text(ended), {"n": name})
            try:
                for _ in range(2):  # A pooled connection the server ended is not reused.
                    refused = await service.client.get("/v1/tasks", headers=auth(key))
                    assert refused.status_code == 503, refused.text
                    assert refused.json()["error"]["code"] == "database_unavailable"
                    assert refused.headers["Retry-After"] == "5"
                submitted = await service.submit(key, input="hello")
                assert submitted.status_code == 503, submitted.text
            finally:
                with admin.connect() as connection:
                    connection.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
            again = await service.client.get("/v1/tasks", headers=auth(key))
            assert again.status_code == 200, again.text
    admin.dispose()


def test_a_worker_tries_a_task_again_while_the_database_cannot_begin_it() -> None:
    """``relaygraph.run_task`` whose start fails for an unavailable database is retried (a
    new message, after ``DATABASE_RETRY_SECONDS``) until it starts; any other error is the
    run's own and is not retried."""
    calls: list[tuple[str, int]] = []

    def run(task_id: str, dispatch: int) -> None:
        calls.append((task_id, dispatch))
        if len(calls) < 3:
            raise _refused_connection()

    app = create_celery_app(WorkerSettings(broker_url="amqp://guest@127.0.0.1:1//"), run=run)
    app.tasks[RUN_TASK].apply(args=("task-1", 4)).get()
    assert calls == [("task-1", 4)] * 3

    def broken(task_id: str, dispatch: int) -> None:
        calls.append((task_id, dispatch))
        raise ValueError("a bug")

    calls.clear()
    app = create_celery_app(WorkerSettings(broker_url="amqp://guest@127.0.0.1:1//"), run=broken)
    with pytest.raises(ValueError, match="a bug"):
        app.tasks[RUN_TASK].apply(args=("task-1", 4)).get()
    assert calls == [("task-1", 4)]
