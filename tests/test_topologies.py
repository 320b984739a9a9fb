"""The swarm and the tool-calling supervisor run the same agents under the same policy, ledger
and result shape as the structured team; each upstream defect they have is guarded."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from relaygraph.errors import ConfigError
from relaygraph.runner import Decision, RunResult, ledger_for, resume_task, run_task
from relaygraph.topology import Topology
from tests.builtin_team import parse_policy

from ._scripts import call, say
from .test_cli import relaygraph
from .test_team import final_state

Script = Callable[[dict[str, Any]], str]
SWARM = Topology.parse("swarm")
TOOLS = Topology.parse("supervisor-tools")


def transfer(target: str, task: str = "do it", reason: str = "because") -> dict[str, Any]:
    return call(f"transfer_to_{target}", task=task, reason=reason)


def calls(*names_and_args: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"tool_calls": [{"name": n, "args": a} for n, a in names_and_args]}


def events_of(result: RunResult, home: Path) -> list[dict[str, Any]]:
    ledger = ledger_for(home)
    try:
        return [e.data for e in ledger.events_after(result.task_id)]
    finally:
        ledger.close()


def ledger_rows(result: RunResult, home: Path) -> tuple[Any, Any, Any]:
    ledger = ledger_for(home)
    try:
        return (
            ledger.handoffs(result.task_id),
            ledger.tool_calls(result.task_id),
            ledger.get_task(result.task_id, project_id="local"),
        )
    finally:
        ledger.close()


# -- relay across the three agents ------------------------------------------------------------


def test_swarm_relays_across_three_agents_by_direct_handoffs(home: Path, script: Script) -> None:
    spec = script(
        {
            "researcher": [
                call("search_docs", query="checkpoint"),
                transfer("coder", task="count the checkpoints"),
            ],
            "coder": [call("run_python", code="print(40 + 1)"), transfer("writer", "write it")],
            "writer": [say("Report: 41 checkpoints, one per super-step.")],
        }
    )
    result = run_task("checkpoints?", model=spec, topology=SWARM)
    assert result.status == "succeeded", result.stop_reason
    assert result.answer == "Report: 41 checkpoints, one per super-step."
    assert result.agents_run == ["researcher", "coder", "writer"]
    assert [(h["kind"], h["from"], h["to"]) for h in result.handoffs] == [
        ("direct", "researcher", "coder"),
        ("direct", "coder", "writer"),
    ]
    # The same result shape as the structured team; only the roles with models differ.
    assert set(result.usage) == {"researcher", "coder", "writer"}
    assert result.team_usage["agent_runs"] == 3
    assert result.topology == {"kind": "swarm"}
    handoffs, tools, task = ledger_rows(result, home)
    assert [(h.kind, h.source, h.target) for h in handoffs] == [
        ("direct", "researcher", "coder"),
        ("direct", "coder", "writer"),
    ]
    assert [(t.agent, t.tool, t.status) for t in tools] == [
        ("researcher", "search_docs", "success"),
        ("coder", "run_python", "success"),
    ]
    assert task.topology == {"kind": "swarm"}
    started = [e for e in events_of(result, home) if e["type"] == "agent_started"]
    assert started[0]["source"] == "user"


def test_tool_supervisor_relays_by_transfer_calls(home: Path, script: Script) -> None:
    spec = script(
        {
            "supervisor": [
                transfer("researcher", "find the facts"),
                transfer("coder", "count them"),
                transfer("writer", "write it up"),
                say("Final: 41 checkpoints."),
            ],
            "researcher": [call("search_docs", query="checkpoint"), say("one per super-step")],
            "coder": [call("run_python", code="print(41)"), say("41")],
            "writer": [say("Report: 41")],
        }
    )
    result = run_task("checkpoints?", model=spec, topology=TOOLS)
    assert result.status == "succeeded", result.stop_reason
    assert result.answer == "Final: 41 checkpoints."
    assert result.agents_run == ["researcher", "coder", "writer"]
    # The supervisor's transfers are routes, with the task and reason it gave.
    assert [(h["kind"], h["from"], h["to"], h["task"]) for h in result.handoffs] == [
        ("route", "supervisor", "researcher", "find the facts"),
        ("route", "supervisor", "coder", "count them"),
        ("route", "supervisor", "writer", "write it up"),
    ]
    assert result.usage["supervisor"]["model_calls"] == 4
    assert "finalize" not in result.usage
    assert result.topology == {"kind": "supervisor-tools", "output_mode": "last_message"}
    routes = [e for e in events_of(result, home) if e["type"] == "route"]
    assert [r["next"] for r in routes] == ["researcher", "coder", "writer", "FINISH"]


def test_output_mode_decides_what_the_supervisor_reads(home: Path, script: Script) -> None:
    turns = {
        "supervisor": [
            {**transfer("researcher", "look"), "usage": None},
            {**say("done"), "usage": None},
        ],
        "researcher": [
            call("search_docs", query="checkpoint"),
            call("read_doc", doc_id="langgraph-persistence"),
            say("found it"),
        ],
    }
    for turn in turns["supervisor"]:
        turn.pop("usage")  # Estimated from the text the supervisor is sent.
    sent = {}
    for mode in ("last_message", "full_history"):
        result = run_task(
            "look it up",
            model=script(turns),
            topology=Topology.parse("supervisor-tools", output_mode=mode),
        )
        assert result.status == "succeeded", result.stop_reason
        sent[mode] = result.usage["supervisor"]["input_tokens"]
    # The whole transcript (a read document included) reaches the supervisor only in
    # full_history.
    assert sent["full_history"] > sent["last_message"] + 50


# -- the upstream defects, guarded ------------------------------------------------------------


def test_tool_supervisor_parallel_transfers_lose_no_agent(home: Path, script: Script) -> None:
    """langgraph-supervisor #230: parallel handoffs lose agents. Here the first transfer is
    carried out and the second is answered as not carried out; the supervisor sends it
    again and both agents run."""
    spec = script(
        {
            "supervisor": [
                calls(
                    ("transfer_to_researcher", {"task": "find", "reason": "a"}),
                    ("transfer_to_coder", {"task": "compute", "reason": "b"}),
                ),
                transfer("coder", "compute"),
                say("both done"),
            ],
            "researcher": [say("facts")],
            "coder": [say("numbers")],
        }
    )
    result = run_task("two things", model=spec, topology=TOOLS)
    assert result.status == "succeeded", result.stop_reason
    assert result.agents_run == ["researcher", "coder"]
    state = final_state(home, result.thread_id)
    answers = {
        m.tool_call_id: m.text
        for m in state["messages"]
        if m.type == "tool" and m.name.startswith("transfer_to_")
    }
    first_message = next(m for m in state["messages"] if m.type == "ai" and len(m.tool_calls) == 2)
    first, second = (c["id"] for c in first_message.tool_calls)
    assert answers[first].startswith("Transferred to researcher")
    assert "only one transfer per message" in answers[second]


def test_swarm_two_handoffs_in_one_message_answer_the_second(home: Path, script: Script) -> None:
    """langgraph-swarm #58: the second handoff of a message is dropped silently upstream."""
    spec = script(
        {
            "researcher": [
                calls(
                    ("transfer_to_writer", {"task": "write"}),
                    ("transfer_to_coder", {"task": "compute"}),
                )
            ],
            "writer": [say("written")],
        }
    )
    result = run_task("go", model=spec, topology=SWARM)
    assert result.status == "succeeded", result.stop_reason
    assert result.agents_run == ["researcher", "writer"]
    _, tools, _ = ledger_rows(result, home)
    refused = [t for t in tools if t.tool == "transfer_to_coder"]
    assert len(refused) == 1 and refused[0].status == "error"
    assert "only one handoff per message" in (refused[0].result_preview or "")


