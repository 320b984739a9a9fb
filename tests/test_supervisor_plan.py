"""The supervisor's plan: a route's ``then`` runs later steps without a supervisor call each,
while every step finishes with a result; anything else asks the supervisor again."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from relaygraph.models.local._team import without_plan
from relaygraph.supervisor import FINISH
from relaygraph.supervisor._route import route_json_schema, route_model

from ._scripts import call, say


def route(next: str, task: str = "", reason: str = "because", then: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"next": next, "task": task, "reason": reason}
    if then is not None:
        body["then"] = then
    return {"route": body}


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
    then = schema["properties"]["then"]
    assert then["type"] == "array" and then["items"]["type"] == "string"
    assert then["items"]["pattern"].startswith("^ *(researcher|coder|writer) *:")
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


# In process, on the scripted model, under a policy of the test's own.


def _run(tmp_path: Path, script: dict[str, Any], policy: str | None = None) -> Any:
    from relaygraph.runner import run_task

    path = tmp_path / f"script-{len(list(tmp_path.glob('script-*')))}.json"
    path.write_text(json.dumps(script), encoding="utf-8")
    policy_file = None
    if policy is not None:
        policy_file = tmp_path / "policy.toml"
        policy_file.write_text(policy, encoding="utf-8")
    return run_task("When are checkpoints written?", model=f"scripted:{path}", policy=policy_file)


def test_a_plan_may_name_an_agent_that_may_not_work_until_its_step(tmp_path: Path) -> None:
    # After a researcher/coder ping-pong the pair is barred after each other; a plan
    # writer -> researcher is valid: the researcher comes after the writer, not the coder.
    script = {
        "supervisor": [
            route("researcher", "r1"),
            route("coder", "c1"),
            route("researcher", "r2"),
            route("coder", "c2"),
            route("researcher", "r3"),  # a ping-pong: the pair is barred
            route("writer", "Write the draft", "draft, then verify", then=["researcher: Verify"]),
            route(FINISH, reason="verified"),
        ],
        "researcher": [say("r1 out"), say("r2 out"), say("verified")],
        "coder": [say("c1 out"), say("c2 out")],
        "writer": [say("draft")],
    }
    result = _run(tmp_path, script, '[ping_pong]\non_detect = "supervisor"\n')
    assert result.agents_run == [
        "researcher",
        "coder",
        "researcher",
        "coder",
        "writer",
        "researcher",
    ]
    assert result.handoffs[-1]["reason"] == "planned (1/1): draft, then verify"


def test_a_planned_step_to_a_spent_agent_is_refused_and_recorded(tmp_path: Path) -> None:
    script = {
        "supervisor": [
            route("writer", "Draft the report", "draft first", then=["writer: Final report"]),
            route(FINISH, reason="the draft will do"),
        ],
        "writer": [say("draft report")],
    }
    result = _run(tmp_path, script, "[agents.writer]\nmax_model_calls = 1\n")
    # The writer spent its one call: its planned step is refused, recorded as a model's
    # route to it is, and the supervisor decides (here: FINISH).
    assert result.agents_run == ["writer"]
    assert [v["kind"] for v in result.violations] == ["budget"]
    assert "route to 'writer' refused: out of budget" in result.violations[0]["detail"]


def test_a_plan_past_the_teams_visits_asks_the_supervisor(tmp_path: Path) -> None:
    script = {
        "supervisor": [
            route(
                "researcher", "Find it", "facts first", then=["coder: Tabulate", "writer: Report"]
            ),
            route(FINISH, reason="enough with two visits"),
        ],
        "researcher": [say("A checkpoint per super-step.")],
        "coder": [say("table")],
    }
    result = _run(tmp_path, script, "[team]\nmax_agent_runs = 2\n")
    # With every visit spent the supervisor may still say FINISH, plan or no plan.
    assert result.agents_run == ["researcher", "coder"]
    assert result.status == "succeeded", result.stop_reason


def test_other_topologies_play_a_plan_one_route_per_step(tmp_path: Path) -> None:
    from relaygraph.evals._translate import to_supervisor_tools, to_swarm
    from relaygraph.runner import run_task
    from relaygraph.topology import Topology

    script = {
        "supervisor": [
            route("researcher", "Find it", "facts, then the report", then=["writer: Report"]),
            route(FINISH, reason="answered"),
        ],
        "researcher": [say("A checkpoint is written after every super-step.")],
        "writer": [say("Report: one checkpoint per super-step.")],
    }
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(to_supervisor_tools(script)), encoding="utf-8")
    swarm_script, start = to_swarm(script, ["researcher", "coder", "writer"])
    swarm = tmp_path / "swarm.json"
    swarm.write_text(json.dumps(swarm_script), encoding="utf-8")
    for path, topology in (
        (tools, Topology(kind="supervisor-tools")),
        (swarm, Topology(kind="swarm", start_agent=start)),
    ):
        result = run_task("When?", model=f"scripted:{path}", topology=topology)
        assert result.agents_run == ["researcher", "writer"], topology


@given(st.data())
def test_every_step_the_schema_allows_is_a_step_the_check_accepts(data: st.DataObject) -> None:
    """A server that decodes under the schema cannot write a plan the check refuses: every
    string the ``then`` pattern matches passes validation."""
    agents = ["researcher", "co-der", "writer_2"]
    schema = route_json_schema(route_model(agents))
    pattern = schema["properties"]["then"]["items"]["pattern"]
    step = data.draw(st.from_regex(pattern, fullmatch=True))
    route = route_model(agents)(next="researcher", task="look", reason="r", then=[step])
    assert route.planned_steps()[0][0] in agents


def test_the_plan_pattern_refuses_what_the_check_refuses() -> None:
    pattern = re.compile(
        route_json_schema(route_model(["researcher"]))["properties"]["then"]["items"]["pattern"]
    )
    assert pattern.fullmatch("researcher: look it up")
    for step in (
        "researcher:",
        "researcher: \t",
        "designer: draw",
        "FINISH: stop",
        "look it up",
    ):
        assert not pattern.fullmatch(step), step
