"""What a run costs the ledger, in statements: the hot path (a task recorded under its
runner's lease, its events in batches, the tool journal, the run's end) stays a few
statements per batch, on SQLite and PostgreSQL, and what it writes stays right."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from relaygraph.errors import ConfigError
from relaygraph.events import Usage
from relaygraph.runner import run_task
from relaygraph.store import LOCAL_PROJECT_ID, Ledger, RecordNotFound
from tests.conftest import EXAMPLE_RELAY


@contextmanager
def statements(ledger: Ledger) -> Iterator[list[str]]:
    """Every statement the ledger sends while in the block, BEGIN and COMMIT aside."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.split()[0] not in ("BEGIN", "COMMIT"):
            seen.append(" ".join(statement.split()))

    engines = {ledger.core.engine, ledger.core.write_engine}
    for engine in engines:
        event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        for engine in engines:
            event.remove(engine, "before_cursor_execute", record)


def usage(agent: str, record_id: str, tokens: int) -> dict[str, Any]:
    return dict(
        Usage(
            id=record_id,
            agent=agent,
            turn=1,
            model_calls=1,
            tool_calls=0,
            input_tokens=tokens,
            output_tokens=1,
            cost_usd=0.0,
            seconds=0.5,
            estimated=False,
        )
    )


def test_a_task_recorded_under_a_lease_is_held_and_counted_once(ledger: Ledger) -> None:
    task, created = ledger.create_task(
        project_id=LOCAL_PROJECT_ID, input="x", runner_id="runner-a", lease_seconds=30
    )
    assert created
    assert (task.status, task.attempts) == ("running", 1)
    assert task.started_at is not None
    assert ledger.get_task(task.id, project_id=LOCAL_PROJECT_ID) == task
    holder, until = ledger.lease_of(task.id)
    assert holder == "runner-a" and until is not None and until > task.started_at
    # Another runner cannot take it; its own runner taking it again counts no attempt.
    assert ledger.take_lease(task.id, "runner-b", seconds=30) is None
    again = ledger.take_lease(task.id, "runner-a", seconds=30)
    assert again is not None and again.attempts == 1
    with pytest.raises(ConfigError, match="runner_id and lease_seconds together"):
        ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x", runner_id="runner-a")


def test_an_earlier_try_of_a_leased_task_comes_back_as_it_is(ledger: Ledger) -> None:
    first, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x", idempotency_key="k")
    again, created = ledger.create_task(
        project_id=LOCAL_PROJECT_ID,
        input="x",
        idempotency_key="k",
        runner_id="runner-a",
        lease_seconds=30,
    )
    assert not created and again == first and again.status == "queued"
    assert ledger.lease_of(first.id) == (None, None)


def test_a_batch_reads_and_writes_its_usage_rows_once(ledger: Ledger) -> None:
    task, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x")
    ledger.append_event(task.id, {"type": "usage", "usage": usage("supervisor", "s1", 10)})
    batch = [
        {"type": "usage", "usage": usage("supervisor", "s2", 20)},
        {"type": "agent_finished", "agent": "researcher", "usage": usage("researcher", "r1", 5)},
        {"type": "usage", "usage": usage("supervisor", "s3", 30)},
        # Sent again (the node re-ran): replaces its record.
        {"type": "usage", "usage": usage("supervisor", "s2", 25)},
    ]
    with statements(ledger) as seen:
        ledger.append_events(task.id, batch)
    usage_statements = [s for s in seen if " usage" in s.split(" WHERE")[0]]
    # One read of every role's row, one insert of the new row, one update of the other.
    assert len(usage_statements) == 3, usage_statements
    rows = {row.agent: row for row in ledger.usage(task.id)}
    assert rows["supervisor"].input_tokens == 10 + 25 + 30
    assert rows["supervisor"].model_calls == 3
    assert rows["supervisor"].seconds == 1.5
    assert rows["researcher"].input_tokens == 5


def test_a_tool_call_and_its_result_in_one_batch_read_the_call_once(ledger: Ledger) -> None:
    task, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x")
    call = {"agent": "coder", "tool": "run_python", "tool_call_id": "call-1"}
    batch = [
        {"type": "tool_call", **call, "args": {"code": "1"}},
        {"type": "tool_result", **call, "status": "success", "preview": "1"},
    ]
    with statements(ledger) as seen:
        ledger.append_events(task.id, batch)
    reads = [s for s in seen if s.startswith("SELECT") and "tool_calls" in s]
    assert len(reads) == 1, reads
    (row,) = ledger.tool_calls(task.id)
    assert (row.tool_call_id, row.status, row.result_preview) == ("call-1", "success", "1")
    # The same call and result again in a later batch (a replay after a crash): one row.
    ledger.append_events(task.id, batch)
    assert len(ledger.tool_calls(task.id)) == 1