def test_swarm_tool_call_beside_a_handoff_is_answered(home: Path, script: Script) -> None:
    """langgraph-swarm #26/#82: a tool call next to a handoff loses its ToolMessage upstream.
    Here the tool runs, the handoff is refused with a message, and the agent hands off next."""
    spec = script(
        {
            "researcher": [
                calls(
                    ("search_docs", {"query": "checkpoint"}), ("transfer_to_writer", {"task": "w"})
                ),
                transfer("writer", "write it"),
            ],
            "writer": [say("written")],
        }
    )
    result = run_task("go", model=spec, topology=SWARM)
    assert result.status == "succeeded", result.stop_reason
    assert result.agents_run == ["researcher", "writer"]
    state = final_state(home, result.thread_id)
    transcript = state["visits"][0]["messages"]
    asked = {c["id"] for m in transcript if m.type == "ai" for c in m.tool_calls}
    answered = {m.tool_call_id: m for m in transcript if m.type == "tool"}
    assert asked == set(answered)  # Every call has its answer.
    refusal = next(m for m in answered.values() if m.name == "transfer_to_writer")
    assert "hand off in a message of its own" in refusal.text


# -- the policy, the same in every topology ---------------------------------------------------


@pytest.mark.parametrize("topology", [SWARM, TOOLS], ids=["swarm", "supervisor-tools"])
def test_disallowed_tool_is_refused_and_recorded(
    home: Path, script: Script, topology: Topology
) -> None:
    researcher = [call("run_python", code="print(1)"), say("I may not run code")]
    turns: dict[str, Any] = {"researcher": researcher}
    if topology.kind == "supervisor-tools":
        turns["supervisor"] = [transfer("researcher", "look"), say("done")]
    result = run_task("go", model=script(turns), topology=topology)
    assert result.status == "succeeded", result.stop_reason
    assert [(v["agent"], v["kind"]) for v in result.violations] == [
        ("researcher", "tool_not_allowed")
    ]
    _, tools, _ = ledger_rows(result, home)
    assert [(t.tool, t.status) for t in tools] == [("run_python", "error")]
    assert (tools[0].result_preview or "").startswith("Not run")


def test_swarm_agent_budget_ends_the_task_degraded(home: Path, script: Script) -> None:
    policy = parse_policy({"agents": {"researcher": {"max_model_calls": 1}}})
    spec = script({"researcher": [call("search_docs", query="checkpoint"), say("never reached")]})
    result = run_task("go", model=spec, policy=policy, topology=SWARM)
    assert result.status == "degraded"
    assert result.stop_reason == "budget:agent:researcher:max_model_calls"
    assert [(v["agent"], v["kind"]) for v in result.violations] == [("researcher", "budget")]
    assert result.usage["researcher"]["model_calls"] == 1
    assert "never reached" not in (result.answer or "")


