"""Every call a role may not make is answered and recorded, in every topology (issue 13,
finding 8): the model gets a ToolMessage saying why, so it can go on, and the refusal is a
violation in the run's result, in the ledger's events and in the timeline.

An agent calling a tool outside its allowlist is covered in ``test_policies.py`` (structured)
and ``test_topologies.py`` (swarm, supervisor-tools); these are the refusals that left no
record before: the tool-calling supervisor's calls, transfers with invalid arguments, a
second transfer in one message, a transfer or an approval tool beside other calls,
``run_python`` on a server without isolation, a work tool's invalid arguments, and
finalize answering with a tool call. Where an agent's call did not run, its ``tool_result``
event says so (``ran: false``) and no budget counts it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import BaseMessage, ToolMessage

from relaygraph.runner import RunResult, TaskRunner, run_task
from relaygraph.store import LOCAL_PROJECT_ID, Ledger
from relaygraph.supervisor import FINALIZE, FINISH
from relaygraph.topology import Topology
from relaygraph.tracing import build_timeline

from ._scripts import one_visit, route, say
from .builtin_team import parse_policy
from .test_team import final_state

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


def assert_violation(result: RunResult, home: Path, *, agent: str, kind: str) -> None:
    """One violation of ``agent`` of this kind is in the result, and the ledger's events and
    the timeline hold exactly the result's violations."""
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
    assert_violation(result, home, agent=agent, kind=kind)
    answers = [m for m in messages if isinstance(m, ToolMessage) and m.tool_call_id == call_id]
    assert len(answers) == 1, answers
    assert answers[0].status == "error"
    return answers[0]


def supervisor_refusal(result: RunResult, home: Path, kind: str) -> ToolMessage:
    """The tool-calling supervisor's refused call ``sup-bad``, recorded as a violation of
    ``kind`` (:func:`assert_recorded`); returns the answer it got."""
    messages = final_state(home, result.thread_id)["messages"]
    return assert_recorded(
        result, home, agent="supervisor", kind=kind, call_id="sup-bad", messages=messages
    )


def agent_refusal(result: RunResult, home: Path, agent: str, kind: str) -> ToolMessage:
    """The refused call ``agent-bad`` of ``agent``, recorded as a violation of ``kind``
    (:func:`assert_recorded`); returns the answer it got."""
    messages = transcript_of(home, result)
    return assert_recorded(
        result, home, agent=agent, kind=kind, call_id="agent-bad", messages=messages
    )


def supervised(
    script: Script,
    *turns: dict[str, Any],
    answer: str = "done",
    agent: str = "researcher",
    reply: str = "facts",
) -> RunResult:
    """The run in which the tool-calling supervisor makes its ``turns`` of calls, then
    writes ``answer``; ``agent``, handed work, says ``reply``."""
    spec = script({"supervisor": [*turns, say(answer)], agent: [say(reply)]})
    return succeeded(spec, TOOLS)


def succeeded(spec: str, topology: Topology, **kwargs: Any) -> RunResult:
    """The run of ``spec`` in ``topology``, which went on past its refusals and succeeded."""
    result = run_task("go", model=spec, topology=topology, **kwargs)
    assert result.status == "succeeded", result.stop_reason
    return result


def tool_results(result: RunResult, home: Path, call_id: str) -> list[tuple[str, bool]]:
    """``(status, ran)`` of each ``tool_result`` event of the call."""
    with ledger_of(home) as ledger:
        return [
            (e.data["status"], e.data["ran"])
            for e in ledger.events_after(result.task_id)
            if e.type == "tool_result" and e.data["tool_call_id"] == call_id
        ]


def transcript_of(home: Path, result: RunResult) -> list[BaseMessage]:
    """Every agent visit's messages, in order."""
    state = final_state(home, result.thread_id)
    return [m for visit in state["visits"] for m in visit["messages"]]


# -- the tool-calling supervisor --------------------------------------------------------------


@pytest.mark.parametrize("tool", ["run_python", "summon_oracle"])
def test_supervisor_calling_a_tool_it_does_not_have_is_refused_and_recorded(
    home: Path, script: Script, tool: str
) -> None:
    result = supervised(
        script,
        calls((tool, "sup-bad", {"code": "open('pwned.txt', 'w').write('x')"})),
        calls(("transfer_to_researcher", "sup-ok", {"task": "find the facts"})),
        answer="I answer without it.",
    )
    # Told why, the supervisor went on with its own tools.
    assert result.agents_run == ["researcher"]
    assert result.answer == "I answer without it."
    answer = supervisor_refusal(result, home, "tool_not_allowed")
    assert f"Not run: '{tool}' is not a tool of the supervisor" in answer.text
    assert "transfer_to_researcher" in answer.text  # It is told what it may call.
    assert tool in result.violations[0]["detail"]


