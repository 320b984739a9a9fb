"""What the team sends its models: the scoped message once per visit, a stable prefix for
provider caching, minimal handoff and route schemas, and finalize without a model call when
the last agent's reply is the answer (``[finalize] answer``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from relaygraph.errors import ConfigError
from relaygraph.policies import FinalizePolicy, policy_to_mapping, tighten
from relaygraph.runner import run_task
from relaygraph.supervisor import FINISH

from ._scripts import call, route, say
from .builtin_team import default_policy, parse_policy

Script = Callable[[dict[str, Any]], str]
ROLES = ("supervisor", "researcher", "coder", "writer", "finalize")


RELAY = {
    "supervisor": [
        route("researcher", "Find when checkpoints are written", "facts first"),
        route("writer", "Write a short report from the results", "the deliverable"),
        route(FINISH, reason="the report answers it"),
    ],
    "researcher": [
        call("search_docs", query="checkpoint super-step"),
        say("A checkpoint is written after every super-step [checkpoints]."),
    ],
    "writer": [
        call("save_artifact", name="report.md", content="One checkpoint per super-step."),
        say("Checkpoints are written after every super-step [checkpoints]. See report.md."),
    ],
    "finalize": [say("The finalize model's answer.")],
}


def _of(requests: list[dict[str, Any]], role: str) -> list[dict[str, Any]]:
    return [r for r in requests if r["model"] == f"script-{role}"]


def test_the_scoped_message_is_sent_once_per_visit(over_http: Any) -> None:
    result, requests = over_http(RELAY)
    assert result.status == "succeeded", result.stop_reason
    for agent in ("researcher", "writer"):
        first, second = _of(requests, agent)
        # The visit's second call is the first call's conversation and the agent's own
        # turn after it: the scoped message is not rebuilt, repeated or moved.
        assert second["messages"][: len(first["messages"])] == first["messages"]
        assert [m["role"] for m in first["messages"]] == ["system", "user"]
        assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool"]
        scoped = first["messages"][1]["content"]
        assert scoped.startswith("Task: ")
        texts = [json.dumps(m) for m in second["messages"]]
        head = json.dumps(scoped[:60])[1:-1]  # as it appears in a message's JSON
        assert sum(head in text for text in texts) == 1
        # Definitions come first and stay the same for every call of the agent.
        assert first["tools"] == second["tools"]


def test_an_agent_sees_the_results_but_not_the_reason_or_an_empty_results_block(
    over_http: Any,
) -> None:
    _, requests = over_http(RELAY)
    researcher = _of(requests, "researcher")[0]["messages"][1]["content"]
    writer = _of(requests, "writer")[0]["messages"][1]["content"]
    assert "Results so far" not in researcher  # nothing to show yet
    assert "facts first" not in researcher and "Why you" not in researcher
    # The request once, and each result without the task it answered (the supervisor's
    # input keeps those, so as not to give a task twice).
    assert writer.count("When are checkpoints written? Write a short report.") == 1
    assert "Results so far:\n- researcher: A checkpoint is written after every super-step" in writer
    assert "Find when checkpoints are written" not in writer
    supervisor = _of(requests, "supervisor")[1]["messages"][1]["content"]
    assert "- researcher (task: Find when checkpoints are written): " in supervisor
    # Before any agent has worked, the supervisor reads the request alone.
    first = _of(requests, "supervisor")[0]["messages"][1]["content"]
    assert first == "Request: When are checkpoints written? Write a short report."


def test_a_direct_handoffs_task_is_sent_once_per_message(over_http: Any) -> None:
    task = "Compute how many checkpoints a 40-step run writes"
    script = {
        "supervisor": [
            route("researcher", "Find when checkpoints are written", "facts first"),
            route(FINISH, reason="the count answers it"),
        ],
        "researcher": [call("transfer_to_coder", task=task, reason="needs code")],
        "coder": [say("41: one per super-step plus the input.")],
    }
    result, requests = over_http(script)
    assert result.status == "succeeded", result.stop_reason
    coder = _of(requests, "coder")[0]["messages"][1]["content"]
    assert coder.startswith(f"Task (from researcher): {task}\n\n")
    assert coder.count(task) == 1
    assert coder.endswith("Results so far:\n- researcher: Handed off to coder.")
    supervisor = _of(requests, "supervisor")[1]["messages"][1]["content"]
    assert supervisor.count(task) == 1
    assert "Handed off to coder.\n- coder (task: " in supervisor


def test_handoff_tools_and_the_route_schema_are_minimal(over_http: Any) -> None:
    _, requests = over_http(RELAY)
    tools = {t["function"]["name"]: t["function"] for t in _of(requests, "researcher")[0]["tools"]}
    # One transfer tool per peer the policy allows; no description (its name says what it
    # does, and a description would go with every definition of every call), bare
    # arguments: 'task' required,
    # 'reason' optional (the ledger and the dashboard show it when given).
    assert tools["transfer_to_coder"]["description"] == ""
    params = tools["transfer_to_writer"]["parameters"]
    assert params["required"] == ["task"]
    assert params["properties"] == {"task": {"type": "string"}, "reason": {"type": "string"}}
    # The writer, the built-in team's last stage, hands off to no peer: its definitions are
    # its work tools alone.
    writer = {t["function"]["name"] for t in _of(requests, "writer")[0]["tools"]}
    assert writer == {"save_artifact", "list_artifacts"}
    schema = _of(requests, "supervisor")[-1]["response_format"]["json_schema"]["schema"]
    assert schema["required"] == ["next", "task", "reason"]
    assert schema["properties"] == {
        "next": {"enum": ["researcher", "coder", "writer", FINISH]},
        "task": {"type": "string"},
        "reason": {"type": "string"},
        # The plan (optional): later steps as 'agent: task' strings, the shortest form, with
        # the pattern the check applies (a grammar-constrained server writes no step the
        # check refuses: issue 42).
        "then": {
            "items": {
                "type": "string",
                "pattern": "^ *(researcher|coder|writer) *: *[^ \\t-\\r].*$",
            },
            "type": "array",
        },
    }


def test_finalize_answers_with_the_last_reply_and_calls_no_model(over_http: Any) -> None:
    result, requests = over_http(RELAY)
    assert result.status == "succeeded", result.stop_reason
    assert _of(requests, "finalize") == []
    assert result.answer == RELAY["writer"][-1]["content"]
    assert "finalize" not in result.usage
    # As many model calls as the conversation needs: three routes and two per visit.
    assert len(requests) == 3 + 2 + 2


@pytest.mark.parametrize("how", ["python", "policy file", "team file"])
def test_the_switch_makes_finalize_call_its_model(over_http: Any, tmp_path: Path, how: str) -> None:
    chosen: dict[str, Any] = {}
    if how == "python":
        policy = parse_policy({"finalize": {"answer": "model"}})
        assert policy.finalize == FinalizePolicy(answer="model")
        chosen["policy"] = policy
    elif how == "policy file":
        chosen["policy"] = tmp_path / "policy.toml"
        chosen["policy"].write_text('[finalize]\nanswer = "model"\n', encoding="utf-8")
    else:
        chosen["team"] = tmp_path / "team.toml"
        chosen["team"].write_text(
            'name = "trio"\n'
            + "".join(f'[agents.{a}]\nuse = "builtin:{a}"\n' for a in ROLES[1:4])
            + '[policy.finalize]\nanswer = "model"\n',
            encoding="utf-8",
        )
    result, requests = over_http(RELAY, **chosen)
    assert result.status == "succeeded", result.stop_reason
    assert len(_of(requests, "finalize")) == 1
    assert result.answer == "The finalize model's answer."
    assert result.usage["finalize"]["model_calls"] == 1


def test_a_task_that_stopped_early_still_gets_an_answer_written(home: Path, script: Script) -> None:
    import dataclasses

    from relaygraph.policies import TeamLimits

    policy = dataclasses.replace(default_policy(), team=TeamLimits(max_agent_runs=1))
    spec = script(
        {
            "supervisor": [route("researcher"), route("writer")],
            "researcher": [say("half the facts")],
            "finalize": [say("what we have")],
        }
    )
    result = run_task("go", model=spec, policy=policy)
    assert result.status == "degraded"
    assert result.answer == "what we have"
    assert result.usage["finalize"]["model_calls"] == 1


def test_a_last_visit_cut_off_by_its_budget_is_no_answer(home: Path, script: Script) -> None:
    """The supervisor finishes right after an agent ran out of budget: its visit ended with
    a note, not a reply, so finalize's model writes the answer."""
    spec = script(
        {
            "supervisor": [route("coder"), route(FINISH)],
            "coder": [call("write_file", path="a.txt", content="a"), say("never")],
            "finalize": [say("written by finalize")],
        }
    )
    policy = parse_policy({"agents": {"coder": {"max_model_calls": 1}}})
    result = run_task("go", model=spec, policy=policy)
    assert result.answer == "written by finalize"
    assert result.usage["finalize"]["model_calls"] == 1


