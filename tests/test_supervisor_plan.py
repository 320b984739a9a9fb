"""The supervisor's plan: a route's ``then`` runs later steps without a supervisor call each,
while every step finishes with a result; anything else asks the supervisor again."""

from __future__ import annotations

from typing import Any

from relaygraph.models.local._team import without_plan
from relaygraph.supervisor import FINISH
from relaygraph.supervisor._route import route_json_schema, route_model


def route(next: str, task: str = "", reason: str = "because", then: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"next": next, "task": task, "reason": reason}
    if then is not None:
        body["then"] = then
    return {"route": body}


def call(tool: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": tool, "args": args}]}


def say(text: str) -> dict[str, Any]:
    return {"content": text}


RESEARCH = [
    call("search_docs", query="checkpoint super-step"),
    say("A checkpoint is written after every super-step [checkpoints]."),
]
WRITE = [
    call("save_artifact", name="report.md", content="One checkpoint per super-step."),
    say("Checkpoints are written after every super-step [checkpoints]. See report.md."),
]


def _of(requests: list[dict[str, Any]], role: str) -> list[dict[str, Any]]:
    return [r for r in requests if r["model"] == f"script-{role}"]


def test_a_planned_step_runs_without_a_supervisor_call(over_http: Any) -> None:
    script = {
        "supervisor": [
            route(
                "researcher",
                "Find when checkpoints are written",
                "facts first, then the report",
                then=["writer: Write a short report from the results"],
            ),
            route(FINISH, reason="the report answers it"),
        ],
        "researcher": RESEARCH,
        "writer": WRITE,
    }
    result, requests = over_http(script)
    assert result.status == "succeeded", result.stop_reason
    # Two supervisor calls for two agents and FINISH: the writer's step was planned.
    assert len(_of(requests, "supervisor")) == 2
    assert result.agents_run == ["researcher", "writer"]
    planned = result.handoffs[1]
    assert planned["kind"] == "route" and planned["from"] == "supervisor"
    assert planned["to"] == "writer"
    assert planned["task"] == "Write a short report from the results"
    assert planned["reason"] == "planned (1/1): facts first, then the report"
    # The planned step's agent gets its task and the results, as a routed one does.
    scoped = _of(requests, "writer")[0]["messages"][1]["content"]
    assert scoped.startswith("Task: Write a short report from the results")
    assert "- researcher: A checkpoint is written after every super-step" in scoped
    # The route schema offers the plan, a list of strings.
    schema = _of(requests, "supervisor")[0]["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["then"] == {"items": {"type": "string"}, "type": "array"}
    assert "then" not in schema["required"]


def test_a_step_that_ends_without_a_result_drops_the_plan(over_http: Any) -> None:
    # The researcher hands its work to the coder instead of finishing it: the plan made
    # before that no longer holds, so the supervisor is asked, and sees the results.
    script = {
        "supervisor": [
            route(
                "researcher",
                "Find when checkpoints are written",
                then=["writer: Write a short report from the results"],
            ),
            route("writer", "Write the report from the coder's table", "the table is in"),
            route(FINISH, reason="done"),
        ],
        "researcher": [call("transfer_to_coder", task="Tabulate checkpoints per step count")],
        "coder": [say("1 step -> 2 checkpoints; 2 steps -> 3 checkpoints.")],
        "writer": WRITE,
    }
    result, requests = over_http(script)
    assert result.status == "succeeded", result.stop_reason
    supervisor = _of(requests, "supervisor")
    assert len(supervisor) == 3
    assert "- coder (task: Tabulate checkpoints" in supervisor[1]["messages"][1]["content"]
    assert [h["to"] for h in result.handoffs] == ["researcher", "coder", "writer"]
    assert result.handoffs[2]["task"] == "Write the report from the coder's table"


def test_a_plan_naming_no_agent_of_the_team_is_repaired(over_http: Any) -> None:
    script = {
        "supervisor": [
            route("researcher", "Find when checkpoints are written", then=["designer: draw"]),
            route("researcher", "Find when checkpoints are written"),
            route(FINISH, reason="answered"),
        ],
        "researcher": RESEARCH,
    }
    result, requests = over_http(script)
    assert result.status == "succeeded", result.stop_reason
    repair = _of(requests, "supervisor")[1]["messages"][-1]["content"]
    assert "not a valid route" in repair and "'designer'" in repair
    assert [h["to"] for h in result.handoffs] == ["researcher"]


def test_the_embedded_model_is_never_offered_a_plan() -> None:
    schema = route_json_schema(route_model(["researcher", "writer"]))
    assert "then" in schema["properties"]
    narrowed = without_plan(schema)
    assert "then" not in narrowed["properties"]
    assert narrowed["required"] == schema["required"]
    other = {"type": "object", "properties": {"then": {"type": "string"}}, "required": []}
    assert without_plan(other) == other  # not a route: unchanged