def test_supervisor_transfer_to_no_agent_of_the_team_is_refused(home: Path, script: Script) -> None:
    result = supervised(
        script,
        calls(("transfer_to_reviewer", "sup-bad", {"task": "review it"})),
        calls(("transfer_to_writer", "sup-ok", {"task": "review it"})),
        answer="answered",
        agent="writer",
        reply="reviewed",
    )
    answer = supervisor_refusal(result, home, "handoff_not_allowed")
    assert "'transfer_to_reviewer' is not a tool of the supervisor" in answer.text
    assert [(h["from"], h["to"]) for h in result.handoffs] == [("supervisor", "writer")]


def test_supervisor_tool_beside_a_transfer_is_recorded_and_the_transfer_runs(
    home: Path, script: Script
) -> None:
    result = supervised(
        script,
        calls(
            ("transfer_to_researcher", "sup-ok", {"task": "find the facts"}),
            ("run_python", "sup-bad", {"code": "print(1)"}),
        ),
    )
    assert result.agents_run == ["researcher"]
    supervisor_refusal(result, home, "tool_not_allowed")
    messages = final_state(home, result.thread_id)["messages"]
    answered = [m.tool_call_id for m in messages if isinstance(m, ToolMessage)]
    assert (answered.count("sup-ok"), answered.count("sup-bad")) == (1, 1)


@INVALID_TRANSFER_ARGS
def test_supervisor_transfer_with_invalid_arguments_is_refused_and_recorded(
    home: Path, script: Script, args: dict[str, Any], problem: str
) -> None:
    result = supervised(
        script,
        calls(("transfer_to_researcher", "sup-bad", args)),
        calls(("transfer_to_researcher", "sup-ok", {"task": "find the facts"})),
    )
    answer = supervisor_refusal(result, home, "invalid_arguments")
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
    result = supervised(
        script,
        calls(
            ("transfer_to_researcher", "sup-bad", {"reason": "no task"}),
            ("transfer_to_writer", "sup-ok", {"task": "write it"}),
        ),
        agent="writer",
        reply="written",
    )
    assert result.agents_run == ["writer"]
    supervisor_refusal(result, home, "invalid_arguments")


# -- an agent's transfer, in every topology ---------------------------------------------------


def researcher_run(
    script: Script,
    topology: Topology,
    *turns: dict[str, Any],
    policy: Path | None = None,
    **agents: list[dict[str, Any]],
) -> RunResult:
    """The run in ``topology`` in which the researcher, given the task, plays ``turns`` and
    the other ``agents`` theirs."""
    spec = script(with_roles(topology, {"researcher": list(turns), **agents}))
    return succeeded(spec, topology, policy=policy)


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
    result = researcher_run(
        script,
        topology,
        calls(("transfer_to_coder", "agent-bad", args)),
        calls(("transfer_to_coder", "agent-ok", {"task": "count them"})),
        coder=[say("41")],
    )
    answer = agent_refusal(result, home, "researcher", "invalid_arguments")
    assert answer.text.startswith("Not run: the arguments of transfer_to_coder do not fit")
    assert problem in answer.text
    # Told why, the agent handed off again with a task; only that handoff moved work.
    assert [(h["kind"], h["from"], h["to"], h["task"]) for h in result.handoffs][-1:] == [
        ("direct", "researcher", "coder", "count them")
    ]
    assert result.agents_run == ["researcher", "coder"]
    assert tool_results(result, home, "agent-bad") == [("error", False)]


# -- one transfer per message, and alone --------------------------------------------------------


def test_supervisor_second_transfer_in_one_message_is_refused_and_recorded(
    home: Path, script: Script
) -> None:
    result = supervised(
        script,
        calls(
            ("transfer_to_researcher", "sup-ok", {"task": "find the facts"}),
            ("transfer_to_writer", "sup-bad", {"task": "write it"}),
        ),
    )
    answer = supervisor_refusal(result, home, "handoff_not_allowed")
    assert "only one transfer per message is carried out" in answer.text
    assert "'transfer_to_researcher' came first" in answer.text
    assert "transfer_to_writer" in result.violations[0]["detail"]
    assert result.agents_run == ["researcher"]
    assert [(h["from"], h["to"]) for h in result.handoffs] == [("supervisor", "researcher")]