def test_the_finalize_switch_is_stored_and_a_caller_may_choose_either() -> None:
    base = default_policy()
    assert base.finalize.answer == "last_reply"
    mapping = policy_to_mapping(base)
    assert mapping["finalize"] == {"answer": "last_reply", "citations": "auto"}
    wants_model = tighten(base, {"finalize": {"answer": "model"}})
    assert wants_model.finalize.answer == "model"
    # Not a limit: a caller's policy may turn the extra call off again.
    assert tighten(wants_model, {"finalize": {"answer": "last_reply"}}).finalize.answer == (
        "last_reply"
    )
    with pytest.raises(ConfigError, match=r"finalize.answer = \"always\""):
        parse_policy({"finalize": {"answer": "always"}})


def test_a_model_that_writes_the_final_answer_is_always_asked(home: Path, script: Script) -> None:
    """The embedded model cites its sources in finalize (``writes_final_answer``): under the
    default ``last_reply`` its finalize call still runs; another model's does not."""
    from relaygraph.models import load_model
    from relaygraph.models.local import LocalChatModel

    assert LocalChatModel.writes_final_answer
    spec = script(RELAY)
    finalize = load_model(spec, agent="finalize")
    object.__setattr__(finalize, "writes_final_answer", True)
    result = run_task("go", model=spec, agent_models={"finalize": finalize})
    assert result.answer == "The finalize model's answer."
    assert result.usage["finalize"]["model_calls"] == 1
    plain = run_task("go", model=script(RELAY))
    assert plain.answer.startswith("Checkpoints are written after every super-step")
    assert "finalize" not in plain.usage


def test_the_route_schema_is_made_once_per_roster_and_handed_out_as_a_copy() -> None:
    from relaygraph.supervisor._route import route_json_schema, route_model

    schema = route_model(["researcher", "coder"], may_finish=True)
    assert route_model(("researcher", "coder"), may_finish=True) is schema
    assert route_model(("researcher", "coder"), may_finish=False) is not schema
    first = route_json_schema(schema)
    first["properties"]["next"]["enum"].append("intruder")
    first["required"].clear()
    again = route_json_schema(schema)
    assert again["properties"]["next"]["enum"] == ["researcher", "coder", "FINISH"]
    assert again["required"] == ["next", "task", "reason"]
