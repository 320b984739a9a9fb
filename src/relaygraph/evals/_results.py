"""What an eval run found: each run of each case, each case, and the whole report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from relaygraph.evals._checks import Check, Observation
from relaygraph.evals._golden import Expectation, GoldenLineError
from relaygraph.evals._metrics import EvalMetrics


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialResult:
    """One run of one case."""

    case_id: str
    trial: int
    """Which run of the case, from 1 (``--repeat``)."""
    passed: bool
    checks: tuple[Check, ...]
    observed: Observation | None = None
    """What the run did; None when it could not run (see :attr:`error`)."""
    task_id: str | None = None
    """The ledger's task: ``relaygraph trace TASK_ID`` shows its timeline."""
    thread_id: str | None = None
    latency_seconds: float = 0.0
    usage: dict[str, Any] = field(default_factory=dict)
    """The team's totals: model and tool calls, tokens, cost, seconds, agent runs."""
    usage_by_role: dict[str, dict[str, Any]] = field(default_factory=dict)
    model: str | None = None
    """The model spec the run used for roles without their own (``scripted:...`` offline)."""
    error: str | None = None
    """Why the case could not run at all (a bad model spec, a crash)."""

    @property
    def first_failure(self) -> Check | None:
        return next((check for check in self.checks if not check.passed), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "trial": self.trial,
            "passed": self.passed,
            "task_id": self.task_id,
            "thread_id": self.thread_id,
            "model": self.model,
            "latency_seconds": self.latency_seconds,
            "error": self.error,
            "checks": [check.to_json() for check in self.checks],
            "observed": None if self.observed is None else self.observed.to_json(),
            "usage": self.usage,
            "usage_by_role": self.usage_by_role,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class CaseResult:
    """Every run of one case. The case passes when all its runs pass."""

    id: str
    input: str
    expect: Expectation
    tags: tuple[str, ...] = ()
    line: int = 0
    team: str | None = None
    """The name of the team the case ran with."""
    trials: tuple[TrialResult, ...] = ()

    @property
    def passes(self) -> int:
        """How many runs passed."""
        return sum(trial.passed for trial in self.trials)

    @property
    def passed(self) -> bool:
        return bool(self.trials) and self.passes == len(self.trials)

    @property
    def first_failure(self) -> tuple[TrialResult, Check] | None:
        """The first failed check of the first failed run."""
        for trial in self.trials:
            if (check := trial.first_failure) is not None:
                return trial, check
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "line": self.line,
            "input": self.input,
            "team": self.team,
            "tags": list(self.tags),
            "expect": self.expect.to_json(),
            "passed": self.passed,
            "passes": self.passes,
            "runs": len(self.trials),
            "trials": [trial.to_json() for trial in self.trials],
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class EvalReport:
    """The outcome of ``relaygraph eval``: every case, the metrics, and what regressed."""

    golden: str
    """The golden file's path."""
    cases: tuple[CaseResult, ...]
    metrics: EvalMetrics
    invalid_lines: tuple[GoldenLineError, ...] = ()
    """Lines of the golden file that could not be read; the other cases ran."""
    model: str | None = None
    agent_models: dict[str, str] = field(default_factory=dict)
    topology: dict[str, Any] = field(default_factory=lambda: {"kind": "structured"})
    """How the agents were arranged (``relaygraph eval --topology``)."""
    team: dict[str, Any] | None = None
    """The team evaluated (``relaygraph eval --team``): name, digest, file
    (:meth:`~relaygraph.team.Team.record`); cases naming a team file of their own ran with
    that one (:attr:`CaseResult.team`)."""
    repeat: int = 1
    concurrency: int = 1
    tags: tuple[str, ...] = ()
    started_at: str = ""
    """ISO 8601, UTC."""
    seconds: float = 0.0
    baseline: str | None = None
    """The earlier report compared with, if any."""
    regressions: tuple[str, ...] = ()
    """Ids of cases that passed in the baseline and fail now."""
    fixed: tuple[str, ...] = ()
    """Ids of cases that failed in the baseline and pass now."""
    langsmith: dict[str, Any] | None = None
    """The LangSmith dataset and experiment, with ``--langsmith-dataset``."""
    eval_run_id: str | None = None
    """The ledger's record of this run (``Ledger.eval_run``), with every case result."""

    @property
    def failed(self) -> tuple[CaseResult, ...]:
        return tuple(case for case in self.cases if not case.passed)

    def gate(self, *, min_pass_rate: float | None = None) -> list[str]:
        """Why a pipeline should stop on this report; empty when it may go on.

        A pass rate under ``min_pass_rate`` and any regression against the baseline stop it.
        """
        reasons = []
        rate = self.metrics.pass_rate or 0.0
        if min_pass_rate is not None and rate < min_pass_rate:
            reasons.append(f"pass rate {rate:.1%} is under the minimum {min_pass_rate:.1%}")
        if self.regressions:
            reasons.append(
                f"{len(self.regressions)} case(s) passed in the baseline and fail now: "
                + ", ".join(self.regressions)
            )
        return reasons

    def to_json(self) -> dict[str, Any]:
        return {
            "eval_run_id": self.eval_run_id,
            "golden": self.golden,
            "started_at": self.started_at,
            "seconds": self.seconds,
            "model": self.model,
            "agent_models": self.agent_models,
            "topology": self.topology,
            "team": self.team,
            "repeat": self.repeat,
            "concurrency": self.concurrency,
            "tags": list(self.tags),
            "metrics": self.metrics.to_json(),
            "baseline": self.baseline,
            "regressions": list(self.regressions),
            "fixed": list(self.fixed),
            "invalid_lines": [{"line": e.line, "message": e.message} for e in self.invalid_lines],
            "langsmith": self.langsmith,
            "cases": [case.to_json() for case in self.cases],
        }