def test_tool_supervisor_may_not_route_to_a_spent_agent(home: Path, script: Script) -> None:
    policy = parse_policy({"agents": {"researcher": {"max_model_calls": 1}}})
    spec = script(
        {
            "supervisor": [
                transfer("researcher", "read"),
                transfer("researcher", "read more"),  # refused: out of budget
                transfer("writer", "write what exists"),
                say("partial answer"),
            ],
            "researcher": [call("read_doc", doc_id="langgraph-persistence"), say("never")],
            "writer": [say("written")],
        }
    )
    result = run_task("go", model=spec, policy=policy, topology=TOOLS)
    assert result.status == "succeeded", result.stop_reason
    assert result.agents_run == ["researcher", "writer"]
    kinds = [(v["agent"], v["kind"]) for v in result.violations]
    assert kinds == [("researcher", "budget"), ("supervisor", "handoff_not_allowed")]
    assert "out of budget" in result.violations[1]["detail"]
    state = final_state(home, result.thread_id)
    told = [m.text for m in state["messages"] if m.type == "tool" and m.status == "error"]
    assert any("researcher may not take work now (out of budget" in t for t in told)


@pytest.mark.parametrize("topology", [SWARM, TOOLS], ids=["swarm", "supervisor-tools"])
def test_team_agent_runs_are_capped(home: Path, script: Script, topology: Topology) -> None:
    policy = parse_policy({"team": {"max_agent_runs": 2}})
    bounce = {
        "researcher": [transfer("coder", "a"), transfer("coder", "c")],
        "coder": [transfer("researcher", "b")],
    }
    if topology.kind == "supervisor-tools":
        bounce = {
            "supervisor": [transfer("researcher", "a"), transfer("coder", "b"), transfer("writer")],
            "researcher": [say("r")],
            "coder": [say("c")],
        }
    result = run_task("go", model=script(bounce), policy=policy, topology=topology)
    assert result.status == "degraded"
    assert result.stop_reason == "budget:team:max_agent_runs"
    assert result.team_usage["agent_runs"] == 2


def test_swarm_ping_pong_between_two_agents_is_stopped(home: Path, script: Script) -> None:
    spec = script(
        {
            "researcher": [transfer("coder", "a"), transfer("coder", "c"), say("never")],
            "coder": [transfer("researcher", "b"), transfer("researcher", "d")],
        }
    )
    result = run_task("go", model=spec, topology=SWARM)
    assert result.status == "degraded"
    assert (result.stop_reason or "").startswith("ping_pong")
    assert [v["kind"] for v in result.violations] == ["ping_pong"]
    assert result.agents_run == ["researcher", "coder", "researcher", "coder"]


def test_swarm_ping_pong_to_supervisor_returns_the_work_barred(home: Path, script: Script) -> None:
    policy = parse_policy({"ping_pong": {"on_detect": "supervisor"}})
    spec = script(
        {
            "researcher": [transfer("coder", "a"), transfer("coder", "c")],
            "coder": [
                transfer("researcher", "b"),
                transfer("researcher", "d"),  # the fourth pass: the pair is barred
                transfer("researcher", "e"),  # refused now, and said so
                say("finished it myself"),
            ],
        }
    )
    result = run_task("go", model=spec, policy=policy, topology=SWARM)
    assert result.status == "succeeded", result.stop_reason
    assert result.answer == "finished it myself"
    # The work went back to the agent that handed off, which may no longer pass it on.
    assert result.agents_run == ["researcher", "coder", "researcher", "coder", "coder"]
    assert [v["kind"] for v in result.violations] == ["ping_pong", "handoff_not_allowed"]


def test_tool_supervisor_ping_pong_between_two_agents(home: Path, script: Script) -> None:
    spec = script(
        {
            "supervisor": [
                transfer("researcher", "find A"),
                transfer("coder", "check A"),
                transfer("researcher", "find B"),
                transfer("coder", "check B"),
                transfer("researcher", "find C"),  # over max_bounces = 2
            ],
            "researcher": [say("r1"), say("r2")],
            "coder": [say("c1"), say("c2")],
        }
    )
    result = run_task("go", model=spec, topology=TOOLS)
    assert result.status == "degraded"
    assert "3 times (max_bounces = 2)" in (result.stop_reason or "")
    assert result.agents_run == ["researcher", "coder", "researcher", "coder"]
    assert result.answer == "c2"  # Without a finalize model: the last result.


