"""The team end to end on the scripted model: routing, handoffs, repair, limits, scoping."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, ToolMessage

from relaygraph.runner import run_task, sqlite_checkpointer
from relaygraph.supervisor import FINISH
from relaygraph.team import default_team

from ._scripts import call, route, say
from .conftest import EXAMPLE_RELAY

Script = Callable[[dict[str, Any]], str]


def final_state(home: Path, thread_id: str) -> dict[str, Any]:
    """The thread's latest team state, read through the graph its last task ran on (the
    team's records are delta channels, rebuilt from the checkpoints' writes)."""
    from relaygraph.policies import stored_policy
    from relaygraph.runner._team_cache import team_cache
    from relaygraph.store import LOCAL_PROJECT_ID, Ledger
    from relaygraph.topology import Topology

    ledger = Ledger(f"sqlite:///{home / 'ledger.sqlite'}")
    try:
        tasks, _ = ledger.list_tasks(project_id=LOCAL_PROJECT_ID, limit=100)
    finally:
        ledger.close()
    task = next(t for t in tasks if t.thread_id == thread_id)
    from relaygraph.runner import team_of_record

    team = team_cache.get(
        task.models,
        team=team_of_record(task),
        policy=stored_policy(task.policy, source="<test>"),
        topology=Topology.from_mapping(task.topology),
    )
    with sqlite_checkpointer(home / "checkpoints.sqlite") as saver:
        graph = team.copy({"checkpointer": saver})
        config: Any = {"configurable": {"thread_id": task.checkpoint_thread}}
        return dict(graph.get_state(config).values)


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
    # The writer's reply is the answer: finalize calls no model ([finalize] answer).
    assert "finalize" not in result.usage


def test_after_a_handoff_only_the_target_runs(home: Path) -> None:
    from relaygraph.models import load_model
    from relaygraph.supervisor import FINALIZE, SUPERVISOR, build_team

    spec = f"scripted:{EXAMPLE_RELAY}"
    roles = (SUPERVISOR, "researcher", "coder", "writer", FINALIZE)
    models = {r: load_model(spec, agent=r) for r in roles}
    from langgraph.checkpoint.memory import InMemorySaver

    from relaygraph.agents import TaskContext

    graph = build_team(models, team=default_team(), checkpointer=InMemorySaver())
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
    # The FINISH is answered with the writer's reply in the supervisor's own step: no
    # finalize step follows (below, one follows when finalize's model writes the answer).
    assert steps == [
        ["begin"],
        ["supervisor"],
        ["researcher"],
        ["coder"],
        ["supervisor"],
        ["writer"],
        ["supervisor"],
    ]
    state = graph.get_state(config)
    assert (state.next, state.values["status"]) == ((), "succeeded")
    assert state.values["answer"] == state.values["visits"][-1]["output"]


@pytest.mark.parametrize("answer", ["last_reply", "model"])
def test_finalize_takes_a_step_only_when_its_model_writes_the_answer(
    home: Path, answer: str
) -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    from relaygraph.agents import TaskContext
    from relaygraph.models import load_model
    from relaygraph.supervisor import FINALIZE, SUPERVISOR, build_team

    spec = f"scripted:{EXAMPLE_RELAY}"
    roles = (SUPERVISOR, "researcher", "coder", "writer", FINALIZE)
    models = {r: load_model(spec, agent=r) for r in roles}
    team = default_team()
    policy = team.policy_from({"finalize": {"answer": answer}})
    graph = build_team(models, team=team, policy=policy, checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "th1"}}
    ctx = TaskContext.for_task(home, task_id="t1", thread_id="th1")
    ran = [
        event["payload"]["name"]
        for event in graph.stream({"request": "go"}, config, context=ctx, stream_mode="debug")
        if event["type"] == "task"
    ]
    assert ran[-1] == (FINALIZE if answer == "model" else SUPERVISOR)
    assert graph.get_state(config).values["status"] == "succeeded"


def _visits(home: Path, thread_id: str) -> list[dict[str, Any]]:
    return list(final_state(home, thread_id)["visits"])


def test_two_handoffs_in_one_message_lose_no_agent_silently(home: Path, script: Script) -> None:
    spec = script(
        {
            "supervisor": [route("researcher"), route(FINISH)],
            "researcher": [
                {
                    "tool_calls": [
                        {"name": "transfer_to_writer", "args": {"task": "write", "reason": "r1"}},
                        {"name": "transfer_to_coder", "args": {"task": "code", "reason": "r2"}},
                    ]
                }
            ],
            "writer": [say("written")],
            "finalize": [say("done")],
        }
    )
    result = run_task("go", model=spec)
    assert result.status == "succeeded", result.stop_reason
    # Exactly one target ran; the other call was answered, not dropped.
    assert result.agents_run == ["researcher", "writer"]
    transcript = _visits(home, result.thread_id)[0]["messages"]
    answers = {m.tool_call_id: m for m in transcript if isinstance(m, ToolMessage)}
    ai = next(m for m in transcript if isinstance(m, AIMessage) and m.tool_calls)
    coder_call = next(c for c in ai.tool_calls if c["name"] == "transfer_to_coder")
    assert answers[coder_call["id"]].status == "error"
    assert "not carried out" in str(answers[coder_call["id"]].content)
    assert "transfer_to_writer" in str(answers[coder_call["id"]].content)


def test_handoff_beside_another_tool_call_is_refused_then_retried(
    home: Path, script: Script
) -> None:
    spec = script(
        {
            "supervisor": [route("researcher"), route(FINISH)],
            "researcher": [
                {
                    "tool_calls": [
                        {"name": "search_docs", "args": {"query": "handoff"}},
                        {"name": "transfer_to_writer", "args": {"task": "write"}},
                    ]
                },
                call("transfer_to_writer", task="write it up", reason="facts found"),
            ],
            "writer": [say("written")],
            "finalize": [say("done")],
        }
    )
    events: list[dict[str, Any]] = []
    result = run_task("go", model=spec, on_event=events.append)
    assert result.agents_run == ["researcher", "writer"]
    assert result.handoffs[1]["task"] == "write it up"
    transcript = _visits(home, result.thread_id)[0]["messages"]
    refusal = next(m for m in transcript if isinstance(m, ToolMessage) and m.status == "error")
    assert "hand off in a message of its own" in str(refusal.content)
    # The ordinary tool in that message did run.
    assert any(e["type"] == "tool_result" and e["tool"] == "search_docs" for e in events)


def test_every_tool_call_is_answered_in_every_transcript(home: Path) -> None:
    result = run_task("go", model=f"scripted:{EXAMPLE_RELAY}")
    for visit in _visits(home, result.thread_id):
        calls = [
            c["id"] for m in visit["messages"] if isinstance(m, AIMessage) for c in m.tool_calls
        ]
        answered = [m.tool_call_id for m in visit["messages"] if isinstance(m, ToolMessage)]
        assert sorted(calls) == sorted(answered), visit["agent"]
    handoff_visit = _visits(home, result.thread_id)[0]
    assert handoff_visit["ended"] == "handed_off"
    assert isinstance(handoff_visit["messages"][-1], ToolMessage)
    assert handoff_visit["messages"][-1].name == "transfer_to_coder"


def test_invalid_route_is_repaired_with_the_error_quoted(home: Path, script: Script) -> None:
    spec = script(
        {
            "supervisor": [
                {"route": {"next": "astronaut", "task": "fly", "reason": "why not"}},
                route("writer", task="write a haiku"),
                route(FINISH),
            ],
            "writer": [say("haiku")],
            "finalize": [say("done")],
        }
    )
    events: list[dict[str, Any]] = []
    result = run_task("go", model=spec, on_event=events.append)
    assert result.status == "succeeded"
    assert result.agents_run == ["writer"]
    first = next(e for e in events if e["type"] == "route")
    assert first["repaired"] is True
    assert "astronaut" in first["error"]
    assert result.usage["supervisor"]["model_calls"] == 3


def test_unrepairable_route_finishes_degraded_without_crashing(home: Path, script: Script) -> None:
    spec = script(
        {
            "supervisor": [
                {"route": {"next": "astronaut", "task": "fly", "reason": "r"}},
                {"route": {"next": "coder", "task": "", "reason": "r"}},
            ],
            "finalize": [say("partial answer")],
        }
    )
    result = run_task("go", model=spec)
    assert result.status == "degraded"
    assert result.stop_reason is not None
    assert result.stop_reason.startswith("invalid_route")
    assert "task" in result.stop_reason  # the second error: the task was empty
    assert result.answer == "partial answer"


def test_agent_input_is_scoped_and_stays_bounded(home: Path, script: Script) -> None:
    marker = "TOOL-OUTPUT-MARKER"
    n = 9
    spec = script(
        {
            "supervisor": [route("researcher", task=f"step {i}") for i in range(n)]
            + [route(FINISH)],
            "researcher": [
                turn
                for i in range(n)
                for turn in (
                    call("search_docs", query=f"{marker} checkpoint {i}"),
                    say(f"result {i}: " + "x" * 3000),
                )
            ],
            "finalize": [say("done")],
        }
    )
    from tests.builtin_team import parse_policy

    roomy = parse_policy(
        {"agents": {"researcher": {"max_model_calls": 100, "max_tool_calls": 100}}}
    )
    result = run_task("go", model=spec, policy=roomy)
    assert result.agents_run == ["researcher"] * n
    inputs = [str(v["messages"][0].content) for v in _visits(home, result.thread_id)]
    # Tool traffic of earlier visits never reaches a later agent's input.
    assert all("search_docs" not in text and marker not in text for text in inputs)
    # The input stops growing once the window of shown results is full.
    from relaygraph.supervisor._prompts import MAX_RESULTS_SHOWN

    assert len(inputs[-1]) <= len(inputs[MAX_RESULTS_SHOWN]) + 50
    assert len(inputs[-1]) < 4 * 1600 + 500


def test_team_visit_limit_ends_degraded(home: Path, script: Script) -> None:
    import dataclasses

    from relaygraph.policies import TeamLimits
    from tests.builtin_team import default_policy

    policy = dataclasses.replace(default_policy(), team=TeamLimits(max_agent_runs=2))
    spec = script(
        {
            "supervisor": [route("researcher", task=f"part {i}") for i in range(3)],
            "researcher": [say("a"), say("b"), say("c")],
            "finalize": [say("what we have")],
        }
    )
    result = run_task("go", model=spec, policy=policy)
    assert result.status == "degraded"
    assert result.agents_run == ["researcher", "researcher"]
    assert result.stop_reason == "budget:team:max_agent_runs"
    assert result.answer == "what we have"


@pytest.mark.parametrize(
    ("turns", "expected"),
    [
        ({"supervisor": [route("writer")], "writer": []}, "'writer', turn 1"),
        ({"supervisor": [say("not a route")]}, "'supervisor', turn 1: expected a 'route' turn"),
        (
            {"supervisor": [route("writer")], "writer": [route(FINISH)]},
            "'writer', turn 1: expected a 'content' or 'tool_calls' turn",
        ),
    ],
)
def test_script_errors_fail_the_task_naming_agent_and_turn(
    home: Path, script: Script, turns: dict[str, Any], expected: str
) -> None:
    result = run_task("go", model=script(turns))
    assert result.status == "failed"
    assert expected in (result.stop_reason or "")


def test_a_two_agent_team_runs_as_configured(home: Path, script: Script) -> None:
    from relaygraph.agents import builtin
    from relaygraph.team import Team

    spec = script(
        {
            "supervisor": [route("researcher"), route(FINISH)],
            "researcher": [call("transfer_to_writer", task="write it", reason="done")],
            "writer": [say("written")],
        }
    )
    team = Team(agents=[builtin.researcher(), builtin.writer()])
    result = run_task("go", model=spec, team=team)
    assert result.status == "succeeded", result.stop_reason
    assert result.agents_run == ["researcher", "writer"]
    # The writer's reply is the answer: finalize calls no model ([finalize] answer).
    assert set(result.usage) == {"supervisor", "researcher", "writer"}
