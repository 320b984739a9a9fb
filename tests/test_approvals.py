"""Approvals and ``relaygraph resume``: the run pauses before the tool, a new process decides.

Every resume here runs in a fresh process, from the checkpoint on disk, as a user would.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, ToolMessage

from ._scripts import call, route, say
from .test_cli import relaygraph
from .test_team import final_state

Script = Callable[[dict[str, Any]], str]

APPROVAL_POLICY = """
[agents.coder]
tools = ["run_python", "write_file", "read_file"]
approval = ["run_python"]
max_model_calls = 4

# Finalize's model writes the answer after a resume too (its usage is counted below).
[finalize]
answer = "model"
"""

FIRST = "open('side.txt', 'a').write('1')\nprint('first ran')"
SECOND = "open('side.txt', 'a').write('2')\nprint('second ran')"


def used(turn: dict[str, Any], input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {**turn, "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}}


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "approval.toml"
    path.write_text(APPROVAL_POLICY, encoding="utf-8")
    return path


def run_json(*args: str, home: Path, code: int) -> dict[str, Any]:
    proc = relaygraph(*args, "--json", home=home)
    assert proc.returncode == code, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def side_effect(home: Path, task_id: str) -> str | None:
    path = home / "tasks" / task_id / "workspace" / "side.txt"
    return path.read_text() if path.exists() else None


def ledger_usage(home: Path, task_id: str) -> dict[str, tuple[int, int, int, int]]:
    """Each role's (model calls, tool calls, input, output tokens) in the ledger's rows."""
    from relaygraph.store import Ledger

    with Ledger(f"sqlite:///{home / 'ledger.sqlite'}") as ledger:
        return {
            u.agent: (u.model_calls, u.tool_calls, u.input_tokens, u.output_tokens)
            for u in ledger.usage(task_id)
        }


def figures(usage: dict[str, Any]) -> dict[str, tuple[int, int, int, int]]:
    return {
        role: (u["model_calls"], u["tool_calls"], u["input_tokens"], u["output_tokens"])
        for role, u in usage.items()
    }


def coder_transcript(home: Path, thread_id: str) -> list[Any]:
    state = final_state(home, thread_id)
    return next(v for v in state["visits"] if v["agent"] == "coder")["messages"]


def start(spec: str, policy: Path, home: Path) -> dict[str, Any]:
    paused = run_json(
        "run", "compute it", "--model", spec, "--policy", str(policy), home=home, code=3
    )
    assert paused["status"] == "interrupted"
    assert paused["answer"] is None
    assert paused["stop_reason"] == "awaiting approval: coder wants to run run_python"
    # Nothing with a side effect happened before the interrupt.
    assert side_effect(home, paused["task_id"]) is None
    return paused


def start_first(script: Script, policy: Path, home: Path, *, then: str) -> dict[str, Any]:
    """:func:`start` the task in which the coder asks to run ``FIRST`` and, once decided,
    says ``then``."""
    spec = script(
        {
            "supervisor": [route("coder"), route("FINISH")],
            "coder": [call("run_python", code=FIRST), say(then)],
            "finalize": [say("final")],
        }
    )
    return start(spec, policy, home)


def test_approve_in_a_new_process_runs_the_tool_exactly_once(
    home: Path, script: Script, policy_file: Path
) -> None:
    spec = script(
        {
            "supervisor": [used(route("coder"), 10, 1), used(route("FINISH"), 10, 1)],
            "coder": [
                used(call("run_python", code=FIRST), 100, 10),
                used(call("run_python", code=SECOND), 200, 20),
                used(say("both ran"), 300, 30),
            ],
            "finalize": [used(say("final answer"), 5, 1)],
        }
    )
    paused = start(spec, policy_file, home)
    [pending] = paused["pending"]
    assert pending["type"] == "approval"
    assert (pending["agent"], pending["tool"]) == ("coder", "run_python")
    # The paused visit's call so far is in the ledger: what the task has spent.
    assert ledger_usage(home, paused["task_id"]) == figures(paused["usage"])
    assert ledger_usage(home, paused["task_id"])["coder"] == (1, 0, 100, 10)
    assert pending["args"] == {"code": FIRST}
    assert isinstance(pending["step"], int)

    # The first approval runs the first call; the coder's next call waits in turn.
    again = run_json("resume", paused["task_id"], "--approve", home=home, code=3)
    assert again["status"] == "interrupted"
    assert again["pending"][0]["args"] == {"code": SECOND}
    assert side_effect(home, paused["task_id"]) == "1"

    done = run_json("resume", paused["task_id"], "--approve", home=home, code=0)
    assert done["status"] == "succeeded", done["stop_reason"]
    assert done["stop_reason"] is None
    assert done["answer"] == "final answer"
    assert done["pending"] == []
    assert done["task_id"] == paused["task_id"]
    # Each approved call ran exactly once, across three processes.
    assert side_effect(home, paused["task_id"]) == "12"
    # The coder node was re-run on each resume, yet its usage counts each call once.
    coder = done["usage"]["coder"]
    assert coder["model_calls"] == 3
    assert coder["tool_calls"] == 2
    assert (coder["input_tokens"], coder["output_tokens"]) == (600, 60)
    assert coder["estimated"] is False
    assert coder["limits"]["max_model_calls"] == 4
    assert done["usage"]["supervisor"]["model_calls"] == 2
    assert done["team_usage"]["input_tokens"] == 625
    # The ledger holds the same figures: the visit's finished record replaced what it had
    # spent at each pause, nothing counted twice.
    assert ledger_usage(home, paused["task_id"]) == figures(done["usage"])
    # The script went on where it stopped: turns 1, 2, 3 in order, none replayed or skipped.
    transcript = coder_transcript(home, done["thread_id"])
    turns = [
        m.response_metadata["relaygraph_script_turn"]
        for m in transcript
        if isinstance(m, AIMessage)
    ]
    assert turns == [1, 2, 3]
    results = [str(m.content) for m in transcript if isinstance(m, ToolMessage)]
    assert "first ran" in results[0]
    assert "second ran" in results[1]


def test_reject_tells_the_model_why_and_never_runs_the_tool(
    home: Path, script: Script, policy_file: Path
) -> None:
    paused = start_first(script, policy_file, home, then="I will not run it")
    done = run_json(
        "resume",
        paused["task_id"],
        "--reject",
        "--reason",
        "no file writes today",
        home=home,
        code=0,
    )
    assert done["status"] == "succeeded", done["stop_reason"]
    assert side_effect(home, paused["task_id"]) is None
    transcript = coder_transcript(home, done["thread_id"])
    [answer] = [m for m in transcript if isinstance(m, ToolMessage)]
    assert answer.status == "error"
    assert "rejected" in str(answer.content)
    assert "no file writes today" in str(answer.content)
    # The model saw the rejection and took its next turn.
    assert transcript[-1].text == "I will not run it"
    assert done["usage"]["coder"]["tool_calls"] == 0
    assert done["usage"]["coder"]["model_calls"] == 2


def test_edit_runs_the_tool_with_the_new_arguments(
    home: Path, script: Script, policy_file: Path
) -> None:
    paused = start_first(script, policy_file, home, then="edited version ran")
    edited = "open('side.txt', 'a').write('edited')\nprint('edited ran')"
    done = run_json(
        "resume", paused["task_id"], "--edit", json.dumps({"code": edited}), home=home, code=0
    )
    assert done["status"] == "succeeded", done["stop_reason"]
    assert side_effect(home, paused["task_id"]) == "edited"
    transcript = coder_transcript(home, done["thread_id"])
    [answer] = [m for m in transcript if isinstance(m, ToolMessage)]
    assert "edited ran" in str(answer.content)
    assert done["usage"]["coder"]["tool_calls"] == 1
    # The record says what ran, and that a person changed it from what the model asked.
    from relaygraph.store import LOCAL_PROJECT_ID, Ledger
    from relaygraph.tracing import build_timeline

    task_id = paused["task_id"]
    with Ledger(f"sqlite:///{home / 'ledger.sqlite'}") as ledger:
        [ran] = ledger.tool_calls(task_id)
        [approval] = ledger.approvals(task_id)
        [decided] = [e.data for e in ledger.events_after(task_id) if e.type == "approval"]
        timeline = build_timeline(ledger, task_id, project_id=LOCAL_PROJECT_ID)
    assert ran.args == {"code": edited}
    assert (approval.args, approval.edited_args) == ({"code": FIRST}, {"code": edited})
    assert decided["decision"] == "edit" and decided["args"] == {"code": edited}
    assert decided["tool_call_id"] == ran.tool_call_id
    tools = [
        node
        for visit in timeline["children"]
        if visit["kind"] == "agent"
        for node in visit["children"]
        if node["kind"] == "tool"
    ]
    assert [(t["args"], t.get("model_args"), t["status"]) for t in tools][-1] == (
        {"code": edited},
        {"code": FIRST},
        "success",
    )
    shown = relaygraph("trace", task_id, home=home)
    assert "arguments edited by a person" in shown.stdout, shown.stdout


def test_resume_refuses_what_it_cannot_continue(
    home: Path, script: Script, policy_file: Path
) -> None:
    paused = start_first(script, policy_file, home, then="done")
    task_id = paused["task_id"]

    bad_json = relaygraph("resume", task_id, "--edit", "{code: 1", home=home)
    assert bad_json.returncode == 2
    assert "not valid JSON" in bad_json.stderr
    not_object = relaygraph("resume", task_id, "--edit", "[1, 2]", home=home)
    assert not_object.returncode == 2
    assert "expected a JSON object" in not_object.stderr
    no_decision = relaygraph("resume", task_id, home=home)
    assert no_decision.returncode == 2
    assert "one of the arguments --approve --reject --edit is required" in no_decision.stderr
    wrong_args = relaygraph("resume", task_id, "--edit", '{"cmd": "ls"}', home=home)
    assert wrong_args.returncode == 2
    assert "run_python takes code; not 'cmd'" in wrong_args.stderr
    wrong_type = relaygraph("resume", task_id, "--edit", '{"code": 7}', home=home)
    assert wrong_type.returncode == 2
    assert "arguments for run_python: code: Input should be a valid string (got 7)" in (
        wrong_type.stderr
    )
    unknown = relaygraph("resume", "no-such-task", "--approve", home=home)
    assert unknown.returncode == 2
    assert "no task 'no-such-task'" in unknown.stderr
    # None of that touched the paused task: it still waits, and nothing ran.
    assert side_effect(home, task_id) is None

    run_json("resume", task_id, "--approve", home=home, code=0)
    finished = relaygraph("resume", task_id, "--approve", home=home)
    assert finished.returncode == 2
    assert f"task {task_id!r} is not waiting for a decision" in finished.stderr
    assert "'succeeded'" in finished.stderr
    assert finished.stdout == ""
    assert side_effect(home, task_id) == "1"  # still exactly once


def test_ping_pong_human_decision_in_a_new_process(
    home: Path, script: Script, tmp_path: Path
) -> None:
    policy = tmp_path / "human.toml"
    policy.write_text('[ping_pong]\non_detect = "human"\n', encoding="utf-8")

    def handoff(peer: str, task: str) -> dict[str, Any]:
        return call(f"transfer_to_{peer}", task=task, reason="yours")

    spec = script(
        {
            "supervisor": [route("researcher", task="find A"), route("FINISH")],
            "researcher": [handoff("coder", "check A"), handoff("coder", "check B"), say("r-done")],
            "coder": [handoff("researcher", "find B"), handoff("researcher", "find C")],
            "finalize": [say("final")],
        }
    )
    paused = run_json("run", "go", "--model", spec, "--policy", str(policy), home=home, code=3)
    assert paused["status"] == "interrupted"
    [pending] = paused["pending"]
    assert (pending["type"], pending["source"], pending["next"]) == (
        "ping_pong",
        "coder",
        "researcher",
    )
    done = run_json("resume", paused["task_id"], "--approve", home=home, code=0)
    assert done["status"] == "succeeded", done["stop_reason"]
    assert done["agents_run"] == ["researcher", "coder"] * 2 + ["researcher"]
    # The coder's visit was re-run on resume, but its model was not called again.
    assert done["usage"]["coder"]["model_calls"] == 2
    assert done["usage"]["researcher"]["model_calls"] == 3


def test_json_result_lists_violations_and_limits(
    home: Path, script: Script, tmp_path: Path
) -> None:
    policy = tmp_path / "p.toml"
    policy.write_text("[agents.researcher]\nhandoffs = []\nmax_tool_calls = 5\n", encoding="utf-8")
    spec = script(
        {
            "supervisor": [route("researcher"), route("FINISH")],
            "researcher": [
                call("run_python", code="print(1)"),
                call("transfer_to_coder", task="compute", reason="r"),
                call("search_docs", query="retry"),
                call("search_docs", query=" retry "),
                say("done"),
            ],
            "finalize": [say("final")],
        }
    )
    result = run_json("run", "go", "--model", spec, "--policy", str(policy), home=home, code=0)
    assert result["stop_reason"] is None
    assert [(v["agent"], v["kind"]) for v in result["violations"]] == [
        ("researcher", "tool_not_allowed"),
        ("researcher", "handoff_not_allowed"),
        ("researcher", "repeated_tool_call"),
    ]
    assert all(set(v) == {"agent", "kind", "detail"} for v in result["violations"])
    assert "run_python" in result["violations"][0]["detail"]
    researcher = result["usage"]["researcher"]
    assert (researcher["model_calls"], researcher["tool_calls"]) == (5, 1)
    assert researcher["limits"] == {
        "max_model_calls": 10,
        "max_tool_calls": 5,
        "max_tokens": None,
        "max_cost_usd": None,
        "max_seconds": None,
    }
    assert "limits" not in result["usage"]["supervisor"]
    assert result["team_usage"]["limits"]["max_agent_runs"] == 12
