"""Evals: the scorer check by check, golden files, metrics, reports, gating and the command."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import threading
import typing
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qs, urlparse

import pytest

from relaygraph.cli._evals import add_eval_parser, run_eval_command
from relaygraph.evals import (
    AGENTS_MATCH_MODES,
    VIOLATION_KINDS,
    CaseResult,
    Check,
    Expectation,
    Observation,
    TrialResult,
    agents_match,
    check_expectations,
    compute_metrics,
    load_golden,
    pass_at_k,
    pass_hat_k,
    run_eval,
)
from relaygraph.store import Ledger

from .conftest import REPO

GOLDEN = REPO / "examples" / "golden" / "golden.jsonl"
SCRIPTS = REPO / "examples" / "golden" / "scripts"
POLICIES = REPO / "examples" / "golden" / "policies"


def expectation(**given: Any) -> Expectation:
    """An expectation naming exactly ``given`` (lists become tuples, as the loader makes them)."""
    values = {
        key: tuple(tuple(v) if isinstance(v, list) else v for v in value)
        if isinstance(value, list)
        else value
        for key, value in given.items()
    }
    return Expectation(given=frozenset(given), **values)


RELAY = Observation(
    status="succeeded",
    answer="A 40-step run writes 41 checkpoints; see report.md.",
    stop_reason=None,
    first_agent="researcher",
    agents=("researcher", "coder", "writer"),
    handoffs=(("researcher", "coder"),),
    tools=("search_docs", "run_python", "save_artifact"),
    refused_tools=("read_file",),
    violations=("tool_not_allowed",),
    tokens=3500,
    cost_usd=0.004,
)

# Each expect key with a value the relay run meets and one it does not.
CHECK_CASES: list[tuple[str, Any, Any]] = [
    ("first_agent", "researcher", "coder"),
    ("agents", ["researcher", "coder", "writer"], ["researcher", "writer"]),
    ("handoffs", [["researcher", "coder"]], [["researcher", "writer"]]),
    ("tools_used", ["search_docs", "run_python"], ["read_file"]),
    ("tools_not_used", ["read_file", "read_doc"], ["run_python"]),
    ("answer_contains", ["41 CHECKPOINTS", "report.md"], ["durability"]),
    ("answer_not_contains", ["I don't know"], ["Report.MD"]),
    ("status", "succeeded", "degraded"),
    ("stop_reason", None, "budget:team:max_agent_runs"),
    ("violations", ["tool_not_allowed"], []),
    ("max_tokens", 3500, 3499),
    ("max_cost_usd", 0.004, 0.001),
]


@pytest.mark.parametrize(("key", "good", "bad"), CHECK_CASES, ids=[c[0] for c in CHECK_CASES])
def test_each_expect_key_passes_and_fails(key: str, good: Any, bad: Any) -> None:
    [passing] = check_expectations(expectation(**{key: good}), RELAY)
    assert (passing.name, passing.passed, passing.message) == (key, True, "")
    [failing] = check_expectations(expectation(**{key: bad}), RELAY)
    assert (failing.name, failing.passed) == (key, False)
    assert failing.expected == (list(bad) if isinstance(bad, list) else bad)
    assert failing.actual is not None or key == "stop_reason"
    assert failing.message


def test_only_named_keys_are_checked_in_the_format_order() -> None:
    assert check_expectations(Expectation(), RELAY) == []
    checks = check_expectations(expectation(status="succeeded", first_agent="researcher"), RELAY)
    assert [c.name for c in checks] == ["first_agent", "status"]


def test_failure_messages_say_what_happened() -> None:
    [route] = check_expectations(expectation(first_agent="coder"), RELAY)
    assert route.message == "the first agent was 'researcher', expected 'coder'"
    [tools] = check_expectations(expectation(tools_used=["read_file"]), RELAY)
    assert tools.message == "read_file did not run (read_file called but not run)"
    assert tools.actual == ["search_docs", "run_python", "save_artifact"]
    [handoffs] = check_expectations(expectation(handoffs=[]), RELAY)
    assert handoffs.message == "the direct handoffs were researcher→coder, expected none"
    [cost] = check_expectations(expectation(max_cost_usd=0.001), RELAY)
    assert "$0.004000" in cost.message


def test_a_run_without_an_answer_fails_contains_and_passes_not_contains() -> None:
    silent = Observation(status="failed", answer=None)
    contains, not_contains = check_expectations(
        expectation(answer_contains=["x"], answer_not_contains=["x"]), silent
    )
    assert (contains.passed, not_contains.passed) == (False, True)


AGENT_MATCHES: list[tuple[str, list[str], list[str], bool]] = [
    ("strict", ["researcher", "writer"], ["researcher", "writer"], True),
    ("strict", ["researcher", "writer"], ["writer", "researcher"], False),
    ("strict", ["researcher"], ["researcher", "writer"], False),
    ("unordered", ["researcher", "writer"], ["writer", "researcher"], True),
    ("unordered", ["researcher", "writer"], ["writer"], False),
    ("unordered", ["researcher", "researcher"], ["researcher"], False),
    ("subset", ["researcher"], ["researcher", "writer"], True),
    ("subset", [], ["researcher"], True),
    ("subset", ["researcher", "coder"], ["researcher", "writer"], False),
    ("subset", ["researcher", "researcher"], ["researcher", "writer"], False),
    ("superset", ["researcher", "coder", "writer"], ["writer", "researcher"], True),
    ("superset", ["researcher", "coder"], ["researcher", "writer"], False),
    ("superset", ["researcher"], [], True),
]


@pytest.mark.parametrize(("mode", "ran", "expected", "matches"), AGENT_MATCHES)
def test_agents_match_modes(mode: Any, ran: list[str], expected: list[str], matches: bool) -> None:
    assert agents_match(ran, expected, mode) is matches
    observed = Observation(status="succeeded", agents=tuple(ran))
    [check] = check_expectations(expectation(agents=expected, agents_match=mode), observed)
    assert check.passed is matches
    assert check.details == {"match": mode}


def test_every_agents_match_mode_is_tested() -> None:
    assert {case[0] for case in AGENT_MATCHES} == set(AGENTS_MATCH_MODES)


def test_violation_kinds_are_the_teams() -> None:
    from relaygraph.supervisor._state import Violation

    kind = typing.get_type_hints(Violation)["kind"]
    assert set(VIOLATION_KINDS) == set(typing.get_args(kind))


def test_public_names_import() -> None:
    import relaygraph.evals as evals

    for name in evals.__all__:
        assert getattr(evals, name) is not None, name


# -- golden files --------------------------------------------------------------------------


def write_golden(folder: Path, *cases: dict[str, Any] | str) -> Path:
    """A golden file in ``folder`` (a string is written as the raw line), with the shipped
    scripts and policies beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "scripts").exists():
        shutil.copytree(SCRIPTS, folder / "scripts")
        shutil.copytree(POLICIES, folder / "policies")
    path = folder / "golden.jsonl"
    lines = [case if isinstance(case, str) else json.dumps(case) for case in cases]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def case(
    id: str, script: str = "route-coder", *, tags: list[str] | None = None, **expect: Any
) -> dict[str, Any]:
    return {
        "id": id,
        "input": f"request for {id}",
        "script": f"scripts/{script}.json",
        "expect": expect,
        "tags": tags or [],
    }