def paused_coder(
    script: Script, topology: Topology, request: str, coder: list[dict[str, Any]], *, answer: str
) -> RunResult:
    """Run ``request`` in ``topology`` with the coder's ``run_python`` under approval: the
    supervisor (or, in a swarm, the start) gives the coder the task "run it", the coder
    plays ``coder``, and the team answers ``answer``. The run pauses at the coder's call."""
    policy = parse_policy({"agents": {"coder": {"approval": ["run_python"]}}})
    turns: dict[str, Any] = {"coder": coder}
    if topology.kind == "supervisor-tools":
        turns["supervisor"] = [transfer("coder", "run it"), say(answer)]
    elif topology.kind == "structured":
        turns["supervisor"] = [
            {"route": {"next": "coder", "task": "run it", "reason": "code"}},
            {"route": {"next": "FINISH", "task": "", "reason": "done"}},
        ]
        turns["finalize"] = [say(answer)]
    else:
        topology = Topology.parse("swarm", start_agent="coder")
    return run_task(request, model=script(turns), policy=policy, topology=topology)


@pytest.mark.parametrize(
    "topology", [Topology(), SWARM, TOOLS], ids=["structured", "swarm", "supervisor-tools"]
)
def test_approval_pauses_and_resumes(home: Path, script: Script, topology: Topology) -> None:
    asks = {
        **call("run_python", code="print('ran')"),
        "usage": {"input_tokens": 100, "output_tokens": 20},
    }
    paused = paused_coder(
        script, topology, "run it", [asks, say("it printed ran")], answer="The code printed ran."
    )
    assert paused.status == "interrupted"
    assert paused.pending[0]["tool"] == "run_python"
    # The paused visit's call is counted already: the ledger shows what was spent.
    coder = paused.usage["coder"]
    assert (coder["model_calls"], coder["input_tokens"], coder["tool_calls"]) == (1, 100, 0)
    ledger = ledger_for(home)
    try:
        stored = {u.agent: u for u in ledger.usage(paused.task_id)}
    finally:
        ledger.close()
    assert stored["coder"].input_tokens == 100
    done = resume_task(paused.task_id, Decision(decision="approve"))
    assert done.status == "succeeded", done.stop_reason
    assert done.usage["coder"]["tool_calls"] == 1
    assert done.usage["coder"]["model_calls"] == 2  # Counted once, though counted while paused.
    assert done.usage["coder"]["input_tokens"] > 100


# -- threads ----------------------------------------------------------------------------------


def test_swarm_remembers_the_active_agent_across_turns(home: Path, script: Script) -> None:
    spec = script(
        {
            "researcher": [transfer("writer", "write")],
            "writer": [say("first answer"), say("second answer")],
        }
    )
    first = run_task("one", model=spec, topology=SWARM)
    assert first.agents_run == ["researcher", "writer"]
    second = run_task("two", model=spec, topology=SWARM, thread_id=first.thread_id)
    assert second.status == "succeeded", second.stop_reason
    assert second.agents_run == ["writer"]  # The agent active last takes the next request.
    assert second.answer == "second answer"


def test_a_thread_keeps_its_topology(home: Path, script: Script) -> None:
    spec = script({"researcher": [say("done")]})
    first = run_task("one", model=spec, topology=SWARM)
    with pytest.raises(ConfigError, match="runs the 'swarm' topology, not 'structured'"):
        run_task("two", model=spec, thread_id=first.thread_id)


def test_topology_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="'mesh' is not one of"):
        Topology.parse("mesh")
    with pytest.raises(ConfigError, match="start_agent 'coder' applies only to the swarm"):
        Topology.parse("supervisor-tools", start_agent="coder")
    with pytest.raises(ConfigError, match="output_mode 'everything' is not one of"):
        Topology.parse("supervisor-tools", output_mode="everything")
    with pytest.raises(ConfigError, match="start_agent 'critic' is not an agent"):
        Topology.parse("swarm", start_agent="critic").check_agents(("researcher",))
    assert Topology.from_mapping(None) == Topology()
    tools = Topology.parse("supervisor-tools", output_mode="full_history")
    assert Topology.from_mapping(tools.to_mapping()) == tools


# -- the command line -------------------------------------------------------------------------


def test_cli_runs_each_topology_and_refuses_misplaced_options(home: Path, script: Script) -> None:
    spec = script({"researcher": [say("swarm answer")]})
    proc = relaygraph("run", "go", "--model", spec, "--topology", "swarm", "--json", home=home)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["topology"] == {"kind": "swarm"} and out["answer"] == "swarm answer"
    proc = relaygraph("run", "go", "--model", spec, "--output-mode", "full_history", home=home)
    assert proc.returncode == 2
    assert "output_mode 'full_history' applies only to the supervisor-tools topology" in proc.stderr
    proc = relaygraph("run", "go", "--topology", "swarm", "--start-agent", "critic", home=home)
    assert proc.returncode == 2
    assert "start_agent 'critic' is not an agent of this team" in proc.stderr


def test_graph_draws_each_topology(home: Path) -> None:
    swarm = relaygraph("graph", "--topology", "swarm", home=home)
    assert swarm.returncode == 0, swarm.stderr
    assert "researcher -.-> coder;" in swarm.stdout and "supervisor" not in swarm.stdout
    tools = relaygraph("graph", "--topology", "supervisor-tools", home=home)
    assert "supervisor -.-> finalize;" in tools.stdout
    assert "researcher --> supervisor;" in tools.stdout


# -- tracing ----------------------------------------------------------------------------------


