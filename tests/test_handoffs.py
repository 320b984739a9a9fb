"""Handoff records merge safely under re-runs; the handoff tool refuses what it cannot do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relaygraph.handoffs import handoff_target, merge_by_id
from relaygraph.runner import run_task

from ._scripts import call, one_visit, say


def rec(id: str, task: str = "t") -> dict[str, Any]:
    return {"id": id, "task": task}


def test_merge_by_id_appends_new_and_replaces_rewritten_records() -> None:
    first = merge_by_id([], [rec("a"), rec("b")])
    # A re-run super-step writes the same records again: nothing is duplicated.
    again = merge_by_id(first, [rec("b", "t2")])
    assert again == [rec("a"), rec("b", "t2")]
    assert merge_by_id(again, rec("c")) == [rec("a"), rec("b", "t2"), rec("c")]
    assert merge_by_id(None, None) == []


def test_handoff_target() -> None:
    assert handoff_target("transfer_to_writer") == "writer"
    assert handoff_target("search_docs") is None


def test_empty_handoff_task_is_refused_and_the_agent_goes_on(home: Path, script: Any) -> None:
    spec = script(
        one_visit(
            "researcher",
            "look",
            "r",
            call("transfer_to_writer", task="  "),
            say("did it myself"),
            final="ok",
        )
    )
    result = run_task("go", model=spec)
    assert result.status == "succeeded"
    assert result.agents_run == ["researcher"]
    assert [h["kind"] for h in result.handoffs] == ["route"]


def test_refused_tool_input_is_answered_not_fatal(home: Path, script: Any) -> None:
    spec = script(
        one_visit(
            "coder",
            "read a file",
            "r",
            call("read_file", path="../../../etc/passwd"),
            call("read_doc", doc_id="x"),
            say("could not read it"),
            final="ok",
        )
    )
    events: list[dict[str, Any]] = []
    result = run_task("go", model=spec, on_event=events.append)
    assert result.status == "succeeded", result.stop_reason
    errors = [e for e in events if e["type"] == "tool_result" and e["status"] == "error"]
    # The path escape is refused with a message naming the path; a tool the coder does not
    # have is answered with an error naming it, not run.
    assert "../../../etc/passwd" in errors[0]["preview"]
    assert errors[0]["ran"] is True  # the tool ran and refused the path itself
    assert errors[1]["tool"] == "read_doc"
    assert errors[1]["ran"] is False  # the policy refused the call: the tool never ran
    assert "read_doc" in errors[1]["preview"]
    assert len(errors) == 2
