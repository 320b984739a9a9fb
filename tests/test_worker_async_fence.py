"""The async fenced checkpointer (``AsyncFencedPostgresSaver``): a superseded attempt's
checkpoint writes are refused on PostgreSQL, as the sync saver's are
(tests/test_worker_checkpoint_fence.py), for a run on an event loop, while the savers of
every run share one pool and a connection is held per write, not per run.

PostgreSQL only: skipped without it, unless ``RELAYGRAPH_REQUIRE_POSTGRES=1``. Every wait is
for an event under a generous deadline; nothing sleeps for a fixed time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from relaygraph.runner import CheckpointFence
from relaygraph.runner._checkpoint import open_checkpointer
from relaygraph.runner._event_writer import EventWriter
from relaygraph.runner._fenced_saver import AsyncFencedPostgresSaver
from relaygraph.runner._run_mode import _acheck_at_each_step
from relaygraph.store import AttemptSuperseded, Ledger

from .test_worker_checkpoint_fence import (
    DEADLINE,
    Steps,
    begin,
    checkpoint_rows,
    conninfo,
    running_task,
    two_step_graph,
)


@pytest.fixture
async def pool(postgres_ledger: Ledger, home: Path) -> AsyncIterator[AsyncConnectionPool[Any]]:
    """A pool as the async checkpointers' (autocommit, dict rows), on the saver's tables,
    of one connection: a saver that held it for a whole run would stop every other run."""
    with open_checkpointer(home):  # The saver's tables.
        pass
    made: AsyncConnectionPool[Any] = AsyncConnectionPool(
        conninfo(),
        min_size=0,
        max_size=1,
        timeout=DEADLINE,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        open=False,
    )
    await made.open()
    try:
        yield made
    finally:
        await made.close()


def two_steps(saver: Any, by: str, frozen: asyncio.Event | None = None) -> Any:
    """first → second (which, given ``frozen``, waits for it: the worker froze mid-step)."""
    entered = asyncio.Event()

    async def second(state: Steps) -> Steps:
        entered.set()
        if frozen is not None:
            await asyncio.wait_for(frozen.wait(), DEADLINE)
        return {"steps": [f"second by {by}"]}

    async def first(state: Steps) -> Steps:
        return {"steps": [f"first by {by}"]}

    return two_step_graph(saver, first, second, entered)


async def test_a_stale_attempt_on_the_loop_saves_nothing_on_the_new_attempts_thread(
    postgres_ledger: Ledger,
    pool: AsyncConnectionPool[Any],
) -> None:
    task_id, dispatch = running_task(postgres_ledger)
    config: RunnableConfig = {"configurable": {"thread_id": f"thread-{task_id}"}}
    frozen = asyncio.Event()
    stale_saver = AsyncFencedPostgresSaver(pool, fence=CheckpointFence(task_id=task_id, attempt=1))
    stale = two_steps(stale_saver, "attempt 1", frozen)
    stale_run = asyncio.create_task(stale.ainvoke({"steps": []}, config, durability="sync"))
    # Attempt 1 saved its first step and froze in the second.
    await asyncio.wait_for(stale.entered.wait(), DEADLINE)

    # The task is redelivered: attempt 2 goes on from attempt 1's last checkpoint, on the
    # same pool's one connection, which the frozen run does not hold.
    assert await asyncio.to_thread(begin, postgres_ledger, task_id, dispatch) == 2
    saver = AsyncFencedPostgresSaver(pool, fence=CheckpointFence(task_id=task_id, attempt=2))
    new = two_steps(saver, "attempt 2")
    assert await new.ainvoke(None, config, durability="sync") == {
        "steps": ["first by attempt 1", "second by attempt 2"]
    }
    saved = await asyncio.to_thread(checkpoint_rows, f"thread-{task_id}")
    latest = await saver.aget_tuple(config)
    assert latest is not None

    # Attempt 1 wakes up: its step's writes and its checkpoint are refused.
    frozen.set()
    with pytest.raises(AttemptSuperseded) as refused:
        await asyncio.wait_for(stale_run, DEADLINE)
    assert (refused.value.task_id, refused.value.attempt, refused.value.current) == (
        task_id,
        1,
        2,
    )
    # Its writes are kept until its checkpoint, and refused with it.
    await stale_saver.aput_writes(latest.config, [("steps", ["stale"])], "stale-task")
    with pytest.raises(AttemptSuperseded):
        await stale_saver.aput(latest.config, latest.checkpoint, latest.metadata, {})
    assert await asyncio.to_thread(checkpoint_rows, f"thread-{task_id}") == saved
    # The saver's reads are its own, unfenced.
    assert await stale_saver.aget_tuple(config) == await saver.aget_tuple(config)


async def test_an_async_write_tells_the_fence_of_a_cancel_asked_for(
    postgres_ledger: Ledger,
    pool: AsyncConnectionPool[Any],
) -> None:
    task_id, _ = running_task(postgres_ledger)
    config: RunnableConfig = {
        "configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "c1"}
    }
    told: list[str] = []
    fence = CheckpointFence(task_id=task_id, attempt=1, on_cancel=lambda: told.append("cancel"))
    saver = AsyncFencedPostgresSaver(pool, fence=fence)
    await saver.aput_writes(config, [("steps", ["one"])], "task-1")
    await saver.asave_kept()
    assert told == []
    cancelled = await asyncio.to_thread(postgres_ledger.request_cancel, task_id)
    assert cancelled.status == "running"  # It waits for the worker.
    await saver.aput_writes(config, [("steps", ["two"])], "task-2")
    await saver.asave_kept()
    assert told == ["cancel"]
    # The write itself is saved: the run stops at the step boundary, after its writes.
    writes = (await asyncio.to_thread(checkpoint_rows, "t"))["checkpoint_writes"]
    assert [row[2] for row in writes] == ["task-1", "task-2"]


async def test_an_async_write_of_an_unknown_task_is_refused(
    postgres_ledger: Ledger,
    pool: AsyncConnectionPool[Any],
) -> None:
    config: RunnableConfig = {
        "configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "c1"}
    }
    saver = AsyncFencedPostgresSaver(pool, fence=CheckpointFence(task_id="no-such", attempt=1))
    await saver.aput_writes(config, [("steps", ["one"])], "task-1")
    with pytest.raises(AttemptSuperseded):
        await saver.asave_kept()
    assert (await asyncio.to_thread(checkpoint_rows, "t"))["checkpoint_writes"] == []


class CountedPool:
    """A pool that counts the connections it lends: a fenced saver takes one for each
    write transaction."""

    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self.pool = pool
        self.lent = 0

    def connection(self, *args: Any, **kwargs: Any) -> Any:
        self.lent += 1
        return self.pool.connection(*args, **kwargs)


async def test_a_steps_writes_are_saved_with_its_checkpoint_in_one_transaction(
    postgres_ledger: Ledger,
    pool: AsyncConnectionPool[Any],
) -> None:
    """A task's writes wait in the saver (no connection taken, nothing saved) until the
    step's checkpoint, whose one fenced transaction saves both; a read first saves what is
    kept, so it never misses a write."""
    task_id, _ = running_task(postgres_ledger)
    saver = AsyncFencedPostgresSaver(pool, fence=CheckpointFence(task_id=task_id, attempt=1))
    graph = two_steps(saver, "attempt 1")
    config: RunnableConfig = {"configurable": {"thread_id": f"thread-{task_id}"}}
    await graph.ainvoke({"steps": []}, config, durability="sync")
    latest = await saver.aget_tuple(config)
    assert latest is not None
    counted = CountedPool(pool)
    saver._pool = counted  # type: ignore[assignment]

    def saved_by(task: str) -> int:
        rows = checkpoint_rows(f"thread-{task_id}")["checkpoint_writes"]
        return [row[2] for row in rows].count(task)

    await saver.aput_writes(latest.config, [("steps", ["kept"])], "task-a")
    await saver.aput_writes(latest.config, [("steps", ["also kept"])], "task-b")
    assert counted.lent == 0
    assert await asyncio.to_thread(saved_by, "task-a") == 0

    # A read sees them: it saves them first, in one transaction.
    read = await saver.aget_tuple(latest.config)
    assert read is not None
    assert [(w[0], w[2]) for w in read.pending_writes] == [
        ("task-a", ["kept"]),
        ("task-b", ["also kept"]),
    ]
    assert counted.lent == 1

    # The next step's writes and its checkpoint: one transaction.
    await saver.aput_writes(latest.config, [("steps", ["third"])], "task-c")
    following = {**latest.checkpoint, "id": "following"}
    await saver.aput(latest.config, following, latest.metadata, {})
    assert counted.lent == 2
    assert await asyncio.to_thread(saved_by, "task-c") == 1


# A step's events and its checkpoint: one transaction, on the ledger's write thread.


def step_saver(
    ledger: Ledger, pool: AsyncConnectionPool[Any], task_id: str
) -> tuple[AsyncFencedPostgresSaver, EventWriter, CountedPool]:
    """Attempt 1's saver, whose ``aput`` saves each step's checkpoint with the step's events
    (as a worker's run wires it), its writer, and its pool, counted."""
    saver = AsyncFencedPostgresSaver(pool, fence=CheckpointFence(task_id=task_id, attempt=1))
    writer = EventWriter(ledger, task_id, lambda event: None, attempt=1)
    _acheck_at_each_step(saver, None, flush=writer.aflush, save_with=writer.asave_with)  # type: ignore[arg-type]
    counted = CountedPool(pool)
    saver._pool = counted  # type: ignore[assignment]
    return saver, writer, counted


def noting(writer: EventWriter, by: str) -> Any:
    """first → second, each queueing an event to ``writer`` (as a run's nodes do)."""

    async def first(state: Steps) -> Steps:
        writer.queue({"type": "note", "text": f"first by {by}"})  # type: ignore[typeddict-item]
        return {"steps": [f"first by {by}"]}

    async def second(state: Steps) -> Steps:
        writer.queue({"type": "note", "text": f"second by {by}"})  # type: ignore[typeddict-item]
        return {"steps": [f"second by {by}"]}

    return two_step_graph(None, first, second, None)


def broken(connection: Any, *args: Any) -> None:
    connection.execute("SELECT no_such_column FROM tasks")


def unserializable(connection: Any, *args: Any) -> None:
    raise TypeError("Object of type Thing is not serializable")


def after_the_first_node(saver: AsyncFencedPostgresSaver, failing: Any) -> Any:
    """``saver.put_in``, but ``failing`` for the checkpoint after the node ``first`` (step 1;
    the first node's event is in its transaction)."""
    real = saver.put_in

    def put_in(connection: Any, config: Any, checkpoint: Any, metadata: Any, new: Any) -> Any:
        save = failing if metadata.get("step") == 1 else real
        return save(connection, config, checkpoint, metadata, new)

    return put_in


def notes(ledger: Ledger, task_id: str) -> list[str]:
    return [e.data["text"] for e in ledger.events_after(task_id, 0) if e.type == "note"]


async def test_a_steps_events_and_checkpoint_commit_in_one_transaction(
    postgres_ledger: Ledger,
    pool: AsyncConnectionPool[Any],
) -> None:
    task_id, _ = running_task(postgres_ledger)
    saver, writer, counted = step_saver(postgres_ledger, pool, task_id)
    graph = noting(writer, "attempt 1").copy({"checkpointer": saver})
    config: RunnableConfig = {"configurable": {"thread_id": f"thread-{task_id}"}}
    assert await graph.ainvoke({"steps": []}, config, durability="sync") == {
        "steps": ["first by attempt 1", "second by attempt 1"]
    }
    # Every checkpoint was saved in its events' transaction: the saver took no connection
    # of its own for a write.
    assert counted.lent == 0
    assert await asyncio.to_thread(notes, postgres_ledger, task_id) == [
        "first by attempt 1",
        "second by attempt 1",
    ]
    latest = await saver.aget_tuple(config)
    assert latest is not None and latest.checkpoint["channel_values"]["steps"] == [
        "first by attempt 1",
        "second by attempt 1",
    ]
    await writer.aclose()


async def test_a_checkpoint_the_database_refuses_takes_its_steps_events_with_it(
    postgres_ledger: Ledger,
    pool: AsyncConnectionPool[Any],
) -> None:
    """Both commit or neither: a statement of the checkpoint's that fails rolls the step's
    events back, and the writer fails (the run stops)."""
    import psycopg

    task_id, _ = running_task(postgres_ledger)
    saver, writer, _ = step_saver(postgres_ledger, pool, task_id)

    saver.put_in = after_the_first_node(saver, broken)  # type: ignore[method-assign]
    graph = noting(writer, "attempt 1").copy({"checkpointer": saver})
    config: RunnableConfig = {"configurable": {"thread_id": f"thread-{task_id}"}}
    with pytest.raises(psycopg.Error):
        await graph.ainvoke({"steps": []}, config, durability="sync")
    assert await asyncio.to_thread(notes, postgres_ledger, task_id) == []
    with pytest.raises(psycopg.Error):
        await writer.aflush()


async def test_a_checkpoint_whose_values_do_not_save_leaves_its_events_written(
    postgres_ledger: Ledger,
    pool: AsyncConnectionPool[Any],
) -> None:
    """A save that fails for its values, not the database (as one that does not serialize),
    is raised where the run saves, as the saver's own would be; the step's events are
    written and the writer goes on, so the run can record how it ended."""
    task_id, _ = running_task(postgres_ledger)
    saver, writer, _ = step_saver(postgres_ledger, pool, task_id)

    saver.put_in = after_the_first_node(saver, unserializable)  # type: ignore[method-assign]
    graph = noting(writer, "attempt 1").copy({"checkpointer": saver})
    config: RunnableConfig = {"configurable": {"thread_id": f"thread-{task_id}"}}
    with pytest.raises(TypeError, match="not serializable"):
        await graph.ainvoke({"steps": []}, config, durability="sync")
    writer.put({"type": "note", "text": "the run's end"})  # type: ignore[typeddict-item]
    await writer.aflush()
    assert await asyncio.to_thread(notes, postgres_ledger, task_id) == [
        "first by attempt 1",
        "the run's end",
    ]
    await writer.aclose()
