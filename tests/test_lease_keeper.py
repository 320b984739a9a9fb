"""LeaseKeeper tells the run of a cancel it finds in the ledger (no watcher thread needed)."""

from __future__ import annotations

import threading
import time
from typing import Any

from relaygraph.runner._lease import RENEWAL_THREADS, LeaseKeeper


class _Ledger:
    def __init__(self) -> None:
        self.cancel = threading.Event()

    def renew_lease(self, task_id: str, runner_id: str, *, seconds: float) -> bool:
        return True

    def cancel_requested(self, task_id: str) -> bool:
        return self.cancel.is_set()

    def renew_leases(
        self, task_ids: list[str], runner_id: str, *, seconds: float, wait: bool = False
    ) -> dict[str, bool | None]:
        """As the ledger's: one call for every lease due in a round, by way of this fake's
        :meth:`renew_lease` and :meth:`cancel_requested` for each."""
        return _renew_each(self, task_ids, runner_id, seconds, wait)


def _renew_each(
    ledger: Any, task_ids: list[str], runner_id: str, seconds: float, wait: bool
) -> dict[str, bool | None]:
    """A fake ledger's ``renew_leases``; a task in its ``stuck`` (a row locked elsewhere)
    is passed over unless ``wait``, as PostgreSQL's ``SKIP LOCKED`` does."""
    held: dict[str, bool | None] = {}
    for task_id in task_ids:
        if not wait and task_id in getattr(ledger, "stuck", ()):
            held[task_id] = None
        elif ledger.renew_lease(task_id, runner_id, seconds=seconds):
            held[task_id] = bool(ledger.cancel_requested(task_id))
    return held


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


def test_every_keeper_is_renewed_from_one_thread_until_closed() -> None:
    """One thread schedules every keeper's renewals and a pool of a few runs them: no
    thread is started per run."""
    ledger = _Counting()
    keepers = [LeaseKeeper(ledger, f"task-{n}", "runner-1", seconds=0.03) for n in range(3)]
    try:
        assert all(_renewed(ledger, f"task-{n}", 3) for n in range(3))
        threads = [t for t in threading.enumerate() if t.name.startswith("relaygraph-lease")]
        assert len(threads) == 1, threads
        pool = [t for t in threading.enumerate() if t.name.startswith("relaygraph-renewal")]
        assert 1 <= len(pool) <= RENEWAL_THREADS, pool
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
    """A lost-lease callback that raises (on a thread of the renewals) is logged, and the
    other keepers are still renewed (and later ones too)."""
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


def test_a_drain_signal_drains_its_runs_as_it_is_set() -> None:
    """A server's cancel and stop events ask their runs to drain in the thread that sets
    them, before ``set`` returns (no look from the drain watch's thread); one set before
    the run was watched asks it as it is watched."""
    from relaygraph.runner import DrainSignal
    from relaygraph.runner._task_run import _drain_when

    class Control:
        def __init__(self) -> None:
            self.asked: list[str] = []

        def request_drain(self, why: str) -> None:
            self.asked.append(why)

    cancelled, stopped, early = Control(), Control(), Control()
    cancel, stop, set_early = DrainSignal(), DrainSignal(), DrainSignal()
    set_early.set()
    with (
        _drain_when(cancelled, cancel=cancel, stop=stop),
        _drain_when(stopped, cancel=DrainSignal(), stop=stop),
        _drain_when(early, cancel=set_early, stop=None),
    ):
        assert early.asked == ["cancel"]
        cancel.set()
        assert cancelled.asked == ["cancel"]
        assert stopped.asked == []
        stop.set()
        assert (cancelled.asked, stopped.asked) == (["cancel"], ["shutdown"])


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


class _Hanging(_Counting):
    """Renewals of the tasks in ``stuck`` hang until ``release`` is set (a row lock held
    elsewhere, a connection that stopped answering)."""

    def __init__(self) -> None:
        super().__init__()
        self.stuck: set[str] = set()
        self.release = threading.Event()

    def renew_lease(self, task_id: str, runner_id: str, *, seconds: float) -> bool:
        if task_id in self.stuck:
            self.release.wait(120)
        return super().renew_lease(task_id, runner_id, seconds=seconds)


