"""Whole team tasks on the embedded model (SmolLM2 in llama.cpp): slow, and CI runs them."""

from __future__ import annotations

import importlib.resources
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest

# find_spec, not importorskip: importing llama_cpp opens files it never closes.
if importlib.util.find_spec("llama_cpp") is None:
    pytest.skip("the embedded model needs relaygraph[local]", allow_module_level=True)

DEMO_TASK = "What do the docs say about checkpoint durability? Write a short report."
EMBEDDED_GOLDEN = importlib.resources.files("relaygraph.evals") / "golden" / "embedded.jsonl"


def _plain(text: str) -> str:
    """Text as the quotes show it: no emphasis, no list markers, single spaces."""
    unlisted = re.sub(r"^\s*- ", "", text, flags=re.M)
    return " ".join(unlisted.replace("**", "").split())


@pytest.mark.slow
def test_the_demo_task_is_answered_from_the_right_document(home: Path) -> None:
    from relaygraph.backends.kb import sample_corpus_path
    from relaygraph.runner import run_task

    events: list[dict[str, Any]] = []
    result = run_task(DEMO_TASK, on_event=events.append)
    # Every role ran on the embedded default, with no key and no server.
    assert set(result.models.values()) == {"local:smollm2"}
    assert result.status == "succeeded", result.stop_reason
    assert result.agents_run == ["researcher", "writer"]
    routes = [e for e in events if e["type"] == "route"]
    assert [r["next"] for r in routes] == ["researcher", "writer", "FINISH"]
    assert all(len(r["task"]) < 100 and r["task"] != DEMO_TASK for r in routes)
    calls = [(e["agent"], e["tool"], e["args"]) for e in events if e["type"] == "tool_call"]
    assert calls[:2] == [
        ("researcher", "search_docs", {"query": "checkpoint durability"}),
        ("researcher", "read_doc", {"doc_id": "checkpoints"}),
    ]
    assert calls[2][:2] == ("writer", "save_artifact")
    assert result.artifacts == ["report.md"]
    # The answer is the document's own text, with its id and where it came from.
    assert result.answer is not None
    quoted, source = result.answer.split("\n\nSource: ")
    assert quoted.endswith(" [checkpoints]")
    assert source.startswith("[checkpoints] found by the researcher")
    document = _plain((sample_corpus_path() / "checkpoints.md").read_text(encoding="utf-8"))
    for piece in re.split(r"; |(?<=\.) ", quoted.removesuffix(" [checkpoints]")):
        assert _plain(piece).rstrip(".") in document, piece
    # Choices with one option cost nothing: the three routes and finalize made no tokens.
    assert result.usage["supervisor"]["input_tokens"] == 0
    assert result.usage["finalize"]["input_tokens"] == 0
    assert result.team_usage["input_tokens"] < 3000


@pytest.mark.slow
def test_the_embedded_golden_set_passes_80_percent(home: Path, tmp_path: Path) -> None:
    from relaygraph.cli import main

    out = tmp_path / "eval"
    code = main(["eval", str(EMBEDDED_GOLDEN), "--out", str(out), "--min-pass-rate", "0.8"])
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    failed = {c["id"]: c["trials"][0]["observed"] for c in report["cases"] if not c["passed"]}
    assert code == 0, failed
    assert len(report["cases"]) >= 15
    assert report["metrics"]["pass_rate"] >= 0.8
