"""The LangGraph checkpointer follows the ledger's database choice.

SQLite file in the data directory by default; PostgreSQL (``langgraph-checkpoint-postgres``)
when ``RELAYGRAPH_DATABASE_URL`` names a PostgreSQL database, so a service's checkpoints
live beside its ledger and survive the machine.

A worker's run writes its checkpoints fenced by its attempt (``_fenced_saver``): each
write commits only while the attempt is still the task's latest, in the transaction that
checks it.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from relaygraph.store import database_pool_size, is_quiet

if TYPE_CHECKING:
    from relaygraph.runner._fence import CheckpointFence

T = TypeVar("T")

_SETUP_DONE: set[str] = set()
_SETUP_LOCK = threading.Lock()


@contextmanager
def sqlite_checkpointer(path: Path) -> Iterator[Any]:
    """A SqliteSaver in WAL mode (:func:`_open_sqlite`), closed at the block's end."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    saver = _open_sqlite(path, SqliteSaver)
    try:
        yield saver
    finally:
        saver.conn.close()


def _open_sqlite(path: Path, saver_class: type[T]) -> T:
    """A ``saver_class`` (``SqliteSaver`` or a subclass) on a new connection to ``path``, in
    WAL mode.

    With SQLite's defaults (a rollback journal, ``synchronous=FULL``) every checkpoint
    save waits for the disk, and a run saves at each step; in WAL mode with
    ``synchronous=NORMAL`` a save is an append to the log, synced only when the log is
    checkpointed (a power loss may undo the last few saves, and corrupts nothing).
    """
    conn = sqlite3.connect(path, check_same_thread=False, timeout=30)
    try:
        key = f"sqlite:{Path(path).resolve()}"
        with _SETUP_LOCK:
            # The first runs of a new data directory side by side (an eval with
            # --concurrency) would each switch the new file to WAL and create the saver's
            # tables, and collide ("database is locked"): once per file per process.
            conn.execute("PRAGMA journal_mode=WAL")
            saver = saver_class(conn)  # type: ignore[call-arg]
            if key not in _SETUP_DONE:
                saver.setup()  # type: ignore[attr-defined]
                _SETUP_DONE.add(key)
        conn.execute("PRAGMA synchronous=NORMAL")
    except BaseException:
        conn.close()
        raise
    return saver