def test_a_renewal_that_hangs_holds_up_no_other_lease_and_its_run_is_told() -> None:
    """One keeper's renewal hangs: the others are still renewed (renewals do not queue
    behind it), and the hung keeper says its lease is lost while the renewal still hangs,
    so its run stops before the lease can lapse and another runner take the task."""
    ledger = _Hanging()
    ledger.stuck.add("task-1")
    lost = threading.Event()
    stuck = LeaseKeeper(ledger, "task-1", "runner-1", seconds=0.3)
    other = LeaseKeeper(ledger, "task-2", "runner-1", seconds=1.5)
    try:
        stuck.when_lost(lost.set)
        assert lost.wait(30), "the keeper of the hung renewal never said its lease was lost"
        assert _renewed(ledger, "task-2", 3), "another lease waited behind the hung renewal"
        with ledger.lock:
            assert "task-1" not in ledger.renewed  # still hanging when both were seen
    finally:
        ledger.release.set()
        stuck.close()
        other.close()


def test_a_lease_renewed_in_time_is_never_said_lost() -> None:
    """The lease of a keeper whose renewals work stays confirmed: none is said lost while
    they go on (each counted from when its renewal began, not when it came back)."""
    ledger = _Counting()
    keepers = [LeaseKeeper(ledger, f"task-{n}", "runner-1", seconds=1.5) for n in range(3)]
    try:
        assert all(_renewed(ledger, f"task-{n}", 4) for n in range(3))
        assert not any(keeper.lost.is_set() for keeper in keepers)
    finally:
        for keeper in keepers:
            keeper.close()


class _InFlight:
    """The real ledger's renewals, counted while they are under way: the test closes the
    ledger only after the last has come back (a lost keeper's close does not wait for its
    renewal, and a connection still out when the pool closes would be left open)."""

    def __init__(self, ledger: Any) -> None:
        self.ledger = ledger
        self.busy = 0
        self.held: dict[str, int] = {}
        """Renewals that came back holding the lease, by task."""
        self.changed = threading.Condition()

    def renew_lease(self, task_id: str, runner_id: str, *, seconds: float) -> bool:
        with self.changed:
            self.busy += 1
        held = False
        try:
            held = bool(self.ledger.renew_lease(task_id, runner_id, seconds=seconds))
            return held
        finally:
            with self.changed:
                self.busy -= 1
                self.held[task_id] = self.held.get(task_id, 0) + held
                self.changed.notify_all()

    def cancel_requested(self, task_id: str) -> bool:
        return bool(self.ledger.cancel_requested(task_id))

    def renew_leases(
        self, task_ids: list[str], runner_id: str, *, seconds: float, wait: bool = False
    ) -> dict[str, bool | None]:
        with self.changed:
            self.busy += 1
        held: dict[str, bool | None] = {}
        try:
            held = dict(self.ledger.renew_leases(task_ids, runner_id, seconds=seconds, wait=wait))
            return held
        finally:
            with self.changed:
                self.busy -= 1
                for task_id, cancel in held.items():
                    self.held[task_id] = self.held.get(task_id, 0) + (cancel is not None)
                self.changed.notify_all()

    def renewed(self, task_id: str) -> bool:
        """Wait (60 s at most) until a renewal of ``task_id`` has come back holding it."""
        with self.changed:
            return self.changed.wait_for(lambda: self.held.get(task_id, 0) > 0, 60)

    def settled(self) -> bool:
        """Wait (60 s at most) until no renewal is under way."""
        with self.changed:
            return self.changed.wait_for(lambda: self.busy == 0, 60)