def test_tool_supervisor_spans_show_routes_not_errors(home: Path, script: Script) -> None:
    from opentelemetry.trace import StatusCode

    from .test_tracing import events, named, traced_run

    spec = script(
        {
            "supervisor": [transfer("researcher", "look", "facts"), say("answered")],
            "researcher": [say("found")],
        }
    )
    result, spans = traced_run(spec, topology=TOOLS)
    assert result.status == "succeeded", result.stop_reason
    supervisor = named(spans, "invoke_agent supervisor")
    assert [s.status.status_code for s in supervisor] == [StatusCode.UNSET] * 2
    [route] = events(supervisor[0], "relaygraph.route")
    assert route["relaygraph.route.next"] == "researcher"
    assert route["relaygraph.route.reason"] == "facts"
    usage = supervisor[0].attributes or {}
    assert usage["gen_ai.usage.input_tokens"] > 0
    assert all(s.status.status_code is not StatusCode.ERROR for s in spans)


def test_swarm_handoff_spans(home: Path, script: Script) -> None:
    from .test_tracing import events, named, span_tree, traced_run

    spec = script({"researcher": [transfer("writer", "write", "words")], "writer": [say("ok")]})
    result, spans = traced_run(spec, topology=SWARM)
    assert result.status == "succeeded", result.stop_reason
    tree = span_tree(spans)
    assert [node if isinstance(node, str) else node[0] for node in tree[0][1]] == [
        "invoke_agent researcher",
        "invoke_agent writer",
        "invoke_agent finalize",
    ]
    [researcher] = named(spans, "invoke_agent researcher")
    [handoff] = events(researcher, "relaygraph.handoff")
    assert (handoff["relaygraph.handoff.to"], handoff["relaygraph.handoff.task"]) == (
        "writer",
        "write",
    )


# -- comparing the three on the shipped golden set --------------------------------------------


@pytest.mark.slow
def test_eval_compares_the_three_topologies_on_the_shipped_golden_set(
    home: Path, tmp_path: Path
) -> None:
    import importlib.resources

    from relaygraph.evals import run_eval

    golden = Path(str(importlib.resources.files("relaygraph.evals") / "golden" / "golden.jsonl"))
    reports = {
        kind: run_eval(
            golden,
            topology=Topology.parse(kind),
            concurrency=2,
            out=tmp_path / kind,
            home=home,
        )
        for kind in ("structured", "supervisor-tools", "swarm")
    }
    for kind, report in reports.items():
        assert report.topology["kind"] == kind
        assert len(report.cases) == 43
        stored = json.loads((tmp_path / kind / "report.json").read_text())
        assert stored["topology"]["kind"] == kind
        assert all(c["trials"][0]["checks"][0]["name"] != "run" for c in stored["cases"]), (
            kind
        )  # every case ran in every topology
    assert reports["structured"].metrics.pass_rate == 1.0
    # The case written around the structured supervisor's repair of an invalid route: here
    # that route is a call of a transfer tool the supervisor lacks, refused and recorded as
    # a violation, which the case (expecting none) notices.
    tools = reports["supervisor-tools"]
    assert {c.id for c in tools.failed} == {"invalid-route-repaired"}
    repaired = next(c for c in tools.cases if c.id == "invalid-route-repaired")
    assert [(c.name, c.actual) for c in repaired.trials[0].checks if not c.passed] == [
        ("violations", ["handoff_not_allowed"])
    ]
    # The swarm has no supervisor: routes become handoffs and a spent agent ends the task,
    # which the cases written for a supervisor notice.
    swarm = reports["swarm"]
    assert swarm.metrics.routing_accuracy == 1.0
    assert 0.5 < swarm.metrics.pass_rate < 1.0
    failed = {c.id for c in swarm.failed}
    assert {"three-agents-routed", "budget-agent-model-calls"} <= failed


def test_tool_supervisor_langsmith_runs_carry_routes_not_errors(home: Path, script: Script) -> None:
    from relaygraph.tracing import LangSmithTracer

    from .test_tracing import LangSmithRecorder, langsmith_client, metadata

    recorder = LangSmithRecorder()
    spec = script(
        {
            "supervisor": [transfer("researcher", "look", "facts"), say("answered")],
            "researcher": [say("found")],
        }
    )
    tracer = LangSmithTracer(client=langsmith_client(recorder))
    result = run_task("go", model=spec, topology=TOOLS, callbacks=[tracer])
    assert result.status == "succeeded", result.stop_reason
    [root] = [r for r in recorder.runs.values() if r.get("parent_run_id") is None]
    assert [r["name"] for r in recorder.children(root)] == [
        "begin",
        "supervisor",
        "researcher",
        "supervisor",
        "finalize",
    ]
    first = recorder.children(root)[1]
    route = metadata(first)["relaygraph_route"]
    assert (route["from"], route["to"], route["task"]) == ("supervisor", "researcher", "look")
    assert metadata(first)["relaygraph_usage"]["model_calls"] == 1
    assert [r["name"] for r in recorder.runs.values() if r.get("error")] == []


