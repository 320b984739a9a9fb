"""The SQLite checkpointer of runs on an event loop (``runner/_sqlite_saver.py``): each save,
read and listing is one hand-over to the saver's own thread, and its rows are LangGraph's."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.sqlite import SqliteSaver

from relaygraph.runner._checkpoint import async_checkpointer, close_async_checkpointers
from relaygraph.runner._sqlite_saver import ThreadSqliteSaver


def _config(thread: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    configurable = {"thread_id": thread, "checkpoint_ns": ""}
    if checkpoint_id:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def _saver(path: Path) -> ThreadSqliteSaver:
    return ThreadSqliteSaver(sqlite3.connect(path, check_same_thread=False))


def test_a_save_is_one_hand_over_to_the_savers_thread(tmp_path: Path) -> None:
    saver = _saver(tmp_path / "c.sqlite")
    threads: list[str] = []
    put = saver.put

    def recording_put(*args: Any) -> Any:
        threads.append(threading.current_thread().name)
        return put(*args)

    saver.put = recording_put  # type: ignore[method-assign]
    handed: list[object] = []
    submit = saver._thread.submit
    saver._thread.submit = lambda call: (handed.append(call), submit(call))  # type: ignore[method-assign]

    async def main() -> None:
        checkpoint = empty_checkpoint()
        await saver.aput(_config("t"), checkpoint, {"step": 0}, {})
        await saver.aclose()

    asyncio.run(main())
    assert threads and threads[0].startswith("relaygraph-checkpoints")
    assert threads[0] != threading.current_thread().name
    assert len(handed) == 2  # The save, then the close: one hand-over each.


def test_its_rows_are_langgraphs_both_ways(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    first = empty_checkpoint()

    async def write() -> None:
        saver = _saver(path)
        saved = await saver.aput(_config("t"), first, {"step": 0}, {})
        await saver.aput_writes(saved, [("messages", ["hello"])], "task-1")
        await saver.aclose()

    asyncio.run(write())
    with SqliteSaver.from_conn_string(str(path)) as sync:
        got = sync.get_tuple(_config("t"))
        assert got is not None and got.checkpoint["id"] == first["id"]
        assert [(w[1], w[2]) for w in got.pending_writes or []] == [("messages", ["hello"])]
        second = empty_checkpoint()
        sync.put(_config("t", first["id"]), second, {"step": 1}, {})

    async def read() -> tuple[Any, list[Any]]:
        saver = _saver(path)
        latest = await saver.aget_tuple(_config("t"))
        listed = [each async for each in saver.alist(_config("t"))]
        await saver.adelete_thread("t")
        gone = await saver.aget_tuple(_config("t"))
        await saver.aclose()
        assert gone is None
        return latest, listed

    latest, listed = asyncio.run(read())
    assert latest.checkpoint["id"] == second["id"]
    assert latest.parent_config["configurable"]["checkpoint_id"] == first["id"]
    assert [each.checkpoint["id"] for each in listed] == [second["id"], first["id"]]


def test_an_error_on_its_thread_is_raised_where_the_run_awaits(tmp_path: Path) -> None:
    saver = _saver(tmp_path / "c.sqlite")

    async def main() -> None:
        await saver.aclose()
        with pytest.raises(sqlite3.ProgrammingError):
            await saver.aput(_config("t"), empty_checkpoint(), {"step": 0}, {})

    asyncio.run(main())


def test_a_cancelled_wait_leaves_the_loop_and_the_save_sound(tmp_path: Path) -> None:
    saver = _saver(tmp_path / "c.sqlite")
    gate = threading.Event()
    put = saver.put
    saver.put = lambda *args: (gate.wait(30), put(*args))[1]  # type: ignore[method-assign]
    errors: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        checkpoint = empty_checkpoint()
        waiting = asyncio.ensure_future(saver.aput(_config("t"), checkpoint, {"step": 0}, {}))
        await asyncio.sleep(0)
        waiting.cancel()
        gate.set()
        got = await saver.aget_tuple(_config("t"))  # Queued behind the save: it ended.
        assert got is not None and got.checkpoint["id"] == checkpoint["id"]
        await saver.aclose()

    asyncio.run(main())
    assert errors == []


def test_a_servers_runs_on_sqlite_save_through_it(tmp_path: Path) -> None:
    async def main() -> None:
        async with async_checkpointer(tmp_path) as saver:
            assert isinstance(saver, ThreadSqliteSaver)
            await saver.aput(_config("t"), empty_checkpoint(), {"step": 0}, {})
        await close_async_checkpointers()

    asyncio.run(main())
    with SqliteSaver.from_conn_string(str(tmp_path / "checkpoints.sqlite")) as sync:
        assert sync.get_tuple(_config("t")) is not None
