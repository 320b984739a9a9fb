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

A step's writes (``put_writes``: each finished task's, before the step's checkpoint) are not
a transaction of their own: the saver keeps them until its next write, the step's checkpoint,
which saves them in its fenced transaction, before the checkpoint's rows (one fence, one
commit a step instead of two; in the worker-mode benchmark a task's writes were eleven
transactions of their own, about a fifth of its commits). A read of the saver (the state at
the run's end, a subgraph's start) saves what it keeps first, so nothing reads around them.
What that costs: a worker killed between a task's end and its step's checkpoint loses that
task's writes, and the next attempt runs the task again, as it runs every task of a step
whose checkpoint was not saved; a tool call it makes again is answered from the tool journal
(``relaygraph.agents._journal``), not run again, so tool calls stay exactly once.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from typing import TYPE_CHECKING, Any, Self

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import WRITES_IDX_MAP
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.postgres.base import BasePostgresSaver
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
        if fence.on_superseded is not None:
            fence.on_superseded(current)
        raise AttemptSuperseded(fence.task_id, fence.attempt, current)
    if row is not None and row["cancel"] and fence.on_cancel is not None:
        fence.on_cancel()


class _KeptWrites:
    """The writes of a step's tasks that a fenced saver keeps until its next write (see the
    module's docstring): ``(query, rows)`` as ``put_writes`` would execute them, in order.
    A lock of its own: a sync run's tasks end on the threads of LangGraph's pool."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: list[tuple[str, list[Any]]] = []

    def keep(
        self,
        saver: BasePostgresSaver,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> None:
        """Keep ``put_writes``'s statement and rows for ``writes`` (made now: the values as
        they are when the task ends)."""
        query = (
            saver.UPSERT_CHECKPOINT_WRITES_SQL
            if all(w[0] in WRITES_IDX_MAP for w in writes)
            else saver.INSERT_CHECKPOINT_WRITES_SQL
        )
        configurable = config["configurable"]
        rows = saver._dump_writes(
            configurable["thread_id"],
            configurable["checkpoint_ns"],
            configurable["checkpoint_id"],
            task_id,
            task_path,
            writes,
        )
        with self._lock:
            self._kept.append((query, rows))

    def __bool__(self) -> bool:
        return bool(self._kept)

    def take(self) -> list[tuple[str, list[Any]]]:
        """What is kept, no longer kept: a transaction that fails after taking them drops
        them with itself (a superseded attempt's must not be saved; any other failure
        fails the run, and its next attempt runs the step again)."""
        with self._lock:
            kept, self._kept = self._kept, []
        return kept


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
        self._kept = _KeptWrites()

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

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Kept until the next write, which saves them (see the module's docstring)."""
        self._kept.keep(self, config, writes, task_id, task_path)

    def save_kept(self) -> None:
        """Save the writes kept so far, in a fenced transaction of their own (nothing when
        none are kept).

        Raises:
            AttemptSuperseded: The task is on another attempt, or gone; the writes are
                dropped.
        """
        if self._kept:
            with self._cursor(pipeline=True):
                pass

    @contextmanager
    def _cursor(self, *, pipeline: bool = False) -> Iterator[Cursor[DictRow]]:
        if not pipeline:  # A read, or the saver's set-up: after the kept writes.
            # Refused, they are dropped and the read goes on: a saver's reads are unfenced,
            # a superseded attempt's too (its run reads its state to end); the fence's
            # on_superseded has told the run.
            with suppress(AttemptSuperseded):
                self.save_kept()
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
            self._write_kept(cur)
            yield cur

    def _write_kept(self, cur: Cursor[DictRow]) -> None:
        """The kept writes' INSERTs, in the fenced transaction of ``cur``."""
        for query, rows in self._kept.take():
            cur.executemany(query, rows)


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
        # Not the base saver's pipeline, shared across writes: each write's transaction is
        # a pipeline of its own (see _cursor).
        super().__init__(pool)
        self.fence = fence
        self._pool = pool
        self._kept = _KeptWrites()

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Kept until the next write, which saves them (see the module's docstring). Their
        rows are made here, on the loop: a hand-over to a thread for them (as the base
        saver's) cost more than the few values of one task."""
        self._kept.keep(self, config, writes, task_id, task_path)

    def put_in(
        self,
        connection: Connection[Any],
        config: RunnableConfig,
        checkpoint: Any,
        metadata: Any,
        new_versions: Any,
    ) -> RunnableConfig:
        """Save the step's checkpoint, with the writes kept, in the transaction open on
        ``connection`` (the ledger's, in which the worker writes the step's events:
        ``EventWriter.asave_with``), after the same fence: blocking, on the thread of that
        transaction. Returns what ``aput`` returns.

        One transaction a step instead of two: the step's events and its checkpoint commit
        together (or neither does), on a ledger write thread, with psycopg's waits in C
        instead of the loop's."""
        saver = _InTransaction(connection, fence=self.fence, kept=self._kept, serde=self.serde)
        return saver.put(config, checkpoint, metadata, new_versions)

    async def asave_kept(self) -> None:
        """:meth:`FencedPostgresSaver.save_kept` on the loop."""
        if self._kept:
            async with self._cursor(pipeline=True):
                pass

    @asynccontextmanager
    async def _cursor(self, *, pipeline: bool = False) -> AsyncIterator[AsyncCursor[DictRow]]:
        if not pipeline:  # A read, or the saver's set-up: after the kept writes (as above).
            with suppress(AttemptSuperseded):
                await self.asave_kept()
            async with super()._cursor() as cur:
                yield cur
            return
        # The saver's lock for the whole transaction, as the sync saver's: a run's
        # concurrent writes (parallel nodes) must not interleave on one connection.
        #
        # One pipeline: BEGIN, the fence's read, the INSERTs, then one round trip for all
        # of them, the fence checked, and COMMIT (or ROLLBACK when the check refuses). The
        # server runs them in order, so the INSERTs run after the fence's read has locked
        # the task's row, as they would one round trip each; nothing commits before the
        # check. A step's save was six round trips, each a wake-up of the loop and a pass
        # through psycopg's protocol in Python: about a sixth of a worker's interpreter
        # time at 200 tasks in flight.
        async with (
            self.lock,
            self._pool.connection() as conn,
            conn.pipeline() as round_trip,
            conn.transaction(),
            conn.cursor(row_factory=dict_row) as fence,
            conn.cursor(binary=True, row_factory=dict_row) as cur,
        ):
            await fence.execute(ATTEMPT_FENCE_SQL, (self.fence.task_id,))
            for query, rows in self._kept.take():
                await cur.executemany(query, rows)
            yield cur
            await round_trip.sync()
            _check_attempt(self.fence, await fence.fetchone())


class _InTransaction(FencedPostgresSaver):
    """A fenced saver's writes in a transaction someone else opened on ``conn`` and
    commits (see :meth:`AsyncFencedPostgresSaver.put_in`): the fence's read, the kept writes
    and the write's own INSERTs, in no transaction of its own.

    ``conn`` is the ledger's (SQLAlchemy's psycopg connection), whose JSON dumps are the
    ledger's (``ensure_ascii=False, allow_nan=False``): the rows stored are the same
    ``jsonb`` values, and a NaN, which ``jsonb`` refuses either way, fails here before it is
    sent."""

    def __init__(
        self,
        conn: Connection[Any],
        *,
        fence: CheckpointFence,
        kept: _KeptWrites,
        serde: Any,
    ) -> None:
        PostgresSaver.__init__(self, conn, serde=serde)
        self.fence = fence
        self._connection = conn
        self._kept = kept

    @contextmanager
    def _cursor(self, *, pipeline: bool = False) -> Iterator[Cursor[DictRow]]:
        with self._connection.cursor(binary=True, row_factory=dict_row) as cur:
            row = cur.execute(ATTEMPT_FENCE_SQL, (self.fence.task_id,)).fetchone()
            _check_attempt(self.fence, row)
            self._write_kept(cur)
            yield cur