def postgres_conninfo(url: str) -> str | None:
    """The libpq URL for a SQLAlchemy PostgreSQL URL, or None for another database."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.split("+")[0] not in ("postgresql", "postgres"):
        return None
    return f"postgresql://{rest}"


class _Kept(Generic[T]):
    """Things the process keeps open between runs, one per key, the most recently used kept.

    Two kinds: SQLite checkpointers, one per file (opening a SqliteSaver, with connect, WAL
    and checks, and closing it, where the last connection to a WAL file checkpoints it,
    cost a run a few milliseconds; SqliteSaver serialises its use of the connection with a
    lock of its own, so runs on several threads share it), and pools of PostgreSQL
    connections for checkpointers, one per database (see :func:`_postgres_pool`). At most
    ``keep`` keys stay open (a process with many data directories or databases, a test
    session, does not pile up open files and connections); one dropped while runs use it is
    closed when the last of them ends. A forked child (Celery's prefork pool) keeps none of
    its parent's: their connections are the parent's sockets (:meth:`forget`).
    """

    def __init__(self, opener: Callable[[str], AbstractContextManager[T]], keep: int = 4) -> None:
        self.keep = keep
        self._opener = opener
        self._lock = threading.Lock()
        self._open: dict[str, tuple[T, AbstractContextManager[T]]] = {}
        self._users: dict[int, int] = {}
        self._dropped: dict[int, AbstractContextManager[T]] = {}

    @contextmanager
    def use(self, key: str) -> Iterator[T]:
        with self._lock:
            kept = self._open.pop(key, None)
            if kept is None:
                manager = self._opener(key)
                kept = (manager.__enter__(), manager)
            self._open[key] = kept  # The most recently used last.
            thing = kept[0]
            self._users[id(thing)] = self._users.get(id(thing), 0) + 1
            while len(self._open) > self.keep:
                old = self._open.pop(next(iter(self._open)))
                if self._users.get(id(old[0]), 0):
                    self._dropped[id(old[0])] = old[1]
                else:
                    old[1].__exit__(None, None, None)
        try:
            yield thing
        finally:
            with self._lock:
                self._users[id(thing)] -= 1
                if not self._users[id(thing)]:
                    del self._users[id(thing)]
                    dropped = self._dropped.pop(id(thing), None)
                    if dropped is not None:
                        dropped.__exit__(None, None, None)

    def forget(self) -> None:
        """In a forked child: drop what the parent opened, unclosed (closing a connection
        would end the parent's session on the socket they share). Referenced for good, so
        no finalizer closes them either."""
        _INHERITED.append((self._open, self._dropped))
        self._lock = threading.Lock()
        self._open, self._users, self._dropped = {}, {}, {}


_INHERITED: list[Any] = []
"""What forked children inherited of their parent's kept things, never closed."""


@contextmanager
def _postgres_pool(conninfo: str) -> Iterator[Any]:
    """A psycopg_pool pool of checkpointer connections to ``conninfo``, closed after.

    A checkpointer on a connection of its own per run cost every worker task a new server
    backend and a fresh parse of each statement the saver prepares (``prepare_threshold=0``,
    as ``PostgresSaver.from_conn_string`` connects): half of PostgreSQL's CPU per task in the
    worker-mode benchmark. The pool starts empty and grows on demand (a worker's pool
    process runs one task at a time; ``serve --workers N`` on PostgreSQL up to N); each
    connection is checked before it is lent (a restarted server costs no run) and kept
    while used (``max_idle``). The options are ``from_conn_string``'s.
    """
    from psycopg_pool import ConnectionPool

    with ConnectionPool(
        conninfo, **_pool_options(ConnectionPool, "relaygraph-checkpoints"), open=True
    ) as pool:
        yield pool


def _pool_options(pool_class: Any, name: str) -> dict[str, Any]:
    """The options of a pool of checkpointer connections, ``ConnectionPool`` or
    ``AsyncConnectionPool`` (``pool_class``): the sync runs' pool and an event loop's are
    alike but for the name they go by (see :func:`_postgres_pool`)."""
    from psycopg.rows import dict_row

    return {
        "min_size": 0,
        # Runs at once beyond it wait (psycopg_pool's timeout, 30 s) for one to come back.
        "max_size": database_pool_size(),
        "kwargs": {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        "check": _lend_check(pool_class),
        "name": name,
    }


def _lend_check(pool_class: Any) -> Callable[[Any], Any]:
    """The check of a connection before the pool lends it: the pool's own
    (``check_connection``, a round trip to the server) only when the connection's socket has
    something to read. A connection back in the pool is idle, and the server writes to an
    idle one only to end it (its FATAL notice, then the close: a terminated backend, a
    restart, an idle timeout), so a quiet socket is a live connection as far as the round
    trip could tell, at none of its cost. A worker's run borrows a connection for every
    checkpoint read and write: the round trip was a fifth of the saves' time."""
    full = pool_class.check_connection
    if asyncio.iscoroutinefunction(full):

        async def acheck(conn: Any) -> None:
            if not is_quiet(conn):
                await full(conn)

        return acheck

    def check(conn: Any) -> None:
        if not is_quiet(conn):
            full(conn)

    return check


_KEPT: _Kept[Any] = _Kept(lambda path: sqlite_checkpointer(Path(path)))
_POOLS: _Kept[Any] = _Kept(_postgres_pool)
os.register_at_fork(after_in_child=_KEPT.forget)
os.register_at_fork(after_in_child=_POOLS.forget)


@contextmanager
def open_checkpointer(
    home: Path, *, shared: bool = False, fence: CheckpointFence | None = None
) -> Iterator[Any]:
    """The checkpointer for runs: PostgreSQL when the ledger is on PostgreSQL, else SQLite.

    Args:
        shared: On SQLite, the process's open checkpointer of the file (see
            :class:`_Kept`) instead of one of the run's own, opened and closed here.
            Only for a run that leaves the saver as it is (a worker's run patches its own).
        fence: On PostgreSQL, the worker's attempt whose writes alone the checkpointer
            saves (``_fenced_saver.FencedPostgresSaver``; ``TaskRunner.run`` passes its
            ``attempt``); None: unfenced. SQLite has no fence: the worker mode
            runs on PostgreSQL only, and an in-process run holds the task's lease.
    """
    from relaygraph.store import DATABASE_URL_ENV

    conninfo = postgres_conninfo(os.environ.get(DATABASE_URL_ENV, ""))
    if conninfo is None:
        path = home / "checkpoints.sqlite"
        with _KEPT.use(str(path.resolve())) if shared else sqlite_checkpointer(path) as saver:
            yield saver
        return
    from langgraph.checkpoint.postgres import PostgresSaver

    from relaygraph.runner._fenced_saver import FencedPostgresSaver

    with _POOLS.use(conninfo) as pool, pool.connection() as connection:
        saver = (
            PostgresSaver(connection)
            if fence is None
            else FencedPostgresSaver(connection, fence=fence)
        )
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


class _LoopSavers:
    """Async checkpointers kept open per event loop and database: the runs of a loop
    (``serve``'s) share one SQLite connection (``ThreadSqliteSaver``'s, on its own thread)
    or one pool of PostgreSQL connections, rather than open one per run. They are bound to
    their loop. At most ``keep`` keys stay open per loop (a test session's many data
    directories do not pile up open files and threads); one dropped while runs use it is
    closed when the last of them ends."""

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._open: dict[tuple[int, str], tuple[Any, Callable[[], Awaitable[None]]]] = {}
        self._users: dict[int, int] = {}
        self._dropped: dict[int, Callable[[], Awaitable[None]]] = {}
        self._locks: dict[int, asyncio.Lock] = {}

    @asynccontextmanager
    async def use(
        self, key: str, opener: Callable[[], Awaitable[tuple[Any, Any]]]
    ) -> AsyncIterator[Any]:
        loop = id(asyncio.get_running_loop())
        to_close: list[Callable[[], Awaitable[None]]] = []
        async with self._locks.setdefault(loop, asyncio.Lock()):
            kept = self._open.pop((loop, key), None)
            if kept is None:
                kept = await opener()
            self._open[(loop, key)] = kept  # The most recently used last.
            saver = kept[0]
            self._users[id(saver)] = self._users.get(id(saver), 0) + 1
            mine = [k for k in self._open if k[0] == loop]
            while len(mine) > self.keep:
                old = self._open.pop(mine.pop(0))
                if self._users.get(id(old[0]), 0):
                    self._dropped[id(old[0])] = old[1]
                else:
                    to_close.append(old[1])
        for close in to_close:
            await close()
        try:
            yield saver
        finally:
            self._users[id(saver)] -= 1
            if not self._users[id(saver)]:
                del self._users[id(saver)]
                dropped = self._dropped.pop(id(saver), None)
                if dropped is not None:
                    await dropped()

    async def close(self) -> None:
        loop = id(asyncio.get_running_loop())
        for key in [k for k in self._open if k[0] == loop]:
            _, closer = self._open.pop(key)
            await closer()
        self._locks.pop(loop, None)

    def forget(self) -> None:
        self._open, self._users, self._dropped, self._locks = {}, {}, {}, {}


_LOOP_SAVERS = _LoopSavers()
os.register_at_fork(after_in_child=_LOOP_SAVERS.forget)


def async_checkpointer(home: Path) -> AbstractAsyncContextManager[Any]:
    """The running event loop's checkpointer for in-process runs, while the block lasts
    (see :func:`open_checkpointer`, whose unfenced savers these are, in their async form)."""
    from relaygraph.store import DATABASE_URL_ENV

    conninfo = postgres_conninfo(os.environ.get(DATABASE_URL_ENV, ""))
    if conninfo is None:
        path = str((home / "checkpoints.sqlite").resolve())
        return _LOOP_SAVERS.use(path, lambda: _open_async_sqlite(Path(path)))
    return _LOOP_SAVERS.use(conninfo, lambda: _open_async_postgres(conninfo))


async def close_async_checkpointers() -> None:
    """Close the running loop's checkpointers (its runs are over)."""
    await _LOOP_SAVERS.close()


async def _open_async_sqlite(path: Path) -> tuple[Any, Callable[[], Awaitable[None]]]:
    from relaygraph.runner._sqlite_saver import ThreadSqliteSaver

    saver = await asyncio.to_thread(_open_sqlite, path, ThreadSqliteSaver)
    return saver, saver.aclose


async def _open_async_postgres(conninfo: str) -> tuple[Any, Callable[[], Awaitable[None]]]:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg_pool import AsyncConnectionPool

    if conninfo not in _SETUP_DONE:
        # The saver's migrations, as the sync path runs them (one process at a time).
        await asyncio.to_thread(_setup_postgres, conninfo)
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        conninfo, **_pool_options(AsyncConnectionPool, "relaygraph-checkpoints-async"), open=False
    )
    await pool.open()
    return AsyncPostgresSaver(pool), pool.close


def _setup_postgres(conninfo: str) -> None:
    with _SETUP_LOCK:
        if conninfo in _SETUP_DONE:
            return
        from langgraph.checkpoint.postgres import PostgresSaver

        with _setup_lock(conninfo), PostgresSaver.from_conn_string(conninfo) as saver:
            saver.setup()
        _SETUP_DONE.add(conninfo)