def test_load_golden_resolves_paths_against_the_golden_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_golden(
        tmp_path / "suite",
        {**case("a"), "policy": "policies/approve-code.toml", "tags": ["x"]},
    )
    monkeypatch.chdir(tmp_path)  # not the golden file's folder
    golden = load_golden(Path("suite") / "golden.jsonl")
    [loaded] = golden.cases
    assert loaded.script == (tmp_path / "suite" / "scripts" / "route-coder.json").resolve()
    assert loaded.policy == (tmp_path / "suite" / "policies" / "approve-code.toml").resolve()
    assert (loaded.line, loaded.tags, golden.errors) == (1, ("x",), ())
    assert path.exists()


def test_malformed_lines_are_reported_with_their_numbers(tmp_path: Path) -> None:
    path = write_golden(
        tmp_path,
        case("good", first_agent="coder"),
        "{not json",
        "",
        case("typo", answer_contain=["x"]),
        case("good", status="succeeded"),
        {**case("no-script"), "script": "scripts/missing.json"},
        case("bad-mode", agents=["coder"], agents_match="sorted"),
        case("no-agents", agents_match="subset"),
        case("null-status", status=None),
        case("bad-kind", violations=["budget_exceeded"]),
        '["a list"]',
        case("string-number", max_tokens="6000"),
        case("good-2"),
    )
    golden = load_golden(path)
    assert [c.id for c in golden.cases] == ["good", "good-2"]
    errors = {e.line: e.message for e in golden.errors}
    assert sorted(errors) == [2, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    assert errors[2].startswith("not valid JSON")
    assert "case 'typo'" in errors[4] and "answer_contain" in errors[4]
    assert errors[5] == "case id 'good' is already used on line 1"
    assert "script 'scripts/missing.json' does not exist" in errors[6]
    assert "'sorted'" in errors[7]
    assert "agents_match is given without agents" in errors[8]
    assert "status is null" in errors[9]
    assert "'budget_exceeded'" in errors[10]
    assert errors[11] == "expected a JSON object, got list"
    assert "max_tokens" in errors[12] and "'6000'" in errors[12]


def test_a_broken_script_is_reported_on_its_case_line(tmp_path: Path) -> None:
    path = write_golden(tmp_path, case("a"), case("b", script="broken"))
    (tmp_path / "scripts" / "broken.json").write_text('{"writer": [{"say": "hi"}]}')
    [error] = load_golden(path).errors
    assert error.line == 2 and "case 'b'" in error.message and "broken.json" in error.message


def test_malformed_lines_do_not_stop_the_other_cases(tmp_path: Path, home: Path) -> None:
    path = write_golden(tmp_path, "oops", case("runs", first_agent="coder"))
    report = run_eval(path, home=home)
    assert [(c.id, c.passed) for c in report.cases] == [("runs", True)]
    assert [(e.line, e.message[:14]) for e in report.invalid_lines] == [(1, "not valid JSON")]


# -- running ------------------------------------------------------------------------------


def test_the_shipped_golden_set_passes_offline(home: Path, tmp_path: Path) -> None:
    report = run_eval(GOLDEN, concurrency=4, out=tmp_path / "out", home=home)
    failures = {c.id: c.first_failure for c in report.cases if not c.passed}
    assert failures == {}
    assert report.invalid_lines == ()
    assert len(report.cases) >= 6
    m = report.metrics
    assert (m.pass_rate, m.routing_accuracy, m.trajectory_match, m.handoff_match) == (1, 1, 1, 1)
    assert (m.answer_match, m.budget_adherence) == (1, 1)
    assert m.total_tokens > 0 and m.latency_p50 is not None
    # Each case ran in a thread of its own.
    threads = [t.thread_id for c in report.cases for t in c.trials]
    assert len(set(threads)) == len(threads)
    statuses = {c.id: c.trials[0].observed.status for c in report.cases if c.trials[0].observed}
    assert {"succeeded", "degraded", "interrupted"} <= set(statuses.values())


def test_a_wrong_route_and_a_missing_tool_fail(home: Path, tmp_path: Path) -> None:
    """A scorer that passes everything is caught: the shipped scripts, wrong expectations."""
    path = write_golden(
        tmp_path,
        case("wrong-route", "route-coder", first_agent="researcher"),
        case("missing-tool", "route-writer", tools_used=["search_docs"]),
        case("refused-tool", "injected-instruction", tools_used=["run_python"]),
        case("no-handoff", "route-researcher", handoffs=[["researcher", "writer"]]),
        {
            **case("wrong-status", "budget-stop", status="succeeded"),
            "policy": "policies/two-runs.toml",
        },
    )
    report = run_eval(path, home=home)
    outcome = {c.id: c.trials[0].first_failure for c in report.cases}
    assert all(check is not None for check in outcome.values())
    checks = cast(dict[str, Check], outcome)
    assert checks["wrong-route"].actual == "coder"
    assert checks["missing-tool"].actual == ["save_artifact"]
    assert "run_python called but not run" in checks["refused-tool"].message
    assert checks["no-handoff"].actual == []
    assert checks["wrong-status"].actual == "degraded"
    assert "budget:team:max_agent_runs" in checks["wrong-status"].message
    assert report.metrics.pass_rate == 0.0


def test_model_flag_overrides_the_scripts(home: Path, tmp_path: Path) -> None:
    path = write_golden(tmp_path, case("a", "route-coder", first_agent="writer"))
    spec = f"scripted:{SCRIPTS / 'route-writer.json'}"
    report = run_eval(path, model=spec, home=home)
    assert report.cases[0].passed
    assert report.cases[0].trials[0].model == spec
    assert report.model == spec


@pytest.fixture
def crashing_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """A task whose request says "crash" raises (its provider exploded); the others run."""
    import relaygraph.runner

    real = relaygraph.runner.run_task

    def flaky(request: str, **kwargs: Any) -> Any:
        if "crash" in request:
            raise RuntimeError("provider exploded")
        return real(request, **kwargs)

    monkeypatch.setattr(relaygraph.runner, "run_task", flaky)


@pytest.mark.usefixtures("crashing_provider")
def test_a_case_that_cannot_run_fails_and_the_others_run(home: Path, tmp_path: Path) -> None:
    path = write_golden(tmp_path, case("crash"), case("fine", first_agent="coder"))
    report = run_eval(path, home=home)
    crash, fine = report.cases
    assert fine.passed and not crash.passed
    [check] = crash.trials[0].checks
    assert (check.name, check.actual) == ("run", "RuntimeError: provider exploded")
    assert report.metrics.pass_rate == 0.5


def test_repeat_runs_each_case_k_times(home: Path, tmp_path: Path) -> None:
    path = write_golden(tmp_path, case("a", first_agent="coder"))
    progress: list[tuple[int, int]] = []
    report = run_eval(
        path,
        repeat=3,
        concurrency=3,
        home=home,
        on_progress=lambda d, t, _: progress.append((d, t)),
    )
    assert [t.trial for t in report.cases[0].trials] == [1, 2, 3]
    assert sorted(progress) == [(1, 3), (2, 3), (3, 3)]
    assert report.metrics.pass_at_k == {1: 1.0, 2: 1.0, 3: 1.0}
    assert report.metrics.pass_hat_k == {1: 1.0, 2: 1.0, 3: 1.0}


def test_tags_filter_the_cases(home: Path, tmp_path: Path) -> None:
    path = write_golden(
        tmp_path,
        case("a", tags=["smoke"]),
        case("b", tags=["slow"]),
        case("c", tags=["smoke", "slow"]),
    )
    assert [c.id for c in run_eval(path, tags=["smoke"], home=home).cases] == ["a", "c"]
    with pytest.raises(Exception, match=r"tag\(s\) 'nope'.*tags in the file: slow, smoke"):
        run_eval(path, tags=["nope"], home=home)


# -- metrics ------------------------------------------------------------------------------


def synthetic_case(id: str, outcomes: list[bool], **given: Any) -> CaseResult:
    trials = tuple(
        TrialResult(
            case_id=id,
            trial=n,
            passed=ok,
            checks=tuple(Check(name=key, passed=ok, expected=None, actual=None) for key in given),
            latency_seconds=float(n),
            usage={"input_tokens": 100, "output_tokens": 10, "cost_usd": 0.001},
        )
        for n, ok in enumerate(outcomes, start=1)
    )
    return CaseResult(id=id, input="x", expect=expectation(**given), trials=trials)


def test_pass_at_k_and_pass_hat_k_as_tau_bench_defines_them() -> None:
    assert pass_hat_k(3, 1, 1) == pytest.approx(1 / 3)
    assert pass_hat_k(3, 2, 2) == pytest.approx(1 / 3)  # C(2,2) / C(3,2)
    assert pass_hat_k(3, 2, 3) == 0.0
    assert pass_at_k(3, 1, 2) == pytest.approx(2 / 3)  # 1 - C(2,2) / C(3,2)
    assert pass_at_k(3, 0, 3) == 0.0
    with pytest.raises(ValueError, match="k=4"):
        pass_hat_k(3, 3, 4)

    metrics = compute_metrics(
        [
            synthetic_case("always", [True, True, True], first_agent="x"),
            synthetic_case("once", [False, True, False], first_agent="x", max_tokens=1),
            synthetic_case("never", [False, False, False], handoffs=[]),
        ]
    )
    assert (metrics.cases, metrics.runs, metrics.passed_runs) == (3, 9, 4)
    assert metrics.pass_rate == pytest.approx(4 / 9, abs=1e-4)
    assert metrics.pass_hat_k == {
        1: pytest.approx((1 + 1 / 3 + 0) / 3, abs=1e-4),
        2: pytest.approx((1 + 0 + 0) / 3, abs=1e-4),
        3: pytest.approx(1 / 3, abs=1e-4),
    }
    assert metrics.pass_at_k == {
        1: pytest.approx((1 + 1 / 3 + 0) / 3, abs=1e-4),
        2: pytest.approx((1 + 2 / 3 + 0) / 3, abs=1e-4),
        3: pytest.approx((1 + 1 + 0) / 3, abs=1e-4),
    }
    # Aspect metrics count only the runs of cases that name the key.
    assert metrics.routing_accuracy == pytest.approx(4 / 6, abs=1e-4)
    assert metrics.budget_adherence == pytest.approx(1 / 3, abs=1e-4)
    assert metrics.handoff_match == 0.0
    assert metrics.trajectory_match is None and metrics.answer_match is None
    assert (metrics.input_tokens, metrics.output_tokens, metrics.total_tokens) == (900, 90, 990)
    assert metrics.total_cost_usd == pytest.approx(0.009)
    assert (metrics.latency_p50, metrics.latency_p95) == (2.0, 3.0)


def test_one_run_per_case_reports_no_pass_at_k() -> None:
    metrics = compute_metrics([synthetic_case("a", [True]), synthetic_case("b", [False])])
    assert metrics.pass_rate == 0.5
    assert metrics.pass_at_k == {} and "pass_at_k" not in metrics.to_json()


# -- reports, baselines, gating -----------------------------------------------------------


def test_report_files_hold_every_check_with_expected_and_actual(home: Path, tmp_path: Path) -> None:
    from relaygraph.store import LOCAL_PROJECT_ID, Ledger

    path = write_golden(
        tmp_path,
        case("passes", "route-writer", first_agent="writer", tools_used=["save_artifact"]),
        case("fails", "route-writer", first_agent="coder", status="succeeded"),
    )
    out = tmp_path / "out"
    run_eval(path, out=out, home=home)
    data = json.loads((out / "report.json").read_text())
    assert data["metrics"]["pass_rate"] == 0.5
    passes, fails = data["cases"]
    [trial] = fails["trials"]
    assert trial["checks"] == [
        {
            "name": "first_agent",
            "passed": False,
            "expected": "coder",
            "actual": "writer",
            "message": "the first agent was 'writer', expected 'coder'",
        },
        {"name": "status", "passed": True, "expected": "succeeded", "actual": "succeeded"},
    ]
    assert fails["expect"] == {"first_agent": "coder", "status": "succeeded"}
    assert trial["usage"]["input_tokens"] > 0 and trial["latency_seconds"] > 0
    assert passes["passed"] and passes["trials"][0]["observed"]["tools"] == ["save_artifact"]
    # The task id is the ledger's: `relaygraph trace` opens its timeline.
    with Ledger(f"sqlite:///{home / 'ledger.sqlite'}") as ledger:
        task = ledger.get_task(trial["task_id"], project_id=LOCAL_PROJECT_ID)
    assert task is not None and task.input == "request for fails"
    markdown = (out / "report.md").read_text()
    assert "| pass_rate | 50.0% (1/2 runs) |" in markdown
    assert "| fails | first_agent: the first agent was 'writer', expected 'coder' |" in markdown
    assert '**first_agent**: expected "coder", actual "writer"' in markdown
    assert trial["task_id"] in markdown


# -- the command --------------------------------------------------------------------------


def eval_cli(*argv: str, home: Path) -> int:
    """``relaygraph eval ...`` through the parser and handler relaygraph.cli registers."""
    parser = argparse.ArgumentParser(prog="relaygraph")
    parser.add_argument("--home", type=Path)
    add_eval_parser(parser.add_subparsers(dest="command", required=True))
    return run_eval_command(parser.parse_args(["--home", str(home), "eval", *argv]))


def test_cli_prints_cases_and_metrics(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    path = write_golden(tmp_path, case("fine", first_agent="coder"), case("bad", first_agent="x"))
    assert eval_cli(str(path), "--out", str(tmp_path / "out"), home=home) == 0
    out, err = capsys.readouterr()
    assert re.search(r"fine\s+│ passed", out)
    assert "first_agent: the first agent was 'coder', expected 'x'" in out
    assert re.search(r"pass_rate\s+│\s+50.0% \(1/2 runs\)", out)
    assert "report.json" in err
    assert "eval 2/2: " in err  # not a terminal: a line per run instead of a bar


def test_baseline_regression_fails_the_command(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = write_golden(
        tmp_path / "v1", case("stays", first_agent="coder"), case("breaks", first_agent="coder")
    )
    assert eval_cli(str(before), "--out", str(tmp_path / "r1"), home=home) == 0
    after = write_golden(
        tmp_path / "v2", case("stays", first_agent="coder"), case("breaks", first_agent="writer")
    )
    capsys.readouterr()
    code = eval_cli(
        str(after),
        "--baseline",
        str(tmp_path / "r1" / "report.json"),
        "--out",
        str(tmp_path / "r2"),
        home=home,
    )
    assert code == 1
    out, err = capsys.readouterr()
    assert "1 case(s) passed in the baseline and fail now: breaks" in err
    assert "(regression)" in out
    report = json.loads((tmp_path / "r2" / "report.json").read_text())
    assert (report["regressions"], report["fixed"]) == (["breaks"], [])
    # The same comparison the other way round is a fix, not a regression; a folder works too.
    assert eval_cli(str(before), "--baseline", str(tmp_path / "r2"), home=home) == 0


def test_min_pass_rate_gates(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_golden(tmp_path, case("ok", first_agent="coder"), case("no", first_agent="x"))
    assert eval_cli(str(path), "--min-pass-rate", "0.5", home=home) == 0
    assert eval_cli(str(path), "--min-pass-rate", "0.6", home=home) == 1
    assert "pass rate 50.0% is under the minimum 60.0%" in capsys.readouterr().err


def test_cli_tag_runs_only_tagged_cases(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_golden(tmp_path, case("a", tags=["smoke"]), case("b", first_agent="x"))
    assert eval_cli(str(path), "--tag", "smoke", "--min-pass-rate", "1", home=home) == 0
    out = capsys.readouterr().out
    assert "1 cases" in out and re.search(r"\bb\b\s+│", out) is None


def test_cli_invalid_lines_run_the_rest_and_exit_2(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_golden(tmp_path, case("a"), '{"id": "b"}')
    assert eval_cli(str(path), "--out", str(tmp_path / "out"), home=home) == 2
    err = capsys.readouterr().err
    assert "line 2: case 'b': input: Field required" in err
    assert "1 line(s)" in err and "the other cases ran" in err
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [c["id"] for c in report["cases"]] == ["a"]
    assert report["invalid_lines"][0]["line"] == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--concurrency", "0"], "--concurrency: expected a whole number of at least 1, got '0'"),
        (["--repeat", "two"], "--repeat: expected a whole number of at least 1, got 'two'"),
        (["--min-pass-rate", "90"], "expected a share between 0 and 1 (0.9 for 90%), got '90'"),
        (["--agent-model", "coder"], "expected AGENT=SPEC, for example"),
    ],
)
def test_cli_refuses_bad_flags(
    home: Path, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        eval_cli(str(GOLDEN), *argv, home=home)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["GOLDEN=missing.jsonl"], "golden file 'missing.jsonl' does not exist"),
        (["--model", "bogus:x"], "invalid model spec 'bogus:x'"),
        (["--agent-model", "poet=scripted:x.json"], "unknown agent(s) 'poet'"),
        (["--baseline", "nowhere.json"], "baseline report 'nowhere.json' does not exist"),
        (["--baseline", "GOLDEN"], "is not an eval report.json"),
        (["--tag", "nope"], "has the tag(s) 'nope'"),
        (["--out", "GOLDEN"], "is a file; name a folder for the report"),
        (["GOLDEN=EMPTY"], "has no valid case: the file has no cases"),
        (
            ["--topology", "swarm", "--start-agent", "nobody"],
            "start_agent 'nobody' is not an agent of this team",
        ),
    ],
)
def test_cli_bad_input_exits_2_naming_the_value(
    home: Path,
    tmp_path: Path,
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    golden = str(GOLDEN)
    args = []
    for arg in argv:
        if arg.startswith("GOLDEN="):
            golden = str(empty) if arg == "GOLDEN=EMPTY" else arg.removeprefix("GOLDEN=")
        else:
            args.append(str(GOLDEN) if arg == "GOLDEN" else arg)
    assert eval_cli(golden, *args, home=home) == 2
    err = capsys.readouterr().err
    assert err.startswith("relaygraph: error: ") and message in err


# -- LangSmith ----------------------------------------------------------------------------


class FakeLangSmith(ThreadingHTTPServer):
    """Enough of the LangSmith API on loopback for datasets, experiments and feedback."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _LangSmithHandler)
        self.requests: list[tuple[str, str]] = []
        self.datasets: dict[str, dict[str, Any]] = {}
        self.examples: dict[str, dict[str, Any]] = {}
        self.sessions: dict[str, dict[str, Any]] = {}
        self.feedback: list[dict[str, Any]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _LangSmithHandler(BaseHTTPRequestHandler):
    server: FakeLangSmith

    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, method: str) -> None:
        fake, url = self.server, urlparse(self.path)
        query, path = parse_qs(url.query), url.path
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        body = (
            json.loads(raw) if raw and "json" in (self.headers.get("content-type") or "") else None
        )
        fake.requests.append((method, path))
        now = datetime.now(UTC).isoformat()
        if (method, path) == ("GET", "/datasets"):
            names = query.get("name", [])
            return self._reply([d for d in fake.datasets.values() if d["name"] in names])
        if (method, path) == ("POST", "/datasets"):
            dataset = {"id": str(uuid.uuid4()), "name": body["name"], "created_at": now}
            fake.datasets[dataset["id"]] = dataset
            return self._reply(dataset)
        if (method, path) == ("GET", "/examples"):
            wanted = query.get("dataset", [])
            found = [e for e in fake.examples.values() if e["dataset_id"] in wanted]
            offset, limit = int(query["offset"][0]), int(query["limit"][0])
            return self._reply(found[offset : offset + limit])
        if (method, path) == ("POST", "/examples/bulk"):
            made = [{**e, "id": e.get("id") or str(uuid.uuid4()), "created_at": now} for e in body]
            fake.examples.update({e["id"]: e for e in made})
            return self._reply(made)
        if method == "PATCH" and (match := re.fullmatch(r"/examples/([^/]+)", path)):
            fake.examples[match.group(1)].update(
                {k: v for k, v in body.items() if k in ("inputs", "outputs", "metadata")}
            )
            return self._reply({})
        if (method, path) == ("POST", "/sessions"):
            session = {
                **body,
                "id": body.get("id") or str(uuid.uuid4()),
                "start_time": now,
                "tenant_id": str(uuid.uuid4()),
            }
            fake.sessions[session["id"]] = session
            return self._reply(session)
        if (method, path) == ("POST", "/feedback"):
            fake.feedback.append(body)
            return self._reply(body)
        return self._reply({} if method != "GET" or path != "/sessions" else [])

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PATCH(self) -> None:
        self._handle("PATCH")


@pytest.fixture
def fake_langsmith(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLangSmith]:
    """LangSmith on loopback, named by the usual environment variables, tracing off."""
    from langsmith.utils import get_env_var

    server = FakeLangSmith()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("LANGSMITH_ENDPOINT", server.url)
    monkeypatch.setenv("LANGSMITH_API_KEY", "lsv2_test")
    cast(Any, get_env_var).cache_clear()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        monkeypatch.undo()
        cast(Any, get_env_var).cache_clear()


def test_nothing_is_posted_without_the_flag_even_with_tracing_on(
    home: Path, tmp_path: Path, fake_langsmith: FakeLangSmith, monkeypatch: pytest.MonkeyPatch
) -> None:
    import langchain_core.tracers.langchain as langchain_tracer
    from langchain_core.tracers.langchain import wait_for_all_tracers
    from langsmith import Client
    from langsmith.utils import get_env_var

    from relaygraph.runner import run_task

    client = Client(api_url=fake_langsmith.url, api_key="lsv2_test")
    monkeypatch.setattr(langchain_tracer, "get_client", lambda: client)
    monkeypatch.setenv("LANGSMITH_TRACING", "true")
    cast(Any, get_env_var).cache_clear()
    path = write_golden(tmp_path, case("a", first_agent="coder"), case("b"))
    report = run_eval(path, concurrency=2, home=home)
    assert report.metrics.pass_rate == 1.0 and report.langsmith is None
    client.flush()
    wait_for_all_tracers()
    posted = [r for r in fake_langsmith.requests if r[0] != "GET"]
    assert posted == []
    # The same run outside the eval is traced: the check above could have seen a post.
    run_task("traced", model=f"scripted:{SCRIPTS / 'route-coder.json'}", home=home)
    client.flush()
    wait_for_all_tracers()
    assert ("POST", "/runs/multipart") in fake_langsmith.requests or (
        "POST",
        "/runs/batch",
    ) in fake_langsmith.requests


def test_langsmith_dataset_and_experiment(
    home: Path, tmp_path: Path, fake_langsmith: FakeLangSmith
) -> None:
    path = write_golden(
        tmp_path, case("ok", first_agent="coder", status="succeeded"), case("no", first_agent="x")
    )
    report = run_eval(path, repeat=2, langsmith_dataset="rg-golden", home=home)
    assert report.langsmith is not None and "error" not in report.langsmith, report.langsmith
    [dataset] = fake_langsmith.datasets.values()
    assert (dataset["name"], report.langsmith["dataset_id"]) == ("rg-golden", dataset["id"])
    examples = {e["inputs"]["case_id"]: e for e in fake_langsmith.examples.values()}
    assert examples["ok"]["outputs"] == {"expect": {"first_agent": "coder", "status": "succeeded"}}
    [experiment] = fake_langsmith.sessions.values()
    assert experiment["reference_dataset_id"] == dataset["id"]
    assert experiment["name"].startswith("relaygraph-eval-golden")
    feedback = [(f["key"], f["score"]) for f in fake_langsmith.feedback]
    # Two runs of each case: every check and the verdict, as in report.json.
    assert sorted(feedback) == sorted(
        [("first_agent", 1), ("status", 1), ("passed", 1)] * 2
        + [("first_agent", 0), ("passed", 0)] * 2
    )

    # Run again with a changed case: the example is updated, not duplicated.
    write_golden(tmp_path, case("ok", first_agent="coder"), case("no", first_agent="x"))
    again = run_eval(path, langsmith_dataset="rg-golden", home=home)
    assert again.langsmith is not None and "error" not in again.langsmith
    assert len(fake_langsmith.datasets) == 1 and len(fake_langsmith.examples) == 2
    examples = {e["inputs"]["case_id"]: e for e in fake_langsmith.examples.values()}
    assert examples["ok"]["outputs"] == {"expect": {"first_agent": "coder"}}


def test_a_langsmith_failure_is_reported_beside_the_results(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from langsmith.utils import get_env_var

    monkeypatch.setenv("LANGSMITH_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("LANGSMITH_API_KEY", "lsv2_test")
    cast(Any, get_env_var).cache_clear()
    try:
        path = write_golden(tmp_path, case("a"))
        out = tmp_path / "out"
        code = eval_cli(str(path), "--langsmith-dataset", "x", "--out", str(out), home=home)
    finally:
        monkeypatch.undo()
        cast(Any, get_env_var).cache_clear()
    assert code == 1
    assert "LangSmith: " in capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    assert report["cases"][0]["passed"] and report["langsmith"]["dataset"] == "x"
    assert report["langsmith"]["error"]


@pytest.mark.usefixtures("crashing_provider")
def test_an_eval_run_is_recorded_in_the_ledger_with_its_tasks(home: Path, tmp_path: Path) -> None:
    from relaygraph.store import LOCAL_PROJECT_ID, Ledger

    path = write_golden(
        tmp_path,
        case("fine", first_agent="coder", tags=["smoke"]),
        case("wrong", first_agent="writer", tags=["smoke"]),
        case("crash", tags=["smoke"]),
    )
    out = tmp_path / "out"
    report = run_eval(path, repeat=2, concurrency=2, tags=["smoke"], out=out, home=home)
    assert report.eval_run_id is not None
    saved = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert saved["eval_run_id"] == report.eval_run_id

    with Ledger(f"sqlite:///{home / 'ledger.sqlite'}") as ledger:
        run = ledger.eval_run(report.eval_run_id)
        assert [r.id for r in ledger.eval_runs()] == [run.id]
        tasks = {
            c.case_id: ledger.get_task(c.task_id, project_id=LOCAL_PROJECT_ID)
            for c in run.cases
            if c.task_id
        }
    assert run.finished and run.golden == str(path)
    assert run.options == {
        "repeat": 2,
        "concurrency": 2,
        "tags": ["smoke"],
        "baseline": None,
        "langsmith_dataset": None,
        "topology": {"kind": "structured"},
    }
    assert run.models == {"model": None, "agent_models": {}}
    counts = (run.case_count, run.run_count, run.passed_case_count, run.passed_run_count)
    assert counts == (3, 6, 1, 2)
    assert run.pass_rate == report.metrics.pass_rate == round(1 / 3, 4)
    assert run.metrics == report.metrics.to_json()
    assert [(c.case_id, c.trial, c.passed) for c in run.cases] == [
        ("crash", 1, False),
        ("crash", 2, False),
        ("fine", 1, True),
        ("fine", 2, True),
        ("wrong", 1, False),
        ("wrong", 2, False),
    ]
    by_key = {(c.case_id, c.trial): c for c in run.cases}
    for result in report.cases:
        for trial in result.trials:
            stored = by_key[(result.id, trial.trial)]
            assert stored.task_id == trial.task_id
            assert stored.checks == [check.to_json() for check in trial.checks]
            assert stored.latency_seconds == trial.latency_seconds
            assert stored.usage == json.loads(json.dumps(trial.usage))
    # Cases that ran point at real tasks of the ledger; the crash never had one.
    assert set(tasks) == {"fine", "wrong"}
    assert all(task is not None and task.input == f"request for {k}" for k, task in tasks.items())
    crash = by_key[("crash", 1)]
    assert crash.task_id is None and crash.error == "RuntimeError: provider exploded"
    assert crash.first_failure is not None and crash.first_failure["name"] == "run"
    wrong = by_key[("wrong", 1)].first_failure
    assert wrong is not None
    assert (wrong["name"], wrong["expected"], wrong["actual"]) == ("first_agent", "writer", "coder")


def test_cli_topology_flag_runs_the_set_in_that_topology(home: Path, tmp_path: Path) -> None:
    out = tmp_path / "swarm"
    code = eval_cli(
        str(GOLDEN),
        "--topology",
        "swarm",
        "--start-agent",
        "researcher",
        "--out",
        str(out),
        home=home,
    )
    report = json.loads((out / "report.json").read_text())
    assert report["topology"] == {"kind": "swarm", "start_agent": "researcher"}
    assert code in (0, 1)  # the swarm fails some supervisor cases; the run itself worked
    assert all(c["trials"][0]["checks"][0]["name"] != "run" for c in report["cases"])
    with Ledger(f"sqlite:///{home / 'ledger.sqlite'}") as ledger:
        [run] = ledger.eval_runs()
        assert run.options["topology"]["kind"] == "swarm"
