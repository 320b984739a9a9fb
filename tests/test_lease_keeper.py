"""LeaseKeeper tells the run of a cancel it finds in the ledger (no watcher thread needed)."""

from __future__ import annotations

import threading

from relaygraph.runner._lease import LeaseKeeper


class _Ledger:
    def __init__(self) -> None:
        self.cancel = threading.Event()

    def renew_lease(self, task_id: str, runner_id: str, *, seconds: float) -> bool:
        return True

    def cancel_requested(self, task_id: str) -> bool:
        return self.cancel.is_set()


def test_a_cancel_found_in_the_ledger_calls_back_once() -> None:
    ledger = _Ledger()
    cancel = threading.Event()
    heard = threading.Event()
    calls: list[str] = []
    keeper = LeaseKeeper(ledger, "task-1", "runner-1", seconds=0.03, cancel=cancel)
    try:
        keeper.when_cancelled(lambda: (calls.append("cancel"), heard.set()))
        ledger.cancel.set()
        assert heard.wait(2)
        assert cancel.is_set()
    finally:
        keeper.close()
    assert calls == ["cancel"]


def test_a_cancel_set_before_is_told_at_once() -> None:
    cancel = threading.Event()
    cancel.set()
    keeper = LeaseKeeper(_Ledger(), "task-1", "runner-1", seconds=30, cancel=cancel)
    calls: list[str] = []
    try:
        keeper.when_cancelled(lambda: calls.append("cancel"))
    finally:
        keeper.close()
    assert calls == ["cancel"]


class _Counting(_Ledger):
    """Counts renewals per task; a task in ``gone`` has lost its lease."""

    def __init__(self) -> None:
        super().__init__()
        self.renewed: dict[str, int] = {}
        self.gone: set[str] = set()
        self.lock = threading.Condition()

    def renew_lease(self, task_id: str, runner_id: str, *, seconds: float) -> bool:
        with self.lock:
            self.renewed[task_id] = self.renewed.get(task_id, 0) + 1
            self.lock.notify_all()
        return task_id not in self.gone


def _renewed(ledger: _Counting, task_id: str, at_least: int) -> bool:
    """Wait (woken by each renewal, 30 s at most) until ``task_id`` was renewed
    ``at_least`` times."""
    with ledger.lock:
        return ledger.lock.wait_for(lambda: ledger.renewed.get(task_id, 0) >= at_least, 30)


def test_every_keeper_is_renewed_by_one_thread_until_closed() -> None:
    ledger = _Counting()
    keepers = [LeaseKeeper(ledger, f"task-{n}", "runner-1", seconds=0.03) for n in range(3)]
    try:
        assert all(_renewed(ledger, f"task-{n}", 3) for n in range(3))
        threads = [t for t in threading.enumerate() if t.name.startswith("relaygraph-lease")]
        assert len(threads) == 1, threads
        keepers[0].close()
        with ledger.lock:
            closed_at = ledger.renewed["task-0"]
        assert _renewed(ledger, "task-1", ledger.renewed["task-1"] + 3)
        with ledger.lock:
            assert ledger.renewed["task-0"] == closed_at  # none after close returned
    finally:
        for keeper in keepers:
            keeper.close()


def test_a_lost_lease_is_told_once_and_renewed_no_more() -> None:
    ledger = _Counting()
    ledger.gone.add("task-1")
    lost = threading.Event()
    keeper = LeaseKeeper(ledger, "task-1", "runner-1", seconds=0.03)
    other = LeaseKeeper(ledger, "task-2", "runner-1", seconds=0.03)
    try:
        keeper.when_lost(lost.set)
        assert lost.wait(30) and keeper.lost.is_set()
        assert _renewed(ledger, "task-2", ledger.renewed.get("task-2", 0) + 3)
        with ledger.lock:
            assert ledger.renewed["task-1"] == 1
    finally:
        keeper.close()
        other.close()


def test_a_callback_that_raises_stops_no_other_lease() -> None:
    """The renewals of every keeper run on one thread: a lost-lease callback that raises is
    logged, and the other keepers are still renewed (and later ones too)."""
    ledger = _Counting()
    ledger.gone.add("task-1")
    heard = threading.Event()
    keeper = LeaseKeeper(ledger, "task-1", "runner-1", seconds=0.03)
    keeper.when_lost(lambda: 1 / 0)
    keeper.when_lost(heard.set)  # the next callback still runs
    try:
        assert heard.wait(30)
        later = LeaseKeeper(ledger, "task-2", "runner-1", seconds=0.03)
        try:
            assert _renewed(ledger, "task-2", 3)
        finally:
            later.close()
    finally:
        keeper.close()


def test_a_drain_request_that_raises_stops_no_other_runs_watch() -> None:
    from relaygraph.runner._task_run import _drain_when

    class Control:
        def __init__(self, fails: bool) -> None:
            self.fails, self.asked = fails, threading.Event()

        def request_drain(self, why: str) -> None:
            self.asked.set()
            if self.fails:
                raise RuntimeError("boom")

    bad, good = Control(fails=True), Control(fails=False)
    first, second = threading.Event(), threading.Event()
    with _drain_when(bad, cancel=first, stop=None), _drain_when(good, cancel=second, stop=None):
        first.set()
        assert bad.asked.wait(30)
        second.set()
        assert good.asked.wait(30)


def test_a_forked_child_renews_its_own_leases() -> None:
    """A Celery pool process is forked from a process that may hold leases: the child starts
    a renewal thread of its own (the parent's is not copied) for the leases it takes.
    In a process of its own, since it forks."""
    import subprocess
    import sys

    probe = """
import os, sys, threading
sys.path.insert(0, os.getcwd())
from tests.test_lease_keeper import _Counting, _renewed
from relaygraph.runner._lease import LeaseKeeper
parent = LeaseKeeper(_Counting(), "parent", "r", seconds=0.03)
pid = os.fork()
if pid == 0:
    ledger = _Counting()
    child = LeaseKeeper(ledger, "child", "r", seconds=0.03)
    ok = _renewed(ledger, "child", 3)
    child.close()
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
parent.close()
sys.exit(os.waitstatus_to_exitcode(status))
"""
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
