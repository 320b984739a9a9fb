"""The policy layer in scripted team runs: budgets, allowlists, ping-pong, repeated calls.

Every scenario runs the real team graph on the scripted model, with real tools (the sandbox,
the workspace), so a side effect on disk shows whether a tool really ran.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from relaygraph.policies import TeamPolicy
from relaygraph.runner import Decision, RunResult, resume_task, run_task
from relaygraph.supervisor import FINISH
from tests.builtin_team import parse_policy

from ._scripts import call, route, say
from .openai_server import serve_script
from .test_team import final_state

Script = Callable[[dict[str, Any]], str]
Events = list[dict[str, Any]]


def used(turn: dict[str, Any], input_tokens: int, output_tokens: int = 0) -> dict[str, Any]:
    """The turn with exact token usage."""
    return {**turn, "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}}


def calls(*pairs: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """One model message with several tool calls."""
    return {"tool_calls": [{"name": name, "args": args} for name, args in pairs]}


def handoff(peer: str, task: str) -> dict[str, Any]:
    return call(f"transfer_to_{peer}", task=task, reason="over to you")


def workspace(home: Path, result: RunResult) -> Path:
    return home / "tasks" / result.task_id / "workspace"


def files(home: Path, result: RunResult) -> dict[str, str]:
    folder = workspace(home, result)
    if not folder.exists():
        return {}
    return {p.name: p.read_text() for p in folder.iterdir() if p.is_file()}


def visits(home: Path, result: RunResult) -> list[dict[str, Any]]:
    state = final_state(home, result.thread_id)
    return [v for v in state["visits"] if v["turn"] == state["turn"]]


def tool_answers(messages: list[BaseMessage]) -> dict[str, ToolMessage]:
    """The ToolMessages of a transcript, by the name of the tool they answer (the last one)."""
    return {m.name or "": m for m in messages if isinstance(m, ToolMessage)}


def routes(events: Events) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "route"]


def kinds(result: RunResult) -> list[tuple[str, str]]:
    return [(v["agent"], v["kind"]) for v in result.violations]


# -- agent budgets ----------------------------------------------------------------------------

SLEEP = "import time\ntime.sleep(1.2)\nprint('slept')"

AGENT_LIMITS: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {
    # limit: (the coder's policy, the coder's turns); each time the coder writes a.txt, is
    # stopped at its limit before b.txt (or before its second model call), and never says
    # "never".
    "max_model_calls": (
        {"max_model_calls": 1},
        [call("write_file", path="a.txt", content="a"), say("never")],
    ),
    "max_tool_calls": (
        {"max_tool_calls": 1},
        [
            calls(
                ("write_file", {"path": "a.txt", "content": "a"}),
                ("write_file", {"path": "b.txt", "content": "b"}),
            ),
            say("never"),
        ],
    ),
    "max_tokens": (
        {"max_tokens": 1000},
        [
            used(call("write_file", path="a.txt", content="a"), 300, 100),
            used(call("write_file", path="b.txt", content="b"), 500, 100),
            say("never"),
        ],
    ),
    "max_cost_usd": (
        # Priced at 1000 USD per million input tokens: 0.3 USD, then 0.6 USD in all.
        {"max_cost_usd": 0.5},
        [
            used(call("write_file", path="a.txt", content="a"), 300),
            used(call("write_file", path="b.txt", content="b"), 300),
            say("never"),
        ],
    ),
    "max_seconds": (
        {"max_seconds": 1},
        [
            calls(
                ("write_file", {"path": "a.txt", "content": "a"}),
                ("run_python", {"code": SLEEP}),
            ),
            say("never"),
        ],
    ),
}


@pytest.mark.parametrize("limit", list(AGENT_LIMITS))
def test_agent_limit_stops_the_agent_and_the_supervisor_routes_elsewhere(
    home: Path, script: Script, limit: str
) -> None:
    rules, coder_turns = AGENT_LIMITS[limit]
    # The coder plays its own script file, so a price can name its model alone.
    coder = script({"coder": coder_turns})
    team = script(
        {
            "supervisor": [
                route("coder", task="write the files"),
                route("coder", task="write more files"),  # refused: out of budget
                route("writer", task="write it up"),  # the repair
                route(FINISH),
            ],
            "writer": [say("final answer")],
        }
    )
    mapping: dict[str, Any] = {"agents": {"coder": rules}}
    if limit == "max_cost_usd":
        mapping["prices"] = {
            Path(coder.removeprefix("scripted:")).name: {"input": 1000, "output": 0}
        }
    events: Events = []
    result = run_task(
        "go",
        model=team,
        agent_models={"coder": coder},
        policy=parse_policy(mapping),
        on_event=events.append,
    )

    # The rest of the team went on: the writer ran and the supervisor finished.
    assert result.status == "succeeded", result.stop_reason
    assert result.stop_reason is None
    assert result.answer == "final answer"
    assert result.agents_run == ["coder", "writer"]
    # The coder's visit ended with a note naming the limit, and it never got to "never".
    coder_visit = visits(home, result)[0]
    assert coder_visit["ended"] == "budget"
    assert f"budget:agent:coder:{limit}" in coder_visit["output"]
    assert not any(m.text == "never" for m in coder_visit["messages"] if isinstance(m, AIMessage))
    # It stopped before the call that would go over: a.txt was written, b.txt never.
    assert files(home, result).get("a.txt") == "a"
    assert "b.txt" not in files(home, result)
    # One violation, for the coder, naming the limit; one live event for it, even where a
    # tool call was refused at the same limit before the visit ended.
    assert kinds(result) == [("coder", "budget")]
    assert [(e["agent"], e["kind"]) for e in events if e["type"] == "violation"] == [
        ("coder", "budget")
    ]
    unit = {
        "max_model_calls": "model calls",
        "max_tool_calls": "tool calls",
        "max_tokens": "tokens",
        "max_cost_usd": "USD",
        "max_seconds": "seconds",
    }[limit]
    assert result.violations[0]["detail"].startswith("agent 'coder' used ")
    assert result.violations[0]["detail"].endswith(f" {unit}")
    # The supervisor's second route to the coder was refused and repaired to the writer.
    second = routes(events)[1]
    assert second["next"] == "writer"
    assert second["repaired"] is True
    assert "'coder'" in second["error"]
    # Usage shows the counts beside the limits.
    usage = result.usage["coder"]
    assert usage["limits"][limit] == rules[limit]
    expected = {
        "max_model_calls": ("model_calls", 1),
        "max_tool_calls": ("tool_calls", 1),
        "max_tokens": ("input_tokens", 800),
        "max_cost_usd": ("cost_usd", 0.6),
        "max_seconds": ("tool_calls", 2),
    }[limit]
    assert usage[expected[0]] == pytest.approx(expected[1])
    if limit == "max_tokens":
        assert usage["output_tokens"] == 200
        assert usage["estimated"] is False
    if limit == "max_seconds":
        assert usage["seconds"] >= 1.2
        assert usage["model_calls"] == 1


def test_agent_budget_covers_all_its_visits(home: Path, script: Script) -> None:
    spec = script(
        {
            "supervisor": [
                route("coder", task="first part"),
                route("coder", task="second part"),
                route("writer", task="write it up"),
                route(FINISH),
            ],
            # Two model calls per visit: each visit alone is under the limit of three.
            "coder": [
                call("write_file", path="a.txt", content="a"),
                say("first done"),
                call("write_file", path="b.txt", content="b"),
                say("never"),
            ],
            "writer": [say("written")],
            "finalize": [say("final")],
        }
    )
    result = run_task(
        "go", model=spec, policy=parse_policy({"agents": {"coder": {"max_model_calls": 3}}})
    )
    assert result.agents_run == ["coder", "coder", "writer"]
    first, second = visits(home, result)[:2]
    assert first["ended"] == "finished"
    assert second["ended"] == "budget"
    assert "used 3 of 3 model calls" in second["output"]
    assert result.usage["coder"]["model_calls"] == 3
    assert kinds(result) == [("coder", "budget")]
    assert files(home, result) == {"a.txt": "a", "b.txt": "b"}


def test_a_route_to_an_agent_out_of_budget_is_refused_on_the_record(
    home: Path, script: Script
) -> None:
    """The coder spent its budget exactly and finished; the supervisor routes to it again:
    the route is refused, the repair prompt says why, and the refusal is a violation."""
    spec = script(
        {
            "supervisor": [
                route("coder", task="compute"),
                route("coder", task="compute again"),
                route("writer", task="write it up"),
                route(FINISH),
            ],
            "coder": [call("write_file", path="a.txt", content="a"), say("done")],
            "writer": [say("written")],
            "finalize": [say("final")],
        }
    )
    events: Events = []
    result = run_task(
        "go",
        model=spec,
        policy=parse_policy({"agents": {"coder": {"max_model_calls": 2}}}),
        on_event=events.append,
    )
    assert result.status == "succeeded"
    assert result.agents_run == ["coder", "writer"]
    assert kinds(result) == [("coder", "budget")]
    assert "route to 'coder' refused: out of budget" in result.violations[0]["detail"]
    assert "used 2 of 2 model calls" in result.violations[0]["detail"]
    live = [e for e in events if e["type"] == "violation"]
    assert [(e["agent"], e["kind"]) for e in live] == [("coder", "budget")]
    repaired = next(e for e in events if e["type"] == "route" and e["repaired"])
    assert repaired["next"] == "writer"


def test_handoff_to_an_agent_out_of_budget_is_refused(home: Path, script: Script) -> None:
    spec = script(
        {
            "supervisor": [
                route("coder", task="compute"),
                route("researcher", task="look it up"),
                route(FINISH),
            ],
            "coder": [call("write_file", path="a.txt", content="a"), say("never")],
            "researcher": [handoff("coder", "compute more"), say("did it myself")],
            "finalize": [say("final")],
        }
    )
    result = run_task(
        "go", model=spec, policy=parse_policy({"agents": {"coder": {"max_model_calls": 1}}})
    )
    assert result.status == "succeeded", result.stop_reason
    assert result.agents_run == ["coder", "researcher"]
    researcher = visits(home, result)[1]
    refusal = tool_answers(researcher["messages"])["transfer_to_coder"]
    assert "may not hand work to coder" in str(refusal.content)
    assert "out of budget" in str(refusal.content)
    assert researcher["output"] == "did it myself"
    assert kinds(result) == [("coder", "budget"), ("researcher", "handoff_not_allowed")]


# -- team budgets -----------------------------------------------------------------------------


@pytest.mark.parametrize("on_exhausted", ["finalize", "fail"])
def test_team_max_agent_runs(home: Path, script: Script, on_exhausted: str) -> None:
    spec = script(
        {
            "supervisor": [route("researcher", task=f"part {i}") for i in range(3)],
            "researcher": [say("a"), say("b"), say("c")],
            "finalize": [say("what we have")] if on_exhausted == "finalize" else [],
        }
    )
    policy = parse_policy({"team": {"max_agent_runs": 2, "on_exhausted": on_exhausted}})
    result = run_task("go", model=spec, policy=policy)
    assert result.agents_run == ["researcher", "researcher"]
    assert result.stop_reason == "budget:team:max_agent_runs"
    assert kinds(result) == [("team", "budget")]
    assert result.violations[0]["detail"] == "the team used 2 of 2 agent visits"
    if on_exhausted == "finalize":
        assert (result.status, result.answer) == ("degraded", "what we have")
    else:
        assert (result.status, result.answer) == ("failed", None)
        assert "finalize" not in result.usage  # no answer from a partial result


def test_supervisor_may_finish_with_every_visit_spent(home: Path, script: Script) -> None:
    spec = script(
        {
            "supervisor": [route("researcher"), route(FINISH)],
            "researcher": [say("all of it")],
            "finalize": [say("final")],
        }
    )
    result = run_task("go", model=spec, policy=parse_policy({"team": {"max_agent_runs": 1}}))
    assert (result.status, result.stop_reason) == ("succeeded", None)
    assert result.violations == []


@pytest.mark.parametrize("on_exhausted", ["finalize", "fail"])
def test_team_max_tokens_stops_inside_a_visit(
    home: Path, script: Script, on_exhausted: str
) -> None:
    spec = script(
        {
            "supervisor": [used(route("researcher"), 100), used(route(FINISH), 100)],
            # 100 + 400 spent; the second call brings the team to 900 of 900, so its tool
            # call is not run and no third model call is made.
            "researcher": [
                used(call("search_docs", query="retry"), 300, 100),
                used(call("search_docs", query="backoff"), 300, 100),
                say("never"),
            ],
            "finalize": [used(say("partial"), 50, 10)],
        }
    )
    policy = parse_policy({"team": {"max_tokens": 900, "on_exhausted": on_exhausted}})
    events: Events = []
    result = run_task("go", model=spec, policy=policy, on_event=events.append)
    assert result.stop_reason == "budget:team:max_tokens"
    assert result.usage["researcher"]["model_calls"] == 2
    assert result.usage["researcher"]["tool_calls"] == 1
    assert result.usage["supervisor"]["model_calls"] == 1
    ran = [e["preview"] for e in events if e["type"] == "tool_result" and e["status"] == "success"]
    assert len(ran) == 1
    assert ("team", "budget") in kinds(result)
    assert "the team used 900 of 900 tokens" in [v["detail"] for v in result.violations]
    if on_exhausted == "finalize":
        assert (result.status, result.answer) == ("degraded", "partial")
        assert result.team_usage["input_tokens"] + result.team_usage["output_tokens"] == 960
    else:
        assert (result.status, result.answer) == ("failed", None)
        assert result.team_usage["input_tokens"] + result.team_usage["output_tokens"] == 900


def test_team_max_cost_stops_before_the_next_route(home: Path, script: Script) -> None:
    spec = script(
        {
            "supervisor": [used(route("researcher"), 100), used(route(FINISH), 100)],
            "researcher": [used(call("search_docs", query="retry"), 200), used(say("found"), 200)],
            "finalize": [used(say("partial"), 0)],
        }
    )
    name = Path(spec.removeprefix("scripted:")).name
    # 1000 USD per million tokens: 0.1 + 0.2 + 0.2 = 0.5 USD, all of the team's budget.
    policy = parse_policy(
        {
            "team": {"max_cost_usd": 0.5},
            "prices": {f"scripted:{name}": {"input": 1000, "output": 1000}},
        }
    )
    result = run_task("go", model=spec, policy=policy)
    assert (result.status, result.stop_reason) == ("degraded", "budget:team:max_cost_usd")
    assert result.answer == "partial"
    assert result.agents_run == ["researcher"]
    assert result.usage["supervisor"]["model_calls"] == 1  # no second route was asked for
    assert result.team_usage["cost_usd"] == pytest.approx(0.5)
    assert result.violations == [
        {"agent": "team", "kind": "budget", "detail": "the team used 0.5 of 0.5 USD"}
    ]


def test_price_matches_the_scripted_model_name() -> None:
    policy = parse_policy({"prices": {"s.json": {"input": 1, "output": 2}}})
    assert policy.price_of("scripted:s.json") == policy.prices["s.json"]
    assert policy.price_of("scripted:other.json") is None


def test_team_max_seconds(home: Path, script: Script) -> None:
    spec = script(
        {
            "supervisor": [route("coder"), route(FINISH)],
            "coder": [call("run_python", code=SLEEP), say("never")],
            "finalize": [say("partial")],
        }
    )
    result = run_task("go", model=spec, policy=parse_policy({"team": {"max_seconds": 1}}))
    assert (result.status, result.stop_reason) == ("degraded", "budget:team:max_seconds")
    assert result.answer == "partial"
    assert result.usage["coder"]["model_calls"] == 1
    assert result.usage["supervisor"]["model_calls"] == 1
    assert kinds(result) == [("team", "budget")]


def test_recursion_limit_is_a_graceful_stop(
    home: Path, script: Script, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The team's own limits normally come first; with LangGraph's limit set low the step
    # guard must still finalize instead of letting GraphRecursionError out.
    monkeypatch.setattr(TeamPolicy, "recursion_limit", property(lambda self: 8))
    spec = script(
        {
            "supervisor": [route("researcher", task=f"part {i}") for i in range(6)],
            "researcher": [say(f"result {i}") for i in range(6)],
            "finalize": [say("what we have")],
        }
    )
    result = run_task("go", model=spec)
    assert (result.status, result.stop_reason) == ("degraded", "budget:team:recursion_limit")
    assert result.answer == "what we have"
    assert 1 <= len(result.agents_run) < 6
    assert kinds(result) == [("team", "budget")]


def test_a_long_agent_loop_is_not_cut_by_the_team_recursion_limit(
    home: Path, script: Script
) -> None:
    # One visit allowed (a team recursion limit of 12) but the agent takes 8 model calls:
    # its own subgraph needs more steps than that, and its max_model_calls is what ends it.
    spec = script(
        {
            "supervisor": [route("researcher"), route(FINISH)],
            "researcher": [call("search_docs", query=f"q{i}") for i in range(7)] + [say("done")],
            "finalize": [say("final")],
        }
    )
    result = run_task("go", model=spec, policy=parse_policy({"team": {"max_agent_runs": 1}}))
    assert (result.status, result.stop_reason) == ("succeeded", None)
    assert result.usage["researcher"]["model_calls"] == 8


# -- allowlists -------------------------------------------------------------------------------


def test_tool_not_allowed_is_not_run(home: Path, script: Script) -> None:
    spec = script(
        {
            "supervisor": [route("researcher"), route(FINISH)],
            "researcher": [
                call("run_python", code="open('pwned.txt', 'w').write('x')"),
                call("delete_everything"),
                say("done"),
            ],
            "finalize": [say("final")],
        }
    )
    events: Events = []
    result = run_task("go", model=spec, on_event=events.append)
    assert result.status == "succeeded", result.stop_reason
    assert "pwned.txt" not in files(home, result)
    answers = tool_answers(visits(home, result)[0]["messages"])
    for tool in ("run_python", "delete_everything"):
        assert answers[tool].status == "error"
        assert f"Not run: '{tool}' is not allowed for researcher" in str(answers[tool].content)
    assert kinds(result) == [("researcher", "tool_not_allowed")] * 2
    assert "run_python" in result.violations[0]["detail"]
    assert result.usage["researcher"]["tool_calls"] == 0  # refused calls are not counted
    assert [e["kind"] for e in events if e["type"] == "violation"] == ["tool_not_allowed"] * 2


def test_handoff_not_allowed_is_refused(home: Path, script: Script) -> None:
    spec = script(
        {
            "supervisor": [route("researcher"), route(FINISH)],
            "researcher": [handoff("coder", "compute"), handoff("writer", "write it up")],
            "writer": [say("written")],
            "finalize": [say("final")],
        }
    )
    policy = parse_policy({"agents": {"researcher": {"handoffs": ["writer"]}}})
    result = run_task("go", model=spec, policy=policy)
    assert result.status == "succeeded", result.stop_reason
    assert result.agents_run == ["researcher", "writer"]  # never the coder
    answer = tool_answers(visits(home, result)[0]["messages"])["transfer_to_coder"]
    assert "is not allowed for researcher" in str(answer.content)
    assert kinds(result) == [("researcher", "handoff_not_allowed")]
    assert [(h["from"], h["to"]) for h in result.handoffs if h["kind"] == "direct"] == [
        ("researcher", "writer")
    ]


@pytest.fixture
def openai_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")


def test_models_get_only_allowed_tools_and_supervisor_is_told_who_is_out(
    home: Path, openai_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    turns = {
        "supervisor": [
            {"route": {"next": "researcher", "task": "look it up", "reason": "facts"}},
            {"route": {"next": "coder", "task": "compute", "reason": "numbers"}},
            {"route": {"next": "FINISH", "task": "", "reason": "done"}},
        ],
        "researcher": [{"tool_calls": [{"name": "search_docs", "args": {"query": "retry"}}]}],
        "coder": [{"content": "42"}],
        "finalize": [{"content": "final"}],
    }
    policy = parse_policy(
        {
            "agents": {
                "researcher": {
                    "tools": ["search_docs"],
                    "handoffs": ["writer"],
                    "max_model_calls": 1,
                },
                "coder": {"tools": ["run_python"], "handoffs": []},
            }
        }
    )
    roles = ("supervisor", "researcher", "coder", "writer", "finalize")
    with serve_script(turns) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        result = run_task(
            "go", agent_models={r: f"openai:script-{r}" for r in roles}, policy=policy
        )
        requests = list(server.requests)
    assert result.status == "succeeded", result.stop_reason

    def offered(model: str) -> set[str]:
        body = next(r for r in requests if r["model"] == model)
        return {t["function"]["name"] for t in body.get("tools", [])}

    assert offered("script-researcher") == {"search_docs", "transfer_to_writer"}
    assert offered("script-coder") == {"run_python"}
    # After the researcher ran out, the supervisor's choices exclude it, and it is told why.
    second = [r for r in requests if r["model"] == "script-supervisor"][1]
    schema = second["response_format"]["json_schema"]["schema"]
    assert "researcher" not in schema["properties"]["next"]["enum"]
    prompt = json.dumps(second["messages"])
    assert "You may not route to: researcher (out of budget" in prompt
    assert "1 of 1 model calls" in prompt


# -- ping-pong --------------------------------------------------------------------------------

BOUNCING_ROUTES = [
    route("researcher", task="find A"),
    route("coder", task="check A"),
    route("researcher", task="find B"),
    route("coder", task="check B"),
    route("researcher", task="find C"),  # the third bounce of the pair: over max_bounces = 2
]


def test_ping_pong_through_routes_finalizes(home: Path, script: Script) -> None:
    spec = script(
        {
            "supervisor": BOUNCING_ROUTES,
            "researcher": [say("r1"), say("r2"), say("never")],
            "coder": [say("c1"), say("c2")],
            "finalize": [say("what we have")],
        }
    )
    result = run_task("go", model=spec)
    assert result.status == "degraded"
    assert (result.stop_reason or "").startswith("ping_pong")
    assert "3 times (max_bounces = 2)" in (result.stop_reason or "")
    assert result.agents_run == ["researcher", "coder", "researcher", "coder"]
    assert kinds(result) == [("researcher", "ping_pong")]
    assert result.answer == "what we have"


def test_ping_pong_through_routes_tells_the_supervisor(home: Path, script: Script) -> None:
    spec = script(
        {
            "supervisor": [
                *BOUNCING_ROUTES,
                route("researcher", task="find D"),  # the pair is barred: refused
                route("writer", task="write it up"),
                route(FINISH),
            ],
            "researcher": [say("r1"), say("r2"), say("never")],
            "coder": [say("c1"), say("c2")],
            "writer": [say("written")],
            "finalize": [say("final")],
        }
    )
    events: Events = []
    result = run_task(
        "go",
        model=spec,
        policy=parse_policy({"ping_pong": {"on_detect": "supervisor"}}),
        on_event=events.append,
    )
    assert (result.status, result.stop_reason) == ("succeeded", None)
    assert result.agents_run == ["researcher", "coder", "researcher", "coder", "writer"]
    assert kinds(result) == [("researcher", "ping_pong")]
    retry = routes(events)[5]
    assert retry["repaired"] is True
    assert "'researcher'" in retry["error"]


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_ping_pong_through_routes_asks_a_human(home: Path, script: Script, decision: str) -> None:
    spec = script(
        {
            "supervisor": [*BOUNCING_ROUTES, route(FINISH)],
            "researcher": [say("r1"), say("r2"), say("r3")],
            "coder": [say("c1"), say("c2")],
            "finalize": [say("final")],
        }
    )
    policy = parse_policy({"ping_pong": {"on_detect": "human"}})
    paused = run_task("go", model=spec, policy=policy)
    assert paused.status == "interrupted"
    assert paused.answer is None
    [pending] = paused.pending
    assert pending["type"] == "ping_pong"
    assert pending["next"] == "researcher"
    assert set(pending["agents"]) == {"researcher", "coder"}
    assert paused.agents_run == ["researcher", "coder", "researcher", "coder"]

    result = resume_task(paused.task_id, Decision(decision=decision))  # type: ignore[arg-type]
    assert kinds(result) == [("researcher", "ping_pong")]
    assert result.usage["supervisor"]["model_calls"] == 5 + (decision == "approve")
    if decision == "approve":
        assert (result.status, result.stop_reason) == ("succeeded", None)
        assert result.agents_run == ["researcher", "coder"] * 2 + ["researcher"]
    else:
        assert result.status == "degraded"
        assert (result.stop_reason or "").startswith("ping_pong")
        assert result.agents_run == ["researcher", "coder"] * 2


HANDOFF_BOUNCES = {
    "researcher": [handoff("coder", "check A"), handoff("coder", "check B"), say("never")],
    "coder": [handoff("researcher", "find B"), handoff("researcher", "find C")],
}


def test_ping_pong_through_handoffs_finalizes(home: Path, script: Script) -> None:
    spec = script(
        {
            "supervisor": [route("researcher", task="find A")],
            **HANDOFF_BOUNCES,
            "finalize": [say("partial")],
        }
    )
    events: Events = []
    result = run_task("go", model=spec, on_event=events.append)
    assert result.status == "degraded"
    assert (result.stop_reason or "").startswith("ping_pong")
    assert result.agents_run == ["researcher", "coder", "researcher", "coder"]
    # The fourth handoff was stopped: it moved no work, so it is no transfer of the task's
    # (as a route stopped by a limit), though its live event says it was made and stopped.
    assert [h["kind"] for h in result.handoffs] == ["route", "direct", "direct", "direct"]
    sent = [e for e in events if e["type"] == "handoff"]
    assert [e["carried_out"] for e in sent] == [True, True, True, False]
    assert kinds(result) == [("researcher", "ping_pong")]
    assert result.answer == "partial"
    from relaygraph.store import Ledger

    with Ledger(f"sqlite:///{home / 'ledger.sqlite'}") as ledger:
        assert [h.kind for h in ledger.handoffs(result.task_id)] == ["route", *["direct"] * 3]


def test_ping_pong_through_handoffs_bars_the_pair_both_ways(home: Path, script: Script) -> None:
    spec = script(
        {
            "supervisor": [
                route("researcher", task="find A"),
                route("coder", task="finish the check"),
                route(FINISH),
            ],
            "researcher": HANDOFF_BOUNCES["researcher"],
            # After the bar the coder tries to hand off to the researcher once more.
            "coder": [*HANDOFF_BOUNCES["coder"], handoff("researcher", "find D"), say("c-done")],
            "finalize": [say("final")],
        }
    )
    result = run_task(
        "go", model=spec, policy=parse_policy({"ping_pong": {"on_detect": "supervisor"}})
    )
    assert (result.status, result.stop_reason) == ("succeeded", None)
    assert result.agents_run == ["researcher", "coder", "researcher", "coder", "coder"]
    last = visits(home, result)[-1]
    refusal = tool_answers(last["messages"])["transfer_to_researcher"]
    assert "may not hand work to researcher" in str(refusal.content)
    assert "back and forth" in str(refusal.content)
    assert last["output"] == "c-done"
    assert kinds(result) == [("researcher", "ping_pong"), ("coder", "handoff_not_allowed")]


@pytest.mark.parametrize(
    ("on_detect", "expected_runs"),
    [("finalize", ["researcher"]), ("supervisor", ["researcher", "writer"])],
)
def test_the_same_task_sent_again(
    home: Path, script: Script, on_detect: str, expected_runs: list[str]
) -> None:
    spec = script(
        {
            "supervisor": [
                route("researcher", task="Find the retry policy"),
                route("researcher", task="  find the retry   POLICY "),
                route("writer", task="write it up"),
                route(FINISH),
            ],
            "researcher": [say("found"), say("never")],
            "writer": [say("written")],
            "finalize": [say("final")],
        }
    )
    result = run_task(
        "go", model=spec, policy=parse_policy({"ping_pong": {"on_detect": on_detect}})
    )
    assert result.agents_run == expected_runs
    assert kinds(result) == [("researcher", "ping_pong")]
    assert "already sent the same task" in result.violations[0]["detail"]
    if on_detect == "finalize":
        assert result.status == "degraded"
        assert (result.stop_reason or "").startswith("ping_pong")
    else:
        assert (result.status, result.stop_reason) == ("succeeded", None)


# -- repeated tool calls ----------------------------------------------------------------------

APPEND = "open('side.txt', 'a').write('x')\nprint('appended')"


def test_repeated_tool_call_is_answered_from_the_earlier_result(home: Path, script: Script) -> None:
    spec = script(
        {
            "supervisor": [route("coder"), route(FINISH)],
            "coder": [
                call("run_python", code=APPEND),
                call("run_python", code=APPEND + "\n  "),  # only surrounding whitespace differs
                {
                    "tool_calls": [
                        {"name": "write_file", "args": {"path": "a.txt", "content": "one"}}
                    ]
                },
                {
                    "tool_calls": [
                        {"name": "write_file", "args": {"path": "a.txt", "content": "two"}}
                    ]
                },
                # Same as the first write, keys in another order: not run, a.txt stays "two".
                {
                    "tool_calls": [
                        {"name": "write_file", "args": {"content": "one", "path": "a.txt"}}
                    ]
                },
                say("done"),
            ],
            "finalize": [say("final")],
        }
    )
    result = run_task("go", model=spec)
    assert result.status == "succeeded", result.stop_reason
    assert files(home, result) == {"side.txt": "x", "a.txt": "two"}
    assert kinds(result) == [("coder", "repeated_tool_call")] * 2
    assert result.usage["coder"]["tool_calls"] == 3
    transcript = visits(home, result)[0]["messages"]
    repeats = [
        m for m in transcript if isinstance(m, ToolMessage) and "Not run again" in str(m.content)
    ]
    assert len(repeats) == 2
    assert "appended" in str(repeats[0].content)  # the earlier result, given back
    assert "Wrote 3 characters to a.txt" in str(repeats[1].content)


def test_calls_that_differ_inside_a_string_are_not_repeats(home: Path, script: Script) -> None:
    spec = script(
        {
            "supervisor": [route("coder"), route(FINISH)],
            "coder": [
                call("write_file", path="a.txt", content="a  b"),
                call("write_file", path="a.txt", content="a b"),
                say("done"),
            ],
            "finalize": [say("final")],
        }
    )
    result = run_task("go", model=spec)
    assert files(home, result) == {"a.txt": "a b"}
    assert result.violations == []


def test_repeated_tool_call_across_two_visits(home: Path, script: Script) -> None:
    spec = script(
        {
            "supervisor": [
                route("coder", task="first"),
                route("coder", task="second"),
                route(FINISH),
            ],
            "coder": [
                call("run_python", code=APPEND),
                say("first done"),
                call("run_python", code=APPEND),
                say("second done"),
            ],
            "finalize": [say("final")],
        }
    )
    result = run_task("go", model=spec)
    assert result.status == "succeeded", result.stop_reason
    assert result.agents_run == ["coder", "coder"]
    assert files(home, result) == {"side.txt": "x"}
    assert kinds(result) == [("coder", "repeated_tool_call")]
    second = tool_answers(visits(home, result)[1]["messages"])["run_python"]
    assert "appended" in str(second.content)
    assert "Not run again" in str(second.content)
    assert result.usage["coder"]["tool_calls"] == 1


def test_no_agent_left_finalizes_degraded(home: Path, script: Script) -> None:
    agents = ("researcher", "coder", "writer")
    tool = {"researcher": "search_docs", "coder": "read_file", "writer": "list_artifacts"}
    args = {"researcher": {"query": "retry"}, "coder": {"path": "x.txt"}, "writer": {}}
    spec = script(
        {
            "supervisor": [route(a, task=f"{a} part") for a in agents],
            **{a: [call(tool[a], **args[a]), say("never")] for a in agents},
            "finalize": [say("what we have")],
        }
    )
    policy = parse_policy({"agents": {a: {"max_model_calls": 1} for a in agents}})
    result = run_task("go", model=spec, policy=policy)
    assert result.agents_run == list(agents)
    assert result.status == "degraded"
    # Every agent is out of budget: the stop reason names the first agent's limit.
    assert result.stop_reason == "budget:agent:researcher:max_model_calls"
    assert result.usage["supervisor"]["model_calls"] == 3  # not asked once nobody is left
    assert kinds(result) == [(a, "budget") for a in agents]
    assert result.answer == "what we have"


def test_approval_tool_must_come_alone(home: Path, script: Script) -> None:
    # Its siblings would run before the interrupt: the approval call is refused instead.
    spec = script(
        {
            "supervisor": [route("coder"), route(FINISH)],
            "coder": [
                calls(
                    ("write_file", {"path": "a.txt", "content": "a"}),
                    ("run_python", {"code": APPEND}),
                ),
                say("done"),
            ],
            "finalize": [say("final")],
        }
    )
    policy = parse_policy({"agents": {"coder": {"approval": ["run_python"]}}})
    result = run_task("go", model=spec, policy=policy)
    assert result.status == "succeeded", result.stop_reason
    assert files(home, result) == {"a.txt": "a"}
    refusal = tool_answers(visits(home, result)[0]["messages"])["run_python"]
    assert "needs a person's approval" in str(refusal.content)


def test_decision_is_checked() -> None:
    from relaygraph.errors import ConfigError

    with pytest.raises(ConfigError, match="an edit needs the new arguments"):
        Decision(decision="edit")
    with pytest.raises(ConfigError, match="must be 'approve', 'reject' or 'edit'"):
        Decision(decision="maybe")  # type: ignore[arg-type]
