"""The OpenAI path end to end: ChatOpenAI over HTTP to a local Chat Completions server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from relaygraph.run import run_task

from .conftest import EXAMPLE_RELAY
from .openai_server import serve_script

ROLES = ("supervisor", "researcher", "coder", "writer", "finalize")


@pytest.fixture
def openai_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")


@pytest.mark.parametrize("stream_tokens", [False, True])
def test_team_runs_on_chat_completions_over_http(
    home: Path, openai_env: None, monkeypatch: pytest.MonkeyPatch, stream_tokens: bool
) -> None:
    script = json.loads(EXAMPLE_RELAY.read_text())
    events: list[dict[str, Any]] = []
    with serve_script(script) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        result = run_task(
            "When are checkpoints written?",
            agent_models={role: f"openai:script-{role}" for role in ROLES},
            on_event=events.append,
            stream_tokens=stream_tokens,
        )
        requests = list(server.requests)
    assert result.status == "succeeded", result.stop_reason
    assert result.agents_run == ["researcher", "coder", "writer"]
    assert [h["kind"] for h in result.handoffs] == ["route", "direct", "route"]
    assert result.artifacts == ["report.md"]
    assert "41 checkpoints" in (result.answer or "")
    # The supervisor asked for structured output with a JSON schema of the route.
    routes = [r for r in requests if r["model"] == "script-supervisor"]
    schema = routes[0]["response_format"]["json_schema"]["schema"]
    # FINISH becomes a choice only once an agent has worked on the request.
    assert schema["properties"]["next"]["enum"] == ["researcher", "coder", "writer"]
    later = routes[-1]["response_format"]["json_schema"]["schema"]
    assert later["properties"]["next"]["enum"] == ["researcher", "coder", "writer", "FINISH"]
    # Agents were offered their tools and their handoff tools.
    researcher = next(r for r in requests if r["model"] == "script-researcher")
    offered = {t["function"]["name"] for t in researcher["tools"]}
    assert {"search_docs", "read_doc", "transfer_to_coder", "transfer_to_writer"} <= offered
    # Usage came from the server's usage block (the script gives exact numbers here).
    assert result.usage["researcher"]["output_tokens"] >= 40
    if stream_tokens:
        assert any(r.get("stream") for r in requests)
        tokens = "".join(
            e["text"] for e in events if e["type"] == "token" and e["role"] == "finalize"
        )
        assert "41 checkpoints" in tokens


def test_openai_route_that_breaks_the_schema_is_repaired(
    home: Path, openai_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = {
        "supervisor": [
            {"content": "I think the writer should go"},  # not JSON at all
            {"route": {"next": "writer", "task": "write", "reason": "r"}},
            {"route": {"next": "FINISH", "task": "", "reason": "done"}},
        ],
        "writer": [{"content": "written"}],
        "finalize": [{"content": "final"}],
    }
    with serve_script(script) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        events: list[dict[str, Any]] = []
        result = run_task(
            "go",
            agent_models={r: f"openai:script-{r}" for r in ("supervisor", "writer", "finalize")},
            model="openai:script-researcher",
            on_event=events.append,
        )
        repair = [r for r in server.requests if r["model"] == "script-supervisor"][1]
    assert result.status == "succeeded", result.stop_reason
    assert result.agents_run == ["writer"]
    assert next(e for e in events if e["type"] == "route")["repaired"] is True
    # The repair prompt quotes the error to the model.
    assert "not a valid route" in json.dumps(repair["messages"])


def test_tool_supervisor_over_http_asks_for_one_transfer_at_a_time(
    home: Path, openai_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """langgraph-supervisor loses agents when a model sends parallel transfers (its #230):
    the tool-calling supervisor's requests turn parallel tool calls off."""
    from relaygraph.topology import Topology

    script = json.loads((EXAMPLE_RELAY.parent / "tools-relay.json").read_text())
    with serve_script(script) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        result = run_task(
            "When are checkpoints written? Write a report.",
            agent_models={r: f"openai:script-{r}" for r in ("supervisor", "researcher", "writer")},
            model="openai:script-coder",
            topology=Topology.parse("supervisor-tools"),
        )
        requests = list(server.requests)
    assert result.status == "succeeded", result.stop_reason
    assert result.agents_run == ["researcher", "writer"]
    routes = [r for r in requests if r["model"] == "script-supervisor"]
    assert len(routes) == 3
    for request in routes:
        assert request["parallel_tool_calls"] is False
        offered = {t["function"]["name"] for t in request["tools"]}
        assert {"transfer_to_researcher", "transfer_to_coder", "transfer_to_writer"} <= offered