@EVERY_TOPOLOGY
def test_agent_second_transfer_in_one_message_is_refused_and_recorded(
    home: Path, script: Script, topology: Topology
) -> None:
    result = researcher_run(
        script,
        topology,
        calls(
            ("transfer_to_coder", "agent-ok", {"task": "count them"}),
            ("transfer_to_writer", "agent-bad", {"task": "write it"}),
        ),
        coder=[say("41")],
    )
    answer = agent_refusal(result, home, "researcher", "handoff_not_allowed")
    assert "only one handoff per message is carried out" in answer.text
    assert "'transfer_to_coder' came first" in answer.text
    assert tool_results(result, home, "agent-bad") == [("error", False)]
    assert result.agents_run == ["researcher", "coder"]
    assert [(h["from"], h["to"]) for h in result.handoffs if h["kind"] == "direct"] == [
        ("researcher", "coder")
    ]


@EVERY_TOPOLOGY
def test_agent_transfer_beside_a_work_tool_is_refused_and_recorded(
    home: Path, script: Script, topology: Topology
) -> None:
    result = researcher_run(
        script,
        topology,
        calls(
            ("search_docs", "work", {"query": "checkpoint"}),
            ("transfer_to_coder", "agent-bad", {"task": "count them"}),
        ),
        calls(("transfer_to_coder", "agent-ok", {"task": "count them"})),
        coder=[say("41")],
    )
    answer = agent_refusal(result, home, "researcher", "handoff_not_allowed")
    assert "hand off in a message of its own" in answer.text
    assert tool_results(result, home, "agent-bad") == [("error", False)]
    # The work tool beside it ran, and counts; the refused transfer does not.
    assert tool_results(result, home, "work") == [("success", True)]
    assert result.usage["researcher"]["tool_calls"] == 1
    assert result.agents_run == ["researcher", "coder"]


# -- work tools ---------------------------------------------------------------------------------


@EVERY_TOPOLOGY
def test_approval_tool_beside_another_call_is_refused_and_recorded(
    home: Path, script: Script, topology: Topology, tmp_path: Path
) -> None:
    policy = tmp_path / "approve-read-doc.toml"
    policy.write_text('[agents.researcher]\napproval = ["read_doc"]\n', encoding="utf-8")
    # Refused, not paused: nothing waits for a person.
    result = researcher_run(
        script,
        topology,
        calls(
            ("search_docs", "work", {"query": "checkpoint"}),
            ("read_doc", "agent-bad", {"doc_id": "checkpoints"}),
        ),
        say("facts"),
        policy=policy,
    )
    answer = agent_refusal(result, home, "researcher", "tool_not_allowed")
    assert "read_doc needs a person's approval, so call it in a message of its own" in answer.text
    assert "approval" in result.violations[0]["detail"]
    assert tool_results(result, home, "agent-bad") == [("error", False)]
    assert result.usage["researcher"]["tool_calls"] == 1  # search_docs only


@EVERY_TOPOLOGY
def test_work_tool_with_invalid_arguments_is_refused_and_recorded(
    home: Path, script: Script, topology: Topology
) -> None:
    result = researcher_run(
        script,
        topology,
        calls(("search_docs", "agent-bad", {"k": 3})),
        calls(("read_doc", "agent-bad-2", {"doc_id": 5})),
        say("facts"),
    )
    transcript = transcript_of(home, result)
    found = [v for v in result.violations if v["kind"] == "invalid_arguments"]
    assert [v["agent"] for v in found] == ["researcher", "researcher"]
    with ledger_of(home) as ledger:
        timeline = build_timeline(ledger, result.task_id, project_id=LOCAL_PROJECT_ID)
        live = [e.data for e in ledger.events_after(result.task_id) if e.type == "violation"]
    assert [(e["agent"], e["kind"], e["detail"]) for e in live] == [
        (v["agent"], v["kind"], v["detail"]) for v in result.violations
    ]
    traced = [n["violation"] for n in timeline_nodes(timeline) if n["kind"] == "violation"]
    assert traced == ["invalid_arguments", "invalid_arguments"]
    for call_id, problem in [("agent-bad", "'query' is missing"), ("agent-bad-2", "'doc_id'")]:
        [answer] = [
            m for m in transcript if isinstance(m, ToolMessage) and m.tool_call_id == call_id
        ]
        assert answer.status == "error"
        assert answer.text.startswith("Not run: the arguments of ")
        assert problem in answer.text
        assert tool_results(result, home, call_id) == [("error", False)]
    assert "'query' is missing" in found[0]["detail"]
    assert result.usage["researcher"]["tool_calls"] == 0  # Nothing ran.


