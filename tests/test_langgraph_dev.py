"""LangGraph's own tooling serves relaygraph teams: ``langgraph dev`` with the repository's
``langgraph.json``, driven by the official ``langgraph_sdk`` client over loopback.

``langgraph-cli[inmem]`` cannot share the dev venv (every langgraph-api pins
jsonschema-rs<0.45, the dev extra's schemathesis needs >=0.46), so the server runs from its
own venv: ``$RELAYGRAPH_LANGGRAPH_VENV``, else ``.venv/langgraph-server``, made by
``python -m venv .venv/langgraph-server && .venv/langgraph-server/bin/pip install -e
'.[langgraph-server]'``. The in-process tests below need neither.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from relaygraph.errors import ConfigError

from ._service import free_port, wait_answering

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
DEADLINE_SECONDS = 90
"""For the server to answer /ok (a cold start imports LangChain, LangGraph and the API)."""
RUN_SECONDS = 120
"""For one streamed run on the scripted model."""


def _server_venv() -> Path | None:
    """The venv with ``langgraph dev`` (langgraph-cli[inmem]); None when there is none."""
    named = os.environ.get("RELAYGRAPH_LANGGRAPH_VENV")
    candidates = [Path(named)] if named else [REPO / ".venv" / "langgraph-server"]
    if importlib.util.find_spec("langgraph_api") is not None:
        candidates.append(Path(sys.executable).parent.parent)
    for venv in candidates:
        if (venv / "bin" / "langgraph").exists():
            return venv
    return None


def _server_env(home: Path, **settings: str) -> dict[str, str]:
    """The server's environment: this checkout's relaygraph, no way off the machine."""
    env = {
        k: v
        for k, v in os.environ.items()
        # No key means nothing to send: LangSmith, a license check, the control plane.
        if k
        not in {
            "LANGSMITH_API_KEY",
            "LANGCHAIN_API_KEY",
            "LANGGRAPH_CLOUD_LICENSE_KEY",
            "LANGSMITH_CONTROL_PLANE_API_KEY",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "RELAYGRAPH_TEAM_FILE",
            "RELAYGRAPH_MODEL",
        }
    }
    env.update(
        {
            "RELAYGRAPH_HOME": str(home),
            "PYTHONPATH": str(REPO / "src"),
            "LANGGRAPH_CLI_NO_ANALYTICS": "1",
            "LANGGRAPH_NO_VERSION_CHECK": "true",
            "LANGSMITH_TRACING": "false",
            "LANGCHAIN_TRACING_V2": "false",
            **settings,
        }
    )
    return env


@dataclass(frozen=True, kw_only=True)
class _Server:
    url: str
    home: Path


@contextmanager
def _langgraph_dev(tmp_path: Path, venv: Path, **settings: str) -> Iterator[_Server]:
    """``langgraph dev`` on a free loopback port, with ``settings`` in its environment."""
    home = tmp_path / "served-home"
    port = free_port()
    log = tmp_path / "langgraph-dev.log"
    command = [str(venv / "bin" / "langgraph"), "dev", "--config", str(REPO / "langgraph.json")]
    command += ["--host", "127.0.0.1", "--port", str(port), "--no-browser", "--no-reload"]
    with log.open("wb") as out:
        # Its own working directory (the dev server keeps its state in ./.langgraph_api)
        # and its own session, so that its children (a team's MCP servers) end with it.
        process = subprocess.Popen(
            command,
            cwd=tmp_path,
            env=_server_env(home, **settings),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_answering(
            process, f"{url}/ok", log, seconds=DEADLINE_SECONDS, name="langgraph dev", pause=0.2
        )
        yield _Server(url=url, home=home)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert "Traceback" not in log.read_text(), log.read_text()
    # No error logged: the first run's access to the graph logged a "Slow graph load" as
    # one, the factory compiling the team then.
    plain = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text())
    errors = [line for line in plain.splitlines() if re.search(r"\[(error|critical)\s*\]", line)]
    assert not errors, "\n".join(errors)


@pytest.fixture
def server_venv() -> Path:
    venv = _server_venv()
    if venv is None:
        pytest.skip(
            "langgraph-cli[inmem] is not installed: it cannot share the dev venv (langgraph-api "
            "pins jsonschema-rs<0.45, schemathesis needs >=0.46); make its own with "
            "`python -m venv .venv/langgraph-server && .venv/langgraph-server/bin/pip install "
            "-e '.[langgraph-server]'` or set RELAYGRAPH_LANGGRAPH_VENV"
        )
    return venv


async def _stream_run(
    url: str, graph: str, request: str, **run: Any
) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    """One run on a new thread: its thread id, its custom events (the subgraphs' too, when
    ``stream_subgraphs``) and its final state."""
    from langgraph_sdk import get_client

    events: list[dict[str, Any]] = []
    async with get_client(url=url) as client, asyncio.timeout(RUN_SECONDS):
        thread = await client.threads.create()
        async for part in client.runs.stream(
            thread["thread_id"],
            graph,
            input={"request": request},
            stream_mode=["custom", "values"],
            **run,
        ):
            assert part.event != "error", part.data
            if part.event.split("|")[0] == "custom":
                events.append(part.data)
        state = await client.threads.get_state(thread["thread_id"])
    return thread["thread_id"], events, state["values"]


@pytest.mark.slow
async def test_langgraph_dev_serves_the_default_team(tmp_path: Path, server_venv: Path) -> None:
    settings = {"RELAYGRAPH_MODEL": f"scripted:{EXAMPLES / 'scripts' / 'relay.json'}"}
    with _langgraph_dev(tmp_path, server_venv, **settings) as server:
        thread_id, events, values = await _stream_run(
            server.url, "default", "When does LangGraph write checkpoints?"
        )
        handoffs = [(e["source"], e["target"]) for e in events if e["type"] == "handoff"]
        routes = [e["next"] for e in events if e["type"] == "route"]
        assert handoffs == [("researcher", "coder")], events
        assert routes == ["researcher", "writer", "FINISH"], events
        assert values["status"] == "succeeded"
        assert "41 checkpoints" in values["answer"]
        # The run's TaskContext came from its thread: the writer's artifact is in its folder.
        assert (server.home / "tasks" / f"lg-{thread_id}" / "artifacts" / "report.md").exists()

        # A client may name the task folder instead (and nothing else of the context).
        _, _, again = await _stream_run(
            server.url,
            "default",
            "When does LangGraph write checkpoints?",
            context={"task_id": "docs-1", "workspace": "/etc"},
        )
        assert again["status"] == "succeeded"
        assert (server.home / "tasks" / "docs-1" / "artifacts" / "report.md").exists()


@pytest.mark.slow
async def test_langgraph_dev_serves_a_team_file(tmp_path: Path, server_venv: Path) -> None:
    settings = {
        "RELAYGRAPH_TEAM_FILE": str(EXAMPLES / "teams" / "docs-review.toml"),
        "RELAYGRAPH_MODEL": f"scripted:{EXAMPLES / 'scripts' / 'docs-review.json'}",
    }
    with _langgraph_dev(tmp_path, server_venv, **settings) as server:
        _, events, values = await _stream_run(
            server.url, "team", "Review the handoff docs", stream_subgraphs=True
        )
        routes = [(e["next"], e["carried_out"]) for e in events if e["type"] == "route"]
        assert routes == [
            ("researcher", True),
            ("writer", True),
            ("reviewer", True),
            ("FINISH", True),
        ], events
        visited = [e["agent"] for e in events if e["type"] == "agent_finished"]
        assert visited == ["researcher", "writer", "reviewer"]
        assert values["status"] == "succeeded"
        assert values["answer"].endswith("Reviewed: no problems found.")
        # The reviewer's own tools ran in the server, the MCP server's among them.
        results = {e["tool"]: e for e in events if e["type"] == "tool_result"}
        assert results["word_count"]["status"] == "success"
        assert results["lint_check"]["preview"] == "no problems found"


# In process: the graphs langgraph.json names, without a server.


def test_a_served_graph_makes_each_runs_context_from_its_thread(home: Path) -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    from relaygraph.langgraph_app import ServedContext, served_graph
    from relaygraph.team import default_team

    graph = served_graph(default_team(), model=f"scripted:{EXAMPLES / 'scripts' / 'relay.json'}")
    assert graph.context_schema is ServedContext
    graph = graph.copy(update={"checkpointer": InMemorySaver()})  # as the server does
    config: Any = {"configurable": {"thread_id": "t-1"}}
    values = graph.invoke({"request": "When does LangGraph write checkpoints?"}, config)
    assert values["status"] == "succeeded"
    assert (home / "tasks" / "lg-t-1" / "artifacts" / "report.md").exists()
    assert graph.config is not None and graph.config["recursion_limit"] > 0


@pytest.mark.parametrize("task_id", ["../escape", ".hidden", "a/b", "x" * 129])
def test_a_client_cannot_name_a_path_as_its_task(home: Path, task_id: str) -> None:
    from relaygraph.langgraph_app import served_graph
    from relaygraph.team import default_team

    graph = served_graph(default_team(), model=f"scripted:{EXAMPLES / 'scripts' / 'relay.json'}")
    with pytest.raises(ConfigError, match="is not a folder name"):
        graph.task_context({"configurable": {"thread_id": "t"}}, {"task_id": task_id})
    made = graph.task_context({"configurable": {"thread_id": "t"}}, {"workspace": "/etc"})
    assert made.workspace == home.resolve() / "tasks" / "lg-t" / "workspace"


async def test_the_team_graph_names_its_variable_when_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from relaygraph.langgraph_app import TEAM_FILE_ENV, team_file_graph

    monkeypatch.delenv(TEAM_FILE_ENV, raising=False)
    with pytest.raises(ConfigError, match=TEAM_FILE_ENV):
        await team_file_graph()


def test_the_graphs_compiled_at_the_servers_start_are_those_langgraph_json_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import json
    import types

    from relaygraph.langgraph_app import _graphs_the_server_names

    graphs = json.loads((REPO / "langgraph.json").read_text())["graphs"]
    monkeypatch.setenv("LANGSERVE_GRAPHS", json.dumps(graphs))
    monkeypatch.delitem(sys.modules, "langgraph_api", raising=False)
    assert _graphs_the_server_names() == []  # Not in LangGraph's server: nothing at import.
    monkeypatch.setitem(sys.modules, "langgraph_api", types.ModuleType("langgraph_api"))
    assert _graphs_the_server_names() == ["default_team_graph", "team_file_graph"]
    monkeypatch.setenv(
        "LANGSERVE_GRAPHS",
        json.dumps(
            {
                "mine": "./my_graphs.py:graph",
                "t": "./src/relaygraph/langgraph_app.py:team_file_graph",
            }
        ),
    )
    assert _graphs_the_server_names() == ["team_file_graph"]
