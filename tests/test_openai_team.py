"""The OpenAI path end to end: ChatOpenAI over HTTP to a local Chat Completions server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from relaygraph.runner import RunResult, run_task

from .conftest import EXAMPLE_RELAY
from .openai_server import (
    LLAMA_CPP_PYTHON,
    OLLAMA,
    OPENAI,
    STRICT_FIELDS,
    VLLM_NO_TOOL_PARSER,
    ServerProfile,
    serve_script,
)

ROLES = ("supervisor", "researcher", "coder", "writer", "finalize")


@pytest.fixture
def openai_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")


def _specs(roles: tuple[str, ...], options: str = "") -> dict[str, str]:
    return {role: f"openai:script-{role}{options}" for role in roles}


def tools_relay(
    monkeypatch: pytest.MonkeyPatch, **kwargs: Any
) -> tuple[RunResult, list[dict[str, Any]], list[dict[str, Any]]]:
    """The tool-calling supervisor's relay (``tools-relay.json``) over HTTP
    (:func:`served_run`)."""
    from relaygraph.topology import Topology

    return served_run(
        monkeypatch,
        {r: f"openai:script-{r}" for r in ("supervisor", "researcher", "writer")},
        script=EXAMPLE_RELAY.parent / "tools-relay.json",
        task="When are checkpoints written? Write a report.",
        model="openai:script-coder",
        topology=Topology.parse("supervisor-tools"),
        **kwargs,
    )


def served_run(
    monkeypatch: pytest.MonkeyPatch,
    specs: dict[str, str],
    *,
    profile: ServerProfile = OPENAI,
    script: Path = EXAMPLE_RELAY,
    task: str = "When are checkpoints written?",
    **kwargs: Any,
) -> tuple[RunResult, list[dict[str, Any]], list[dict[str, Any]]]:
    """``task`` run with each role on its model of ``specs`` (and ``kwargs``) against the
    local server playing ``script`` as ``profile``'s server would: the result, its events
    and every request body the server got."""
    events: list[dict[str, Any]] = []
    with serve_script(json.loads(script.read_text()), profile=profile) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        result = run_task(task, agent_models=specs, on_event=events.append, **kwargs)
        return result, events, list(server.requests)


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
        # The writer's reply is the answer (finalize calls no model): its tokens stream.
        tokens = "".join(
            e["text"] for e in events if e["type"] == "token" and e["role"] == "writer"
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
    # The repair prompt quotes the error to the model: the reply is not JSON, not a route
    # that lacks a field.
    said = repair["messages"][-1]["content"]
    assert "not a valid route" in said and "Field required" not in said
    assert "I think the writer should go" in said


def test_tool_supervisor_over_http_asks_for_one_transfer_at_a_time(
    home: Path, openai_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """langgraph-supervisor loses agents when a model sends parallel transfers (its #230):
    the tool-calling supervisor's requests turn parallel tool calls off."""

    result, _, requests = tools_relay(monkeypatch)
    assert result.status == "succeeded", result.stop_reason
    assert result.agents_run == ["researcher", "writer"]
    routes = [r for r in requests if r["model"] == "script-supervisor"]
    assert len(routes) == 3
    for request in routes:
        assert request["parallel_tool_calls"] is False
        offered = {t["function"]["name"] for t in request["tools"]}
        assert {"transfer_to_researcher", "transfer_to_coder", "transfer_to_writer"} <= offered


def test_tool_supervisor_tokens_are_labelled_supervisor(
    home: Path, openai_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its model runs in langgraph-supervisor's node ``agent``; its tokens are the
    supervisor's."""

    result, events, _ = tools_relay(monkeypatch, stream_tokens=True)
    assert result.status == "succeeded", result.stop_reason
    tokens = [e for e in events if e["type"] == "token"]
    roles = {e["role"] for e in tokens}
    assert "agent" not in roles, roles
    said = "".join(e["text"] for e in tokens if e["role"] == "supervisor")
    assert "LangGraph writes a checkpoint after every super-step" in said
    assert roles <= {"supervisor", "researcher", "writer", "finalize"}, roles


# -- the team on other servers' behaviour (tests/openai_server.py profiles) ------------------


@pytest.mark.parametrize(
    ("profile", "options"),
    [
        pytest.param(OPENAI, "", id="openai"),
        # llama-cpp-python: no json_schema (auto finds function calling), no null content.
        pytest.param(LLAMA_CPP_PYTHON, "?tool_call_content=empty", id="llama-cpp-python"),
        pytest.param(OLLAMA, "", id="ollama"),
    ],
)
def test_structured_team_on_each_server(
    home: Path,
    openai_env: None,
    monkeypatch: pytest.MonkeyPatch,
    profile: ServerProfile,
    options: str,
) -> None:
    result, events, requests = served_run(
        monkeypatch, profile=profile, specs=_specs(ROLES, options)
    )
    assert result.status == "succeeded", result.stop_reason
    assert result.agents_run == ["researcher", "coder", "writer"]
    assert [h["kind"] for h in result.handoffs] == ["route", "direct", "route"]
    assert [e["next"] for e in events if e["type"] == "route"] == [
        "researcher",
        "writer",
        "FINISH",
    ]
    assert result.artifacts == ["report.md"]
    assert not [e for e in events if e["type"] in ("model_error", "model_retry")]
    routes = [r for r in requests if r["model"] == "script-supervisor"]
    learned = [e for e in events if e["type"] == "structured_method"]
    if profile is LLAMA_CPP_PYTHON:
        # One json_schema request was refused; every later route came by function calling.
        assert routes[0]["response_format"]["type"] == "json_schema"
        assert all(r["tool_choice"]["function"]["name"] == "Route" for r in routes[1:])
        assert [e["method"] for e in learned] == ["function_calling"]
        assert all(
            m["content"] == ""
            for r in requests
            for m in r["messages"]
            if m["role"] == "assistant" and m.get("tool_calls")
        )
    else:
        assert all(r["response_format"]["type"] == "json_schema" for r in routes)
        assert learned == []


@pytest.mark.parametrize(
    ("profile", "options", "error"),
    [
        pytest.param(
            LLAMA_CPP_PYTHON,
            "",
            "HTTP 500: messages.2.ChatCompletionRequestAssistantMessage.content: Input should "
            "be a valid string",
            id="llama-cpp-python-null-content",
        ),
        pytest.param(
            VLLM_NO_TOOL_PARSER,
            "",
            'HTTP 400: "auto" tool choice requires --enable-auto-tool-choice and '
            "--tool-call-parser to be set",
            id="vllm-no-tool-parser",
        ),
    ],
)
def test_an_agents_failed_call_is_reported_with_the_servers_words(
    home: Path,
    openai_env: None,
    monkeypatch: pytest.MonkeyPatch,
    profile: ServerProfile,
    options: str,
    error: str,
) -> None:
    result, events, _ = served_run(monkeypatch, profile=profile, specs=_specs(ROLES, options))
    assert result.status != "succeeded"
    assert error in (result.stop_reason or "")
    failed = [e for e in events if e["type"] == "model_error"]
    assert failed[0] == {
        "type": "model_error",
        "role": "researcher",
        "model": "openai:script-researcher",
        "status": int(error.split()[1].rstrip(":")),
        "error": error.split(": ", 1)[1],
        "attempts": 1,  # a request the server refuses is not sent again
    }
    assert all(e["error"] == failed[0]["error"] for e in failed)
    # The supervisor's route was carried out before the agent's call failed.
    assert next(e["next"] for e in events if e["type"] == "route") == "researcher"


def test_the_team_goes_on_after_an_agents_failed_call(
    home: Path, openai_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The researcher's call fails (llama-cpp-python refuses content null): it is barred,
    the supervisor routes on to the writer (whose spec sends content ""), which is not
    given the failure as the researcher's result; the writer's work stands, and the task
    ends degraded, saying why. When every agent's call fails, the task failed."""
    specs = _specs(ROLES) | {"writer": "openai:script-writer?tool_call_content=empty"}
    result, events, requests = served_run(monkeypatch, profile=LLAMA_CPP_PYTHON, specs=specs)
    writer = [r for r in requests if r["model"] == "script-writer"]
    supervisor = [r for r in requests if r["model"] == "script-supervisor"]
    assert result.status == "degraded", result.stop_reason
    assert (result.stop_reason or "").startswith("model_error: researcher: HTTP 500: ")
    assert result.agents_run[:2] == ["researcher", "writer"]
    finished = [e for e in events if e["type"] == "agent_finished"]
    assert finished[0]["ended"] == "model_error"
    assert finished[0]["output"].startswith("Its model call failed: HTTP 500: ")
    assert result.answer
    # The writer is given no result of the researcher's (its failure is none); the
    # supervisor sees that the researcher's call failed.
    assert "model call failed" not in json.dumps(writer[0]["messages"]).lower()
    assert any("(no result: Its model call failed: HTTP 500" in json.dumps(r) for r in supervisor)

    failed, _, _ = served_run(monkeypatch, profile=LLAMA_CPP_PYTHON, specs=_specs(ROLES))
    assert failed.status == "failed"
    assert failed.answer is None
    assert (failed.stop_reason or "").startswith("model_error: ")


def test_tool_supervisor_on_a_server_that_rejects_parallel_tool_calls(
    home: Path, openai_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from relaygraph.topology import Topology

    script = json.loads((EXAMPLE_RELAY.parent / "tools-relay.json").read_text())
    roles = ("supervisor", "researcher", "coder", "writer")
    with serve_script(script, profile=STRICT_FIELDS) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        refused = run_task(
            "When are checkpoints written? Write a report.",
            agent_models=_specs(roles),
            topology=Topology.parse("supervisor-tools"),
        )
        assert refused.status == "failed"
        assert "Unrecognized request argument supplied: parallel_tool_calls" in (
            refused.stop_reason or ""
        )
        result = run_task(
            "When are checkpoints written? Write a report.",
            agent_models=_specs(roles, "?parallel_tool_calls=omit"),
            topology=Topology.parse("supervisor-tools"),
        )
        later = [r for r in server.requests[1:] if r["model"] == "script-supervisor"]
    assert result.status == "succeeded", result.stop_reason
    assert result.agents_run == ["researcher", "writer"]
    assert later and all("parallel_tool_calls" not in r for r in later)


def test_swarm_on_llama_cpp_python(
    home: Path, openai_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from relaygraph.topology import Topology

    script = json.loads((EXAMPLE_RELAY.parent / "swarm-relay.json").read_text())
    with serve_script(script, profile=LLAMA_CPP_PYTHON) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        result = run_task(
            "How many checkpoints does a 40-step run write? Write a report.",
            agent_models=_specs(("researcher", "coder", "writer"), "?tool_call_content=empty"),
            topology=Topology.parse("swarm"),
        )
    assert result.status == "succeeded", result.stop_reason
    assert result.agents_run == ["researcher", "coder", "writer"]
    assert [h["kind"] for h in result.handoffs] == ["direct", "direct"]