def test_swarm_langsmith_runs_carry_handoffs_not_errors(home: Path, script: Script) -> None:
    """In the swarm, an agent that hands off is annotated with the handoff and not failed,
    though LangGraph's ParentCommand carries the handoff out of its subgraph."""
    from relaygraph.tracing import LangSmithTracer

    from .test_tracing import LangSmithRecorder, langsmith_client, metadata

    recorder = LangSmithRecorder()
    spec = script(
        {
            "researcher": [transfer("writer", "write it up", "a report was asked for")],
            "writer": [say("written")],
        }
    )
    tracer = LangSmithTracer(client=langsmith_client(recorder))
    result = run_task("go", model=spec, topology=SWARM, callbacks=[tracer])
    assert result.status == "succeeded", result.stop_reason
    assert [(h["kind"], h["from"], h["to"]) for h in result.handoffs] == [
        ("direct", "researcher", "writer")
    ]
    researcher = [r for r in recorder.runs.values() if r["name"] == "researcher"]
    assert researcher, [r["name"] for r in recorder.runs.values()]
    handoff = metadata(researcher[0])["relaygraph_handoff"]
    assert (handoff["from"], handoff["to"], handoff["task"]) == (
        "researcher",
        "writer",
        "write it up",
    )
    assert [r["name"] for r in recorder.runs.values() if r.get("error")] == []


@pytest.mark.parametrize("topology", [Topology(), TOOLS], ids=["structured", "supervisor-tools"])
def test_a_route_approved_after_a_ping_pong_is_recorded_once(
    home: Path, script: Script, topology: Topology
) -> None:
    """The supervisor's step re-runs after the person's decision and reports the route again;
    the ledger keeps one row per transfer."""
    tasks = ["find A", "check A", "find B", "check B", "find C"]
    agents = ["researcher", "coder", "researcher", "coder", "researcher"]
    if topology.kind == "structured":
        supervisor = [
            {"route": {"next": a, "task": t, "reason": "r"}}
            for a, t in zip(agents, tasks, strict=True)
        ] + [{"route": {"next": "FINISH", "task": "", "reason": "done"}}]
    else:
        supervisor = [transfer(a, t, "r") for a, t in zip(agents, tasks, strict=True)] + [
            say("final")
        ]
    spec = script(
        {
            "supervisor": supervisor,
            "researcher": [say("r1"), say("r2"), say("r3")],
            "coder": [say("c1"), say("c2")],
            "finalize": [say("final")],
        }
    )
    policy = parse_policy({"ping_pong": {"on_detect": "human"}})
    paused = run_task("go", model=spec, policy=policy, topology=topology)
    assert paused.status == "interrupted"
    assert paused.pending[0]["type"] == "ping_pong"
    # The violation is reported at the pause, whether or not a decision ever comes.
    assert [(v["agent"], v["kind"]) for v in paused.violations] == [("researcher", "ping_pong")]
    assert [e["kind"] for e in events_of(paused, home) if e["type"] == "violation"] == ["ping_pong"]
    done = resume_task(paused.task_id, Decision(decision="approve"))
    assert done.status == "succeeded", done.stop_reason
    assert done.agents_run == agents
    handoffs, _, _ = ledger_rows(done, home)
    assert [h.task for h in handoffs] == tasks
    violations = [e for e in events_of(done, home) if e["type"] == "violation"]
    assert [(v["agent"], v["kind"]) for v in violations] == [("researcher", "ping_pong")]
    assert [(v["agent"], v["kind"]) for v in done.violations] == [("researcher", "ping_pong")]
    # Each transfer's tokens_so_far is what the agents had spent when the work moved (the
    # supervisor's tokens, in the ledger's rows after the pause, are not among them).
    spent, expected = 0, []
    for event in events_of(done, home):
        if event["type"] == "agent_finished":
            spent += event["usage"]["input_tokens"] + event["usage"]["output_tokens"]
        elif event["type"] == "route" and event["next"] != "FINISH":
            expected.append(spent)
    assert [h.tokens_so_far for h in handoffs] == expected


def test_tool_supervisor_out_of_steps_is_a_stop_not_an_answer(home: Path, script: Script) -> None:
    """LangGraph's prebuilt supervisor would answer "need more steps" when its steps run out
    in the middle of tool calls; the team's step guard stops the task before that reply
    could pass for the supervisor's answer."""
    policy = parse_policy({"team": {"max_agent_runs": 1}})  # recursion limit 12
    spec = script({"supervisor": [call("transfer_to_nobody", task="x")] * 5 + [say("never")]})
    result = run_task("go", model=spec, policy=policy, topology=TOOLS)
    assert result.status == "degraded"
    assert result.stop_reason == "budget:team:recursion_limit"
    assert result.answer != "Sorry, need more steps to process this request."


