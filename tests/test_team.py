"""The team end to end on the scripted model: routing, handoffs, repair, limits, scoping."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, ToolMessage

from relaygraph.run import run_task, sqlite_checkpointer
from relaygraph.supervisor import FINISH

from .conftest import EXAMPLE_RELAY

Script = Callable[[dict[str, Any]], str]


def route(next: str, task: str = "do it", reason: str = "because") -> dict[str, Any]:
    return {"route": {"next": next, "task": task if next != FINISH else "", "reason": reason}}


def call(name: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "args": args}]}


def say(text: str) -> dict[str, Any]:
    return {"content": text}


def final_state(home: Path, thread_id: str) -> dict[str, Any]:
    from relaygraph.supervisor import build_team  # noqa: F401  (graph import warms the models)

    with sqlite_checkpointer(home / "checkpoints.sqlite") as saver:
        tup = saver.get_tuple({"configurable": {"thread_id": thread_id}})
        assert tup is not None
        return tup.checkpoint["channel_values"]


def test_relay_visits_three_agents_with_direct_handoff(home: Path) -> None:
    events: list[dict[str, Any]] = []
    result = run_task(
        "When are checkpoints written?", model=f"scripted:{EXAMPLE_RELAY}", on_event=events.append
    )
    assert result.status == "succeeded", result.stop_reason
    assert result.agents_run == ["researcher", "coder", "writer"]
    assert [(h["kind"], h["from"], h["to"]) for h in result.handoffs] == [
        ("route", "supervisor", "researcher"),
        ("direct", "researcher", "coder"),
        ("route", "supervisor", "writer"),
    ]
    assert result.handoffs[1]["reason"] == "a calculation is best checked by running code"
    assert result.artifacts == ["report.md"]
    assert "41 checkpoints" in (result.answer or "")
    # Real tools ran: the sandbox printed the computed number, the artifact is on disk.
    results = [e for e in events if e["type"] == "tool_result"]
    assert any("40 super-steps write 41 checkpoints" in e["preview"] for e in results)
    report = home / "tasks" / result.task_id / "artifacts" / "report.md"
    assert "41 checkpoints" in report.read_text()
    # Usage per role, from the script's usage where given.
    assert result.usage["researcher"]["model_calls"] == 2
    assert result.usage["researcher"]["tool_calls"] == 1
    assert result.usage["researcher"]["output_tokens"] >= 40
    assert result.usage["supervisor"]["model_calls"] == 3
    assert result.usage["finalize"]["model_calls"] == 1


def test_after_a_handoff_only_the_target_runs(home: Path) -> None:
    from relaygraph.models import load_model
    from relaygraph.supervisor import FINALIZE, SUPERVISOR, build_team

    spec = f"scripted:{EXAMPLE_RELAY}"
    roles = (SUPERVISOR, "researcher", "coder", "writer", FINALIZE)
    models = {r: load_model(spec, agent=r) for r in roles}
    from langgraph.checkpoint.memory import InMemorySaver

    from relaygraph.agents import TaskContext

    graph = build_team(models, checkpointer=InMemorySaver())
    ctx = TaskContext.for_task(home, task_id="t1", thread_id="th1")
    config: Any = {"configurable": {"thread_id": "th1"}}
    by_step: dict[int, list[str]] = {}
    for event in graph.stream({"request": "go"}, config, context=ctx, stream_mode="debug"):
        if event["type"] == "task":
            by_step.setdefault(event["step"], []).append(event["payload"]["name"])
    steps = [by_step[k] for k in sorted(by_step)]
    # The researcher hands off to the coder: the next task is the coder alone, not the
    # coder and the supervisor in parallel as in langgraph-supervisor.
    i = steps.index(["researcher"])
    assert steps[i + 1] == ["coder"]
    assert steps == [
        ["begin"], ["supervisor"], ["researcher"], ["coder"], ["supervisor"], ["writer"],
        ["supervisor"], ["finalize"],
    ]
