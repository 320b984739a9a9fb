"""A SQLite ledger's writers take turns: a request's write goes before the runs' own that
wait (issue 44), and the runs' writes are not held up for good."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import pytest
from sqlalchemy.exc import TimeoutError as PoolTimeout

from relaygraph.runner._event_writer import EventWriter
from relaygraph.runner._lease import LeaseKeeper
from relaygraph.store import LOCAL_PROJECT_ID, Ledger, background_writes
from relaygraph.store._write_turns import _BACKGROUND, URGENT_TURNS_IN_A_ROW, WriteTurns

from .worker_cluster import wait_until

WAIT_SECONDS = 30.0


class _Queue:
    """Writers started one at a time, each queued for its turn before the next starts, that
    say in ``order`` when their turn came; the first holds its turn until :meth:`go`."""

    def __init__(self, turns: WriteTurns, write: Callable[[], Any]) -> None:
        self.turns, self.write = turns, write
        self.order: list[str] = []
        self.holding = threading.Event()
        self.let_go = threading.Event()
        self.threads: list[threading.Thread] = []

    def hold(self) -> None:
        def holder() -> None:
            with background_writes(), self.write():
                self.holding.set()
                self.let_go.wait(WAIT_SECONDS)

        self._start(holder)
        assert self.holding.wait(WAIT_SECONDS)

    def add(self, name: str, *, background: bool) -> None:
        before = sum(self.turns.waiting)

        def writer() -> None:
            with background_writes() if background else nullcontext(), self.write():
                self.order.append(name)

        self._start(writer)
        wait_until(lambda: sum(self.turns.waiting) == before + 1, WAIT_SECONDS, f"{name} queued")

    def go(self) -> list[str]:
        self.let_go.set()
        for thread in self.threads:
            thread.join(WAIT_SECONDS)
        return self.order

    def _start(self, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        self.threads.append(thread)


def test_a_requests_write_goes_before_the_runs_writes_that_wait(sqlite_ledger: Ledger) -> None:
    turns = sqlite_ledger.core.write_turns
    assert turns is not None
    queue = _Queue(turns, sqlite_ledger.core.write_connection)
    queue.hold()
    for n in range(3):
        queue.add(f"run-{n}", background=True)
    queue.add("request", background=False)
    assert turns.waiting == (1, 3)
    assert queue.go() == ["request", "run-0", "run-1", "run-2"]
    # Each write was a transaction of the ledger's, which still takes writes.
    task, created = sqlite_ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x")
    assert created and sqlite_ledger.get_task(task.id, project_id=LOCAL_PROJECT_ID) == task


def test_a_background_write_goes_after_a_few_urgent_ones_however_many_wait(
    sqlite_ledger: Ledger,
) -> None:
    turns = sqlite_ledger.core.write_turns
    assert turns is not None
    queue = _Queue(turns, sqlite_ledger.core.write)
    queue.hold()
    queue.add("run", background=True)
    urgent = [f"request-{n}" for n in range(URGENT_TURNS_IN_A_ROW + 2)]
    for name in urgent:
        queue.add(name, background=False)
    order = queue.go()
    assert order == [*urgent[:URGENT_TURNS_IN_A_ROW], "run", *urgent[URGENT_TURNS_IN_A_ROW:]]


def test_a_writer_whose_turn_does_not_come_gives_up_and_leaves_the_queue() -> None:
    turns = WriteTurns(timeout=0.05)
    with turns.turn():
        with pytest.raises(PoolTimeout, match="no turn to write"), turns.turn():
            pass
        assert turns.waiting == (0, 0)
    with turns.turn():  # Free again for the next.
        assert turns.waiting == (0, 0)


def test_postgresql_writers_take_no_turns() -> None:
    ledger = Ledger("postgresql+psycopg://nobody@127.0.0.1:1/none")
    assert ledger.core.write_turns is None  # Its pool has a connection for each writer.


def test_a_runs_events_are_background_writes_and_its_lease_renewals_are_not() -> None:
    """A renewal that fell behind the events would stop its run (its lease unconfirmed)."""
    marked: dict[str, bool] = {}
    renewed = threading.Event()

    class Ledger:
        def append_events(self, task_id: str, events: list[Any], **_: Any) -> list[int]:
            marked["events"] = _BACKGROUND.get()
            return []

        def renew_leases(
            self, task_ids: list[str], runner_id: str, **_: Any
        ) -> dict[str, bool | None]:
            marked["lease"] = _BACKGROUND.get()
            renewed.set()
            return dict.fromkeys(task_ids, False)

    writer = EventWriter(Ledger(), "task-1", lambda e: None, linger_seconds=0)
    writer.put({"type": "run_started"})
    writer.close()
    keeper = LeaseKeeper(Ledger(), "task-1", "runner-1", seconds=0.03)
    try:
        assert renewed.wait(WAIT_SECONDS)
    finally:
        keeper.close()
    assert marked == {"events": True, "lease": False}
    assert not _BACKGROUND.get()  # Only theirs: this thread's writes stay urgent.