def test_an_unfenced_journal_record_needs_no_read_of_the_task(ledger: Ledger) -> None:
    task, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x")
    with statements(ledger) as seen:
        ledger.journal_call(task.id, "call-1", {"result": 1})
    assert not [s for s in seen if "FROM tasks" in s], seen
    assert ledger.journal_call(task.id, "call-1", {"result": 2}) == {"result": 1}
    with pytest.raises(RecordNotFound):
        ledger.journal_call("no-such-task", "call-1", {"result": 1})


def test_the_ledgers_engines_dispatch_no_connection_events(tmp_path: Path) -> None:
    """A connection event listener (a "begin" listener for SQLite's BEGIN, say) makes every
    statement dispatch every event, on the ledger's hot path."""
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    try:
        ledger.upgrade()
        assert not ledger.core.engine._has_events and not ledger.core.write_engine._has_events
        # Writes still take SQLite's write lock when they begin; reads do not.
        other = sqlite3.connect(tmp_path / "ledger.sqlite", timeout=0, isolation_level=None)
        try:
            with ledger.core.engine.begin():
                other.execute("BEGIN IMMEDIATE")
                other.execute("ROLLBACK")
            with (
                ledger.core.write_engine.begin(),
                pytest.raises(sqlite3.OperationalError, match="locked"),
            ):
                other.execute("BEGIN IMMEDIATE")
        finally:
            other.close()
    finally:
        ledger.close()


def never_called(monkeypatch: pytest.MonkeyPatch, method: str, why: str) -> None:
    """Make ``Ledger.<method>`` fail the test, saying ``why``, if anything calls it."""

    def called(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(why)

    monkeypatch.setattr(Ledger, method, called)


def test_run_task_records_its_task_under_its_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    never_called(monkeypatch, "take_lease", "run_task took a lease after recording its task")
    with relay_run(tmp_path) as (ledger, task):
        assert task.status == "succeeded"
        # The run ended on its own: its lease is given up and its attempts start over.
        assert ledger.lease_of(task.id) == (None, None) and task.attempts == 0


@contextmanager
def relay_run(home: Path) -> Iterator[tuple[Ledger, Any]]:
    """Run the shipped relay example with ``run_task``; its ledger and finished task."""
    result = run_task("x", model=f"scripted:{EXAMPLE_RELAY}", home=home)
    assert result.status == "succeeded", result
    ledger = Ledger(f"sqlite:///{home / 'ledger.sqlite'}")
    try:
        task = ledger.get_task(result.task_id, project_id=LOCAL_PROJECT_ID)
        assert task is not None
        yield ledger, task
    finally:
        ledger.close()


@contextmanager
def every_statement() -> Iterator[list[str]]:
    """Every statement any engine of the process sends while in the block (the run's ledger
    is the process's own)."""
    from sqlalchemy.engine import Engine

    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(" ".join(statement.split()))

    event.listen(Engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", record)


def test_a_run_that_starts_its_task_reads_no_tool_journal(tmp_path: Path) -> None:
    """A run from the request knows the ledger has no record of its calls: it writes one
    per completed call and reads none (a step re-run after a crash is a continued run,
    which reads them: tests/test_tool_journal.py)."""
    with every_statement() as seen, relay_run(tmp_path) as (ledger, task):
        reads = [s for s in seen if s.startswith("SELECT") and "FROM tool_journal" in s]
        writes = [s for s in seen if s.startswith("INSERT INTO tool_journal")]
        assert reads == []
        calls = [c for c in ledger.tool_calls(task.id) if c.status == "success"]
        work = [c for c in calls if not c.tool.startswith("transfer_to_")]
        assert work and len(writes) == len(work), (writes, work)


def test_a_runs_last_events_and_its_end_commit_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    never_called(monkeypatch, "end_run", "the run's end was written apart from its last events")
    with relay_run(tmp_path) as (ledger, task):
        assert (task.status, task.attempts) == ("succeeded", 0)
        assert task.answer
        assert ledger.lease_of(task.id) == (None, None)
        assert ledger.events_after(task.id)[-1].type == "run_finished"
        # What the visits spent is recorded with the end.
        assert {u.agent for u in ledger.usage(task.id)} >= {"supervisor", "researcher"}


def test_an_end_with_the_last_batch_is_refused_with_it(ledger: Ledger) -> None:
    """A bad end (an unknown status) writes neither the end nor the batch's events."""
    from relaygraph.store import RunEnd

    task, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x")
    with pytest.raises(ConfigError, match="'done'"):
        ledger.append_events(task.id, [{"type": "log"}], end=RunEnd(status="done"))
    assert ledger.events_after(task.id) == []
    ledger.append_events(task.id, [{"type": "log"}], end=RunEnd(status="succeeded", answer="a"))
    done = ledger.get_task(task.id, project_id=LOCAL_PROJECT_ID)
    assert done is not None and (done.status, done.answer, done.last_event_seq) == (
        "succeeded",
        "a",
        1,
    )
