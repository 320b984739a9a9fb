"""The worker mode's ledger: dispatches, attempts and their fencing number, deferred cancels,
event notices; and a worker's run of a task (``run_ledger_task``, called in this process,
without Celery) from its message to its end, through a pause and its decision.

The ledger cases run on SQLite and PostgreSQL (the ``ledger`` fixture); the notices only on
PostgreSQL, which has them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from relaygraph.errors import RunError
from relaygraph.store import (
    LOCAL_PROJECT_ID,
    AttemptSuperseded,
    EventNotice,
    Ledger,
    RecordNotFound,
)

from .conftest import EXAMPLE_RELAY
from .test_worker_notify import Received

WORKER = "worker-test-1"
USAGE = [
    {"id": "coder:1", "agent": "coder", "model_calls": 1, "input_tokens": 10, "output_tokens": 2}
]


def queued(ledger: Ledger, key: str = "k-1") -> str:
    task, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x", idempotency_key=key)
    return task.id


def task_of(ledger: Ledger, task_id: str) -> Any:
    task = ledger.get_task(task_id, project_id=LOCAL_PROJECT_ID)
    assert task is not None
    return task


def begin(ledger: Ledger, task_id: str, dispatch: int, max_attempts: int = 3) -> int | None:
    return ledger.begin_attempt(
        task_id, dispatch=dispatch, worker_id=WORKER, max_attempts=max_attempts
    )


def event_types(ledger: Ledger, task_id: str) -> list[str]:
    return [event.type for event in ledger.events_after(task_id)]


# Dispatches and attempts


def test_queue_for_workers_counts_dispatches(ledger: Ledger) -> None:
    task_id = queued(ledger)
    assert task_of(ledger, task_id).dispatch == 0
    assert ledger.queue_for_workers(task_id) == 1
    assert ledger.queue_for_workers(task_id) == 2
    task = task_of(ledger, task_id)
    assert (task.status, task.dispatch) == ("queued", 2)
    with pytest.raises(RecordNotFound):
        ledger.queue_for_workers("no-such-task")


def test_begin_attempt_outcomes(ledger: Ledger) -> None:
    task_id = queued(ledger)
    dispatch = ledger.queue_for_workers(task_id)
    # A message of another dispatch is stale; a task that does not exist, dropped.
    assert begin(ledger, task_id, dispatch - 1) is None
    assert begin(ledger, task_id, dispatch + 1) is None
    assert begin(ledger, "no-such-task", dispatch) is None
    assert task_of(ledger, task_id).status == "queued"

    assert begin(ledger, task_id, dispatch, max_attempts=2) == 1
    task = task_of(ledger, task_id)
    assert (task.status, task.attempts) == ("running", 1)
    assert task.started_at is not None
    assert ledger.lease_of(task_id) == (WORKER, None)  # Held, with no end.
    # The same message again (its worker died): the next attempt supersedes the first.
    assert begin(ledger, task_id, dispatch, max_attempts=2) == 2
    assert ledger.attempt_state(task_id) == (2, False)
    # Started max_attempts times without finishing: failed, saying so, never run again.
    assert begin(ledger, task_id, dispatch, max_attempts=2) is None
    task = task_of(ledger, task_id)
    assert task.status == "failed"
    assert task.stop_reason is not None
    assert "started 2 times" in task.stop_reason
    assert "RELAYGRAPH_MAX_ATTEMPTS" in task.stop_reason
    assert event_types(ledger, task_id) == ["run_finished"]
    assert ledger.events_after(task_id)[0].data["status"] == "failed"
    assert ledger.lease_of(task_id) == (None, None)
    # A finished task takes no message, even of a new dispatch.
    assert begin(ledger, task_id, dispatch) is None
    assert begin(ledger, task_id, ledger.queue_for_workers(task_id)) is None
    assert task_of(ledger, task_id).status == "failed"


def test_an_attempt_says_whether_its_task_ever_ran(ledger: Ledger) -> None:
    """The attempt comes with its task as the ledger now has it (the worker reads no more)
    and whether the task ran before: only one that never did starts from its request."""
    task_id = queued(ledger)
    dispatch = ledger.queue_for_workers(task_id)
    first = ledger.start_attempt(task_id, dispatch=dispatch, worker_id=WORKER, max_attempts=3)
    assert first is not None and (first.number, first.fresh) == (1, True)
    assert first.task == task_of(ledger, task_id)
    assert first.task.status == "running" and ledger.lease_of(task_id) == (WORKER, None)
    # Redelivered (its worker died): the task ran, and may have checkpoints of its own.
    again = ledger.start_attempt(task_id, dispatch=dispatch, worker_id=WORKER, max_attempts=3)
    assert again is not None and (again.number, again.fresh) == (2, False)
    # Paused, decided and dispatched again: it ran before, though its attempts were reset.
    ledger.end_run(task_id, usage=USAGE, status="interrupted", attempt=2)
    resumed = ledger.start_attempt(
        task_id, dispatch=ledger.queue_for_workers(task_id), worker_id=WORKER, max_attempts=3
    )
    assert resumed is not None and resumed.fresh is False
    assert ledger.start_attempt(task_id, dispatch=1, worker_id=WORKER, max_attempts=3) is None


def test_a_decision_dispatches_again_and_the_attempt_number_goes_on(ledger: Ledger) -> None:
    task_id = queued(ledger)
    first = ledger.queue_for_workers(task_id)
    assert begin(ledger, task_id, first, max_attempts=1) == 1
    # The run pauses for a person: the worker's hold ends, the attempt number stays.
    ledger.end_run(task_id, usage=USAGE, status="interrupted", attempt=1)
    task = task_of(ledger, task_id)
    assert (task.status, task.attempts) == ("interrupted", 1)
    assert ledger.lease_of(task_id) == (None, None)
    assert begin(ledger, task_id, first) is None  # A paused task takes no message.

    second = ledger.queue_for_workers(task_id)
    assert task_of(ledger, task_id).status == "queued"
    assert begin(ledger, task_id, first) is None  # The old message is stale.
    # The limit counts the starts of this dispatch; the fencing number never goes back,
    # so the first dispatch's attempt cannot pass for this one's.
    assert begin(ledger, task_id, second, max_attempts=1) == 2
    with pytest.raises(AttemptSuperseded):
        ledger.append_event(task_id, {"type": "log"}, attempt=1)


def test_an_older_attempts_writes_are_refused(ledger: Ledger) -> None:
    task_id = queued(ledger)
    dispatch = ledger.queue_for_workers(task_id)
    assert begin(ledger, task_id, dispatch) == 1
    assert ledger.append_events(task_id, [{"type": "run_started"}], attempt=1) == [1]
    assert begin(ledger, task_id, dispatch) == 2  # Redelivered: attempt 1 was frozen.

    with pytest.raises(AttemptSuperseded) as refused:
        ledger.append_events(task_id, [{"type": "log"}, {"type": "log"}], attempt=1)
    assert (refused.value.task_id, refused.value.attempt, refused.value.current) == (
        task_id,
        1,
        2,
    )
    assert isinstance(refused.value, RunError)
    assert "attempt 1" in str(refused.value) and "attempt 2" in str(refused.value)
    with pytest.raises(AttemptSuperseded):
        ledger.end_run(task_id, usage=USAGE, status="succeeded", attempt=1, answer="stale")
    with pytest.raises(AttemptSuperseded):
        ledger.set_status(task_id, "failed", attempt=1, stop_reason="stale")
    with pytest.raises(AttemptSuperseded):
        ledger.record_usage(task_id, USAGE, attempt=1)
    with pytest.raises(AttemptSuperseded):
        ledger.attempt_journal(1).put(task_id, "call-1", {"result": "stale"})
    # None of it was written.
    task = task_of(ledger, task_id)
    assert (task.status, task.answer, task.last_event_seq) == ("running", None, 1)
    assert ledger.usage(task_id) == []
    assert ledger.journaled_call(task_id, "call-1") is None

    # The latest attempt writes, and so does an unfenced writer (the in-process mode).
    assert ledger.append_events(task_id, [{"type": "log"}], attempt=2) == [2]
    assert ledger.attempt_journal(2).put(task_id, "call-1", {"result": "ok"}) == {"result": "ok"}
    ledger.record_usage(task_id, USAGE, attempt=2)
    ledger.end_run(task_id, usage=USAGE, status="succeeded", attempt=2, answer="done")
    task = task_of(ledger, task_id)
    assert (task.status, task.answer, task.attempts) == ("succeeded", "done", 2)
    assert ledger.append_event(task_id, {"type": "log"}) == 3
    with pytest.raises(RecordNotFound):
        ledger.append_event("no-such-task", {"type": "log"}, attempt=1)


def test_a_cancel_of_a_task_a_worker_runs_waits_for_the_worker(ledger: Ledger) -> None:
    task_id = queued(ledger)
    dispatch = ledger.queue_for_workers(task_id)
    assert begin(ledger, task_id, dispatch) == 1

    task = ledger.request_cancel(task_id)
    assert task.status == "running"
    assert task.cancel_requested_at is not None
    assert ledger.attempt_state(task_id) == (1, True)
    # The worker's hold does not lapse: no sweeper takes the task, no runner leases it.
    assert task_id not in {t.id for t in ledger.unfinished_tasks()}
    assert ledger.settle_abandoned(task_id, max_attempts=1) is None
    assert ledger.take_lease(task_id, "server-x", seconds=30) is None
    assert ledger.lease_of(task_id) == (WORKER, None)

    # The worker stops at a step boundary and records the end.
    ledger.append_event(task_id, {"type": "run_finished", "status": "cancelled"}, attempt=1)
    ledger.end_run(
        task_id, usage={}, status="cancelled", attempt=1, stop_reason="cancelled by request"
    )
    task = task_of(ledger, task_id)
    assert (task.status, task.cancel_requested_at) == ("cancelled", None)


def test_a_cancel_that_waits_ends_the_task_at_its_next_delivery(ledger: Ledger) -> None:
    """The worker died before it saw the cancel: the redelivered message ends the task."""
    task_id = queued(ledger)
    dispatch = ledger.queue_for_workers(task_id)
    assert begin(ledger, task_id, dispatch) == 1
    ledger.request_cancel(task_id)
    assert begin(ledger, task_id, dispatch) is None
    task = task_of(ledger, task_id)
    assert (task.status, task.stop_reason) == ("cancelled", "cancelled by request")
    assert event_types(ledger, task_id) == ["run_finished"]
    assert ledger.lease_of(task_id) == (None, None)


def test_the_service_counts_for_metrics(ledger: Ledger) -> None:
    counts = ledger.count_tasks_by_status()
    assert set(counts) >= {"queued", "running", "succeeded", "failed", "cancelled"}
    assert ledger.oldest_queued_at() is None
    first = queued(ledger, "k-1")
    queued(ledger, "k-2")
    running = queued(ledger, "k-3")
    assert begin(ledger, running, ledger.queue_for_workers(running)) == 1
    ledger.request_cancel(queued(ledger, "k-4"))
    counts = ledger.count_tasks_by_status()
    assert (counts["queued"], counts["running"], counts["cancelled"]) == (2, 1, 1)
    assert counts["succeeded"] == 0
    oldest = ledger.oldest_queued_at()
    assert oldest is not None
    assert oldest == task_of(ledger, first).created_at


# Event notices (PostgreSQL)


@pytest.fixture
def channel() -> str:
    return f"rg_test_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def notified(postgres_url: str, channel: str) -> Iterator[tuple[Ledger, Any]]:
    from relaygraph.worker import EventListener, libpq_url

    with Ledger(postgres_url, notify_channel=channel) as ledger:
        ledger.upgrade()
        with EventListener(libpq_url(postgres_url), channel=channel) as listener:
            yield ledger, listener


def test_appended_events_are_announced_when_they_commit(
    notified: tuple[Ledger, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger, listener = notified
    task_id = queued(ledger)
    notices = Received()
    listener.subscribe(task_id, notices)
    assert ledger.append_events(task_id, [{"type": "log"}, {"type": "log"}]) == [1, 2]
    assert notices.wait_for(1) == [EventNotice(task_id=task_id, seq=2)]

    # A transaction that announced its events and then rolled back announced nothing.
    announce = ledger.core.announce

    def announce_then_fail(session: Any, task: str, seq: int) -> None:
        announce(session, task, seq)
        raise RuntimeError("the transaction fails after its NOTIFY")

    monkeypatch.setattr(ledger.core, "announce", announce_then_fail)
    with pytest.raises(RuntimeError):
        ledger.append_event(task_id, {"type": "log"})
    monkeypatch.undo()
    # The ledger's own ends of a task are announced too (a cancel of a queued task).
    ledger.request_cancel(task_id)
    assert notices.wait_for(2) == [
        EventNotice(task_id=task_id, seq=2),
        EventNotice(task_id=task_id, seq=3),
    ]
    assert [e.seq for e in ledger.events_after(task_id)] == [1, 2, 3]


def test_a_refused_write_and_a_ledger_without_a_channel_announce_nothing(
    notified: tuple[Ledger, Any], postgres_url: str
) -> None:
    ledger, listener = notified
    task_id = queued(ledger)
    notices = Received()
    listener.subscribe(task_id, notices)
    dispatch = ledger.queue_for_workers(task_id)
    assert begin(ledger, task_id, dispatch) == 1
    assert begin(ledger, task_id, dispatch) == 2
    with pytest.raises(AttemptSuperseded):
        ledger.append_event(task_id, {"type": "log"}, attempt=1)
    with Ledger(postgres_url) as quiet:
        quiet.append_event(task_id, {"type": "log"})
    ledger.append_event(task_id, {"type": "log"}, attempt=2)
    assert notices.wait_for(1) == [EventNotice(task_id=task_id, seq=2)]
    assert notices.wait_for(2, timeout=0.5) == [EventNotice(task_id=task_id, seq=2)]


# A worker's run of a task (run_ledger_task, without Celery)


APPROVAL_POLICY = '[agents.coder]\napproval = ["run_python"]\n'


@pytest.fixture
def worker_env(url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ledger]:
    """The environment a worker process reads (the ledger at ``url``), and its ledger."""
    from relaygraph.worker import close_worker_runtime

    monkeypatch.setenv("RELAYGRAPH_DATABASE_URL", url)
    monkeypatch.setenv("RELAYGRAPH_UNSAFE_SANDBOX", "true")
    with Ledger(url) as ledger:
        ledger.upgrade()
        try:
            yield ledger
        finally:
            close_worker_runtime()


def submitted(ledger: Ledger, policy: Path | None = None) -> str:
    from relaygraph.runner import Intake, TaskRequest, submit_task
    from relaygraph.team import default_team

    team = default_team()
    request = TaskRequest(
        input="When are checkpoints written?",
        team=team,
        model=f"scripted:{EXAMPLE_RELAY}",
        policy=team.policy_from(policy) if policy is not None else None,
    )
    return submit_task(request, Intake(ledger=ledger)).task.id


def test_a_worker_runs_a_task_once_per_dispatch(
    worker_env: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    from langgraph.pregel import Pregel

    from relaygraph.worker import run_ledger_task

    ledger = worker_env
    task_id = submitted(ledger)
    dispatch = ledger.queue_for_workers(task_id)
    states: list[bool] = []
    get_state = Pregel.get_state

    def state_read(self: Any, *args: Any, **kwargs: Any) -> Any:
        states.append(kwargs.get("subgraphs", False))
        return get_state(self, *args, **kwargs)

    monkeypatch.setattr(Pregel, "get_state", state_read)
    run_ledger_task(task_id, dispatch)
    # A task that never ran starts from its request: no read of the thread's checkpoints
    # to find that it has none of its own; the one read is the run's end (its outcome).
    assert states == [True]
    task = task_of(ledger, task_id)
    assert task.status == "succeeded", task.stop_reason
    assert task.answer
    assert (task.attempts, task.dispatch) == (1, 1)
    assert ledger.lease_of(task_id) == (None, None)
    types = event_types(ledger, task_id)
    assert types.count("run_started") == types.count("run_finished") == 1
    assert types.count("final") == 1
    assert {u.agent for u in ledger.usage(task_id)} >= {"supervisor", "coder", "writer"}
    # Its tool calls were journaled under attempt 1, before their results returned.
    coder_call = next(c for c in ledger.tool_calls(task_id) if c.tool == "run_python")
    assert coder_call.tool_call_id is not None
    assert ledger.journaled_call(task_id, coder_call.tool_call_id) is not None

    # The same message again (redelivered after the run ended, before its ack): a no-op.
    run_ledger_task(task_id, dispatch)
    again = task_of(ledger, task_id)
    assert (again.status, again.attempts, again.last_event_seq) == (
        "succeeded",
        1,
        task.last_event_seq,
    )


def test_a_worker_that_ends_a_task_hands_its_threads_next_task_to_the_workers(
    worker_env: Ledger,
) -> None:
    """The task enqueued behind another on its thread is published once the worker's run
    of the first ends it (and not while the first still holds the thread)."""
    from relaygraph.runner import Intake, TaskRequest, submit_task
    from relaygraph.team import default_team
    from relaygraph.worker import worker_runtime

    ledger = worker_env
    spec = f"scripted:{EXAMPLE_RELAY}"
    # A project's: the CLI's own tasks (the local project) are never the workers' to run.
    project, _ = ledger.create_project("acme")

    def submit(text: str) -> Any:
        request = TaskRequest(
            input=text,
            team=default_team(),
            model=spec,
            project_id=project.id,
            thread_id="t-next",
            thread_must_exist=False,
            multitask="enqueue",
        )
        return submit_task(request, Intake(ledger=ledger))

    first, second = submit("When are checkpoints written?"), submit("And after a crash?")
    assert first.starts and not second.starts
    published: list[tuple[str, int]] = []
    runtime = worker_runtime(
        publish=lambda task_id, dispatch: published.append((task_id, dispatch))
    )
    result = runtime.run(first.task.id, ledger.queue_for_workers(first.task.id))
    assert result is not None and result.status == "succeeded", result
    assert published == [(second.task.id, 1)]
    after = ledger.get_task(second.task.id, project_id=project.id)
    assert after is not None and after.dispatch == 1


def test_a_paused_task_returns_and_its_decision_continues_it(
    worker_env: Ledger, tmp_path: Path
) -> None:
    from relaygraph.runner import Decision, decide_task
    from relaygraph.team import default_team
    from relaygraph.worker import run_ledger_task

    ledger = worker_env
    policy = tmp_path / "policy.toml"
    policy.write_text(APPROVAL_POLICY, encoding="utf-8")
    task_id = submitted(ledger, policy)
    run_ledger_task(task_id, ledger.queue_for_workers(task_id))
    paused = task_of(ledger, task_id)
    assert paused.status == "interrupted", paused.stop_reason
    assert paused.stop_reason == "awaiting approval: coder wants to run run_python"
    assert ledger.lease_of(task_id) == (None, None)  # It holds no worker.
    [approval] = ledger.approvals(task_id)

    answers = decide_task(
        paused,
        Decision(decision="approve"),
        ledger=ledger,
        tools=lambda: default_team().tools,
        decided_by="reviewer",
    )
    assert list(answers) == [approval.interrupt_id]
    # The answers are not handed over: the worker reads the recorded decision.
    dispatch = ledger.queue_for_workers(task_id)
    run_ledger_task(task_id, dispatch)
    done = task_of(ledger, task_id)
    assert done.status == "succeeded", done.stop_reason
    assert (done.attempts, done.dispatch) == (2, 2)
    types = event_types(ledger, task_id)
    assert types.count("run_started") == types.count("run_finished") == 2
    assert types.count("approval") == 1 and types.count("final") == 1
    [decided] = ledger.approvals(task_id)
    assert (decided.decision, decided.decided_by) == ("approve", "reviewer")
    run_python = [c for c in ledger.tool_calls(task_id) if c.tool == "run_python"]
    assert [c.status for c in run_python] == ["success"]  # Approved, run once.


def test_a_worker_whose_attempt_was_superseded_writes_nothing_more(
    worker_env: Ledger, home: Path
) -> None:
    """A frozen worker comes back after the task went to another worker: its run stops at
    once and writes nothing; the task is the new attempt's."""
    from relaygraph.runner import CONTINUE, TaskRunner

    ledger = worker_env
    task_id = submitted(ledger)
    dispatch = ledger.queue_for_workers(task_id)
    assert begin(ledger, task_id, dispatch) == 1
    assert begin(ledger, task_id, dispatch) == 2  # Redelivered while attempt 1 froze.
    runner = TaskRunner(ledger=ledger, home=home, runner_id=WORKER)
    with pytest.raises(AttemptSuperseded) as refused:
        runner.run(task_of(ledger, task_id), CONTINUE, attempt=1)
    assert (refused.value.attempt, refused.value.current) == (1, 2)
    task = task_of(ledger, task_id)
    assert (task.status, task.last_event_seq, task.attempts) == ("running", 0, 2)
    assert ledger.usage(task_id) == []


