"""The ledger, on SQLite and on PostgreSQL.

Every test that takes ``ledger`` or ``url`` runs twice: on a fresh SQLite file, and in a
fresh schema of the PostgreSQL database ``test`` on 127.0.0.1:5432 (dropped afterwards, so
parallel runs never meet). Without a reachable server the PostgreSQL half is skipped, or
fails loudly when ``RELAYGRAPH_REQUIRE_POSTGRES=1`` (as CI sets it).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.exc import SQLAlchemyError

from relaygraph.errors import ConfigError
from relaygraph.runner import Decision, RunResult, resume_task, run_task
from relaygraph.store import (
    DATABASE_URL_ENV,
    LOCAL_PROJECT_ID,
    Ledger,
    RecordConflict,
    RecordNotFound,
    database_url,
    upgrade,
)
from tests.conftest import EXAMPLE_RELAY

TABLES = {
    "projects",
    "api_keys",
    "tasks",
    "events",
    "handoffs",
    "tool_calls",
    "approvals",
    "usage",
    "eval_runs",
    "eval_case_results",
    "team_versions",
    "tool_journal",
    "worker_slots",
}
RELAY_SPEC = f"scripted:{EXAMPLE_RELAY}"


# Databases


def all_rows(url: str) -> list[str]:
    """Every value in every ledger table, as text."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return [
                str(value)
                for table in TABLES
                for row in connection.execute(text(f"SELECT * FROM {table}"))
                for value in row
            ]
    finally:
        engine.dispose()


# Real runs of the scripted team, whose events the ledger records


@dataclass(frozen=True)
class Paused:
    before: list[dict[str, Any]]
    paused: RunResult
    after: list[dict[str, Any]]
    finished: RunResult


@pytest.fixture(scope="module")
def relay_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], RunResult]:
    """The events and result of the example relay (route, handoff, tools, finish)."""
    events: list[dict[str, Any]] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RELAYGRAPH_HOME", str(tmp_path_factory.mktemp("relay-home")))
        result = run_task("x", model=RELAY_SPEC, on_event=events.append)
    assert result.status == "succeeded", result
    return events, result


@pytest.fixture(scope="module")
def approval_run(tmp_path_factory: pytest.TempPathFactory) -> Paused:
    """The relay with ``run_python`` under approval: paused, then approved and finished."""
    home = tmp_path_factory.mktemp("approval-home")
    policy = home / "policy.toml"
    policy.write_text('[agents.coder]\napproval = ["run_python"]\n', encoding="utf-8")
    before: list[dict[str, Any]] = []
    after: list[dict[str, Any]] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RELAYGRAPH_HOME", str(home))
        paused = run_task("x", model=RELAY_SPEC, policy=policy, on_event=before.append)
        assert paused.status == "interrupted", paused
        decision = Decision(decision="approve", reason="safe arithmetic")
        finished = resume_task(paused.task_id, decision, on_event=after.append)
    assert finished.status == "succeeded", finished
    return Paused(before=before, paused=paused, after=after, finished=finished)


def recorded_task(ledger: Ledger, result: RunResult) -> str:
    task, _ = ledger.create_task(
        project_id=LOCAL_PROJECT_ID, input="x", thread_id=result.thread_id, models=result.models
    )
    return task.id


# Schema and configuration


