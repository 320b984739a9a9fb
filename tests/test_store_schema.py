"""The ledger's schema, its database settings and its migrations, on SQLite and on PostgreSQL.

Every test that takes ``ledger`` or ``url`` runs on each backend (``tests/_store.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, inspect, text
from sqlalchemy.exc import SQLAlchemyError

from relaygraph.errors import ConfigError
from relaygraph.runner import RunResult
from relaygraph.store import DATABASE_URL_ENV, LOCAL_PROJECT_ID, Ledger, database_url, upgrade
from tests._store import ORDERED_AGENTS, TABLES, Paused

pytest_plugins = ["tests._store_runs"]


@contextmanager
def engine_at(url: str, revision: str) -> Iterator[Engine]:
    """An engine on the ledger at ``url``, downgraded to ``revision`` first; disposed after."""
    from relaygraph.store._migrate import downgrade_engine

    engine = create_engine(url)
    try:
        downgrade_engine(engine, revision)
        yield engine
    finally:
        engine.dispose()


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


def _insert_task_before_0007(
    connection: Connection, task_id: str, *, input: str, thread_id: str, last_event_seq: int
) -> None:
    """Insert a succeeded task of the local project as revisions before 0007 had them (the
    ORM writes today's columns)."""
    connection.execute(
        text(
            # The column for the project before 0007 renamed it.
            "INSERT INTO tasks (id, team_id, input, status, models, thread_id, "
            "metadata, last_event_seq, created_at, updated_at) VALUES (:id, :project, "
            ":input, 'succeeded', '{}', :thread_id, '{}', :last_event_seq, :now, :now)"
        ),
        {
            "id": task_id,
            "project": LOCAL_PROJECT_ID,
            "input": input,
            "thread_id": thread_id,
            "last_event_seq": last_event_seq,
            "now": datetime.now(UTC),
        },
    )


def _task_at_0001(url: str) -> str:
    """Insert a task as revision 0001 had them."""
    task_id = "00000000-0000-0000-0000-000000000001"
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            _insert_task_before_0007(
                connection, task_id, input="kept", thread_id="thread-old", last_event_seq=0
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
    from relaygraph.store._migrate import upgrade_engine

    with Ledger(url) as ledger:
        ledger.upgrade()
        task, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="old")
    with engine_at(url, "0010") as engine:
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
    with engine_at(url, "0010") as engine:
        with engine.connect() as connection:
            visits = connection.execute(text("SELECT visits FROM usage")).scalar_one()
        if isinstance(visits, str):
            visits = json.loads(visits)
        assert visits == ["coder:b", "coder:before-0011"]


def test_team_definition_migration_keeps_registered_versions(url: str) -> None:
    """0013 stores a registered team's definition as JSON text (``json`` on PostgreSQL, in
    place of ``jsonb``): a version stored before it keeps its row, in the order the ledger
    held it, and the same file pushed again is a new version when that order lost the
    agents' own (PostgreSQL), no change when it did not (SQLite)."""
    from relaygraph.store._migrate import upgrade_engine

    with Ledger(url) as ledger:
        ledger.upgrade()
        project, _ = ledger.create_project("research")
    with engine_at(url, "0012") as engine:
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
    with engine_at(url, "0012") as engine:
        with engine.connect() as connection:
            kept = connection.execute(text("SELECT count(*) FROM team_versions")).scalar_one()
        assert kept == (2 if postgres else 1)


def test_projects_migration_keeps_every_row_both_ways(
    url: str, relay_run: tuple[list[dict[str, Any]], RunResult], approval_run: Paused
) -> None:
    """0007 renames the tenant (``teams`` to ``projects``, ``team_id`` to ``project_id``)
    on a ledger full of rows, and back: no row is lost or changed either way (on SQLite
    the copy of ``tasks`` keeps every event, handoff, tool call, approval and usage row)."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from relaygraph.store._migrate import VERSION_TABLE, upgrade_engine
    from relaygraph.store._models import Base

    events, result = relay_run
    with Ledger(url) as ledger:
        ledger.upgrade()
        project, key = ledger.create_project("research")
        ledger.create_api_key(project.id)
        # Sent again after the migrations below, the same request is the same task.
        request: dict[str, Any] = {
            "project_id": project.id,
            "input": "x",
            "thread_id": "t-1",
            "idempotency_key": "k-1",
            "models": result.models,
            "team": {"name": "docs-review", "version": 2, "digest": "sha256:ab", "source": None},
        }
        task, _ = ledger.create_task(**request)
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
    with engine_at(url, "0006") as engine:
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
    with Ledger(url) as ledger:
        assert ledger.authenticate(key) == project
        again, created = ledger.create_task(**request)
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
            _insert_task_before_0007(connection, "t", input="x", thread_id="th", last_event_seq=1)
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
