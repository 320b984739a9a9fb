"""The ledger's events and the rows they imply: handoffs, tool calls, approvals and usage
(``EventRepository``, ``ApprovalRepository``, ``UsageRepository``), on SQLite and on
PostgreSQL.

Every test that takes ``ledger`` or ``url`` runs on each backend (``tests/_store.py``).
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from relaygraph.runner import RunResult
from relaygraph.store import LOCAL_PROJECT_ID, Ledger, RecordConflict
from tests._store import Paused, recorded_task

pytest_plugins = ["tests._store_runs"]


def test_event_numbers_stay_in_order_under_concurrent_appends(ledger: Ledger) -> None:
    task, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x")
    start = threading.Barrier(8)
    numbers: dict[int, list[int]] = {}
    failures: list[BaseException] = []

    def append(worker: int) -> None:
        try:
            start.wait()
            numbers[worker] = [
                ledger.append_event(
                    task.id, {"type": "token", "role": f"w{worker}", "text": str(n)}
                )
                for n in range(25)
            ]
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=append, args=(worker,)) for worker in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
    assert sorted(n for seqs in numbers.values() for n in seqs) == list(range(1, 201))
    for seqs in numbers.values():
        assert seqs == sorted(seqs)

    events = ledger.events_after(task.id)
    assert [e.seq for e in events] == list(range(1, 201))
    for worker in range(8):
        texts = [e.data["text"] for e in events if e.agent == f"w{worker}"]
        assert texts == [str(n) for n in range(25)]
    assert [e.seq for e in ledger.events_after(task.id, 150)] == list(range(151, 201))
    assert [e.seq for e in ledger.events_after(task.id, 150, limit=3)] == [151, 152, 153]
    stored = ledger.get_task(task.id, project_id=LOCAL_PROJECT_ID)
    assert stored is not None and stored.last_event_seq == 200


def test_a_real_run_yields_handoff_tool_and_usage_rows(
    ledger: Ledger, relay_run: tuple[list[dict[str, Any]], RunResult]
) -> None:
    events, result = relay_run
    task_id = recorded_task(ledger, result)
    assert [ledger.append_event(task_id, event) for event in events] == list(
        range(1, len(events) + 1)
    )

    stored = ledger.events_after(task_id)
    assert [e.data for e in stored] == events
    assert [e.agent for e in stored if e.type in ("route", "handoff")] == [
        "supervisor",
        "researcher",
        "supervisor",
        "supervisor",
    ]

    handoffs = ledger.handoffs(task_id)
    assert [(h.kind, h.source, h.target, h.task, h.reason) for h in handoffs] == [
        (h["kind"], h["from"], h["to"], h["task"], h["reason"]) for h in result.handoffs
    ]
    assert [h.seq for h in handoffs] == [1, 2, 3]
    assert [stored[h.event_seq - 1].type for h in handoffs] == ["route", "handoff", "route"]
    tokens = {role: u["input_tokens"] + u["output_tokens"] for role, u in result.usage.items()}
    assert [h.tokens_so_far for h in handoffs] == [
        0,
        tokens["researcher"],
        tokens["researcher"] + tokens["coder"],
    ]

    calls = ledger.tool_calls(task_id)
    sent = [e for e in events if e["type"] == "tool_call"]
    assert [(c.agent, c.tool, c.tool_call_id, c.args) for c in calls] == [
        (e["agent"], e["tool"], e["tool_call_id"], e["args"]) for e in sent
    ]
    assert [c.status for c in calls] == ["success"] * 3
    assert calls[1].result_preview and "41 checkpoints" in calls[1].result_preview
    assert all(c.finished_at and c.finished_at >= c.created_at for c in calls)

    fields = ("model_calls", "tool_calls", "input_tokens", "output_tokens")
    # Every role's usage records arrive with the events (the agents' in agent_finished,
    # the supervisor's and finalize's in usage events): the ledger stores what the run's
    # result adds up, and derives nothing of its own.
    usage = {u.agent: u for u in ledger.usage(task_id)}
    assert set(usage) == set(result.usage) >= {"researcher", "coder", "writer", "supervisor"}
    for role, entry in usage.items():
        assert {f: getattr(entry, f) for f in fields} == {f: result.usage[role][f] for f in fields}
        assert entry.estimated == result.usage[role]["estimated"]

    # A node that runs again after a crash sends its records again: counted once.
    finished = next(e for e in events if e["type"] == "agent_finished")
    routed = next(e for e in events if e["type"] == "usage")
    ledger.append_events(task_id, [finished, routed])
    assert {u.agent: u for u in ledger.usage(task_id)} == usage
    project = ledger.usage_for_project(LOCAL_PROJECT_ID)
    assert project["tasks"] == 1
    for name in fields:
        assert project["total"][name] == result.team_usage[name]
    assert project["agents"]["coder"]["input_tokens"] == result.usage["coder"]["input_tokens"]


def test_a_paused_run_yields_an_approval_with_who_decided(
    ledger: Ledger, approval_run: Paused
) -> None:
    task_id = recorded_task(ledger, approval_run.paused)
    for event in approval_run.before:
        ledger.append_event(task_id, event)
    (pending,) = approval_run.paused.pending
    (request,) = ledger.approvals(task_id)
    assert request.pending and request.kind == "approval"
    assert (request.interrupt_id, request.agent, request.tool, request.args) == (
        pending["id"],
        "coder",
        "run_python",
        pending["args"],
    )
    assert request.tool_call_id == pending["tool_call_id"]
    assert request.request["step"] == pending["step"]
    assert [c.status for c in ledger.tool_calls(task_id)] == ["success", "pending"]
    assert ledger.get_approval(task_id, pending["id"]) == request

    decided = ledger.record_decision(
        task_id, pending["id"], decision="approve", decided_by="alice", reason="safe arithmetic"
    )
    assert (decided.decision, decided.decided_by, decided.reason) == (
        "approve",
        "alice",
        "safe arithmetic",
    )
    assert decided.decided_at is not None and decided.applied_at is None
    with pytest.raises(RecordConflict, match="already decided: 'approve' by 'alice'"):
        ledger.record_decision(task_id, pending["id"], decision="reject", decided_by="bob")

    for event in approval_run.after:
        ledger.append_event(task_id, event)
    (applied,) = ledger.approvals(task_id)
    assert applied.applied_at is not None and applied.decided_by == "alice"
    # The resumed agent announces its call again; the ledger keeps one call, now answered.
    calls = ledger.tool_calls(task_id)
    assert [(c.agent, c.tool, c.status) for c in calls] == [
        ("researcher", "search_docs", "success"),
        ("coder", "run_python", "success"),
        ("writer", "save_artifact", "success"),
    ]
    coder = next(u for u in ledger.usage(task_id) if u.agent == "coder")
    assert coder.model_calls == approval_run.finished.usage["coder"]["model_calls"]


def test_a_decision_made_outside_the_api_is_taken_from_the_event(
    ledger: Ledger, approval_run: Paused
) -> None:
    task_id = recorded_task(ledger, approval_run.paused)
    for event in approval_run.before + approval_run.after:
        ledger.append_event(task_id, event)
    (approval,) = ledger.approvals(task_id)
    assert (approval.decision, approval.reason, approval.decided_by) == (
        "approve",
        "safe arithmetic",
        None,
    )
    assert approval.applied_at is not None


def test_of_two_people_deciding_at_once_one_wins(ledger: Ledger) -> None:
    task, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x")
    interrupted = {"type": "interrupted", "id": "int-1", "waits_for": "approval", "tool": "t"}
    ledger.append_event(task.id, interrupted)
    start = threading.Barrier(2)
    outcomes: list[str] = []

    def decide(who: str) -> None:
        start.wait()
        try:
            ledger.record_decision(task.id, "int-1", decision="approve", decided_by=who)
            outcomes.append("won")
        except RecordConflict:
            outcomes.append("told")

    threads = [threading.Thread(target=decide, args=(who,)) for who in ("alice", "bob")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["told", "won"]


def test_usage_for_a_project_counts_tasks_created_in_the_window(ledger: Ledger) -> None:
    project, _ = ledger.create_project("research")
    other, _ = ledger.create_project("ops")
    early, _ = ledger.create_task(project_id=project.id, input="early")
    middle = datetime.now(UTC)
    late, _ = ledger.create_task(project_id=project.id, input="late")
    theirs, _ = ledger.create_task(project_id=other.id, input="theirs")
    spent = {"model_calls": 2, "input_tokens": 100, "output_tokens": 10, "cost_usd": 0.25}
    for task in (early, late, theirs):
        ledger.record_usage(
            task.id,
            [
                {"id": "coder:1", "agent": "coder", **spent},
                {"id": "supervisor:1", "agent": "supervisor", **spent, "estimated": True},
            ],
        )

    everything = ledger.usage_for_project(project.id)
    assert everything["tasks"] == 2
    assert everything["total"]["input_tokens"] == 400
    assert everything["total"]["cost_usd"] == pytest.approx(1.0)
    assert everything["total"]["estimated"] is True
    assert everything["agents"]["coder"]["model_calls"] == 4
    assert everything["agents"]["coder"]["estimated"] is False

    before = ledger.usage_for_project(project.id, until=middle)
    assert before["tasks"] == 1 and before["total"]["input_tokens"] == 200
    after = ledger.usage_for_project(project.id, since=middle, until=middle + timedelta(hours=1))
    assert after["tasks"] == 1 and after["since"] == middle.isoformat()
    assert ledger.usage_for_project(project.id, since=middle + timedelta(hours=1))["tasks"] == 0


def test_a_replayed_tool_call_keeps_one_row(ledger: Ledger) -> None:
    """The tool journal replays a finished call after a crash: its events come again, the
    ledger keeps one row for it; the same id for another agent's call is another call."""
    project, _ = ledger.create_project("replays")
    task, _ = ledger.create_task(project_id=project.id, input="x")
    call = {"type": "tool_call", "agent": "coder", "tool": "run_python", "tool_call_id": "c1"}
    result = {**call, "type": "tool_result", "status": "success", "preview": "42"}
    ledger.append_events(task.id, [call, result])
    ledger.append_events(task.id, [call, result])  # The replay.
    ledger.append_events(task.id, [{**call, "agent": "writer"}, {**result, "agent": "writer"}])
    rows = ledger.tool_calls(task.id)
    assert [(r.agent, r.tool_call_id, r.status) for r in rows] == [
        ("coder", "c1", "success"),
        ("writer", "c1", "success"),
    ]
