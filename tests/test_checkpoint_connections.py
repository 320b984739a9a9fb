"""Runs on PostgreSQL borrow their checkpointer's connection from the process's pool.

A connection per run cost every worker task a new server backend and a fresh parse of each
statement the saver prepares. These tests pin what the pool must keep: one run after another
reuses the connection; runs at once never share one (the fence's transaction is the
connection's); a forked child (Celery's prefork pool) never touches its parent's; a
connection the server ended is not lent to the next run.

PostgreSQL only: skipped without it, unless ``RELAYGRAPH_REQUIRE_POSTGRES=1``.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from relaygraph.runner import CheckpointFence
from relaygraph.runner._checkpoint import open_checkpointer, postgres_conninfo
from relaygraph.runner._fenced_saver import FencedPostgresSaver
from relaygraph.store import DATABASE_URL_ENV

from .worker_cluster import wait_until


@pytest.fixture
def conninfo(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Runs' checkpoints in a PostgreSQL schema of their own."""
    monkeypatch.setenv(DATABASE_URL_ENV, postgres_url)
    info = postgres_conninfo(postgres_url)
    assert info is not None
    yield info


def terminate(conninfo: str, backend: int) -> None:
    """End the server process ``backend`` (as an administrator, a restart or an idle timeout
    would), and wait until it is gone."""
    with psycopg.connect(conninfo, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (backend,))

        def gone() -> bool:
            found = admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (backend,))
            return found.fetchone() is None

        wait_until(gone, 120, f"backend {backend} to end")


def backend_of(home: Path, fence: CheckpointFence | None = None) -> int:
    """The server process of the connection a run's checkpointer gets."""
    with open_checkpointer(home, fence=fence) as saver:
        pid = saver.conn.info.backend_pid
        assert isinstance(pid, int)
        return pid


def test_one_run_after_another_reuses_the_connection(conninfo: str, tmp_path: Path) -> None:
    first = backend_of(tmp_path)
    fence = CheckpointFence(task_id="t-1", attempt=1)
    with open_checkpointer(tmp_path, fence=fence) as saver:
        assert isinstance(saver, FencedPostgresSaver) and saver.fence == fence
        assert saver.conn.info.backend_pid == first
    assert backend_of(tmp_path) == first


def test_runs_at_once_never_share_a_connection(conninfo: str, tmp_path: Path) -> None:
    with open_checkpointer(tmp_path) as one, open_checkpointer(tmp_path) as other:
        assert one.conn.info.backend_pid != other.conn.info.backend_pid


def test_a_forked_child_leaves_its_parents_connection_alone(conninfo: str, tmp_path: Path) -> None:
    parent = backend_of(tmp_path)  # Now idle in the parent's pool.
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's report comes back through the pipe
        code = 1
        try:
            os.write(write, str(backend_of(tmp_path)).encode())
            code = 0
        except BaseException:
            traceback.print_exc()  # In the test's captured output.
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        reported = pipe.read()
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child's run failed"
    assert int(reported) != parent, "the child was lent its parent's connection"
    # The child ended without closing the parent's connection for it.
    assert backend_of(tmp_path) == parent
    with open_checkpointer(tmp_path) as saver:
        assert saver.conn.execute("SELECT 1 AS one").fetchone() == {"one": 1}


def test_a_connection_the_server_ended_is_not_lent(conninfo: str, tmp_path: Path) -> None:
    ended = backend_of(tmp_path)
    terminate(conninfo, ended)
    with open_checkpointer(tmp_path) as saver:
        assert saver.conn.info.backend_pid != ended
        assert saver.conn.execute("SELECT 1 AS one").fetchone() == {"one": 1}


def test_an_event_loops_pool_does_not_lend_a_connection_the_server_ended(
    conninfo: str, tmp_path: Path
) -> None:
    """The async pool of a worker's runs in flight: its check before a lend skips the round
    trip for a quiet connection, and still finds one the server ended."""
    import asyncio

    from relaygraph.runner._checkpoint import async_checkpointer, close_async_checkpointers

    async def lent() -> int:
        async with async_checkpointer(tmp_path) as saver, saver.conn.connection() as conn:
            assert (await (await conn.execute("SELECT 1 AS one")).fetchone()) == {"one": 1}
            return int(conn.info.backend_pid)

    async def backend() -> int:
        # A dead connection lent may hang rather than fail: fail instead.
        return await asyncio.wait_for(lent(), 60)

    async def main() -> None:
        first = await backend()
        assert await backend() == first  # Quiet: lent again, without a new backend.
        terminate(conninfo, first)
        assert await backend() != first
        await close_async_checkpointers()

    asyncio.run(main())
