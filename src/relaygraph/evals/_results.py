"""What an eval run found: each run of each case, and each case (the whole report is
:class:`relaygraph.evals._report.EvalReport`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from relaygraph.evals._checks import Check, Observation
from relaygraph.evals._golden import Expectation


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