def test_a_superseded_attempts_tool_call_never_runs(ledger: Ledger, tmp_path: Path) -> None:
    """A worker that froze between steps and woke after the task went to another attempt:
    its next tool call is refused before the tool runs, so it changes nothing in the
    task's workspace (the new attempt's now); the latest attempt's call runs."""
    import dataclasses
    from types import SimpleNamespace

    from langgraph.prebuilt.tool_node import ToolCallRequest

    from relaygraph.agents import TaskContext
    from relaygraph.agents._journal import ToolJournalMiddleware
    from relaygraph.backends.workspace import Workspace

    task_id = queued(ledger)
    dispatch = ledger.queue_for_workers(task_id)
    assert begin(ledger, task_id, dispatch) == 1
    base = TaskContext.for_task(tmp_path, task_id=task_id, thread_id="t")
    base.workspace.mkdir(parents=True)
    call = {"name": "write_file", "args": {"path": "out.txt"}, "id": "call-1", "type": "tool_call"}
    ran: list[int] = []

    def tool_call(attempt: int) -> Any:
        context = dataclasses.replace(base, tool_journal=ledger.attempt_journal(attempt))
        journal = context.tool_journal
        assert journal is not None
        journal.starts_empty(task_id)  # type: ignore[attr-defined]  # a run from the request
        request = ToolCallRequest(
            tool_call=call,  # type: ignore[arg-type]
            tool=None,
            state={},
            runtime=SimpleNamespace(context=context),  # type: ignore[arg-type]
        )

        def handler(_request: Any) -> Any:
            from langchain_core.messages import ToolMessage

            ran.append(attempt)
            Workspace(context.workspace).write_text("out.txt", f"attempt {attempt}")
            return ToolMessage(content="written", tool_call_id="call-1", name="write_file")

        return ToolJournalMiddleware("coder").wrap_tool_call(request, handler)

    assert begin(ledger, task_id, dispatch) == 2  # Redelivered while attempt 1 froze.
    with pytest.raises(AttemptSuperseded):
        tool_call(1)
    assert ran == [] and not (base.workspace / "out.txt").exists()
    assert tool_call(2).content == "written"
    assert ran == [2] and (base.workspace / "out.txt").read_text() == "attempt 2"


