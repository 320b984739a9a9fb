"""A PostgreSQL checkpointer whose writes are fenced by a worker's attempt at its task.

The worker mode's ledger refuses the writes of an attempt that is no longer the task's
latest (a worker that froze while RabbitMQ gave its task to another, then came back). The
checkpoints need the same fence, and atomically: a worker that checked the attempt and then
saved could be frozen between the two, and save over the thread the new attempt goes on
from (a newer checkpoint becomes the thread's latest; a task's writes replace the new
attempt's for the same step). So each write reads the task's attempt in the transaction of
its INSERTs, the task's row locked until the commit; ``Ledger.begin_attempt`` locks that row
to begin the next attempt, so a write either commits before the next attempt begins or sees
it and is refused.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, Self

from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from psycopg import AsyncCursor, Connection, Cursor
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from relaygraph.store import AttemptSuperseded

if TYPE_CHECKING:
    from relaygraph.runner._fence import CheckpointFence

__all__ = ["ATTEMPT_FENCE_SQL", "AsyncFencedPostgresSaver", "FencedPostgresSaver"]

ATTEMPT_FENCE_SQL = (
    "SELECT attempts, cancel_requested_at IS NOT NULL AS cancel FROM tasks WHERE id = %s FOR SHARE"
)
"""The task's attempt in the ledger (``tasks.attempts``, the fencing number), its row held
until the write commits, and whether a cancel waits on it (told to ``fence.on_cancel``: the
run needs no read of its own at each step). FOR SHARE, not FOR KEY SHARE: it must wait for,
and hold off, any change of the row (``begin_attempt`` locks it FOR UPDATE, and a plain
UPDATE of the attempts would take only FOR NO KEY UPDATE)."""


def _check_attempt(fence: CheckpointFence, row: DictRow | None) -> None:
    """Let a write go on only while the task is on ``fence.attempt``: ``row`` is the task's,
    as :data:`ATTEMPT_FENCE_SQL` read it in the write's transaction (None: no such task).
    A cancel that waits on the task is told to ``fence.on_cancel``.

    Raises:
        AttemptSuperseded: The task is on another attempt, or gone; the write's transaction
            rolls back.
    """
    current = None if row is None else int(row["attempts"])
    if current != fence.attempt:
        raise AttemptSuperseded(fence.task_id, fence.attempt, current)
    if row is not None and row["cancel"] and fence.on_cancel is not None:
        fence.on_cancel()


class FencedPostgresSaver(PostgresSaver):
    """A ``PostgresSaver`` that saves only while ``fence.attempt`` is the task's attempt.

    Every write of the saver (a step's checkpoint, a task's writes, a thread's deletion)
    goes through ``_cursor(pipeline=True)``: here one transaction that first reads the
    task's attempt (:data:`ATTEMPT_FENCE_SQL`) and raises ``AttemptSuperseded`` when the task
    is on another attempt (or gone), rolling back, so nothing of the write is saved. Reads
    are the saver's own. The ledger must be in the checkpoints' database (the worker mode's
    ``RELAYGRAPH_DATABASE_URL`` holds both).

    Args:
        conn: The saver's connection, in autocommit mode (as ``from_conn_string`` makes it):
            its reads commit at once, its writes in the transaction made here.
        fence: The worker's attempt at the task.
    """

    def __init__(self, conn: Connection[DictRow], *, fence: CheckpointFence) -> None:
        super().__init__(conn)
        self.fence = fence
        self._connection = conn

    @classmethod
    @contextmanager
    def for_attempt(cls, conninfo: str, fence: CheckpointFence) -> Iterator[Self]:
        """A saver on a connection of its own to ``conninfo``, closed after.

        The connection's options are ``PostgresSaver.from_conn_string``'s.
        """
        with Connection.connect(
            conninfo, autocommit=True, prepare_threshold=0, row_factory=dict_row
        ) as conn:
            yield cls(conn, fence=fence)

    @contextmanager
    def _cursor(self, *, pipeline: bool = False) -> Iterator[Cursor[DictRow]]:
        if not pipeline:  # A read, or the saver's set-up.
            with super()._cursor() as cur:
                yield cur
            return
        conn = self._connection
        # The saver's lock for the whole transaction: the graph's threads share the
        # connection, and another thread's statement must not run inside this transaction.
        with (
            self.lock,
            conn.transaction(),
            conn.cursor(binary=True, row_factory=dict_row) as cur,
        ):
            row = cur.execute(ATTEMPT_FENCE_SQL, (self.fence.task_id,)).fetchone()
            _check_attempt(self.fence, row)
            yield cur


class AsyncFencedPostgresSaver(AsyncPostgresSaver):
    """:class:`FencedPostgresSaver` for a run on an event loop: an ``AsyncPostgresSaver``
    that saves only while ``fence.attempt`` is the task's attempt.

    It works on a pool of connections (the process's, shared by every run on the loop), never
    on a connection of its own: each write takes a connection for its one transaction (the
    fence's read, then its INSERTs) and gives it back, so a process holds as many
    connections as writes at once, not one per run in flight. One saver per attempt (the
    fence is the attempt's); making one costs no connection.

    Args:
        pool: A pool of connections in autocommit mode, as the async checkpointers' pool
            makes them: reads commit at once, writes in the transaction made here.
        fence: The worker's attempt at the task.
    """

    def __init__(self, pool: AsyncConnectionPool[Any], *, fence: CheckpointFence) -> None:
        # No pipeline: the fence's read must see its row before the INSERTs are sent, in
        # one transaction, which a pipeline shared across writes cannot promise.
        super().__init__(pool)
        self.fence = fence
        self._pool = pool

    @asynccontextmanager
    async def _cursor(self, *, pipeline: bool = False) -> AsyncIterator[AsyncCursor[DictRow]]:
        if not pipeline:  # A read, or the saver's set-up.
            async with super()._cursor() as cur:
                yield cur
            return
        # The saver's lock for the whole transaction, as the sync saver's: a run's
        # concurrent writes (parallel nodes) must not interleave on one connection.
        async with (
            self.lock,
            self._pool.connection() as conn,
            conn.transaction(),
            conn.cursor(binary=True, row_factory=dict_row) as cur,
        ):
            await cur.execute(ATTEMPT_FENCE_SQL, (self.fence.task_id,))
            _check_attempt(self.fence, await cur.fetchone())
            yield cur
