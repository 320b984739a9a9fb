"""The LangGraph checkpointer follows the ledger's database choice.

SQLite file in the data directory by default; PostgreSQL (``langgraph-checkpoint-postgres``)
when ``RELAYGRAPH_DATABASE_URL`` names a PostgreSQL database, so a service's checkpoints
live beside its ledger and survive the machine.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_SETUP_DONE: set[str] = set()
_SETUP_LOCK = threading.Lock()


@contextmanager
def sqlite_checkpointer(path: Path) -> Iterator[Any]:
    """A SqliteSaver in WAL mode.

    A default-settings SqliteSaver measured about 5x slower than in-memory on these
    machines; with WAL and ``synchronous=NORMAL`` it is about the same as in-memory.
    """
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(path, check_same_thread=False, timeout=30)
    try:
        key = f"sqlite:{Path(path).resolve()}"
        with _SETUP_LOCK:
            # The first runs of a new data directory side by side (an eval with
            # --concurrency) would each switch the new file to WAL and create the saver's
            # tables, and collide ("database is locked"): once per file per process.
            conn.execute("PRAGMA journal_mode=WAL")
            saver = SqliteSaver(conn)
            if key not in _SETUP_DONE:
                saver.setup()
                _SETUP_DONE.add(key)
        conn.execute("PRAGMA synchronous=NORMAL")
        yield saver
    finally:
        conn.close()


def postgres_conninfo(url: str) -> str | None:
    """The libpq URL for a SQLAlchemy PostgreSQL URL, or None for another database."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.split("+")[0] not in ("postgresql", "postgres"):
        return None
    return f"postgresql://{rest}"


@contextmanager
def open_checkpointer(home: Path) -> Iterator[Any]:
    """The checkpointer for runs: PostgreSQL when the ledger is on PostgreSQL, else SQLite."""
    from relaygraph.store import DATABASE_URL_ENV

    conninfo = postgres_conninfo(os.environ.get(DATABASE_URL_ENV, ""))
    if conninfo is None:
        with sqlite_checkpointer(home / "checkpoints.sqlite") as saver:
            yield saver
        return
    from langgraph.checkpoint.postgres import PostgresSaver

    with PostgresSaver.from_conn_string(conninfo) as saver:
        with _SETUP_LOCK:
            # setup() runs the saver's own migrations; once per database per process, and
            # one process at a time: the first runs of new worker processes on a new
            # database would otherwise insert the same migration row at once and fail.
            if conninfo not in _SETUP_DONE:
                with _setup_lock(conninfo):
                    saver.setup()
                _SETUP_DONE.add(conninfo)
        yield saver


CHECKPOINT_SETUP_LOCK = 0x52470002
"""PostgreSQL advisory lock key: processes set the checkpointer's tables up one at a time."""


@contextmanager
def _setup_lock(conninfo: str) -> Iterator[None]:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as connection:
        # Tried again and again rather than waited for: the saver's migrations build indexes
        # CONCURRENTLY, which waits for every open transaction, a blocked
        # pg_advisory_lock() of another process included (a deadlock PostgreSQL does not see).
        while not connection.execute(
            "SELECT pg_try_advisory_lock(%s)", (CHECKPOINT_SETUP_LOCK,)
        ).fetchone()[0]:  # type: ignore[index]
            time.sleep(0.05)
        try:
            yield
        finally:
            connection.execute("SELECT pg_advisory_unlock(%s)", (CHECKPOINT_SETUP_LOCK,))