def test_an_attempt_at_a_decided_task_clears_why_it_waited(ledger: Ledger) -> None:
    """A task that waited for a person runs again: its status is ``running`` and the
    reason it stopped for (``awaiting approval: ...``) is not shown beside it any more."""
    task_id = queued(ledger)
    assert begin(ledger, task_id, ledger.queue_for_workers(task_id)) == 1
    ledger.set_status(task_id, "interrupted", stop_reason="awaiting approval: coder wants to run")
    assert begin(ledger, task_id, ledger.queue_for_workers(task_id)) == 2
    task = task_of(ledger, task_id)
    assert (task.status, task.stop_reason) == ("running", None)


def test_a_taken_lease_clears_why_the_task_stopped(ledger: Ledger) -> None:
    """In process the same: a decided task taken to run again shows no stale reason."""
    task_id = queued(ledger)
    assert ledger.take_lease(task_id, "server-a", seconds=30)
    ledger.set_status(task_id, "interrupted", stop_reason="awaiting approval: coder wants to run")
    ledger.release_lease(task_id, "server-a")
    taken = ledger.take_lease(task_id, "server-a", seconds=30, only_from=("interrupted",))
    assert taken is not None and (taken.status, taken.stop_reason) == ("running", None)
    assert task_of(ledger, task_id).stop_reason is None