def test_a_locked_task_row_stops_its_run_before_its_lease_can_lapse(url: str) -> None:
    """On the real ledger: another connection holds a lock that a renewal must wait for.
    On PostgreSQL a row lock on one task: its keeper says the lease is lost, while another
    task's lease is still renewed. On SQLite the database's write lock, which every
    renewal waits for: every keeper says its lease is lost. Either way, before any of the
    leases could lapse (the keeper counts from its last renewal that worked)."""
    from sqlalchemy import create_engine, text

    from relaygraph.store import LOCAL_PROJECT_ID, Ledger

    with Ledger(url) as ledger:
        ledger.upgrade()
        locked, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="locked")
        free, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="free")
        for task in (locked, free):
            assert ledger.take_lease(task.id, "runner-1", seconds=30) is not None
        renewals = _InFlight(ledger)
        holder = create_engine(url)
        connection = holder.connect()
        try:
            if ledger.dialect == "postgresql":
                connection.execute(
                    text("SELECT id FROM tasks WHERE id = :id FOR UPDATE"), {"id": locked.id}
                )
            else:
                connection.exec_driver_sql("BEGIN IMMEDIATE")
            lost = {task.id: threading.Event() for task in (locked, free)}
            keepers = {
                locked.id: LeaseKeeper(renewals, locked.id, "runner-1", seconds=1.2),
                free.id: LeaseKeeper(renewals, free.id, "runner-1", seconds=6.0),
            }
            try:
                for task_id, keeper in keepers.items():
                    keeper.when_lost(lost[task_id].set)
                assert lost[locked.id].wait(60), "the locked task's run was never told"
                if ledger.dialect == "postgresql":
                    assert renewals.renewed(free.id), "the free lease was not renewed"
                    assert not lost[free.id].is_set()
                else:
                    assert lost[free.id].wait(60), "a run went on without a renewed lease"
            finally:
                for keeper in keepers.values():
                    keeper.close()  # No renewal starts after this.
                connection.rollback()  # The ones that waited on the lock go through.
                assert renewals.settled(), "a renewal never came back"
        finally:
            connection.close()
            holder.dispose()


def test_a_keeper_closed_by_its_own_lost_callback_holds_up_no_other_lease() -> None:
    """A run that closes its keeper when told the lease is lost (the callback runs on the
    thread that schedules every renewal) while that keeper's renewal hangs: close returns,
    and the other keepers are still renewed."""
    ledger = _Hanging()
    ledger.stuck.add("task-1")
    closed = threading.Event()
    stuck = LeaseKeeper(ledger, "task-1", "runner-1", seconds=0.3)
    stuck.when_lost(lambda: (stuck.close(), closed.set()))
    other = LeaseKeeper(ledger, "task-2", "runner-1", seconds=1.5)
    try:
        assert closed.wait(30), "close() from the lost callback did not return"
        with ledger.lock:
            before = ledger.renewed.get("task-2", 0)
        assert _renewed(ledger, "task-2", before + 3), "the other lease stopped being renewed"
    finally:
        ledger.release.set()
        other.close()


def test_a_renewal_that_hangs_does_not_keep_the_process_from_exiting() -> None:
    """The renewals' threads are daemons: a process whose work is done exits even while a
    renewal hangs on a connection that stopped answering. In a process of its own."""
    import subprocess
    import sys

    probe = """
import os, sys, threading
sys.path.insert(0, os.getcwd())
from tests.test_lease_keeper import _Hanging, _renewed
from relaygraph.runner._lease import LeaseKeeper
ledger = _Hanging()
ledger.stuck.add("task-1")
LeaseKeeper(ledger, "task-1", "r", seconds=0.3)
other = LeaseKeeper(ledger, "task-2", "r", seconds=0.3)
assert _renewed(ledger, "task-2", 2)  # the stuck one is hanging by now
print("done", flush=True)
"""
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=100
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "done"


