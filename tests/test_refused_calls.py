"""Every call a role may not make is answered and recorded, in every topology (issue 13,
finding 8): the model gets a ToolMessage saying why, so it can go on, and the refusal is a
violation in the run's result, in the ledger's events and in the timeline.

An agent calling a tool outside its allowlist is covered in ``test_policies.py`` (structured)
and ``test_topologies.py`` (swarm, supervisor-tools); these are the refusals that left no
record before: the tool-calling supervisor's calls, and transfers with invalid arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import BaseMessage, ToolMessage

from relaygraph.run import RunResult, run_task
from relaygraph.store import LOCAL_PROJECT_ID, Ledger
from relaygraph.supervisor import FINISH
from relaygraph.topology import Topology
from relaygraph.tracing import build_timeline

from .test_team import final_state, route, say

Script = Callable[[dict[str, Any]], str]
STRUCTURED = Topology.parse("structured")
SWARM = Topology.parse("swarm")
TOOLS = Topology.parse("supervisor-tools")
EVERY_TOPOLOGY = pytest.mark.parametrize(
    "topology", [STRUCTURED, SWARM, TOOLS], ids=lambda t: str(t.kind)
)
INVALID_TRANSFER_ARGS = pytest.mark.parametrize(
    ("args", "problem"),
    [
        ({"reason": "no task given"}, "'task' is missing"),
        ({"task": 42, "reason": "a number"}, "'task' is invalid"),
        ({"task": "   ", "reason": "blank"}, "'task' is empty"),
    ],
    ids=["missing-task", "task-not-a-string", "blank-task"],
)


def calls(*made: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    """A turn calling tools, each with an id of its own: ``(name, id, args)``."""
    return {"tool_calls": [{"name": n, "id": i, "args": a} for n, i, a in made]}


def ledger_of(home: Path) -> Ledger:
    return Ledger(f"sqlite:///{home / 'ledger.sqlite'}")


def timeline_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for child in node.get("children", []):
        yield child
        yield from timeline_nodes(child)


def assert_recorded(
    result: RunResult,
    home: Path,
    *,
    agent: str,
    kind: str,
    call_id: str,
    messages: list[BaseMessage],
) -> ToolMessage:
    """The refusal of ``call_id`` is a violation in the result, the ledger's events and the
    timeline, and exactly one ToolMessage (an error) answered the call; returns it."""
    found = [v for v in result.violations if (v["agent"], v["kind"]) == (agent, kind)]
    assert len(found) == 1, result.violations
    with ledger_of(home) as ledger:
        events = [e.data for e in ledger.events_after(result.task_id)]
        timeline = build_timeline(ledger, result.task_id, project_id=LOCAL_PROJECT_ID)
    live = [e for e in events if e["type"] == "violation"]
    assert [(e["agent"], e["kind"], e["detail"]) for e in live] == [
        (v["agent"], v["kind"], v["detail"]) for v in result.violations
    ]
    traced = [
        n for n in timeline_nodes(timeline) if n["kind"] == "violation" and n["agent"] == agent
    ]
    assert [n["violation"] for n in traced] == [kind]
    answers = [m for m in messages if isinstance(m, ToolMessage) and m.tool_call_id == call_id]
    assert len(answers) == 1, answers
    assert answers[0].status == "error"
    return answers[0]


# -- the tool-calling supervisor --------------------------------------------------------------


@pytest.mark.parametrize("tool", ["run_python", "summon_oracle"])
def test_supervisor_calling_a_tool_it_does_not_have_is_refused_and_recorded(
    home: Path, script: Script, tool: str
) -> None:
    spec = script(
        {
            "supervisor": [
                calls((tool, "sup-bad", {"code": "open('pwned.txt', 'w').write('x')"})),
                calls(("transfer_to_researcher", "sup-ok", {"task": "find the facts"})),
                say("I answer without it."),
            ],
            "researcher": [say("facts")],
        }
    )
    result = run_task("go", model=spec, topology=TOOLS)
    assert result.status == "succeeded", result.stop_reason
    # Told why, the supervisor went on with its own tools.
    assert result.agents_run == ["researcher"]
    assert result.answer == "I answer without it."
    state = final_state(home, result.thread_id)
    answer = assert_recorded(
        result,
        home,
        agent="supervisor",
        kind="tool_not_allowed",
        call_id="sup-bad",
        messages=state["messages"],
    )
    assert f"Not run: '{tool}' is not a tool of the supervisor" in answer.text
    assert "transfer_to_researcher" in answer.text  # It is told what it may call.
    assert tool in result.violations[0]["detail"]


def test_supervisor_transfer_to_no_agent_of_the_team_is_refused(home: Path, script: Script) -> None:
    spec = script(
        {
            "supervisor": [
                calls(("transfer_to_reviewer", "sup-bad", {"task": "review it"})),
                calls(("transfer_to_writer", "sup-ok", {"task": "review it"})),
                say("answered"),
            ],
            "writer": [say("reviewed")],
        }
    )
    result = run_task("go", model=spec, topology=TOOLS)
    assert result.status == "succeeded", result.stop_reason
    state = final_state(home, result.thread_id)
    answer = assert_recorded(
        result,
        home,
        agent="supervisor",
        kind="handoff_not_allowed",
        call_id="sup-bad",
        messages=state["messages"],
    )
    assert "'transfer_to_reviewer' is not a tool of the supervisor" in answer.text
    assert [(h["from"], h["to"]) for h in result.handoffs] == [("supervisor", "writer")]


def test_supervisor_tool_beside_a_transfer_is_recorded_and_the_transfer_runs(
    home: Path, script: Script
) -> None:
    spec = script(
        {
            "supervisor": [
                calls(
                    ("transfer_to_researcher", "sup-ok", {"task": "find the facts"}),
                    ("run_python", "sup-bad", {"code": "print(1)"}),
                ),
                say("done"),
            ],
            "researcher": [say("facts")],
        }
    )
    result = run_task("go", model=spec, topology=TOOLS)
    assert result.status == "succeeded", result.stop_reason
    assert result.agents_run == ["researcher"]
    state = final_state(home, result.thread_id)
    assert_recorded(
        result,
        home,
        agent="supervisor",
        kind="tool_not_allowed",
        call_id="sup-bad",
        messages=state["messages"],
    )
    answered = [m.tool_call_id for m in state["messages"] if isinstance(m, ToolMessage)]
    assert (answered.count("sup-ok"), answered.count("sup-bad")) == (1, 1)


@INVALID_TRANSFER_ARGS
def test_supervisor_transfer_with_invalid_arguments_is_refused_and_recorded(
    home: Path, script: Script, args: dict[str, Any], problem: str
) -> None:
    spec = script(
        {
            "supervisor": [
                calls(("transfer_to_researcher", "sup-bad", args)),
                calls(("transfer_to_researcher", "sup-ok", {"task": "find the facts"})),
                say("done"),
            ],
            "researcher": [say("facts")],
        }
    )
    result = run_task("go", model=spec, topology=TOOLS)
    assert result.status == "succeeded", result.stop_reason
    state = final_state(home, result.thread_id)
    answer = assert_recorded(
        result,
        home,
        agent="supervisor",
        kind="invalid_arguments",
        call_id="sup-bad",
        messages=state["messages"],
    )
    assert answer.text.startswith("Not carried out: the arguments of transfer_to_researcher")
    assert problem in answer.text
    assert problem in result.violations[0]["detail"]
    # Only the corrected transfer moved work.
    assert [(h["kind"], h["to"], h["task"]) for h in result.handoffs] == [
        ("route", "researcher", "find the facts")
    ]
    assert result.agents_run == ["researcher"]


def test_supervisor_invalid_transfer_does_not_block_the_next_one_in_its_message(
    home: Path, script: Script
) -> None:
    spec = script(
        {
            "supervisor": [
                calls(
                    ("transfer_to_researcher", "sup-bad", {"reason": "no task"}),
                    ("transfer_to_writer", "sup-ok", {"task": "write it"}),
                ),
                say("done"),
            ],
            "writer": [say("written")],
        }
    )
    result = run_task("go", model=spec, topology=TOOLS)
    assert result.status == "succeeded", result.stop_reason
    assert result.agents_run == ["writer"]
    state = final_state(home, result.thread_id)
    assert_recorded(
        result,
        home,
        agent="supervisor",
        kind="invalid_arguments",
        call_id="sup-bad",
        messages=state["messages"],
    )


# -- an agent's transfer, in every topology ---------------------------------------------------


def with_roles(topology: Topology, agents: dict[str, list[Any]]) -> dict[str, Any]:
    """The agents' turns, with whatever turns the topology's other roles need to give the
    researcher the task and to finish once the agents are done."""
    if topology.kind == "structured":
        return {
            **agents,
            "supervisor": [route("researcher", "find the facts"), route(FINISH)],
            "finalize": [say("final")],
        }
    if topology.kind == "supervisor-tools":
        first = calls(("transfer_to_researcher", "sup-1", {"task": "find the facts"}))
        return {**agents, "supervisor": [first, say("final")]}
    return agents


@EVERY_TOPOLOGY
@INVALID_TRANSFER_ARGS
def test_agent_transfer_with_invalid_arguments_is_refused_and_recorded(
    home: Path, script: Script, topology: Topology, args: dict[str, Any], problem: str
) -> None:
    turns = with_roles(
        topology,
        {
            "researcher": [
                calls(("transfer_to_coder", "agent-bad", args)),
                calls(("transfer_to_coder", "agent-ok", {"task": "count them"})),
            ],
            "coder": [say("41")],
        },
    )
    result = run_task("go", model=script(turns), topology=topology)
    assert result.status == "succeeded", result.stop_reason
    state = final_state(home, result.thread_id)
    transcript = [m for visit in state["visits"] for m in visit["messages"]]
    answer = assert_recorded(
        result,
        home,
        agent="researcher",
        kind="invalid_arguments",
        call_id="agent-bad",
        messages=transcript,
    )
    assert answer.text.startswith("Not run: the arguments of transfer_to_coder do not fit")
    assert problem in answer.text
    # Told why, the agent handed off again with a task; only that handoff moved work.
    assert [(h["kind"], h["from"], h["to"], h["task"]) for h in result.handoffs][-1:] == [
        ("direct", "researcher", "coder", "count them")
    ]
    assert result.agents_run == ["researcher", "coder"]
    with ledger_of(home) as ledger:
        results = [
            e.data
            for e in ledger.events_after(result.task_id)
            if e.type == "tool_result" and e.data["tool_call_id"] == "agent-bad"
        ]
    assert [(r["status"], r["ran"]) for r in results] == [("error", False)]
