"""A run with the ledger and the checkpoints on PostgreSQL (CI requires the server)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from relaygraph.runner import run_task
from relaygraph.store import DATABASE_URL_ENV, LOCAL_PROJECT_ID, Ledger

from .conftest import EXAMPLE_RELAY

Script = Callable[[dict[str, Any]], str]


def count(url: str, table: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return int(connection.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())
    finally:
        engine.dispose()


def test_ledger_and_checkpoints_live_in_postgres(
    home: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch, script: Script
) -> None:
    monkeypatch.setenv(DATABASE_URL_ENV, postgres_url)
    spec = script(
        {
            "supervisor": [
                {"route": {"next": "researcher", "task": "one", "reason": "first"}},
                {"route": {"next": "FINISH", "task": "", "reason": "done"}},
                {"route": {"next": "writer", "task": "two", "reason": "second"}},
                {"route": {"next": "FINISH", "task": "", "reason": "done"}},
            ],
            "researcher": [{"content": "answer one"}],
            "writer": [{"content": "answer two"}],
        }
    )
    first = run_task("first", model=spec)
    assert first.status == "succeeded", first.stop_reason
    # Nothing went to the SQLite files of the data directory.
    assert not (home / "checkpoints.sqlite").exists()
    assert not (home / "ledger.sqlite").exists()
    assert count(postgres_url, "checkpoints") > 0
    second = run_task("again", model=spec, thread_id=first.thread_id)
    assert second.answer == "answer two"
    assert second.agents_run == ["writer"]
    with Ledger(postgres_url) as ledger:
        task = ledger.get_task(first.task_id, project_id=LOCAL_PROJECT_ID)
        assert task is not None and task.status == "succeeded"
        assert [h.target for h in ledger.handoffs(first.task_id)] == ["researcher"]


def test_relay_on_postgres(home: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DATABASE_URL_ENV, postgres_url)
    result = run_task("When?", model=f"scripted:{EXAMPLE_RELAY}")
    assert result.status == "succeeded"
    assert result.agents_run == ["researcher", "coder", "writer"]


def test_the_ledger_does_not_lend_a_connection_the_server_ended(postgres_ledger: Ledger) -> None:
    """The ledger's pool checks an idle connection's socket before it lends it, not with a
    round trip (pool_pre_ping): a quiet one is lent as it is, one the server ended is
    dropped and another lent, and the ledger's next read and write go on."""
    from sqlalchemy import event

    from relaygraph.store._engine import _drop_unless_quiet

    from .test_checkpoint_connections import terminate

    engine = postgres_ledger.core.engine

    def backend() -> int:
        with postgres_ledger.core.read_connection() as connection:
            return int(connection.execute(text("SELECT pg_backend_pid()")).scalar_one())

    first = backend()
    assert backend() == first  # Quiet: lent again, no new backend.
    # The check is the socket's, not SQLAlchemy's ping (a SELECT 1 before every lend).
    assert event.contains(engine, "checkout", _drop_unless_quiet)
    assert not engine.pool._pre_ping
    conninfo = postgres_ledger.core.engine.url.render_as_string(hide_password=False)
    terminate(conninfo.replace("postgresql+psycopg://", "postgresql://"), first)
    assert backend() != first
    project, _ = postgres_ledger.create_project("after-the-restart")
    found = postgres_ledger.get_project("after-the-restart")
    assert found is not None and found.id == project.id


def test_the_ledgers_reads_send_no_begin_and_its_writes_stay_transactions(
    postgres_ledger: Ledger,
) -> None:
    """A hot-path read is its statements alone, each its own transaction (psycopg sends no
    BEGIN, and no COMMIT after: two round trips fewer); a write on a connection of the same
    pool is still one transaction."""
    from psycopg.pq import TransactionStatus

    def status(connection: Any) -> TransactionStatus:
        return connection.connection.driver_connection.info.transaction_status

    for _ in range(2):  # The same pooled connection, read after write after read.
        with postgres_ledger.core.read_connection() as connection:
            assert connection.execute(text("SELECT 1")).scalar_one() == 1
            assert status(connection) == TransactionStatus.IDLE
        with postgres_ledger.core.write_connection() as connection:
            assert connection.execute(text("SELECT 1")).scalar_one() == 1
            assert status(connection) == TransactionStatus.INTRANS
