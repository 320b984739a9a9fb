"""The ledger's tasks and their leases (``TaskRepository``, ``LeaseRepository``), on SQLite
and on PostgreSQL.

Every test that takes ``ledger`` or ``url`` runs on each backend (``tests/_store.py``).
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest

from relaygraph.errors import ConfigError
from relaygraph.store import LOCAL_PROJECT_ID, Ledger, RecordConflict


def test_idempotency_key_returns_the_first_task(ledger: Ledger) -> None:
    project, _ = ledger.create_project("research")
    other, _ = ledger.create_project("ops")
    first, created = ledger.create_task(project_id=project.id, input="sum", idempotency_key="req-1")
    again, created_again = ledger.create_task(
        project_id=project.id, input="sum", idempotency_key="req-1"
    )
    assert created and not created_again
    assert again == first
    # The key names the whole request: another thread is another request.
    with pytest.raises(RecordConflict, match=r"\(thread_id differ\)"):
        ledger.create_task(
            project_id=project.id, input="sum", idempotency_key="req-1", thread_id="another-thread"
        )
    # Keys are per project, and tasks without a key are always new.
    theirs, theirs_created = ledger.create_task(
        project_id=other.id, input="sum", idempotency_key="req-1"
    )
    assert theirs_created and theirs.id != first.id
    assert ledger.create_task(project_id=project.id, input="sum")[0].id != first.id
    with pytest.raises(RecordConflict, match=r"'req-1' was used for task .* \(input differ\)"):
        ledger.create_task(project_id=project.id, input="product", idempotency_key="req-1")


def test_concurrent_retries_create_one_task(ledger: Ledger) -> None:
    project, _ = ledger.create_project("research")
    start = threading.Barrier(8)
    results: list[tuple[str, bool]] = []

    def submit() -> None:
        start.wait()
        task, created = ledger.create_task(
            project_id=project.id, input="sum", idempotency_key="race"
        )
        results.append((task.id, created))

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({task_id for task_id, _ in results}) == 1
    assert sorted(created for _, created in results) == [False] * 7 + [True]


def test_a_project_never_sees_another_projects_tasks(ledger: Ledger) -> None:
    project, _ = ledger.create_project("research")
    other, _ = ledger.create_project("ops")
    mine, _ = ledger.create_task(project_id=project.id, input="mine")
    cli, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="from the CLI")
    assert ledger.get_task(mine.id, project_id=project.id) == mine
    assert ledger.get_task(mine.id, project_id=other.id) is None
    assert ledger.get_task(cli.id, project_id=project.id) is None
    assert ledger.get_task("no-such-task", project_id=project.id) is None
    assert ledger.list_tasks(project_id=other.id) == ([], None)
    assert [t.id for t in ledger.list_tasks(project_id=project.id)[0]] == [mine.id]


def test_cursor_pages_cover_every_task_once_newest_first(ledger: Ledger) -> None:
    project, _ = ledger.create_project("research")
    other, _ = ledger.create_project("ops")
    created = []
    for n in range(120):
        task, _ = ledger.create_task(project_id=project.id, input=f"task {n}")
        if n % 3 == 0:
            task = ledger.set_status(task.id, "succeeded", answer=str(n))
        created.append(task)
        if n % 30 == 0:
            ledger.create_task(project_id=other.id, input="not yours")
    newest_first = sorted(created, key=lambda t: (t.created_at, t.id), reverse=True)

    seen, cursor, pages = [], None, 0
    while True:
        page, cursor = ledger.list_tasks(project_id=project.id, limit=25, cursor=cursor)
        seen += page
        pages += 1
        if pages == 1:
            # A task created while the client pages does not shift the later pages.
            ledger.create_task(project_id=project.id, input="arrived late")
        if cursor is None:
            break
    assert pages == 5
    assert [t.id for t in seen] == [t.id for t in newest_first]

    done, cursor = [], None
    while True:
        page, cursor = ledger.list_tasks(
            project_id=project.id, status="succeeded", limit=7, cursor=cursor
        )
        done += page
        if cursor is None:
            break
    assert [t.id for t in done] == [t.id for t in newest_first if t.status == "succeeded"]
    assert len(done) == 40


def test_status_changes_stamp_times_and_claims_are_exclusive(ledger: Ledger) -> None:
    task, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x", thread_id="thread-1")
    assert task.status == "queued" and task.started_at is None
    assert ledger.active_task_on_thread("thread-1", project_id=LOCAL_PROJECT_ID) == task
    assert [t.id for t in ledger.unfinished_tasks()] == [task.id]

    running = ledger.claim(task.id)
    assert running is not None and running.status == "running" and running.started_at
    assert ledger.claim(task.id) is None  # A second worker loses.
    paused = ledger.set_status(task.id, "interrupted", stop_reason="awaiting approval")
    assert paused.finished_at is None and not paused.finished
    assert ledger.unfinished_tasks() == []
    assert ledger.claim(task.id, "cancelled", only_from=("running", "interrupted"))
    finished = ledger.get_task(task.id, project_id=LOCAL_PROJECT_ID)
    assert finished is not None and finished.status == "cancelled" and finished.finished
    assert finished.finished_at is not None and finished.finished_at >= running.started_at
    assert finished.stop_reason == "awaiting approval"
    assert ledger.active_task_on_thread("thread-1", project_id=LOCAL_PROJECT_ID) is None


def test_a_lease_keeps_a_task_to_one_runner_until_it_lapses(ledger: Ledger) -> None:
    task, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x", thread_id="thread-l")
    taken = ledger.take_lease(task.id, "a", seconds=30)
    assert taken is not None and taken.status == "running" and taken.started_at
    holder, until = ledger.lease_of(task.id)
    assert holder == "a" and until is not None and until > datetime.now(UTC)
    assert ledger.take_lease(task.id, "b", seconds=30) is None  # a holds it
    assert ledger.take_lease(task.id, "a", seconds=30) is not None  # its own, again
    assert ledger.unfinished_tasks() == []  # nothing for a server to pick up
    assert ledger.renew_lease(task.id, "a", seconds=30)
    assert not ledger.renew_lease(task.id, "b", seconds=30)

    # A lapsed lease may be taken over; the old holder then finds it gone.
    assert ledger.renew_lease(task.id, "a", seconds=-1)
    assert [t.id for t in ledger.unfinished_tasks()] == [task.id]
    assert [t.id for t in ledger.unfinished_tasks(exclude_project=LOCAL_PROJECT_ID)] == []
    assert ledger.take_lease(task.id, "b", seconds=30) is not None
    assert not ledger.renew_lease(task.id, "a", seconds=30)

    # Released, anyone may take it at once; a finished task no longer.
    ledger.release_lease(task.id, "a")  # not a's: changes nothing
    assert ledger.lease_of(task.id)[0] == "b"
    ledger.release_lease(task.id, "b")
    assert ledger.lease_of(task.id) == (None, None)
    ledger.set_status(task.id, "succeeded")
    assert ledger.take_lease(task.id, "c", seconds=30) is None
    with pytest.raises(ConfigError, match="'nope'"):
        ledger.take_lease(task.id, "c", seconds=30, only_from=("nope",))


def test_abandoned_tasks_are_the_running_ones_no_live_runner_holds(ledger: Ledger) -> None:
    """What a pulling server's sweep picks up: no queued task (however many wait), no task
    a live lease holds, and a running one whose lease lapsed."""
    queued, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="q", thread_id="t-aq")
    held, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="h", thread_id="t-ah")
    lapsed, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="l", thread_id="t-al")
    assert ledger.take_lease(held.id, "a", seconds=30) is not None
    assert ledger.take_lease(lapsed.id, "a", seconds=30) is not None
    assert ledger.renew_lease(lapsed.id, "a", seconds=-1)
    found = ledger.abandoned_tasks()
    assert [(t.id, t.status) for t in found] == [(lapsed.id, "running")]
    assert found[0].input == "l"  # The whole task, as unfinished_tasks reads it.
    assert {t.id for t in ledger.unfinished_tasks()} == {queued.id, lapsed.id}
    assert ledger.abandoned_tasks(exclude_project=LOCAL_PROJECT_ID) == []


def test_a_queued_task_is_taken_only_as_its_threads_oldest_active_task(ledger: Ledger) -> None:
    """A start (a take from ``queued``) of a task enqueued behind another on its thread is
    refused while the earlier one is active, in the take itself; other threads, and a take
    from another status, are not held back by it."""
    first, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="1", thread_id="t-q")
    second, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="2", thread_id="t-q")
    other, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="3", thread_id="t-o")
    assert ledger.take_lease(second.id, "a", seconds=30, only_from=("queued",)) is None
    assert ledger.take_lease(other.id, "a", seconds=30, only_from=("queued",)) is not None
    assert ledger.take_lease(first.id, "a", seconds=30, only_from=("queued",)) is not None
    # Running, then waiting for a person: the first still holds its thread.
    assert ledger.take_lease(second.id, "b", seconds=30, only_from=("queued",)) is None
    ledger.set_status(first.id, "interrupted")
    assert ledger.take_lease(second.id, "b", seconds=30, only_from=("queued",)) is None
    ledger.set_status(first.id, "succeeded")
    taken = ledger.take_lease(second.id, "b", seconds=30, only_from=("queued",))
    assert taken is not None and (taken.id, taken.status) == (second.id, "running")


def test_a_run_whose_lease_lapsed_does_not_end_the_task_it_lost(ledger: Ledger) -> None:
    """A runner that stalled past its lease ends its run late: the task went on without
    it (another runner took it, or the sweeper settled it), and the late end changes
    neither; the usage it spent is still recorded."""
    usage = {
        "id": "writer:1", "agent": "writer", "turn": 1, "model_calls": 1, "tool_calls": 0,
        "input_tokens": 3, "output_tokens": 2, "cost_usd": 0.0, "seconds": 0.1,
        "estimated": False,
    }  # fmt: skip
    taken_over, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x")
    assert ledger.take_lease(taken_over.id, "a", seconds=-1)  # lapsed at once
    assert ledger.take_lease(taken_over.id, "b", seconds=30)
    ledger.end_run(taken_over.id, runner_id="a", status="succeeded", answer="late", usage=[usage])
    now = ledger.get_task(taken_over.id, project_id=LOCAL_PROJECT_ID)
    assert now is not None and (now.status, now.answer) == ("running", None)
    assert ledger.lease_of(taken_over.id)[0] == "b"
    assert now.attempts == 2  # the new holder's starts still count toward max_attempts
    assert [(u.agent, u.input_tokens) for u in ledger.usage(taken_over.id)] == [("writer", 3)]

    settled, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="y")
    assert ledger.take_lease(settled.id, "a", seconds=-1)
    ended = ledger.settle_abandoned(settled.id, max_attempts=1)
    assert ended is not None and ended.status == "failed"
    ledger.end_run(settled.id, runner_id="a", status="succeeded", answer="late")
    now = ledger.get_task(settled.id, project_id=LOCAL_PROJECT_ID)
    assert now is not None and (now.status, now.stop_reason) == ("failed", ended.stop_reason)

    # Its own lease still held, a run's end is the task's, as always.
    held, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="z")
    assert ledger.take_lease(held.id, "a", seconds=30)
    ledger.end_run(held.id, runner_id="a", status="succeeded", answer="done")
    now = ledger.get_task(held.id, project_id=LOCAL_PROJECT_ID)
    assert now is not None and (now.status, now.answer) == ("succeeded", "done")
