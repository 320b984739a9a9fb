"""What the ledger takes and gives back: JSON values, refused input named, public names, on
SQLite and on PostgreSQL.

Every test that takes ``ledger`` or ``url`` runs on each backend (``tests/_store.py``).
"""

from __future__ import annotations

import importlib
from datetime import UTC, datetime
from typing import Any

import pytest

from relaygraph.errors import ConfigError
from relaygraph.store import LOCAL_PROJECT_ID, Ledger, RecordConflict, RecordNotFound


def test_json_round_trips(ledger: Ledger) -> None:
    policy = {
        "team": {"max_cost_usd": 0.1, "max_tokens": 2**53, "on_exhausted": "finalize"},
        "agents": {"coder": {"tools": ["run_python"], "approval": [], "max_seconds": None}},
        "flags": [True, False, None, 0, -1.5e-7],
    }
    metadata = {"ticket": "ÉQ-42 ✓ 日本語 🎉", "tags": ("a", "b"), "nested": {"deep": [[{}]]}}
    task, _ = ledger.create_task(
        project_id=LOCAL_PROJECT_ID,
        input="say “hi” — in 日本語",
        policy=policy,
        models={"coder": "openai:gpt-4o-mini"},
        metadata=metadata,
    )
    stored = ledger.get_task(task.id, project_id=LOCAL_PROJECT_ID)
    assert stored == task
    assert stored.policy == policy and stored.input == "say “hi” — in 日本語"
    assert stored.metadata == {**metadata, "tags": ["a", "b"]}  # A tuple reads back a list.
    assert ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x")[0].policy is None

    # Tool output may hold NUL characters, which PostgreSQL cannot store: they are replaced.
    event = {"type": "tool_result", "agent": "coder", "tool": "run_python", "preview": "a\x00b"}
    ledger.append_event(task.id, {**event, "extra": {"n": 1.25, "list": [1, "二"]}})
    (stored_event,) = ledger.events_after(task.id)
    assert stored_event.data["preview"] == "a\ufffdb"
    assert stored_event.data["extra"] == {"n": 1.25, "list": [1, "二"]}
    assert ledger.tool_calls(task.id)[0].result_preview == "a\ufffdb"

    ledger.append_event(
        task.id,
        {"type": "interrupted", "id": "int-1", "waits_for": "approval", "agent": "coder",
         "tool": "run_python", "args": {"code": "print('✓')"}},
    )  # fmt: skip
    edited = ledger.record_decision(
        task.id, "int-1", decision="edit", decided_by="alice", args={"code": "print(2 ** 10)"}
    )
    assert ledger.approvals(task.id) == [edited]
    assert edited.edited_args == {"code": "print(2 ** 10)"}
    assert edited.args == {"code": "print('✓')"}


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ({"when": datetime(2024, 1, 1)}, "metadata.when = .* is a datetime"),
        ({"score": float("nan")}, "metadata.score = nan is not a finite number"),
        ({1: "one"}, "metadata has the key 1"),
        ({"tags": {"a"}}, r"metadata.tags = \{'a'\} is a set"),
        ({"text": "a\x00b"}, r"metadata.text 'a\\x00b' contains a NUL"),
        ("not an object", "metadata 'not an object' must be a JSON object"),
    ],
)
def test_values_json_cannot_hold_are_refused_by_name(
    ledger: Ledger, metadata: Any, expected: str
) -> None:
    with pytest.raises(ConfigError, match=expected):
        ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x", metadata=metadata)


