"""What `relaygraph run` prints on stderr for the model server's own events."""

from __future__ import annotations

import pytest

from relaygraph.cli._console import ProgressPrinter


@pytest.mark.parametrize(
    ("event", "shown"),
    [
        (
            {"type": "model_retry", "role": "supervisor", "attempt": 2, "error": "HTTP 429",
             "wait_seconds": 1.5},
            "retry supervisor's model call (attempt 2, HTTP 429; waiting 1.5 s)",
        ),
        (
            {"type": "model_error", "role": "researcher", "model": "openai:x",
             "error": "HTTP 500: boom"},
            "model call failed (researcher, openai:x): HTTP 500: boom",
        ),
        (
            {"type": "structured_method", "model": "openai:x", "method": "function_calling",
             "rejected": ["json_schema"]},
            "answers structured output with function_calling (refused: json_schema)",
        ),
    ],
)  # fmt: skip
def test_model_server_events_are_shown(
    event: dict[str, object], shown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ProgressPrinter()(event)
    assert shown in " ".join(capsys.readouterr().err.split())


def test_trace_prints_the_dashboard_link_when_a_service_is_named(
    home: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from relaygraph.cli import main
    from relaygraph.runner import run_task
    from tests.conftest import EXAMPLE_RELAY

    result = run_task("When?", model=f"scripted:{EXAMPLE_RELAY}")
    capsys.readouterr()
    monkeypatch.setenv("RELAYGRAPH_URL", "http://rg.example:8000/")
    assert main(["trace", result.task_id]) == 0
    err = capsys.readouterr().err
    assert f"dashboard: http://rg.example:8000/ui/tasks/{result.task_id}" in err
    monkeypatch.delenv("RELAYGRAPH_URL")
    assert main(["trace", result.task_id]) == 0
    assert "dashboard:" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("ended", "note"),
    [
        ("budget", "— its budget ran out"),
        ("model_error", "— its model call failed"),
        ("finished", ""),
    ],
)
def test_a_visit_cut_short_says_why(
    ended: str, note: str, capsys: pytest.CaptureFixture[str]
) -> None:
    usage = {"model_calls": 2, "tool_calls": 1}
    ProgressPrinter()({"type": "agent_finished", "agent": "coder", "ended": ended, "usage": usage})
    line = " ".join(capsys.readouterr().err.split())
    assert line.startswith("coder done (2 model calls, 1 tool calls)")
    assert line.endswith(note or "tool calls)")
