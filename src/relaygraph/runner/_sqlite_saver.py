"""The SQLite checkpointer of the runs on an event loop: LangGraph's ``SqliteSaver``, each
async call one hand-over to a thread of its own.

Not LangGraph's ``AsyncSqliteSaver``: on aiosqlite, each statement, cursor, fetch and commit
is a hand-over to its thread and back, three or four for a save. A server holding hundreds
of tasks in flight saves at every step of each (``durability="sync"``), and each hand-over is
a wait for the interpreter's lock while the loop holds it: the saves' hand-overs were most of
the process's thread switches. Here a save, a read or a listing is one hand-over, its
statements and its commit run together on the saver's thread, and the saves of all the runs
queue there in order, as they queued on aiosqlite's. Same tables, same rows: a file written
by either is read by the other (and by the sync ``SqliteSaver`` of ``relaygraph run``).
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, TypeVar

from langgraph.checkpoint.sqlite import SqliteSaver

from relaygraph.runner._daemon import DaemonPool

__all__ = ["ThreadSqliteSaver"]

T = TypeVar("T")


class ThreadSqliteSaver(SqliteSaver):
    """``SqliteSaver`` with async methods that run its sync ones on one daemon thread (a
    :class:`DaemonPool` of one: in order, and a save that hangs on a locked file does not
    keep the process from exiting)."""

    def __init__(self, conn: sqlite3.Connection, *, name: str = "relaygraph-checkpoints") -> None:
        super().__init__(conn)
        self._thread = DaemonPool(1, name)

    async def _on_thread(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()

        def run() -> None:
            try:
                result = call(*args, **kwargs)
            except BaseException as exc:  # Raised where the run awaits it.
                loop.call_soon_threadsafe(_settle, done, None, exc)
            else:
                loop.call_soon_threadsafe(_settle, done, result, None)

        self._thread.submit(run)
        return await done

    async def aget_tuple(self, config: Any) -> Any:
        return await self._on_thread(self.get_tuple, config)

    async def alist(
        self,
        config: Any,
        *,
        filter: dict[str, Any] | None = None,
        before: Any = None,
        limit: int | None = None,
    ) -> AsyncIterator[Any]:
        listing = functools.partial(self.list, config, filter=filter, before=before, limit=limit)
        for each in await self._on_thread(lambda: list(listing())):
            yield each

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        return await self._on_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        await self._on_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await self._on_thread(self.delete_thread, thread_id)

    async def aget_delta_channel_history(
        self, *, config: Any, channels: Sequence[str]
    ) -> Mapping[str, Any]:
        return await self._on_thread(
            self.get_delta_channel_history, config=config, channels=channels
        )

    async def aclose(self) -> None:
        """Close the connection, after the calls handed over so far."""
        await self._on_thread(self.conn.close)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # The awaiting run was cancelled.
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
