"""What the CLI prints on stderr: `relaygraph run` for the model server's own events and a
visit cut short, `relaygraph trace` the dashboard link."""

from __future__ import annotations

from pathlib import Path

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


def test_trace_prints_the_dashboard_link_for_a_projects_task_when_a_service_is_named(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from relaygraph.cli import main
    from relaygraph.runner import run_task
    from relaygraph.store import Ledger
    from tests.conftest import EXAMPLE_RELAY

    local = run_task("When?", model=f"scripted:{EXAMPLE_RELAY}")
    with Ledger(f"sqlite:///{home / 'ledger.sqlite'}") as ledger:
        project, _ = ledger.create_project("research")
        served, _ = ledger.create_task(project_id=project.id, input="When? (from the API)")
    capsys.readouterr()
    monkeypatch.setenv("RELAYGRAPH_URL", "http://rg.example:8000/")
    assert main(["trace", served.id]) == 0
    assert f"dashboard: http://rg.example:8000/ui/tasks/{served.id}" in capsys.readouterr().err
    # The CLI's own task: no key opens it, so there is no page to link.
    assert main(["trace", local.task_id]) == 0
    assert "dashboard:" not in capsys.readouterr().err
    monkeypatch.delenv("RELAYGRAPH_URL")
    assert main(["trace", served.id]) == 0
    assert "dashboard:" not in capsys.readouterr().err


def test_trace_help_names_the_service_url(capsys: pytest.CaptureFixture[str]) -> None:
    from relaygraph.cli import main

    with pytest.raises(SystemExit):
        main(["trace", "--help"])
    assert "RELAYGRAPH_URL" in capsys.readouterr().out


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
