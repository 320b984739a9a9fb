"""Which database the ledger uses, and an engine configured for it."""

from __future__ import annotations

import functools
import json
import os
import re
import select
import types
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DisconnectionError

from relaygraph._home import data_home
from relaygraph.errors import ConfigError

DATABASE_URL_ENV = "RELAYGRAPH_DATABASE_URL"
LEDGER_FILE = "ledger.sqlite"
SQLITE_BUSY_SECONDS = 30.0
DATABASE_POOL_ENV = "RELAYGRAPH_DATABASE_POOL_SIZE"
DEFAULT_DATABASE_POOL_SIZE = 10
"""PostgreSQL connections a process opens at most for the ledger, and as many again for its
checkpoints (docs/deploy.md, *Scaling*): a process with hundreds of tasks in flight shares
them, and PostgreSQL's ``max_connections`` (100 by default) bounds their sum over every
process of the deployment."""
PASSWORD = re.compile(r"(://[^:/@]*:)[^@]*@")


def database_url(explicit: str | None = None) -> str:
    """The ledger's database URL: ``explicit``, else ``$RELAYGRAPH_DATABASE_URL``, else SQLite.

    The SQLite default is ``<data dir>/ledger.sqlite``. A bare ``postgresql://`` or
    ``postgres://`` URL is given the psycopg 3 driver, the one relaygraph installs.

    Raises:
        ConfigError: The URL does not parse, names an in-memory SQLite database, or a
            backend other than SQLite and PostgreSQL.
    """
    raw = explicit or os.environ.get(DATABASE_URL_ENV)
    if not raw:
        return f"sqlite:///{data_home() / LEDGER_FILE}"
    return _parse(raw).render_as_string(hide_password=False)