def test_migrations_build_the_schema_from_an_empty_database(url: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from relaygraph.store._migrate import VERSION_TABLE, alembic_config
    from relaygraph.store._models import Base

    engine = create_engine(url)
    try:
        assert inspect(engine).get_table_names() == []
        with Ledger(url) as ledger:
            assert not ledger.is_current()
            ledger.upgrade()
            ledger.upgrade()  # Nothing left to do: a no-op, not an error.
            assert ledger.is_current()
            local = ledger.get_project("local")
            assert local is not None and local.id == LOCAL_PROJECT_ID
        assert set(inspect(engine).get_table_names()) == TABLES | {VERSION_TABLE}
        with engine.connect() as connection:
            # The migrations build exactly what the models describe (types included).
            context = MigrationContext.configure(
                connection, opts={"compare_type": True, "version_table": VERSION_TABLE}
            )
            assert compare_metadata(context, Base.metadata) == []
        with engine.begin() as connection:
            from alembic import command

            command.downgrade(alembic_config(connection), "base")
        assert set(inspect(engine).get_table_names()) == {VERSION_TABLE}
        assert upgrade(url) == Ledger(url).url
        assert set(inspect(engine).get_table_names()) == TABLES | {VERSION_TABLE}
    finally:
        engine.dispose()


def test_default_database_is_sqlite_in_the_data_directory(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from relaygraph.store._engine import make_engine

    monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
    assert database_url() == f"sqlite:///{home / 'ledger.sqlite'}"
    with Ledger() as ledger:
        ledger.upgrade()
        assert ledger.dialect == "sqlite"
    engine = make_engine(database_url())
    try:
        with engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            with pytest.raises(SQLAlchemyError, match="FOREIGN KEY"):
                connection.exec_driver_sql(
                    "INSERT INTO api_keys VALUES ('k', 'no-project', 'h', 'p', '2024-01-01', NULL)"
                )
    finally:
        engine.dispose()


def test_database_url_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DATABASE_URL_ENV, "postgresql://auditor:s3cret@db.internal:5432/ledger")
    # A bare postgresql:// URL gets the psycopg 3 driver, which relaygraph installs.
    assert database_url() == "postgresql+psycopg://auditor:s3cret@db.internal:5432/ledger"
    ledger = Ledger()
    assert ledger.url == "postgresql+psycopg://auditor:***@db.internal:5432/ledger"
    assert "s3cret" not in repr(ledger)
    assert database_url("sqlite:///x.sqlite") == "sqlite:///x.sqlite"  # an explicit URL wins


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("not a url", "'not a url' is not a database URL"),
        ("mysql://u:hunter2@h/db", "names the 'mysql' backend"),
        ("postgresql://u:hunter2@h:port/db", "'postgresql://u:\\*\\*\\*@h:port/db' is not"),
        ("sqlite://", "in-memory SQLite database"),
        ("sqlite:///:memory:", "in-memory SQLite database"),
    ],
)
def test_bad_database_urls_are_named(raw: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected) as caught:
        Ledger(raw)
    assert "hunter2" not in str(caught.value)


# Teams and keys


def test_keys_are_stored_hashed_and_authenticate(ledger: Ledger, url: str) -> None:
    project, key = ledger.create_project("research")
    other, other_key = ledger.create_project("ops")
    assert key.startswith("rg_") and len(key) > 40 and key != other_key
    (record,) = ledger.api_keys(project.id)
    assert record.prefix == key[:10] and record.revoked_at is None

    rows = all_rows(url)
    assert hashlib.sha256(key.encode()).hexdigest() in rows
    assert not any(key in value or other_key in value for value in rows)
    if url.startswith("sqlite"):
        files = Path(url.removeprefix("sqlite:///")).parent.glob("ledger.sqlite*")
        assert not any(key.encode() in path.read_bytes() for path in files)

    assert ledger.authenticate(key) == project
    assert ledger.authenticate(other_key) == other
    assert ledger.authenticate(key[:-1]) is None
    assert ledger.authenticate("") is None
    assert ledger.authenticate(hashlib.sha256(key.encode()).hexdigest()) is None

    second, second_key = ledger.create_api_key(project.id)
    ledger.revoke_api_key(record.id)
    assert ledger.authenticate(key) is None
    assert ledger.authenticate(second_key) == project
    assert [k.id for k in ledger.api_keys(project.id)] == [record.id, second.id]


def test_project_names_are_unique_and_checked(ledger: Ledger) -> None:
    ledger.create_project("research")
    with pytest.raises(RecordConflict, match="project 'research': a project of that name exists"):
        ledger.create_project("research")
    with pytest.raises(ConfigError, match="'local'"):
        ledger.create_project("local")  # The CLI's built-in project.
    for bad in ["", "has space", "-dash", "x" * 65]:
        with pytest.raises(ConfigError, match=f"project name {bad!r} is invalid"):
            ledger.create_project(bad)
    with pytest.raises(RecordNotFound, match="no project 'ghost'"):
        ledger.create_api_key("ghost")


# Registered teams


