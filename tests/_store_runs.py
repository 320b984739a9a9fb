"""The runs of the scripted team whose events the ledger's tests record, as fixtures.

A test module takes them with ``pytest_plugins = ["tests._store_runs"]`` (a module that
pytest loads as a plugin must not be imported before: ``tests/_store.py`` holds what a test
imports); each runs once per session.
"""

from __future__ import annotations

from typing import Any

import pytest

from relaygraph.runner import Decision, RunResult, resume_task, run_task
from tests._store import RELAY_SPEC, Paused


@pytest.fixture(scope="session")
def relay_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], RunResult]:
    """The events and result of the example relay (route, handoff, tools, finish)."""
    events: list[dict[str, Any]] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RELAYGRAPH_HOME", str(tmp_path_factory.mktemp("relay-home")))
        result = run_task("x", model=RELAY_SPEC, on_event=events.append)
    assert result.status == "succeeded", result
    return events, result


@pytest.fixture(scope="session")
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