def display_url(url: str) -> str:
    """The URL with its password hidden, for messages and logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return PASSWORD.sub(r"\1***@", url)


def _parse(raw: str) -> URL:
    source = "the database URL" if raw != os.environ.get(DATABASE_URL_ENV) else DATABASE_URL_ENV
    try:
        url = make_url(raw)
    except (ArgumentError, ValueError):
        raise ConfigError(
            f"{source} {display_url(raw)!r} is not a database URL; expected "
            "sqlite:///PATH or postgresql+psycopg://USER@HOST:PORT/DATABASE"
        ) from None
    backend = url.get_backend_name()
    if backend in ("postgres", "postgresql"):
        if url.drivername in ("postgres", "postgresql"):
            url = url.set(drivername="postgresql+psycopg")
        return url
    if backend != "sqlite":
        raise ConfigError(
            f"{source} {url.render_as_string(hide_password=True)!r} names the {backend!r} "
            "backend; the ledger supports sqlite and postgresql"
        )
    if url.database in (None, "", ":memory:") or url.query.get("mode") == "memory":
        raise ConfigError(
            f"{source} {raw!r} is an in-memory SQLite database, which every connection sees "
            "empty; give the ledger a file (sqlite:///PATH)"
        )
    return url


def database_pool_size() -> int:
    """``$RELAYGRAPH_DATABASE_POOL_SIZE``, else :data:`DEFAULT_DATABASE_POOL_SIZE`: the
    connections to PostgreSQL of each of a process's pools (the ledger's, and each database's
    checkpoints'). A run that finds its pool's connections all in use waits for one (30 s at
    most) rather than opening another.

    Raises:
        ConfigError: The value is not a whole number from 1 to 1,000.
    """
    raw = os.environ.get(DATABASE_POOL_ENV, "").strip()
    if not raw:
        return DEFAULT_DATABASE_POOL_SIZE
    try:
        size = int(raw)
    except ValueError:
        size = 0
    if not 1 <= size <= 1000:
        raise ConfigError(
            f"{DATABASE_POOL_ENV}={raw!r}: give the connections of a pool, a whole number "
            "from 1 to 1000"
        )
    return size


def make_engine(url: str, *, immediate: bool = False) -> Engine:
    """An engine for ``url``: SQLite in WAL mode with foreign keys, or PostgreSQL via psycopg.

    Args:
        immediate: On SQLite, every transaction takes the write lock when it begins
            (``BEGIN IMMEDIATE``): the engine for transactions that write. A deferred
            transaction that reads and then writes cannot wait for the lock in WAL mode
            (SQLite answers SQLITE_BUSY at once), so writers queue behind each other for up
            to ``SQLITE_BUSY_SECONDS`` instead.
    """
    parsed = _parse(url)
    serializer = functools.partial(json.dumps, ensure_ascii=False, allow_nan=False)
    if parsed.get_backend_name() != "sqlite":
        # A fixed pool, no overflow: the process's connections are what the operator sized
        # (database_pool_size), however many of its threads write at once; the others wait.
        engine = create_engine(
            parsed,
            json_serializer=serializer,
            pool_size=database_pool_size(),
            max_overflow=0,
        )
        # Not pool_pre_ping, a round trip (SELECT 1) before every lend, of every read and
        # write of the ledger: a worker with tasks in flight makes one for each batch of a
        # run's events, about a dozen a task, and each round trip wakes a thread that
        # waits for the interpreter again. An idle connection whose socket is quiet is
        # live as far as the ping could tell (see is_quiet); one that is not is dropped
        # before it is lent, and the pool lends another (SQLAlchemy's documented
        # pessimistic handling: DisconnectionError from a checkout handler).
        event.listen(engine, "checkout", _drop_unless_quiet)
        return engine
    assert parsed.database is not None
    Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    # SQLite has one writer at a time. The write engine hands its one connection to one
    # thread at a time: the next writer of this process wakes the moment the last commits,
    # where two connections would have it wait in SQLite's busy handler, which polls with
    # growing sleeps, so a writer may sleep long after the lock is free
    # (benchmarks/bench_service.py measures it). Other processes still wait in the busy
    # handler. Which of this process's writers goes next is LedgerCore's WriteTurns' to
    # say (a request's write before the runs'), not the pool's first come, first served.
    pool = {"pool_size": 1, "max_overflow": 0, "pool_timeout": SQLITE_BUSY_SECONDS}
    engine = create_engine(
        parsed,
        json_serializer=serializer,
        connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_SECONDS},
        **(pool if immediate else {}),
    )
    event.listen(engine, "connect", _configure_sqlite)
    # The transaction's BEGIN is the dialect's, not a "begin" event listener's: an engine
    # with a connection event listener dispatches every event of every statement, work the
    # ledger would pay on every statement and transaction.
    begin = "BEGIN IMMEDIATE" if immediate else "BEGIN"
    engine.dialect.do_begin = types.MethodType(  # type: ignore[method-assign]
        functools.partial(_begin_sqlite, statement=begin), engine.dialect
    )
    return engine


def _configure_sqlite(dbapi_connection: Any, _record: Any) -> None:
    # pysqlite's own implicit BEGIN is turned off so that _begin_sqlite decides how each
    # transaction starts (and so DDL in migrations stays inside the transaction).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


def _begin_sqlite(_dialect: Any, dbapi_connection: Any, *, statement: str) -> None:
    """The SQLite dialect's ``do_begin``: ``statement`` (``BEGIN`` or ``BEGIN IMMEDIATE``)."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(statement)
    finally:
        cursor.close()


def is_quiet(connection: Any) -> bool:
    """An open psycopg connection with nothing to read on its socket: a connection that is
    idle in a pool, to which the server writes only to end it (its FATAL notice, then the
    close: a terminated backend, a restart, an idle timeout), so a quiet one is live as far
    as a round trip could tell. ``poll``, not ``select``: a server holding many files has
    descriptors past ``select``'s 1,024."""
    if connection.closed or connection.broken:
        return False
    try:
        poller = select.poll()
        poller.register(connection.fileno(), select.POLLIN)
        return not poller.poll(0)
    except (OSError, ValueError):
        return False


def _drop_unless_quiet(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    """The ledger engine's check of a connection before its pool lends it (see
    :func:`make_engine`)."""
    if not is_quiet(getattr(dbapi_connection, "driver_connection", dbapi_connection)):
        raise DisconnectionError("the connection was ended by the server")