@pytest.mark.parametrize(
    "topology", [Topology(), SWARM, TOOLS], ids=["structured", "swarm", "supervisor-tools"]
)
def test_a_long_thread_keeps_its_step_budget_per_request(
    home: Path, script: Script, topology: Topology
) -> None:
    """LangGraph numbers a thread's steps on across its requests; the step guard counts
    from each request's start, as LangGraph's recursion limit does."""
    requests = 6
    if topology.kind == "structured":
        one = {
            "supervisor": [
                {"route": {"next": a, "task": f"part {a}", "reason": "r"}}
                for a in ("researcher", "coder", "writer")
            ]
            + [{"route": {"next": "FINISH", "task": "", "reason": "done"}}],
            "finalize": [say("answer")],
        }
    elif topology.kind == "supervisor-tools":
        one = {
            "supervisor": [transfer(a, f"part {a}") for a in ("researcher", "coder", "writer")]
            + [say("answer")],
        }
    else:
        one = {"researcher": [transfer("coder")], "coder": [transfer("writer")]}
    turns: dict[str, Any] = {role: played * requests for role, played in one.items()}
    if topology.kind != "swarm":
        turns |= {a: [say(f"{a} done")] * requests for a in ("researcher", "coder", "writer")}
    else:
        # The swarm's next request goes to the agent active last: the writer, which
        # passes it round again.
        turns["writer"] = [say("answer")] + [transfer("researcher"), say("answer")] * requests
    spec = script(turns)
    thread = None
    for n in range(requests):
        result = run_task(f"request {n}", model=spec, topology=topology, thread_id=thread)
        assert result.status == "succeeded", (n, result.stop_reason)
        thread = result.thread_id


def test_tool_supervisor_transfer_beside_another_call_is_carried_out(
    home: Path, script: Script
) -> None:
    spec = script(
        {
            "supervisor": [
                calls(
                    ("search_docs", {"query": "x"}), ("transfer_to_researcher", {"task": "look"})
                ),
                say("done"),
            ],
            "researcher": [say("found")],
        }
    )
    result = run_task("go", model=spec, topology=TOOLS)
    assert result.status == "succeeded", result.stop_reason
    assert result.agents_run == ["researcher"]
    state = final_state(home, result.thread_id)
    answers = {m.name: m.text for m in state["messages"] if m.type == "tool"}
    assert answers["transfer_to_researcher"].startswith("Transferred to researcher")
    assert "not a tool of the supervisor" in answers["search_docs"]


def test_a_thread_keeps_its_output_mode(home: Path, script: Script) -> None:
    spec = script({"supervisor": [say("one"), say("two"), say("three")]})
    full = Topology.parse("supervisor-tools", output_mode="full_history")
    first = run_task("one", model=spec, topology=full)
    # Continued without naming a mode: the thread's own.
    second = run_task("two", model=spec, topology=TOOLS, thread_id=first.thread_id)
    assert second.topology == {"kind": "supervisor-tools", "output_mode": "full_history"}
    with pytest.raises(ConfigError, match="runs with output_mode 'full_history', not 'last_"):
        run_task(
            "three",
            model=spec,
            topology=Topology.parse("supervisor-tools", output_mode="last_message"),
            thread_id=first.thread_id,
        )


def test_a_failed_tool_supervisor_run_keeps_what_it_spent_and_refused(
    home: Path, script: Script
) -> None:
    policy = parse_policy({"agents": {"researcher": {"max_model_calls": 1}}})
    spec = script(
        {
            "supervisor": [
                transfer("researcher", "look"),
                transfer("researcher", "look again"),  # refused: out of budget
                transfer("researcher", "and again"),  # refused again; then the script ends
            ],
            "researcher": [say("found")],
        }
    )
    result = run_task("go", model=spec, policy=policy, topology=TOOLS)
    assert result.status == "failed"
    assert "ran out" in (result.stop_reason or "")
    # The supervisor's run that failed had not left its graph: its calls and refusals are
    # read from its own checkpoint.
    assert result.usage["supervisor"]["model_calls"] == 3
    assert [(v["agent"], v["kind"]) for v in result.violations] == [
        ("supervisor", "handoff_not_allowed"),
        ("supervisor", "handoff_not_allowed"),
    ]


def test_thread_history_shows_the_team_s_answers_not_agents_messages() -> None:
    from langchain_core.messages import AIMessage, HumanMessage

    from relaygraph.supervisor._prompts import history_text

    messages = [
        HumanMessage("first question"),
        AIMessage("", name="supervisor", tool_calls=[{"name": "t", "args": {}, "id": "1"}]),
        AIMessage("researcher's notes", name="researcher"),
        AIMessage("the supervisor's answer", name="supervisor"),
        HumanMessage("second question (failed: no answer)"),
        AIMessage("coder did not run: out of budget", name="coder"),
        HumanMessage("third question"),
    ]
    text = history_text({"messages": messages})
    assert "Team: the supervisor's answer" in text
    assert "researcher's notes" not in text and "did not run" not in text
    assert "third question" not in text  # The current request is not history.


def test_tool_supervisor_relays_an_agent_s_own_handoff(home: Path, script: Script) -> None:
    from .test_tracing import events, named, traced_run

    spec = script(
        {
            "supervisor": [transfer("researcher", "look"), say("final")],
            "researcher": [transfer("writer", "write it", "words")],
            "writer": [say("written")],
        }
    )
    result, spans = traced_run(spec, topology=TOOLS)
    assert result.status == "succeeded", result.stop_reason
    assert result.agents_run == ["researcher", "writer"]
    assert [(h["kind"], h["from"], h["to"]) for h in result.handoffs] == [
        ("route", "supervisor", "researcher"),
        ("direct", "researcher", "writer"),
    ]
    # The relay takes no model call of the supervisor's.
    assert result.usage["supervisor"]["model_calls"] == 2
    first, relay, _answered = named(spans, "invoke_agent supervisor")
    assert [e["relaygraph.route.next"] for e in events(first, "relaygraph.route")] == ["researcher"]
    assert events(relay, "relaygraph.route") == []
    [relayed] = events(relay, "relaygraph.relay")
    assert (relayed["relaygraph.handoff.from"], relayed["relaygraph.handoff.to"]) == (
        "researcher",
        "writer",
    )
    handoffs, _, _ = ledger_rows(result, home)
    assert [(h.kind, h.source, h.target) for h in handoffs] == [
        ("route", "supervisor", "researcher"),
        ("direct", "researcher", "writer"),
    ]