@pytest.fixture
def no_isolation(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that refuses unisolated code (``TaskContext.sandbox_isolation_required``)
    on a host without bubblewrap."""
    monkeypatch.setenv("RELAYGRAPH_BWRAP", "")
    init = functools.partialmethod(TaskRunner.__init__, sandbox_isolation_required=True)
    monkeypatch.setattr(TaskRunner, "__init__", init)


@EVERY_TOPOLOGY
@pytest.mark.usefixtures("no_isolation")
def test_run_python_refused_without_isolation_is_recorded(
    home: Path, script: Script, topology: Topology
) -> None:
    turns = with_roles(
        topology,
        {
            "researcher": [calls(("transfer_to_coder", "h-1", {"task": "run it"}))],
            "coder": [
                calls(("run_python", "agent-bad", {"code": "open('ran.txt', 'w').write('x')"})),
                say("could not run code"),
            ],
        },
    )
    result = succeeded(script(turns), topology)
    answer = agent_refusal(result, home, "coder", "tool_unavailable")
    assert answer.text.startswith("Not run: run_python is refused on this server")
    assert "bubblewrap" in result.violations[0]["detail"]
    assert tool_results(result, home, "agent-bad") == [("error", False)]
    assert result.usage["coder"]["tool_calls"] == 0
    assert not (home / "tasks" / result.task_id / "workspace" / "ran.txt").exists()


@pytest.mark.usefixtures("no_isolation")
def test_run_python_that_needs_approval_is_refused_without_asking_where_it_cannot_run(
    home: Path, script: Script, tmp_path: Path
) -> None:
    """A person is never asked to approve a call this host will refuse anyway: the task
    does not pause (it asked, recorded the approval, then refused the call)."""
    policy = tmp_path / "policy.toml"
    policy.write_text('[agents.coder]\napproval = ["run_python"]\n', encoding="utf-8")
    turns = one_visit(
        "coder",
        "run it",
        "code",
        calls(("run_python", "needs-ok", {"code": "print(1)"})),
        say("could not run code"),
    )
    result = run_task("go", model=script(turns), policy=policy)
    assert result.status == "succeeded", result.stop_reason
    assert [v["kind"] for v in result.violations] == ["tool_unavailable"]
    assert "bubblewrap" in result.violations[0]["detail"]


# -- finalize -----------------------------------------------------------------------------------


def finalized(script: Script, turn: dict[str, Any]) -> RunResult:
    """A structured run whose finalize model answers with ``turn`` (its model asked to
    write every answer: by default the researcher's reply would be the answer)."""
    spec = script(
        {
            "supervisor": [route("researcher", "find the facts"), route(FINISH)],
            "researcher": [say("facts")],
            "finalize": [turn],
        }
    )
    policy = parse_policy({"finalize": {"answer": "model"}})
    return run_task("go", model=spec, topology=STRUCTURED, policy=policy)


def test_finalize_answering_with_a_tool_call_is_recorded_and_not_succeeded(
    home: Path, script: Script
) -> None:
    result = finalized(script, calls(("run_python", "fin-1", {"code": "print('final')"})))
    # The call was dropped; with no text there is no answer, and the run says so.
    assert (result.status, result.answer) == ("degraded", None)
    assert result.stop_reason is not None and result.stop_reason.startswith("no answer")
    assert_violation(result, home, agent=FINALIZE, kind="tool_not_allowed")
    assert "run_python" in result.violations[0]["detail"]
    assert tool_results(result, home, "fin-1") == []  # Nothing ran.
    assert result.usage[FINALIZE]["tool_calls"] == 0


def test_finalize_with_no_text_is_not_succeeded(home: Path, script: Script) -> None:
    result = finalized(script, say("   "))
    assert (result.status, result.answer) == ("degraded", None)
    assert result.stop_reason == "no answer: finalize wrote no text"
    assert result.violations == []