class _SlowFirstFailure(_Counting):
    """The first renewal fails after ``seconds`` (a connect timeout); the others work."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.failed = False

    def renew_lease(self, task_id: str, runner_id: str, *, seconds: float) -> bool:
        if not self.failed:
            self.failed = True
            time.sleep(self.seconds)
            raise OSError("connection timed out")
        return super().renew_lease(task_id, runner_id, seconds=seconds)


def test_one_slow_failed_renewal_is_forgiven() -> None:
    """A renewal that fails slowly does not push the next one back: it is due a period
    after the failed one began, so the lease is still confirmed in time (counted from its
    end, the next renewal would come after 5/6 of the lease and the run be told to stop)."""
    # A period of 3 s; told lost 7.5 s after the last renewal that worked began. Counted
    # from its end, the failed one's successor would begin at 8.7 s; counted from its
    # start, at 6 s: 1.2 s and 1.5 s of margin either way for a late thread.
    ledger = _SlowFirstFailure(seconds=2.7)
    keeper = LeaseKeeper(ledger, "task-1", "runner-1", seconds=9.0)
    try:
        assert _renewed(ledger, "task-1", 2)  # past when the next would have come too late
        assert not keeper.lost.is_set()
    finally:
        keeper.close()


def test_the_leases_due_together_are_renewed_in_one_round() -> None:
    """Keepers due about the same time are renewed in one call (one statement on the real
    ledger), not one each: a server with hundreds of tasks in flight makes a few renewals
    a period."""

    class Rounds(_Counting):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[int] = []

        def renew_leases(
            self, task_ids: list[str], runner_id: str, *, seconds: float, wait: bool = False
        ) -> dict[str, bool | None]:
            with self.lock:
                self.calls.append(len(task_ids))
            return _renew_each(self, task_ids, runner_id, seconds, wait)

    ledger = Rounds()
    keepers = [LeaseKeeper(ledger, f"task-{n}", "runner-1", seconds=3.0) for n in range(40)]
    try:
        assert all(_renewed(ledger, f"task-{n}", 1) for n in range(40))
        with ledger.lock:
            calls = list(ledger.calls)
        # Made within a few ms, all 40 fall in the first round (a quarter period wide);
        # a loaded machine may split them, never into one round each.
        assert len(calls) < 20 and max(calls) > 1, calls
    finally:
        for keeper in keepers:
            keeper.close()


def test_the_ledger_renews_many_leases_and_reads_their_cancels_in_one_call(
    url: str, ledger: Any
) -> None:
    """``Ledger.renew_leases``: the leases still this runner's, each with whether a cancel
    waits; another runner's is left out. On PostgreSQL a row locked elsewhere is passed
    over at once (None) unless the call waits for it; ``attempt_states`` reads many."""
    from sqlalchemy import create_engine, text

    from relaygraph.store import LOCAL_PROJECT_ID

    mine, cancelled, other, locked = (
        ledger.create_task(project_id=LOCAL_PROJECT_ID, input=name)[0]
        for name in ("mine", "cancelled", "other", "locked")
    )
    for task in (mine, cancelled, locked):
        assert ledger.take_lease(task.id, "runner-1", seconds=30) is not None
    assert ledger.take_lease(other.id, "runner-2", seconds=30) is not None
    ledger.request_cancel(cancelled.id, by="tester", via="api")
    ids = [mine.id, cancelled.id, other.id, locked.id]
    assert ledger.renew_leases(ids, "runner-1", seconds=30) == {
        mine.id: False,
        cancelled.id: True,
        locked.id: False,
    }
    states = ledger.attempt_states([*ids, "no-such-task"])
    assert set(states) == set(ids) and states[cancelled.id][1] and not states[mine.id][1]
    if ledger.dialect != "postgresql":
        return
    holder = create_engine(url)
    try:
        with holder.connect() as connection:
            connection.execute(
                text("SELECT id FROM tasks WHERE id = :id FOR UPDATE"), {"id": locked.id}
            )
            held = ledger.renew_leases(ids, "runner-1", seconds=30)
            assert held == {mine.id: False, cancelled.id: True, locked.id: None}
            assert ledger.attempt_states([locked.id])  # A read: the lock holds it up not.
            connection.rollback()
        assert ledger.renew_leases([locked.id], "runner-1", seconds=30, wait=True) == {
            locked.id: False
        }
    finally:
        holder.dispose()
