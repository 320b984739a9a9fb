"""The ledger's eval runs and their case results (``EvalRunRepository``), on SQLite and on
PostgreSQL.

Every test that takes ``ledger`` or ``url`` runs on each backend (``tests/_store.py``).
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import Any

import pytest

from relaygraph.errors import ConfigError
from relaygraph.store import LOCAL_PROJECT_ID, Ledger, RecordConflict, RecordNotFound


def test_eval_runs_and_their_case_results(ledger: Ledger) -> None:
    task, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x")
    start = datetime(2020, 12, 1, 12, tzinfo=UTC)
    run_id = ledger.record_eval_run(
        golden="/golden.jsonl",
        models={"model": None, "agent_models": {"coder": "scripted:c.json"}},
        options={"repeat": 2, "concurrency": 1, "tags": ("smoke",), "baseline": None},
        case_count=2,
        run_count=4,
        started_at=start,
    )
    passed = {"name": "status", "passed": True, "expected": "succeeded", "actual": "succeeded"}
    failed = {"name": "first_agent", "passed": False, "expected": "coder", "actual": "writer"}
    first = ledger.record_eval_case(
        run_id,
        case_id="b",
        trial=1,
        passed=False,
        checks=[passed, failed],
        task_id=task.id,
        usage={"input_tokens": 3, "cost_usd": 0.5},
        latency_seconds=1.25,
    )
    assert first.first_failure == failed and first.task_id == task.id
    ledger.record_eval_case(run_id, case_id="a", trial=2, passed=True, checks=[passed])
    ledger.record_eval_case(run_id, case_id="a", trial=1, passed=True, checks=[passed])
    crashed = ledger.record_eval_case(
        run_id,
        case_id="b",
        trial=2,
        passed=False,
        checks=[{"name": "run", "passed": False, "expected": "runs", "actual": "bo\x00om"}],
        error="RuntimeError: bo\x00om",
    )
    assert crashed.task_id is None and crashed.error == "RuntimeError: bo\ufffdom"
    with pytest.raises(RecordConflict, match="b#1"):
        ledger.record_eval_case(run_id, case_id="b", trial=1, passed=True, checks=[])
    with pytest.raises(RecordNotFound, match="eval run 'nope'"):
        ledger.record_eval_case("nope", case_id="b", trial=3, passed=True, checks=[])
    with pytest.raises(RecordNotFound, match="task 'nope'"):
        ledger.record_eval_case(
            run_id, case_id="c", trial=1, passed=True, checks=[], task_id="nope"
        )

    running = ledger.eval_run(run_id)
    assert not running.finished and running.metrics is None and running.pass_rate is None
    assert running.options["tags"] == ["smoke"] and running.started_at == start
    finished = ledger.finish_eval_run(run_id, metrics={"pass_rate": 0.5, "pass_at_k": {"1": 0.5}})
    assert finished.finished and finished.pass_rate == 0.5
    assert (finished.case_count, finished.run_count) == (2, 4)
    assert (finished.passed_case_count, finished.passed_run_count) == (1, 2)
    with pytest.raises(RecordConflict, match="finished already"):
        ledger.finish_eval_run(run_id, metrics={"pass_rate": 0.5})

    stored = ledger.eval_run(run_id)
    assert stored == finished
    assert [(c.case_id, c.trial) for c in stored.cases] == [("a", 1), ("a", 2), ("b", 1), ("b", 2)]
    b1 = stored.cases[2]
    assert b1.checks == [passed, failed] and b1.usage == {"input_tokens": 3, "cost_usd": 0.5}
    assert b1.latency_seconds == 1.25 and b1.created_at.tzinfo is not None
    assert stored.models == {"model": None, "agent_models": {"coder": "scripted:c.json"}}

    later = ledger.record_eval_run(
        golden="/other.jsonl", models={}, options={}, case_count=0, run_count=0
    )
    assert [r.id for r in ledger.eval_runs()] == [later, run_id]
    [newest] = ledger.eval_runs(limit=1)
    assert newest.id == later and newest.cases == ()
    assert ledger.eval_runs()[1] == stored
    with pytest.raises(RecordNotFound, match="eval run 'nope'"):
        ledger.eval_run("nope")


def test_bad_eval_input_is_refused_by_name(ledger: Ledger) -> None:
    run_id = ledger.record_eval_run(golden="g", models={}, options={}, case_count=1, run_count=1)
    run: Any = functools.partial(ledger.record_eval_run, models={}, options={}, run_count=1)
    case: Any = functools.partial(ledger.record_eval_case, run_id, case_id="a")
    cases: list[tuple[Any, str]] = [
        (lambda: run(golden=" ", case_count=1), "golden"),
        (lambda: run(golden="g", case_count=-1), "case_count"),
        (lambda: run(golden="g", case_count=1, started_at=datetime(2020, 1, 1)), "started_at"),
        (lambda: run(golden="g", case_count=1, models=[]), "models"),
        (lambda: case(trial=0, passed=True, checks=[]), "trial"),
        (lambda: case(trial=1, passed=1, checks=[]), "passed"),
        (lambda: case(trial=1, passed=True, checks="x"), "checks"),
        (lambda: case(trial=1, passed=True, checks=[{}]), r"checks\[0\]"),
        (lambda: case(trial=1, passed=True, checks=[], usage={"x": float("nan")}), "usage.x"),
        (lambda: ledger.finish_eval_run(run_id, metrics={"pass_rate": 1.5}), "pass_rate"),
        (lambda: ledger.eval_runs(limit=0), "limit"),
    ]
    for call, message in cases:
        with pytest.raises(ConfigError, match=message):
            call()
    assert ledger.eval_run(run_id).cases == () and not ledger.eval_run(run_id).finished