@pytest.mark.parametrize("topology", [Topology(), TOOLS], ids=["structured", "supervisor-tools"])
def test_a_route_stopped_by_a_ping_pong_moves_no_work_in_the_ledger(
    home: Path, script: Script, topology: Topology
) -> None:
    tasks = ["find A", "check A", "find B", "check B", "find C"]
    agents = ["researcher", "coder", "researcher", "coder", "researcher"]
    if topology.kind == "structured":
        supervisor = [
            {"route": {"next": a, "task": t, "reason": "r"}}
            for a, t in zip(agents, tasks, strict=True)
        ]
    else:
        supervisor = [transfer(a, t, "r") for a, t in zip(agents, tasks, strict=True)]
    spec = script(
        {
            "supervisor": supervisor,
            "researcher": [say("r1"), say("r2")],
            "coder": [say("c1"), say("c2")],
            "finalize": [say("what we have")],
        }
    )
    result = run_task("go", model=spec, topology=topology)
    assert result.status == "degraded"
    assert (result.stop_reason or "").startswith("ping_pong")
    handoffs, _, _ = ledger_rows(result, home)
    # The ledger's transfers are the result's: the stopped route moved no work.
    assert [h.task for h in handoffs] == [h["task"] for h in result.handoffs] == tasks[:4]
    routes = [e for e in events_of(result, home) if e["type"] == "route"]
    assert [(r["task"], r["carried_out"]) for r in routes][-1] == ("find C", False)


def test_tool_supervisor_routes_carry_the_team_graph_s_step(home: Path, script: Script) -> None:
    """The prebuilt supervisor runs as a graph of its own; its routes still carry the step of
    the team graph, as the structured supervisor's do (the same shape of graph, but for its
    end: the structured supervisor answers a FINISH with the last reply in its own step,
    where the prebuilt one's answer takes a finalize step)."""
    steps = {}
    for topology in (Topology(), TOOLS):
        if topology.kind == "structured":
            supervisor = [
                {"route": {"next": a, "task": a, "reason": "r"}} for a in ("researcher", "writer")
            ] + [{"route": {"next": "FINISH", "task": "", "reason": "done"}}]
        else:
            supervisor = [transfer("researcher", "researcher"), transfer("writer", "writer")]
            supervisor.append(say("answer"))
        spec = script(  # Two requests.
            {
                "supervisor": supervisor * 2,
                "researcher": [say("r")] * 2,
                "writer": [say("w")] * 2,
                "finalize": [say("answer")] * 2,
            }
        )
        first = run_task("one", model=spec, topology=topology)
        second = run_task("two", model=spec, topology=topology, thread_id=first.thread_id)
        assert second.status == "succeeded", second.stop_reason
        steps[topology.kind] = [
            [h.step for h in ledger_rows(result, home)[0]] for result in (first, second)
        ]
    (tools_first, tools_second), (first_steps, second_steps) = (
        steps["supervisor-tools"],
        steps["structured"],
    )
    assert tools_first == first_steps
    assert [step - 1 for step in tools_second] == second_steps
    assert all(isinstance(step, int) for run in steps["structured"] for step in run)


@pytest.mark.parametrize(
    "topology", [Topology(), SWARM, TOOLS], ids=["structured", "swarm", "supervisor-tools"]
)
def test_a_resumed_visit_is_counted_once_in_the_ledger_while_it_runs(
    home: Path, script: Script, topology: Topology
) -> None:
    asks = {
        **call("run_python", code="print(1)"),
        "usage": {"input_tokens": 100, "output_tokens": 20},
    }
    answers = {**say("printed 1"), "usage": {"input_tokens": 200, "output_tokens": 30}}
    paused = paused_coder(script, topology, "go", [asks, answers], answer="done")
    assert paused.usage["coder"]["input_tokens"] == 100  # The paused visit, counted.
    seen: list[int] = []

    def on_event(event: dict[str, Any]) -> None:
        if event["type"] == "agent_finished" and event["agent"] == "coder":
            ledger = ledger_for(home)
            try:
                seen.extend(
                    u.input_tokens for u in ledger.usage(paused.task_id) if u.agent == "coder"
                )
            finally:
                ledger.close()

    done = resume_task(paused.task_id, Decision(decision="approve"), on_event=on_event)
    assert done.status == "succeeded", done.stop_reason
    # While the resumed run goes on, the ledger holds the visit once, not the paused part again.
    assert seen == [300]
    assert done.usage["coder"]["input_tokens"] == 300
