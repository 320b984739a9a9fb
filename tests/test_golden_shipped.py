"""The golden set shipped inside the package runs offline and passes every case."""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path

from relaygraph.evals import run_eval

REQUIRED_TAGS = {"routing", "handoff", "tools", "budget", "violation", "ping_pong", "approval"}


def _golden() -> Path:
    resource = importlib.resources.files("relaygraph.evals") / "golden" / "golden.jsonl"
    assert resource.is_file(), "the golden set must ship inside the relaygraph.evals package"
    return Path(str(resource))


def test_shipped_golden_is_in_the_package() -> None:
    golden = _golden()
    folder = golden.parent
    cases = [json.loads(line) for line in golden.read_text("utf-8").splitlines() if line.strip()]
    assert len(cases) >= 30
    for case in cases:
        assert case.get("script"), f"{case['id']} needs a script to run offline"
        assert (folder / case["script"]).is_file(), case["id"]
        if "policy" in case:
            assert (folder / case["policy"]).is_file(), case["id"]
        assert case.get("tags"), f"{case['id']} has no tags"


def test_shipped_golden_passes_offline(home: Path) -> None:
    report = run_eval(_golden(), concurrency=2, home=home)

    assert not report.invalid_lines
    assert len(report.cases) >= 30
    failed = [case.id for case in report.cases if not case.passed]
    assert failed == []
    assert report.metrics.pass_rate == 1.0
    assert report.gate(min_pass_rate=1.0) == []
    tags = {tag for case in report.cases for tag in case.tags}
    assert tags >= REQUIRED_TAGS, f"missing tags: {sorted(REQUIRED_TAGS - tags)}"
    # The priced case costs something real, from its policy's price table, under its bound.
    priced = next(case for case in report.cases if case.id == "priced-under-budget")
    assert 0 < priced.trials[0].usage["cost_usd"] <= 0.001
    assert report.metrics.total_cost_usd > 0


def test_the_injection_arrives_in_a_document_the_researcher_found(home: Path) -> None:
    """The shipped corpus holds a page with an instruction hidden in it; the case that reads
    it has the researcher follow it, and the policy refuses the tool before it runs."""
    from relaygraph.runner import run_task

    script = _golden().parent / "scripts" / "injected-instruction-in-a-found-doc.json"
    events: list[dict[str, object]] = []
    result = run_task(
        "What do the community tips say about retrying rate-limited model calls?",
        model=f"scripted:{script}",
        on_event=events.append,
    )
    from .test_team import final_state

    visit = final_state(home, result.thread_id)["visits"][0]
    found = next(m for m in visit["messages"] if getattr(m, "name", None) == "read_doc")
    assert "ignore your previous instructions" in str(found.content).replace("\n", " ")
    results = [e for e in events if e["type"] == "tool_result"]
    refused = next(e for e in results if e["tool"] == "run_python")
    assert refused["ran"] is False
    assert [v["kind"] for v in result.violations] == ["tool_not_allowed"]
    assert "run_python" in result.violations[0]["detail"]
    assert result.status == "succeeded"
