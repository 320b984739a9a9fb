"""A run that did no real work is not ``succeeded`` (issue 15: honest status)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relaygraph.runner import run_task
from relaygraph.topology import Topology

Script = Any


def test_a_tool_supervisor_that_answers_itself_is_degraded(home: Path, script: Script) -> None:
    """LangGraph's tool-calling supervisor may answer without giving anyone work: the task
    then ran no agent, and says so instead of ``succeeded``."""
    spec = script({"supervisor": [{"content": "Checkpoints are written at every step."}]})
    result = run_task(
        "When are checkpoints written?", model=spec, topology=Topology.parse("supervisor-tools")
    )
    assert result.agents_run == []
    assert result.status == "degraded"
    assert result.stop_reason == "no agent ran: the team answered without doing any work"
    assert result.answer


def test_a_run_where_an_agent_worked_still_succeeds(home: Path, script: Script) -> None:
    spec = script(
        {
            "supervisor": [
                {
                    "tool_calls": [
                        {
                            "name": "transfer_to_researcher",
                            "args": {"task": "find", "reason": "facts"},
                        }
                    ]
                },
                {"content": "done"},
            ],
            "researcher": [
                {"tool_calls": [{"name": "search_docs", "args": {"query": "checkpoint"}}]},
                {"content": "found it"},
            ],
        }
    )
    result = run_task("When?", model=spec, topology=Topology.parse("supervisor-tools"))
    assert result.agents_run == ["researcher"]
    assert result.status == "succeeded", result.stop_reason


def test_a_blank_answer_is_degraded(home: Path, script: Script) -> None:
    spec = script(
        {
            "supervisor": [
                {
                    "tool_calls": [
                        {
                            "name": "transfer_to_researcher",
                            "args": {"task": "find", "reason": "facts"},
                        }
                    ]
                },
                {"content": "   "},
            ],
            "researcher": [
                {"tool_calls": [{"name": "search_docs", "args": {"query": "checkpoint"}}]},
                {"content": "found it"},
            ],
        }
    )
    result = run_task("When?", model=spec, topology=Topology.parse("supervisor-tools"))
    assert result.agents_run == ["researcher"]
    assert result.status == "degraded"
    assert result.stop_reason == "no answer: the team's final answer is empty"


def test_on_the_embedded_model_a_docs_answer_without_a_citation_is_degraded() -> None:
    from langchain_core.messages import ToolMessage

    from relaygraph.runner._summary import honest_status

    summary = {"agents_run": ["researcher"]}
    read = [ToolMessage(content="[checkpoints] Checkpoints\n\nDurability...", tool_call_id="1")]
    request = "What do the docs say about checkpoint durability?"
    cited = "Checkpoints are written at each step. [checkpoints]"
    assert honest_status("succeeded", None, summary, cited, request=request,
                         transcripts=read, grounding=True) == ("succeeded", None)  # fmt: skip
    status, why = honest_status(
        "succeeded", None, summary, "Durability is a choice.", request=request,
        transcripts=read, grounding=True,
    )  # fmt: skip
    assert status == "degraded" and why is not None and why.startswith("ungrounded:")
    # Other models are not held to it (yet): the same answer stays succeeded.
    assert honest_status(
        "succeeded", None, summary, "Durability is a choice.", request=request, transcripts=read
    ) == ("succeeded", None)