def test_registered_teams_are_versioned_per_project(ledger: Ledger) -> None:
    project, _ = ledger.create_project("research")
    other, _ = ledger.create_project("ops")
    first = {"agents": {"reviewer": {"description": "d", "prompt": "p"}}}
    one, created = ledger.register_team(
        project.id, "docs-review", definition=first, digest="sha256:1"
    )
    assert created and (one.name, one.version, one.definition) == ("docs-review", 1, first)
    # The same team again is no change; a changed one is the next version.
    again, created = ledger.register_team(
        project.id, "docs-review", definition=first, digest="sha256:1"
    )
    assert not created and again == one
    two, created = ledger.register_team(
        project.id, "docs-review", definition={"changed": True}, digest="sha256:2"
    )
    assert created and two.version == 2
    # Back to the first content is a change from the latest: version 3, not 1.
    three, _ = ledger.register_team(project.id, "docs-review", definition=first, digest="sha256:1")
    assert three.version == 3
    ledger.register_team(project.id, "alpha", definition={}, digest="sha256:a")
    # Another project's names are its own.
    theirs, _ = ledger.register_team(other.id, "docs-review", definition={}, digest="sha256:9")
    assert theirs.version == 1 and theirs.project_id == other.id

    assert ledger.team_version(project.id, "docs-review") == three
    assert ledger.team_version(project.id, "docs-review", 2) == two
    assert ledger.team_version(project.id, "docs-review", 4) is None
    assert ledger.team_version(other.id, "alpha") is None
    assert [v.version for v in ledger.team_versions(project.id, "docs-review")] == [1, 2, 3]
    assert [(t.name, t.version) for t in ledger.teams(project.id)] == [
        ("alpha", 1),
        ("docs-review", 3),
    ]
    assert [(t.name, t.version) for t in ledger.teams(other.id)] == [("docs-review", 1)]

    with pytest.raises(ConfigError, match="team name 'no space' is invalid"):
        ledger.register_team(project.id, "no space", definition={}, digest="sha256:x")
    with pytest.raises(ConfigError, match="definition"):
        ledger.register_team(project.id, "x", definition=[], digest="sha256:x")  # type: ignore[arg-type]
    with pytest.raises(RecordNotFound, match="project 'ghost'"):
        ledger.register_team("ghost", "x", definition={}, digest="sha256:x")


# Agent names of three lengths, in an order that PostgreSQL's jsonb (keys by length, then
# bytes) would make writer, reviewer, researcher.
ORDERED_AGENTS = {
    "agents": {
        "researcher": {"use": "builtin:researcher"},
        "writer": {"use": "builtin:writer"},
        "reviewer": {"description": "reviews", "prompt": "Review it.", "handoffs": ["writer"]},
    },
    "topology": "swarm",
}


def test_a_registered_definition_reads_back_in_its_own_key_order(ledger: Ledger) -> None:
    """The agents' order is the team's (its digest, a swarm's first agent): the ledger keeps
    the definition as pushed, keys in their order, on every backend."""
    project, _ = ledger.create_project("research")
    ledger.register_team(
        project.id, "docs-review", definition=ORDERED_AGENTS, digest="sha256:ordered"
    )
    found = ledger.team_version(project.id, "docs-review")
    assert found is not None
    assert list(found.definition["agents"]) == ["researcher", "writer", "reviewer"]
    assert json.dumps(found.definition) == json.dumps(ORDERED_AGENTS)
    (listed,) = ledger.teams(project.id)
    assert list(listed.definition) == ["agents", "topology"]


