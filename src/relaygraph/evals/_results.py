"""What an eval run found: each run of each case, and each case (the whole report is
:class:`relaygraph.evals._report.EvalReport`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from relaygraph.evals._checks import Check, Observation
from relaygraph.evals._golden import Expectation
from relaygraph.evals._json import fields_json


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialResult:
    """One run of one case. The fields after ``case_id`` are its JSON, in this order."""

    case_id: str
    trial: int
    """Which run of the case, from 1 (``--repeat``)."""
    passed: bool
    task_id: str | None = None
    """The ledger's task: ``relaygraph trace TASK_ID`` shows its timeline."""
    thread_id: str | None = None
    model: str | None = None
    """The model spec the run used for roles without their own (``scripted:...`` offline)."""
    latency_seconds: float = 0.0
    error: str | None = None
    """Why the case could not run at all (a bad model spec, a crash)."""
    checks: tuple[Check, ...]
    observed: Observation | None = None
    """What the run did; None when it could not run (see :attr:`error`)."""
    usage: dict[str, Any] = field(default_factory=dict)
    """The team's totals: model and tool calls, tokens, cost, seconds, agent runs."""
    usage_by_role: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def first_failure(self) -> Check | None:
        return next((check for check in self.checks if not check.passed), None)

    def to_json(self) -> dict[str, Any]:
        # A case's JSON holds its trials, so each trial's own case id would say it again.
        return fields_json(self, leave_out={"case_id"})


@dataclass(frozen=True, kw_only=True, slots=True)
class CaseResult:
    """Every run of one case. The case passes when all its runs pass."""

    id: str
    line: int = 0
    input: str
    team: str | None = None
    """The name of the team the case ran with."""
    tags: tuple[str, ...] = ()
    expect: Expectation
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
        """Its fields up to ``expect``, the verdict, then every run."""
        return {
            **fields_json(self, leave_out={"trials"}),
            "passed": self.passed,
            "passes": self.passes,
            "runs": len(self.trials),
            "trials": [trial.to_json() for trial in self.trials],
        }