def test_bad_input_errors_name_the_value(ledger: Ledger) -> None:
    task, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x")
    cases: list[tuple[Any, type[Exception], str]] = [
        (
            lambda: ledger.create_task(project_id=LOCAL_PROJECT_ID, input="  "),
            ConfigError,
            "input '  '",
        ),
        (
            lambda: ledger.create_task(project_id="ghost", input="x"),
            RecordNotFound,
            "project 'ghost'",
        ),
        (
            lambda: ledger.create_task(
                project_id=LOCAL_PROJECT_ID, input="x", idempotency_key="k" * 256
            ),
            ConfigError,
            "idempotency_key 'kkk.*' is longer than 255",
        ),
        (lambda: ledger.set_status(task.id, "done"), ConfigError, "status 'done' is not one of"),
        (
            lambda: ledger.set_status(task.id, "failed", reason="x"),
            ConfigError,
            "unknown field.* 'reason'",
        ),
        (lambda: ledger.set_status(task.id, "failed", answer=3), ConfigError, "answer 3 must be"),
        (lambda: ledger.set_status("ghost", "failed"), RecordNotFound, "no task 'ghost'"),
        (lambda: ledger.claim(task.id, only_from=("new",)), ConfigError, "'new'"),
        (lambda: ledger.append_event(task.id, {"no": "type"}), ConfigError, "'type' None"),
        (lambda: ledger.append_event(task.id, "route"), ConfigError, "event 'route' must be"),
        (lambda: ledger.append_event("ghost", {"type": "x"}), RecordNotFound, "'ghost'"),
        (
            lambda: ledger.append_event(
                task.id, {"type": "agent_finished", "agent": "a", "usage": {"input_tokens": -1}}
            ),
            ConfigError,
            "usage.input_tokens -1 must be a non-negative number",
        ),
        (lambda: ledger.list_tasks(project_id="t", limit=0), ConfigError, "limit 0 must be"),
        (lambda: ledger.list_tasks(project_id="t", limit=201), ConfigError, "limit 201"),
        (lambda: ledger.list_tasks(project_id="t", status="bogus"), ConfigError, "'bogus'"),
        (lambda: ledger.list_tasks(project_id="t", cursor="zz!"), ConfigError, "cursor 'zz!'"),
        (
            lambda: ledger.record_decision(task.id, "i", decision="maybe", decided_by="a"),
            ConfigError,
            "decision 'maybe'",
        ),
        (
            lambda: ledger.record_decision(task.id, "i", decision="edit", decided_by="a"),
            ConfigError,
            "an edit needs the new arguments",
        ),
        (
            lambda: ledger.record_decision(
                task.id, "i", decision="approve", decided_by="a", args={"x": 1}
            ),
            ConfigError,
            "only for an 'edit'",
        ),
        (
            lambda: ledger.record_decision(task.id, "i", decision="approve", decided_by=" "),
            ConfigError,
            "decided_by ' '",
        ),
        (
            lambda: ledger.record_decision(task.id, "ghost", decision="approve", decided_by="a"),
            RecordNotFound,
            "no approval 'ghost'",
        ),
        (
            lambda: ledger.record_usage(task.id, [{"agent": "coder", "cost_usd": "free"}]),
            ConfigError,
            "usage\\[0\\].cost_usd 'free'",
        ),
        (
            lambda: ledger.record_usage(task.id, [{"id": "x", "model_calls": 1}]),
            ConfigError,
            "usage\\[0\\].agent None must name the role",
        ),
        (
            lambda: ledger.usage_for_project("t", since=datetime(2024, 1, 1)),
            ConfigError,
            "since datetime.datetime\\(2024, 1, 1, 0, 0\\) must be a timezone-aware",
        ),
        (
            lambda: ledger.usage_for_project(
                "t", since=datetime(2024, 2, 1, tzinfo=UTC), until=datetime(2024, 1, 1, tzinfo=UTC)
            ),
            ConfigError,
            "since '2024-02-01T00:00:00\\+00:00' is after until",
        ),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()
    # Nothing above wrote anything.
    assert ledger.events_after(task.id) == []
    stored = ledger.get_task(task.id, project_id=LOCAL_PROJECT_ID)
    assert stored is not None and stored.status == "queued"


def test_public_names_import() -> None:
    module = importlib.import_module("relaygraph.store")
    for name in module.__all__:
        assert hasattr(module, name), name
    assert issubclass(RecordNotFound, ConfigError) and issubclass(RecordConflict, ConfigError)


def test_event_names_match_the_team_graph() -> None:
    from relaygraph._names import FINISH
    from relaygraph._names import SUPERVISOR as ROUTER
    from relaygraph.supervisor import FINISH as GRAPH_FINISH
    from relaygraph.supervisor import SUPERVISOR

    assert (ROUTER, FINISH) == (SUPERVISOR, GRAPH_FINISH)
