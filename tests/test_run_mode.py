"""The runner's two modes, each called alone (the runs through them are covered by
test_run_plumbing, test_lease_keeper and test_worker_checkpoint_fence)."""

from __future__ import annotations

import threading

import pytest

from relaygraph.errors import TaskBusy
from relaygraph.runner._lease import AttemptWatch, LeaseKeeper
from relaygraph.runner._run_mode import InProcessRun, RunMode, WorkerAttempt
from relaygraph.store import LOCAL_PROJECT_ID, AttemptSuperseded, Ledger


def test_in_process_a_run_takes_the_lease_and_lets_it_go(sqlite_ledger: Ledger) -> None:
    task, _ = sqlite_ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x")
    mode: RunMode = InProcessRun(sqlite_ledger, "runner-1", lease_seconds=30)
    taken = mode.take(task, leased=False)
    assert sqlite_ledger.lease_of(task.id)[0] == "runner-1"
    # Another runner's run of the same task is refused, naming the holder.
    other = InProcessRun(sqlite_ledger, "runner-2", lease_seconds=30)
    with pytest.raises(TaskBusy, match="runner runner-1 holds it"):
        other.take(task, leased=False)
    hold = mode.keep(taken, threading.Event())
    try:
        assert isinstance(hold, LeaseKeeper)
    finally:
        hold.close()
    assert mode.attempt is None
    assert mode.tool_journal().attempt is None
    assert mode.cancels_on_interrupt(True) is True
    mode.let_go(taken)
    assert sqlite_ledger.lease_of(task.id)[0] is None


def test_a_leased_task_is_not_taken_again(sqlite_ledger: Ledger) -> None:
    task, _ = sqlite_ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x")
    assert sqlite_ledger.take_lease(task.id, "runner-1", seconds=30) is not None
    mode = InProcessRun(sqlite_ledger, "runner-1", lease_seconds=30)
    assert mode.take(task, leased=True) is task


def test_a_workers_attempt_takes_no_lease_and_stops_once_superseded(
    sqlite_ledger: Ledger,
) -> None:
    task, _ = sqlite_ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x")
    mode: RunMode = WorkerAttempt(sqlite_ledger, 3)
    assert mode.take(task, leased=False) is task
    assert sqlite_ledger.lease_of(task.id)[0] is None
    hold = mode.keep(task, threading.Event())
    try:
        assert isinstance(hold, AttemptWatch)
        assert mode.attempt == mode.tool_journal().attempt == 3
        assert mode.cancels_on_interrupt(True) is False
        mode.after_stream(task)  # the attempt still holds: nothing raised
        # A ledger write refused for a newer attempt stops the run, and its end is not
        # written.
        mode.on_write_error(AttemptSuperseded(task.id, 3, 4))
        assert hold.lost.is_set()
        with pytest.raises(AttemptSuperseded):
            mode.after_stream(task)
    finally:
        hold.close()