def test_concurrent_pushes_number_versions_without_gaps(ledger: Ledger) -> None:
    project, _ = ledger.create_project("research")
    start = threading.Barrier(6)
    made: list[tuple[int, bool]] = []

    def push(n: int) -> None:
        start.wait()
        version, created = ledger.register_team(
            project.id, "t", definition={"n": n}, digest=f"sha256:{n}"
        )
        made.append((version.version, created))

    threads = [threading.Thread(target=push, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(version for version, _ in made) == [1, 2, 3, 4, 5, 6]
    assert [v.version for v in ledger.team_versions(project.id, "t")] == [1, 2, 3, 4, 5, 6]


# Tasks


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


# Events


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


# Values in and out


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


# Eval runs


def test_eval_runs_and_their_case_results(ledger: Ledger) -> None:
    task, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x")
    start = datetime(2020, 12, 1, 12, tzinfo=UTC)
    run_id = ledger.record_eval_run(
        golden="/golden.jsonl",
        models={"model": None, "agent_models": {"coder": "scripted:c.json"}},
        options={"repeat": 2, "concurrency": 1, "tags": ("smoke",), "baseline": None},
        case_count=2,
        run_count=4,
        started_at=start,
    )
    passed = {"name": "status", "passed": True, "expected": "succeeded", "actual": "succeeded"}
    failed = {"name": "first_agent", "passed": False, "expected": "coder", "actual": "writer"}
    first = ledger.record_eval_case(
        run_id,
        case_id="b",
        trial=1,
        passed=False,
        checks=[passed, failed],
        task_id=task.id,
        usage={"input_tokens": 3, "cost_usd": 0.5},
        latency_seconds=1.25,
    )
    assert first.first_failure == failed and first.task_id == task.id
    ledger.record_eval_case(run_id, case_id="a", trial=2, passed=True, checks=[passed])
    ledger.record_eval_case(run_id, case_id="a", trial=1, passed=True, checks=[passed])
    crashed = ledger.record_eval_case(
        run_id,
        case_id="b",
        trial=2,
        passed=False,
        checks=[{"name": "run", "passed": False, "expected": "runs", "actual": "bo\x00om"}],
        error="RuntimeError: bo\x00om",
    )
    assert crashed.task_id is None and crashed.error == "RuntimeError: bo\ufffdom"
    with pytest.raises(RecordConflict, match="b#1"):
        ledger.record_eval_case(run_id, case_id="b", trial=1, passed=True, checks=[])
    with pytest.raises(RecordNotFound, match="eval run 'nope'"):
        ledger.record_eval_case("nope", case_id="b", trial=3, passed=True, checks=[])
    with pytest.raises(RecordNotFound, match="task 'nope'"):
        ledger.record_eval_case(
            run_id, case_id="c", trial=1, passed=True, checks=[], task_id="nope"
        )

    running = ledger.eval_run(run_id)
    assert not running.finished and running.metrics is None and running.pass_rate is None
    assert running.options["tags"] == ["smoke"] and running.started_at == start
    finished = ledger.finish_eval_run(run_id, metrics={"pass_rate": 0.5, "pass_at_k": {"1": 0.5}})
    assert finished.finished and finished.pass_rate == 0.5
    assert (finished.case_count, finished.run_count) == (2, 4)
    assert (finished.passed_case_count, finished.passed_run_count) == (1, 2)
    with pytest.raises(RecordConflict, match="finished already"):
        ledger.finish_eval_run(run_id, metrics={"pass_rate": 0.5})

    stored = ledger.eval_run(run_id)
    assert stored == finished
    assert [(c.case_id, c.trial) for c in stored.cases] == [("a", 1), ("a", 2), ("b", 1), ("b", 2)]
    b1 = stored.cases[2]
    assert b1.checks == [passed, failed] and b1.usage == {"input_tokens": 3, "cost_usd": 0.5}
    assert b1.latency_seconds == 1.25 and b1.created_at.tzinfo is not None
    assert stored.models == {"model": None, "agent_models": {"coder": "scripted:c.json"}}

    later = ledger.record_eval_run(
        golden="/other.jsonl", models={}, options={}, case_count=0, run_count=0
    )
    assert [r.id for r in ledger.eval_runs()] == [later, run_id]
    [newest] = ledger.eval_runs(limit=1)
    assert newest.id == later and newest.cases == ()
    assert ledger.eval_runs()[1] == stored
    with pytest.raises(RecordNotFound, match="eval run 'nope'"):
        ledger.eval_run("nope")


def test_bad_eval_input_is_refused_by_name(ledger: Ledger) -> None:
    run_id = ledger.record_eval_run(golden="g", models={}, options={}, case_count=1, run_count=1)
    run: Any = functools.partial(ledger.record_eval_run, models={}, options={}, run_count=1)
    case: Any = functools.partial(ledger.record_eval_case, run_id, case_id="a")
    cases: list[tuple[Any, str]] = [
        (lambda: run(golden=" ", case_count=1), "golden"),
        (lambda: run(golden="g", case_count=-1), "case_count"),
        (lambda: run(golden="g", case_count=1, started_at=datetime(2020, 1, 1)), "started_at"),
        (lambda: run(golden="g", case_count=1, models=[]), "models"),
        (lambda: case(trial=0, passed=True, checks=[]), "trial"),
        (lambda: case(trial=1, passed=1, checks=[]), "passed"),
        (lambda: case(trial=1, passed=True, checks="x"), "checks"),
        (lambda: case(trial=1, passed=True, checks=[{}]), r"checks\[0\]"),
        (lambda: case(trial=1, passed=True, checks=[], usage={"x": float("nan")}), "usage.x"),
        (lambda: ledger.finish_eval_run(run_id, metrics={"pass_rate": 1.5}), "pass_rate"),
        (lambda: ledger.eval_runs(limit=0), "limit"),
    ]
    for call, message in cases:
        with pytest.raises(ConfigError, match=message):
            call()
    assert ledger.eval_run(run_id).cases == () and not ledger.eval_run(run_id).finished


def _task_at_0001(url: str) -> str:
    """Insert a task as revision 0001 had them (the ORM writes today's columns)."""
    task_id = "00000000-0000-0000-0000-000000000001"
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(
                text(
                    # Revision 0001's column for the project (renamed in 0007).
                    "INSERT INTO tasks (id, team_id, input, status, models, thread_id, "
                    "metadata, last_event_seq, created_at, updated_at) VALUES (:id, :project, "
                    "'kept', 'succeeded', '{}', 'thread-old', '{}', 0, :now, :now)"
                ),
                {"id": task_id, "project": LOCAL_PROJECT_ID, "now": datetime.now(UTC)},
            )
    finally:
        engine.dispose()
    return task_id


def test_migrations_upgrade_a_ledger_with_tasks_and_downgrade(url: str) -> None:
    from alembic import command

    from relaygraph.store._migrate import alembic_config

    with Ledger(url) as ledger:
        ledger.upgrade("0001")
        assert not ledger.is_current()
    task_id = _task_at_0001(url)
    with Ledger(url) as ledger:
        ledger.upgrade()
        old = ledger.get_task(task_id, project_id=LOCAL_PROJECT_ID)
        assert old is not None and old.topology is None  # Before topologies: structured.
        assert ledger.thread_topology("thread-old", project_id=LOCAL_PROJECT_ID) is None
        # Its checkpoints stay where they were: under its thread id.
        assert old.checkpoint_thread == "thread-old" and old.attempts == 0
        run_id = ledger.record_eval_run(
            golden="g", models={}, options={}, case_count=1, run_count=1
        )
        ledger.record_eval_case(
            run_id, case_id="a", trial=1, passed=True, checks=[], task_id=task_id
        )
        new, _ = ledger.create_task(
            project_id=LOCAL_PROJECT_ID, input="x", thread_id="t", topology={"kind": "swarm"}
        )
        assert ledger.thread_topology("t", project_id=LOCAL_PROJECT_ID) == {"kind": "swarm"}
        assert new.topology == {"kind": "swarm"}
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            command.downgrade(alembic_config(connection), "0002")
        assert "topology" not in {c["name"] for c in inspect(engine).get_columns("tasks")}
        with engine.begin() as connection:
            command.downgrade(alembic_config(connection), "0001")
        names = set(inspect(engine).get_table_names())
        assert "eval_runs" not in names and "eval_case_results" not in names
    finally:
        engine.dispose()
    with Ledger(url) as ledger:
        ledger.upgrade()
        assert ledger.get_task(task_id, project_id=LOCAL_PROJECT_ID) is not None
        assert ledger.eval_runs() == []


def _rows(
    url: str,
    tables: set[str],
    rename: dict[str, str] | None = None,
    leave_out: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Every row of ``tables``, as sorted JSON text per table, columns by name; ``rename``
    maps old table and column names to today's (a ledger taken back to an older revision);
    columns named in ``leave_out`` (added by a later revision) are not compared."""
    rename = rename or {}
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return {
                rename.get(table, table): sorted(
                    json.dumps(
                        {
                            rename.get(k, k): str(v)
                            for k, v in row._mapping.items()
                            if k not in leave_out
                        },
                        sort_keys=True,
                    )
                    for row in connection.execute(text(f"SELECT * FROM {table}"))
                )
                for table in tables
            }
    finally:
        engine.dispose()


def test_usage_records_migration_keeps_each_roles_totals(url: str) -> None:
    """0011 turns a usage row's totals into one record, so that a record added later adds
    to them; downgraded, the row lists its records' ids as ``visits`` again."""
    from relaygraph.store._migrate import downgrade_engine, upgrade_engine

    with Ledger(url) as ledger:
        ledger.upgrade()
        task, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="old")
    engine = create_engine(url)
    try:
        downgrade_engine(engine, "0010")
        with engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO usage (task_id, agent, model_calls, tool_calls, input_tokens, "
                    "output_tokens, cost_usd, seconds, estimated, visits, updated_at) VALUES "
                    "(:id, 'coder', 2, 1, 100, 10, 0.5, 1.5, :yes, :visits, :now)"
                ),
                {
                    "id": task.id,
                    "now": datetime.now(UTC),
                    "yes": True,
                    "visits": json.dumps(["coder:a"]),
                },
            )
        upgrade_engine(engine)
    finally:
        engine.dispose()
    with Ledger(url) as ledger:
        (kept,) = ledger.usage(task.id)
        assert (kept.model_calls, kept.input_tokens, kept.cost_usd, kept.estimated) == (
            2,
            100,
            0.5,
            True,
        )
        ledger.record_usage(
            task.id, [{"id": "coder:b", "agent": "coder", "model_calls": 1, "input_tokens": 7}]
        )
        (added,) = ledger.usage(task.id)
        assert (added.model_calls, added.input_tokens, added.tool_calls) == (3, 107, 1)
        # Sent again, the record replaces itself.
        ledger.record_usage(
            task.id, [{"id": "coder:b", "agent": "coder", "model_calls": 1, "input_tokens": 9}]
        )
        assert ledger.usage(task.id)[0].input_tokens == 109
    engine = create_engine(url)
    try:
        downgrade_engine(engine, "0010")
        with engine.connect() as connection:
            visits = connection.execute(text("SELECT visits FROM usage")).scalar_one()
        if isinstance(visits, str):
            visits = json.loads(visits)
        assert visits == ["coder:b", "coder:before-0011"]
    finally:
        engine.dispose()


def test_team_definition_migration_keeps_registered_versions(url: str) -> None:
    """0013 stores a registered team's definition as JSON text (``json`` on PostgreSQL, in
    place of ``jsonb``): a version stored before it keeps its row, in the order the ledger
    held it, and the same file pushed again is a new version when that order lost the
    agents' own (PostgreSQL), no change when it did not (SQLite)."""
    from relaygraph.store._migrate import downgrade_engine, upgrade_engine

    with Ledger(url) as ledger:
        ledger.upgrade()
        project, _ = ledger.create_project("research")
    engine = create_engine(url)
    try:
        downgrade_engine(engine, "0012")
        with engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO team_versions (project_id, name, version, definition, digest, "
                    "created_at) VALUES (:project, 'docs-review', 1, :definition, "
                    "'sha256:pushed', :now)"
                ),
                {
                    "project": project.id,
                    "definition": json.dumps(ORDERED_AGENTS),
                    "now": datetime.now(UTC),
                },
            )
        upgrade_engine(engine)
        (column,) = [
            c for c in inspect(engine).get_columns("team_versions") if c["name"] == "definition"
        ]
        assert type(column["type"]).__name__ == "JSON"
    finally:
        engine.dispose()
    postgres = url.startswith("postgresql")
    stored_order = (
        ["writer", "reviewer", "researcher"] if postgres else list(ORDERED_AGENTS["agents"])
    )
    with Ledger(url) as ledger:
        old = ledger.team_version(project.id, "docs-review")
        assert old is not None and (old.version, old.digest) == (1, "sha256:pushed")
        assert list(old.definition["agents"]) == stored_order
        assert old.definition["agents"]["reviewer"]["handoffs"] == ["writer"]
        again, created = ledger.register_team(
            project.id, "docs-review", definition=ORDERED_AGENTS, digest="sha256:pushed"
        )
        assert created is postgres and again.version == (2 if postgres else 1)
        assert list(again.definition["agents"]) == ["researcher", "writer", "reviewer"]
    engine = create_engine(url)
    try:
        downgrade_engine(engine, "0012")
        with engine.connect() as connection:
            kept = connection.execute(text("SELECT count(*) FROM team_versions")).scalar_one()
        assert kept == (2 if postgres else 1)
    finally:
        engine.dispose()


