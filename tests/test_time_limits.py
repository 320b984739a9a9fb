"""A task's ``max_seconds`` bounds its wall time, whatever the model server does.

Before, the limit was checked only before each call: one call to a server that hangs took
the request timeout (600 s by default) times its attempts, and a task ran far past a limit
of seconds. Now a call in flight gets what the limit leaves as its deadline, its retries fit
inside it, and the task stops as the policy says. The servers here hang much longer than the
limit, so a run that ends at all near it shows the bound, with a generous margin for a
loaded machine.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from relaygraph.runner import run_task

from ._scripts import one_visit, say
from .openai_server import Faults, quick_retries, serve_script

LIMIT = 3.0
STALL = 90.0
"""How long the hung server holds each request: far past the limit."""
MARGIN = 45.0
"""How long past the limit a run may end here: a loaded machine's slack, well below STALL."""

SCRIPT = one_visit("researcher", "look it up", "facts", say("Found it."), final="Found it.")
ROLES = ("supervisor", "researcher", "coder", "writer", "finalize")


@pytest.fixture(autouse=True)
def _http(monkeypatch: pytest.MonkeyPatch) -> None:
    quick_retries(monkeypatch)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")


def policy(tmp_path: Path) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(f"[team]\nmax_seconds = {LIMIT}\n", encoding="utf-8")
    return path


def run_against(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, faults: Faults
) -> tuple[Any, float]:
    with serve_script(SCRIPT, faults=faults) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        started = time.monotonic()
        result = run_task(
            "When are checkpoints written?",
            agent_models={role: f"openai:script-{role}?timeout=600" for role in ROLES},
            policy=policy(tmp_path),
        )
        return result, time.monotonic() - started


@pytest.mark.parametrize("hung", ["supervisor", "researcher"])
def test_a_hung_server_holds_a_task_no_longer_than_its_max_seconds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hung: str
) -> None:
    faults = Faults(
        sequence=["timeout"] * 10, stall_seconds=STALL, models=frozenset({f"script-{hung}"})
    )
    result, took = run_against(tmp_path, monkeypatch, faults)
    assert took < LIMIT + MARGIN, (took, result.stop_reason)
    assert result.status in ("degraded", "failed")
    assert result.status != "succeeded"
    assert result.stop_reason is not None
    assert "max_seconds" in result.stop_reason, result.stop_reason


def test_a_retry_after_past_the_limit_is_not_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults = Faults(sequence=["429"] * 10, retry_after=STALL / 3)
    result, took = run_against(tmp_path, monkeypatch, faults)
    assert took < LIMIT + MARGIN, (took, result.stop_reason)
    assert result.status != "succeeded"
