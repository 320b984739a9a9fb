"""Each model call of a run is recorded once (issue 46): what the model saw, what it
answered, and what it spent, in a ``model_call`` event whose usage is the same record the
Budgets card and the API read; a visit in progress shows its calls' spend, and the visit's
own record replaces them when it lands."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.outputs import ChatGeneration, LLMResult
from langchain_core.tools import tool
from pydantic import ValidationError

from relaygraph.agents import Agent, builtin
from relaygraph.events import Usage, event_sink, events_to
from relaygraph.policies import TeamPolicy
from relaygraph.runner import run_task
from relaygraph.runner._model_calls import ModelCallRecorder, ModelCallRecording
from relaygraph.store import LOCAL_PROJECT_ID, Ledger
from relaygraph.team import Team
from relaygraph.topology import Topology
from tests.conftest import EXAMPLE_RELAY

from ._scripts import call, route, say
from .test_events import check

RELAY = f"scripted:{EXAMPLE_RELAY}"


def _ledger(home: Path) -> Ledger:
    return Ledger(f"sqlite:///{home / 'ledger.sqlite'}")


def test_every_model_call_of_a_relay_is_recorded_with_the_usage_of_its_role(home: Path) -> None:
    seen: list[Any] = []
    result = run_task("When are checkpoints written?", model=RELAY, on_event=seen.append)
    assert result.status == "succeeded", result
    assert "model_call" in check(seen)
    calls = [e for e in seen if e["type"] == "model_call"]
    # One event per model call, whoever made it, and per role as many as its usage says.
    for role, usage in result.usage.items():
        mine = [c for c in calls if c["role"] == role]
        assert len(mine) == usage["model_calls"], role
        assert sum(c["usage"]["input_tokens"] for c in mine) == usage["input_tokens"], role
        assert sum(c["usage"]["output_tokens"] for c in mine) == usage["output_tokens"], role
    first = calls[0]
    assert first["messages"] and first["messages"][-1]["role"] == "human"
    assert first["reply"] is not None and first["reply"]["role"] == "ai"
    assert first["visit"] == first["usage"]["id"].split("#")[0]
    # The ledger's rows are the visits' records: the calls' were dropped when they landed.
    with _ledger(home) as ledger:
        rows = {u.agent: u for u in ledger.usage(result.task_id)}
        stored = ledger.events_after(result.task_id)
    for role, usage in result.usage.items():
        assert rows[role].model_calls == usage["model_calls"], role
        assert rows[role].input_tokens == usage["input_tokens"], role
    assert len([e for e in stored if e.type == "model_call"]) == len(calls)


def _record(home: Path, task_id: str, *events: dict[str, Any]) -> dict[str, Any]:
    with _ledger(home) as ledger:
        ledger.append_events(task_id, list(events))  # type: ignore[arg-type]
        return {u.agent: u for u in ledger.usage(task_id)}


def _usage(id: str, agent: str, calls: int, tokens: int) -> Usage:
    return Usage(
        id=id,
        agent=agent,
        turn=0,
        model_calls=calls,
        tool_calls=0,
        input_tokens=tokens,
        output_tokens=0,
        cost_usd=0.0,
        seconds=0.0,
        estimated=False,
    )


def test_a_visit_in_progress_shows_its_calls_and_its_own_record_replaces_them(
    home: Path,
) -> None:
    result = run_task("When are checkpoints written?", model=RELAY)
    task = result.task_id
    visit = "coder:visit-in-progress"

    def call(n: int, tokens: int) -> dict[str, Any]:
        return {
            "type": "model_call",
            "role": "coder",
            "visit": visit,
            "model": "m",
            "messages": [],
            "reply": None,
            "usage": _usage(f"{visit}#{n}", "coder", 1, tokens),
            "truncated": False,
            "redacted": True,
        }

    before = _record(home, task).get("coder")
    base_calls = before.model_calls if before else 0
    base_tokens = before.input_tokens if before else 0
    live = _record(home, task, call(1, 100), call(2, 50))["coder"]
    assert (live.model_calls, live.input_tokens) == (base_calls + 2, base_tokens + 150)
    # The same call sent again replaces itself.
    assert _record(home, task, call(2, 50))["coder"].model_calls == base_calls + 2
    finished = {
        "type": "agent_finished",
        "agent": "coder",
        "ended": "finished",
        "output": "",
        "usage": _usage(visit, "coder", 2, 150),
    }
    landed = _record(home, task, finished)["coder"]
    assert (landed.model_calls, landed.input_tokens) == (base_calls + 2, base_tokens + 150)


def _recorded(recording: ModelCallRecording, *seen: Any, reply: AIMessage) -> dict[str, Any]:
    from uuid import uuid4

    recorder = ModelCallRecorder(TeamPolicy(agents={}), recording)
    sent: list[Any] = []
    run = uuid4()
    with events_to(sent.append):
        assert event_sink() is not None
        recorder.on_chat_model_start(
            {}, [list(seen)], run_id=run, metadata={"langgraph_checkpoint_ns": "coder:t1|model:x"}
        )
        recorder.on_llm_end(LLMResult(generations=[[ChatGeneration(message=reply)]]), run_id=run)
    [event] = sent
    return event


def test_a_long_prompt_is_cut_and_says_so() -> None:
    reply = AIMessage(
        "ok", usage_metadata={"input_tokens": 9, "output_tokens": 1, "total_tokens": 10}
    )
    event = _recorded(
        ModelCallRecording(max_chars=10, max_messages=1),
        SystemMessage("system prompt"),
        HumanMessage("x" * 50),
        reply=reply,
    )
    assert event["truncated"] and not event["redacted"]
    assert event["messages"] == [{"role": "human", "content": "x" * 10}]
    assert event["usage"]["id"].startswith("coder:t1#")
    assert (event["usage"]["input_tokens"], event["usage"]["model_calls"]) == (9, 1)


def test_a_recording_without_messages_keeps_only_the_usage() -> None:
    reply = AIMessage("secret answer")
    event = _recorded(
        ModelCallRecording(messages=False), HumanMessage("secret prompt"), reply=reply
    )
    assert event["redacted"] and event["messages"] == [] and event["reply"] is None
    assert event["usage"]["model_calls"] == 1
    assert "secret" not in repr(event)


def test_the_recording_is_set_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from relaygraph.runner import RunnerSettings

    monkeypatch.setenv("RELAYGRAPH_MODEL_CALL_MESSAGES", "false")
    monkeypatch.setenv("RELAYGRAPH_MODEL_CALL_MAX_CHARS", "123")
    recording = RunnerSettings().model_call_recording()
    assert (recording.messages, recording.max_chars) == (False, 123)
    monkeypatch.setenv("RELAYGRAPH_MODEL_CALL_MAX_CHARS", "-1")
    with pytest.raises(ValidationError, match="model_call_max_chars"):
        RunnerSettings()


_ENTERED = threading.Event()
_RELEASE = threading.Event()


@tool
def hold_on(text: str) -> str:
    """Wait until the test has looked at the ledger."""
    _ENTERED.set()
    assert _RELEASE.wait(120), "the test never let the tool go on"
    return text


@pytest.mark.parametrize("kind", ["structured", "swarm"])
def test_the_ledger_shows_a_visits_spend_while_it_runs(
    home: Path, script: Callable[[dict[str, Any]], str], kind: str
) -> None:
    """While an agent's tool runs, mid-visit, its usage row already counts the model call
    that asked for the tool; the visit's own record replaces it when the visit ends."""
    _ENTERED.clear()
    _RELEASE.clear()
    holder = Agent(name="holder", description="holds", prompt="You hold.", tools=[hold_on])
    team = Team(agents=[holder, builtin.writer()], name="holders")
    turns: dict[str, Any] = {"holder": [call("hold_on", text="hi"), say("done")]}
    if kind == "structured":
        turns |= {"supervisor": [route("holder"), route("FINISH")], "finalize": [say("done")]}
    results: list[Any] = []
    runner = threading.Thread(
        target=lambda: results.append(
            run_task("Hold", team=team, model=script(turns), topology=Topology.parse(kind))
        )
    )
    runner.start()
    try:
        assert _ENTERED.wait(60), "the tool never ran"
        with _ledger(home) as ledger:
            [task], _ = ledger.list_tasks(project_id=LOCAL_PROJECT_ID, status="running")
            deadline = time.monotonic() + 60
            rows: dict[str, Any] = {}
            while time.monotonic() < deadline:
                rows = {u.agent: u for u in ledger.usage(task.id)}
                if "holder" in rows:
                    break
                time.sleep(0.05)
            finished = [e for e in ledger.events_after(task.id) if e.type == "agent_finished"]
        assert finished == []  # The visit is still in progress...
        assert rows["holder"].model_calls == 1  # ...and its first call is counted.
    finally:
        _RELEASE.set()
        runner.join(120)
    [result] = results
    assert result.status == "succeeded", result.stop_reason
    with _ledger(home) as ledger:
        final = {u.agent: u for u in ledger.usage(result.task_id)}["holder"]
    # Both calls, once each: the calls' records gave way to the visit's.
    assert final.model_calls == result.usage["holder"]["model_calls"] == 2
    assert final.input_tokens == result.usage["holder"]["input_tokens"]
