"""The audit timeline of events no run of the scripted model makes: a model call retried and
failed, a run suspended by a server that stopped, a tool result cut to the ledger's preview.

The events are written to the ledger as the runner writes them, then read back as
``relaygraph trace`` and ``GET /v1/tasks/{id}/trace`` read them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from relaygraph.events import PREVIEW_CHARS
from relaygraph.store import LOCAL_PROJECT_ID, Ledger
from relaygraph.tracing import build_timeline, render_timeline

LONG_RESULT = "a line of the document\n" * 40
"""A tool result longer than the ledger keeps."""


def _usage(agent: str) -> dict[str, Any]:
    return {
        "id": f"{agent}:1",
        "agent": agent,
        "turn": 1,
        "model_calls": 2,
        "tool_calls": 2,
        "input_tokens": 120,
        "output_tokens": 8,
        "cost_usd": 0.0,
        "seconds": 0.4,
        "estimated": False,
    }


def _tool(name: str, call_id: str, result: str) -> list[dict[str, Any]]:
    return [
        {
            "type": "tool_call",
            "agent": "researcher",
            "tool": name,
            "args": {"doc_id": "ckpt"},
            "tool_call_id": call_id,
        },
        {
            "type": "tool_result",
            "agent": "researcher",
            "tool": name,
            "tool_call_id": call_id,
            "status": "success",
            "ran": True,
            # As the agents' tool middleware cuts it.
            "preview": result[:PREVIEW_CHARS],
        },
    ]


def _run_started(task_id: str) -> dict[str, Any]:
    return {
        "type": "run_started",
        "task_id": task_id,
        "thread_id": "thread-1",
        "models": {"supervisor": "openai:gpt-4o-mini"},
        "topology": {"kind": "structured"},
    }


def troubled_run(task_id: str) -> list[dict[str, Any]]:
    """The supervisor's call is retried once; the researcher reads two documents (one too
    long to keep whole), then its model call fails after a retry; the server stops the run,
    and another run finishes it."""
    retry = {
        "type": "model_retry",
        "model": "openai:gpt-4o-mini",
        "status": 429,
        "error": "HTTP 429: rate limited",
        "wait_seconds": 1.5,
        "retry_after": 1.5,
    }
    return [
        _run_started(task_id),
        retry | {"role": "supervisor", "attempt": 2},
        {
            "type": "route",
            "next": "researcher",
            "task": "Look it up",
            "reason": "facts first",
            "step": 1,
            "carried_out": True,
        },
        {"type": "agent_started", "agent": "researcher", "task": "Look it up", "source": "x"},
        *_tool("read_doc", "call-1", LONG_RESULT),
        *_tool("read_doc", "call-2", "A checkpoint after every super-step."),
        retry | {"role": "researcher", "attempt": 2},
        {
            "type": "model_error",
            "role": "researcher",
            "model": "openai:gpt-4o-mini",
            "status": 500,
            "error": "HTTP 500: the server broke",
            "attempts": 3,
        },
        {
            "type": "agent_finished",
            "agent": "researcher",
            "ended": "model_error",
            "output": "Its model call failed: HTTP 500: the server broke (after 3 attempts)",
            "usage": _usage("researcher"),
        },
        {"type": "run_suspended", "reason": "the server is shutting down"},
        _run_started(task_id),
        {"type": "route", "next": "FINISH", "task": "", "reason": "done", "carried_out": True},
        {"type": "run_finished", "status": "degraded", "stop_reason": "model_error: researcher"},
    ]


def record_task(
    ledger: Ledger, events: Sequence[Mapping[str, Any]] | None = None, *, project_id: str
) -> str:
    """A finished task of ``project_id`` with ``events`` (default: :func:`troubled_run`)."""
    task, _ = ledger.create_task(project_id=project_id, input="When are checkpoints written?")
    ledger.set_status(task.id, "running")
    ledger.append_events(task.id, list(events) if events is not None else troubled_run(task.id))
    ledger.set_status(task.id, "degraded", stop_reason="model_error: researcher")
    return task.id


def _ledger(home: Path) -> Ledger:
    ledger = Ledger(f"sqlite:///{home / 'ledger.sqlite'}")
    ledger.upgrade()
    return ledger


def test_model_retries_failures_and_a_suspended_run_are_on_the_timeline(home: Path) -> None:
    with _ledger(home) as ledger:
        task_id = record_task(ledger, project_id=LOCAL_PROJECT_ID)
        timeline = build_timeline(ledger, task_id, project_id=LOCAL_PROJECT_ID)
    kinds = [node["kind"] for node in timeline["children"]]
    assert kinds == [
        "run_started",
        "model_retry",  # the supervisor's, outside any visit
        "route",
        "agent",
        "run_suspended",
        "run_started",
        "route",
        "run_finished",
    ]
    supervisor_retry = timeline["children"][1]
    assert supervisor_retry["role"] == "supervisor" and supervisor_retry["attempt"] == 2
    assert supervisor_retry["wait_seconds"] == 1.5
    visit = timeline["children"][3]
    assert [c["kind"] for c in visit["children"]] == ["tool", "tool", "model_retry", "model_error"]
    failed = visit["children"][3]
    assert failed["role"] == "researcher" and failed["status"] == 500
    assert failed["error"] == "HTTP 500: the server broke" and failed["attempts"] == 3
    assert timeline["children"][4]["reason"] == "the server is shutting down"
    # The first result was cut to the ledger's preview, the second was kept whole.
    long, short = visit["children"][:2]
    assert long["preview_cut"] and len(long["preview"]) == PREVIEW_CHARS
    assert not short["preview_cut"] and short["preview"].endswith("super-step.")

    console = Console(record=True, width=200, color_system=None)
    console.print(render_timeline(timeline))
    text = console.export_text()
    retried = "retry supervisor's model call (attempt 2, HTTP 429: rate limited; waiting 1.5 s)"
    assert retried in text
    assert "model call failed (researcher, openai:gpt-4o-mini): HTTP 500: the server broke" in text
    assert "run suspended: the server is shutting down" in text
    assert text.count("run started") == 2


def test_a_run_suspended_inside_a_visit_ends_it_as_suspended(home: Path) -> None:
    with _ledger(home) as ledger:
        task_id = record_task(
            ledger,
            [
                _run_started("t"),
                {"type": "agent_started", "agent": "coder", "task": "Compute", "source": "x"},
                {"type": "run_suspended", "reason": "the lease was lost"},
            ],
            project_id=LOCAL_PROJECT_ID,
        )
        timeline = build_timeline(ledger, task_id, project_id=LOCAL_PROJECT_ID)
    visit = timeline["children"][1]
    assert visit["kind"] == "agent" and visit["ended"] == "suspended"
    assert timeline["children"][2]["kind"] == "run_suspended"


def test_a_tool_result_event_keeps_the_preview_the_timeline_reads() -> None:
    from relaygraph.events import tool_result_event

    event = tool_result_event(
        "coder",
        tool="run_python",
        tool_call_id="c1",
        status="success",
        ran=True,
        result="x" * (PREVIEW_CHARS + 50),
    )
    assert event["preview"] == "x" * PREVIEW_CHARS
