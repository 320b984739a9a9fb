"""The ledger's database: its engines and the four kinds of transaction every repository opens."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, Select, bindparam, func, select
from sqlalchemy.orm import Session, sessionmaker

from relaygraph.store._engine import SQLITE_BUSY_SECONDS, database_url, display_url, make_engine
from relaygraph.store._migrate import current_revision, head_revision, upgrade_engine
from relaygraph.store._notices import EventNotice
from relaygraph.store._records import snapshot
from relaygraph.store._write_turns import WriteTurns

R = TypeVar("R")

_NOTIFY = select(func.pg_notify(bindparam("channel"), bindparam("payload")))


class LedgerCore:
    """The engine and the sessions that every repository of the ledger is given.

    Args:
        url: A SQLAlchemy URL; see :func:`~relaygraph.store.database_url` for None.
        notify_channel: The PostgreSQL ``NOTIFY`` channel of event notices; None: none.

    Raises:
        ConfigError: The URL is not one the ledger can use.
    """

    def __init__(self, url: str | None = None, *, notify_channel: str | None = None) -> None:
        self._url = database_url(url)
        self.notify_channel = notify_channel
        """The PostgreSQL ``NOTIFY`` channel on which each write of a task's events is
        announced (:class:`~relaygraph.store.EventNotice`); None: none is sent. SQLite has
        no notices: the setting is ignored there."""
        self.engine = make_engine(self._url)
        """The engine of reads (and, on PostgreSQL, of writes too)."""
        # On SQLite, writes begin with BEGIN IMMEDIATE: an engine (and pool) of their own.
        self.write_engine = (
            make_engine(self._url, immediate=True) if self.dialect == "sqlite" else self.engine
        )
        """The engine of writes."""
        self.write_turns = (
            WriteTurns(timeout=SQLITE_BUSY_SECONDS) if self.dialect == "sqlite" else None
        )
        """On SQLite, who writes next among this process's writers: a request someone
        waits on before the runs' own writes (see :mod:`relaygraph.store._write_turns`).
        None on PostgreSQL, whose pool holds a connection for each writer."""
        self._reader = sessionmaker(self.engine, expire_on_commit=False)
        self._writer = sessionmaker(self.write_engine, expire_on_commit=False)
        self._read_engine = (
            self.engine.execution_options(isolation_level="AUTOCOMMIT")
            if self.dialect == "postgresql"
            else self.engine
        )
        """The hot paths' reads (:meth:`read_connection`): on PostgreSQL, on the same pool
        in autocommit, each statement its own transaction. In a transaction, psycopg sends
        BEGIN before the first statement and COMMIT after the last, each a round trip of its
        own: three for a read of one statement, where one does (under READ COMMITTED each
        statement sees its own snapshot either way). A worker with tasks in flight reads
        the ledger several times a task, each on a thread that waits for the interpreter
        again after every round trip."""

    @property
    def url(self) -> str:
        """The database URL, password hidden."""
        return display_url(self._url)

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.engine.dialect.name

    @property
    def database_file(self) -> Path | None:
        """The SQLite database's file; None on PostgreSQL or for an in-memory database."""
        if self.dialect != "sqlite":
            return None
        name = self.engine.url.database
        return Path(name) if name and name != ":memory:" else None

    def close(self) -> None:
        """Close the connection pools; new connections are opened if the core is used again."""
        self.engine.dispose()
        self.write_engine.dispose()

    def upgrade(self, revision: str = "head") -> None:
        """Apply the shipped migrations up to ``revision``; does nothing when current."""
        upgrade_engine(self.write_engine, revision)

    def is_current(self) -> bool:
        """Whether the database has every shipped migration (a readiness check)."""
        return current_revision(self.engine) == head_revision()

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A write transaction in an ORM session."""
        with self._write_turn(), self._writer() as session, session.begin():
            yield session

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A read transaction in an ORM session."""
        with self._reader() as session, session.begin():
            yield session

    @contextmanager
    def write_connection(self) -> Iterator[Connection]:
        """A write transaction in SQLAlchemy Core (no ORM session): for the hot paths."""
        with self._write_turn(), self.write_engine.begin() as connection:
            yield connection

    def _write_turn(self) -> AbstractContextManager[None]:
        return nullcontext() if self.write_turns is None else self.write_turns.turn()

    @contextmanager
    def read_connection(self) -> Iterator[Connection]:
        """Reads in SQLAlchemy Core (no ORM session), for the hot paths: on PostgreSQL each
        statement commits by itself (see ``_read_engine``), so a read that needs its
        statements to see one snapshot, or a lock held until the end, is not one of them."""
        with self._read_engine.begin() as connection:
            yield connection

    def snapshots(self, record: type[R], query: Select[Any]) -> list[R]:
        """The rows ``query`` selects, each as a ``record`` (a frozen dataclass)."""
        with self.read() as session:
            return [snapshot(record, row) for row in session.scalars(query)]

    def announce(self, session: Session | Connection, task_id: str, last_seq: int) -> None:
        """Tell every listener, when ``session`` commits, that the task has events up to
        ``last_seq`` (nothing is sent if it rolls back, or without a channel)."""
        if self.notify_channel is None or self.dialect != "postgresql":
            return
        payload = EventNotice(task_id=task_id, seq=last_seq).payload()
        session.execute(_NOTIFY, {"channel": self.notify_channel, "payload": payload})