def test_projects_migration_keeps_every_row_both_ways(
    url: str, relay_run: tuple[list[dict[str, Any]], RunResult], approval_run: Paused
) -> None:
    """0007 renames the tenant (``teams`` to ``projects``, ``team_id`` to ``project_id``)
    on a ledger full of rows, and back: no row is lost or changed either way (on SQLite
    the copy of ``tasks`` keeps every event, handoff, tool call, approval and usage row)."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from relaygraph.store._migrate import VERSION_TABLE, downgrade_engine, upgrade_engine
    from relaygraph.store._models import Base

    events, result = relay_run
    with Ledger(url) as ledger:
        ledger.upgrade()
        project, key = ledger.create_project("research")
        ledger.create_api_key(project.id)
        task, _ = ledger.create_task(
            project_id=project.id,
            input="x",
            thread_id="t-1",
            idempotency_key="k-1",
            models=result.models,
            team={"name": "docs-review", "version": 2, "digest": "sha256:ab", "source": None},
        )
        ledger.append_events(task.id, events)
        paused, _ = ledger.create_task(project_id=project.id, input="y")
        ledger.append_events(paused.id, approval_run.before)
        run_id = ledger.record_eval_run(
            golden="g", models={}, options={}, case_count=1, run_count=1
        )
        ledger.record_eval_case(
            run_id, case_id="a", trial=1, passed=True, checks=[], task_id=task.id
        )
    # Registered teams (0008), the tool journal (0009) and the workers' slots (0014) came
    # later.
    at_0006 = TABLES - {"team_versions", "tool_journal", "worker_slots"}
    # The worker mode's dispatch counts (0010) are columns 0006 has not; usage rows hold
    # their records since 0011 (the record ids before); projects their quotas since 0012;
    # tasks say what they replay since 0015.
    later = frozenset(
        {"dispatch", "dispatch_attempts", "records", "visits"}
        | {"max_running", "max_queued", "daily_cost_usd"}
        | {"replay_of", "from_step"}
    )
    before = _rows(url, at_0006, leave_out=later)
    assert all(before.values())  # Every table holds rows.
    old = {"teams": "projects", "team_id": "project_id"}
    engine = create_engine(url)
    try:
        downgrade_engine(engine, "0006")
        assert set(inspect(engine).get_table_names()) == at_0006 - {"projects"} | {
            "teams",
            VERSION_TABLE,
        }
        for table in ("api_keys", "tasks"):
            assert "team_id" in {c["name"] for c in inspect(engine).get_columns(table)}
        assert _rows(url, at_0006 - {"projects"} | {"teams"}, old, later) == before
        upgrade_engine(engine)
        assert _rows(url, at_0006, leave_out=later) == before
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection, opts={"compare_type": True, "version_table": VERSION_TABLE}
            )
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()
    with Ledger(url) as ledger:
        assert ledger.authenticate(key) == project
        again, created = ledger.create_task(
            project_id=project.id,
            input="x",
            thread_id="t-1",
            idempotency_key="k-1",
            models=result.models,
            team={"name": "docs-review", "version": 2, "digest": "sha256:ab", "source": None},
        )
        assert (
            not created and again.id == task.id and again.checkpoint_thread == f"{project.id}/t-1"
        )
        assert len(ledger.handoffs(task.id)) == 3 and ledger.approvals(paused.id)
        assert ledger.usage_for_project(project.id)["tasks"] == 2


def test_a_migration_that_copies_tasks_keeps_their_events(url: str) -> None:
    """SQLite changes a table by copying it: with foreign keys on, dropping the old
    ``tasks`` would cascade to every event (0005 copies it)."""
    with Ledger(url) as ledger:
        ledger.upgrade("0004")
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(
                text(
                    # Revision 0004's column for the project (renamed in 0007).
                    "INSERT INTO tasks (id, team_id, input, status, models, thread_id, "
                    "metadata, last_event_seq, created_at, updated_at) VALUES ('t', 'local', "
                    "'x', 'succeeded', '{}', 'th', '{}', 1, :now, :now)"
                ),
                {"now": datetime.now(UTC)},
            )
            connection.execute(
                text(
                    "INSERT INTO events (task_id, seq, type, data, created_at) "
                    "VALUES ('t', 1, 'final', '{\"type\": \"final\"}', :now)"
                ),
                {"now": datetime.now(UTC)},
            )
    finally:
        engine.dispose()
    with Ledger(url) as ledger:
        ledger.upgrade()
        assert [e.type for e in ledger.events_after("t")] == ["final"]


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
