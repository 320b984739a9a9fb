"""What the ledger's tests share (``tests/test_store_*.py``).

Every test that takes ``ledger`` or ``url`` (``tests/conftest.py``) runs twice: on a fresh
SQLite file, and in a fresh schema of the PostgreSQL database ``test`` on 127.0.0.1:5432
(dropped afterwards, so parallel runs never meet). Without a reachable server the PostgreSQL
half is skipped, or fails loudly when ``RELAYGRAPH_REQUIRE_POSTGRES=1`` (as CI sets it).

The runs of the scripted team whose events several tests record are session fixtures in
``tests/_store_runs.py``, which a test module takes with
``pytest_plugins = ["tests._store_runs"]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import create_engine, text

from relaygraph.runner import RunResult
from relaygraph.store import LOCAL_PROJECT_ID, Ledger
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


@dataclass(frozen=True)
class Paused:
    before: list[dict[str, Any]]
    paused: RunResult
    after: list[dict[str, Any]]
    finished: RunResult


def recorded_task(ledger: Ledger, result: RunResult) -> str:
    task, _ = ledger.create_task(
        project_id=LOCAL_PROJECT_ID, input="x", thread_id=result.thread_id, models=result.models
    )
    return task.id
