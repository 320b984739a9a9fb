"""Evals: score the team against golden sets, offline or on a real model, and catch regressions.

A golden set is a JSON Lines file of cases: a request, and what the team is expected to do
with it (who is routed first, which agents run, who hands off to whom, which tools run, what
the answer says, what it may cost). :func:`run_eval` runs every case through the same team
the API runs and scores each run on what it did, not only on its final text::

    from relaygraph.evals import run_eval

    report = run_eval("examples/golden/golden.jsonl", out="eval-report")
    print(report.metrics.pass_rate, report.regressions)

``relaygraph eval`` is the same from the command line; ``docs/evals.md`` has the format.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from relaygraph._lazy import lazy_imports

if TYPE_CHECKING:
    from relaygraph.evals._checks import Check, Observation, agents_match, check_expectations
    from relaygraph.evals._golden import (
        AGENTS_MATCH_MODES,
        VIOLATION_KINDS,
        AgentsMatch,
        Expectation,
        GoldenCase,
        GoldenSet,
        InvalidGoldenLine,
        load_golden,
    )
    from relaygraph.evals._metrics import EvalMetrics, compute_metrics, pass_at_k, pass_hat_k
    from relaygraph.evals._replay_eval import (
        ReplayCase,
        ReplayEvalReport,
        export_golden,
        golden_case_of,
        run_replay_eval,
    )
    from relaygraph.evals._report import (
        EvalReport,
        case_outcome,
        load_baseline,
        metric_rows,
        render_markdown,
        write_report,
    )
    from relaygraph.evals._results import CaseResult, TrialResult
    from relaygraph.evals._runner import run_case, run_eval
    from relaygraph.evals._trajectory import (
        StepDiff,
        ToolCallRecord,
        Trajectory,
        TrajectoryDiff,
        TrajectoryStep,
        diff_trajectories,
        read_trajectory,
    )

__all__ = [
    "AGENTS_MATCH_MODES",
    "VIOLATION_KINDS",
    "AgentsMatch",
    "CaseResult",
    "Check",
    "EvalMetrics",
    "EvalReport",
    "Expectation",
    "GoldenCase",
    "GoldenSet",
    "InvalidGoldenLine",
    "Observation",
    "ReplayCase",
    "ReplayEvalReport",
    "StepDiff",
    "ToolCallRecord",
    "Trajectory",
    "TrajectoryDiff",
    "TrajectoryStep",
    "TrialResult",
    "agents_match",
    "case_outcome",
    "check_expectations",
    "compute_metrics",
    "diff_trajectories",
    "export_golden",
    "golden_case_of",
    "load_baseline",
    "load_golden",
    "metric_rows",
    "pass_at_k",
    "pass_hat_k",
    "read_trajectory",
    "render_markdown",
    "run_case",
    "run_eval",
    "run_replay_eval",
    "write_report",
]

# Loaded on first use: ``relaygraph --help`` imports the eval command's parser from this
# package and should not pay for pydantic, LangGraph or agentevals.
__getattr__ = lazy_imports(
    __name__,
    {
        "AGENTS_MATCH_MODES": "._golden",
        "VIOLATION_KINDS": "._golden",
        "AgentsMatch": "._golden",
        "Expectation": "._golden",
        "GoldenCase": "._golden",
        "InvalidGoldenLine": "._golden",
        "GoldenSet": "._golden",
        "load_golden": "._golden",
        "Check": "._checks",
        "Observation": "._checks",
        "agents_match": "._checks",
        "check_expectations": "._checks",
        "EvalMetrics": "._metrics",
        "compute_metrics": "._metrics",
        "pass_at_k": "._metrics",
        "pass_hat_k": "._metrics",
        "case_outcome": "._report",
        "load_baseline": "._report",
        "metric_rows": "._report",
        "render_markdown": "._report",
        "write_report": "._report",
        "CaseResult": "._results",
        "EvalReport": "._report",
        "TrialResult": "._results",
        "run_case": "._runner",
        "run_eval": "._runner",
        "ReplayCase": "._replay_eval",
        "ReplayEvalReport": "._replay_eval",
        "export_golden": "._replay_eval",
        "golden_case_of": "._replay_eval",
        "run_replay_eval": "._replay_eval",
        "StepDiff": "._trajectory",
        "ToolCallRecord": "._trajectory",
        "Trajectory": "._trajectory",
        "TrajectoryDiff": "._trajectory",
        "TrajectoryStep": "._trajectory",
        "diff_trajectories": "._trajectory",
        "read_trajectory": "._trajectory",
    },
)
