"""Golden sets evaluate a team of your own: ``relaygraph eval --team FILE`` and a case's
``team`` key run examples/teams/docs-review.toml's agents on the scripted model."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from relaygraph.cli._evals import add_eval_parser, run_eval_command
from relaygraph.evals import load_golden, run_eval
from relaygraph.store import LOCAL_PROJECT_ID, Ledger
from relaygraph.team import load_team

REPO = Path(__file__).resolve().parents[1]
DOCS_REVIEW = REPO / "examples" / "teams" / "docs-review.toml"
DOCS_REVIEW_SCRIPT = REPO / "examples" / "scripts" / "docs-review.json"
DRAFT = "An agent hands work to a peer with its transfer_to_<peer> tool."

REVIEW_THEN_REWRITE = {
    "supervisor": [
        {"route": {"next": "reviewer", "task": "Review the draft", "reason": "a draft exists"}},
        {"route": {"next": "FINISH", "task": "", "reason": "rewritten after review"}},
    ],
    "reviewer": [
        {"tool_calls": [{"name": "lint_check", "args": {"text": f"{DRAFT} {DRAFT}"}}]},
        {
            "tool_calls": [
                {
                    "name": "transfer_to_writer",
                    "args": {"task": "Keep one of the two sentences", "reason": "it repeats"},
                }
            ]
        },
    ],
    "writer": [{"content": DRAFT}],
    "finalize": [{"content": f"Rewritten after review: {DRAFT}"}],
}
"""The reviewer lints a draft and hands it straight back to the writer (its one peer)."""


def golden_file(tmp_path: Path, *, team_key: bool = False) -> Path:
    """Two cases for the docs-review team; with ``team_key`` each names the team file."""
    rewrite = tmp_path / "review-then-rewrite.json"
    rewrite.write_text(json.dumps(REVIEW_THEN_REWRITE), encoding="utf-8")
    team = {"team": str(DOCS_REVIEW)} if team_key else {}
    cases = [
        {
            "id": "research-write-review",
            "input": "Review the handoff docs",
            "script": str(DOCS_REVIEW_SCRIPT),
            **team,
            "expect": {
                "first_agent": "researcher",
                "agents": ["researcher", "writer", "reviewer"],
                "handoffs": [],
                "tools_used": ["search_docs", "save_artifact", "word_count", "lint_check"],
                "answer_contains": ["Reviewed: no problems found"],
                "status": "succeeded",
                "violations": [],
            },
        },
        {
            "id": "reviewer-hands-back",
            "input": "Review this draft and have it fixed",
            "script": str(rewrite),
            **team,
            "expect": {
                "first_agent": "reviewer",
                "agents": ["reviewer", "writer"],
                "handoffs": [["reviewer", "writer"]],
                "tools_used": ["lint_check"],
                "tools_not_used": ["search_docs", "word_count"],
                "answer_contains": ["Rewritten after review"],
                "status": "succeeded",
            },
        },
    ]
    path = tmp_path / "golden.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")
    return path


def eval_cli(*argv: str, home: Path) -> int:
    """``relaygraph eval ...`` through the parser and handler relaygraph.cli registers."""
    parser = argparse.ArgumentParser(prog="relaygraph")
    parser.add_argument("--home", type=Path)
    add_eval_parser(parser.add_subparsers(dest="command", required=True))
    return run_eval_command(parser.parse_args(["--home", str(home), "eval", *argv]))


def test_eval_team_runs_the_team_files_agents(home: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    code = eval_cli(
        str(golden_file(tmp_path)), "--team", str(DOCS_REVIEW), "--out", str(out), home=home
    )
    report = json.loads((out / "report.json").read_text())
    failures = [c["trials"][0]["checks"] for c in report["cases"] if not c["passed"]]
    assert code == 0 and report["metrics"]["pass_rate"] == 1.0, failures
    team = load_team(DOCS_REVIEW)
    assert report["team"] == team.record()
    assert [c["team"] for c in report["cases"]] == ["docs-review", "docs-review"]
    assert "team docs-review" in (out / "report.md").read_text()
    # Each run is a task of the ledger that records the team that ran it.
    with Ledger(f"sqlite:///{home / 'ledger.sqlite'}") as ledger:
        for case in report["cases"]:
            task = ledger.get_task(case["trials"][0]["task_id"], project_id=LOCAL_PROJECT_ID)
            assert task is not None and task.team == team.record()


def test_the_built_in_team_fails_the_same_set(home: Path, tmp_path: Path) -> None:
    """Without --team the reviewer does not exist: the set is not scored on docs-review."""
    report = run_eval(golden_file(tmp_path), home=home)
    assert report.metrics.pass_rate == 0.0
    assert report.team is not None and report.team["name"] == "default"


def test_a_cases_team_key_names_its_team_file(home: Path, tmp_path: Path) -> None:
    golden = load_golden(golden_file(tmp_path, team_key=True))
    assert not golden.errors
    assert {case.team for case in golden.cases} == {DOCS_REVIEW}
    assert [golden.team_for_case(c).name for c in golden.cases] == ["docs-review", "docs-review"]
    # One team file named by both cases is read once.
    assert golden.team_for_case(golden.cases[0]) is golden.team_for_case(golden.cases[1])
    report = run_eval(golden.path, home=home)  # no --team: each case brings its own
    assert report.metrics.pass_rate == 1.0, [c.first_failure for c in report.cases]
    assert [c.team for c in report.cases] == ["docs-review", "docs-review"]


def test_a_bad_team_key_is_reported_on_its_line(home: Path, tmp_path: Path) -> None:
    lines = [
        {"id": "missing", "input": "x", "team": "nowhere.toml"},
        {
            "id": "policy",
            "input": "x",
            "policy": str(REPO / "examples/policies/tight.toml"),
            "team": str(DOCS_REVIEW),
        },
        {"id": "fine", "input": "x", "team": str(DOCS_REVIEW)},
    ]
    path = tmp_path / "golden.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    golden = load_golden(path)
    assert [case.id for case in golden.cases] == ["fine"]
    missing, policy = golden.errors
    assert missing.line == 1 and "team 'nowhere.toml' does not exist" in missing.message
    # The built-in team's policy names agents docs-review does not have.
    assert policy.line == 2 and policy.message.startswith("case 'policy': ")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--agent-model", "coder=scripted:x.json"],
            "unknown agent(s) 'coder'; known: supervisor, researcher, writer, reviewer, finalize",
        ),
        (["--topology", "swarm", "--start-agent", "coder"], "start_agent 'coder'"),
        (["--team", "nowhere.toml"], "team file 'nowhere.toml' does not exist"),
    ],
)
def test_flags_are_checked_against_the_team(
    home: Path,
    tmp_path: Path,
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["--team", str(DOCS_REVIEW), *argv] if "--team" not in argv else argv
    assert eval_cli(str(golden_file(tmp_path)), *args, home=home) == 2
    err = capsys.readouterr().err
    assert err.startswith("relaygraph: error: ") and message in err


def test_agent_model_may_name_the_teams_own_agent(home: Path, tmp_path: Path) -> None:
    """``--agent-model reviewer=...`` is the team's role: the reviewer plays another script."""
    lazy: dict[str, Any] = {"reviewer": [{"content": "Looks fine."}] * 4}
    reviewer = tmp_path / "reviewer.json"
    reviewer.write_text(json.dumps(lazy), encoding="utf-8")
    report = run_eval(
        golden_file(tmp_path),
        team=DOCS_REVIEW,
        agent_models={"reviewer": f"scripted:{reviewer}"},
        tags=(),
        home=home,
    )
    by_id = {case.id: case for case in report.cases}
    # The reviewer answered at once: no lint_check ran, so both cases fail on it.
    first = by_id["research-write-review"].first_failure
    assert first is not None and first[1].name == "tools_used"
    assert report.agent_models == {"reviewer": f"scripted:{reviewer}"}
