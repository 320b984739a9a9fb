"""The numbers an eval run reports: pass rate, per-aspect accuracy, cost, latency, pass@k."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from relaygraph.evals._json import fields_json
from relaygraph.evals._results import CaseResult, TrialResult

# Each aspect metric is the share of runs whose checks of these keys all passed, among the
# runs of cases that name at least one of them (None when no case does).
_ASPECTS: dict[str, tuple[str, ...]] = {
    "routing_accuracy": ("first_agent",),
    "trajectory_match": ("agents",),
    "handoff_match": ("handoffs",),
    "answer_match": ("answer_contains", "answer_not_contains"),
    "budget_adherence": ("max_tokens", "max_cost_usd"),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class EvalMetrics:
    """The metrics of one eval run. Shares are between 0 and 1; None when nothing was measured."""

    cases: int
    runs: int
    """Case runs: cases times ``repeat``."""
    passed_runs: int
    pass_rate: float | None
    """Share of runs that passed every check."""
    routing_accuracy: float | None = None
    """Share of runs whose first agent was the expected one (cases naming ``first_agent``)."""
    trajectory_match: float | None = None
    """Share of runs whose agents matched ``agents`` (cases naming it)."""
    handoff_match: float | None = None
    """Share of runs whose direct handoffs were ``handoffs`` (cases naming it)."""
    answer_match: float | None = None
    """Share of runs passing ``answer_contains`` and ``answer_not_contains`` (cases naming one)."""
    budget_adherence: float | None = None
    """Share of runs within ``max_tokens`` and ``max_cost_usd`` (cases naming one)."""
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    total_cost_usd: float = 0.0
    latency_p50: float | None = None
    """Median wall-clock seconds of one run."""
    latency_p95: float | None = None
    pass_at_k: dict[int, float] = field(default_factory=dict)
    """With ``repeat`` K > 1, for k = 1..K: chance that at least one of k runs of a case passes."""
    pass_hat_k: dict[int, float] = field(default_factory=dict)
    """With ``repeat`` K > 1, for k = 1..K: chance that all k runs of a case pass (pass^k)."""

    def to_json(self) -> dict[str, Any]:
        """Its fields; the pass@k estimates (keyed by k as a string) only with ``repeat`` > 1."""
        data = fields_json(self, leave_out={"pass_at_k", "pass_hat_k"})
        if self.pass_at_k:
            data["pass_at_k"] = {str(k): v for k, v in self.pass_at_k.items()}
            data["pass_hat_k"] = {str(k): v for k, v in self.pass_hat_k.items()}
        return data


def compute_metrics(cases: Sequence[CaseResult]) -> EvalMetrics:
    """The metrics of these case results (every trial of every case)."""
    trials = [trial for case in cases for trial in case.trials]
    aspects = {
        name: _share(
            [
                _aspect_passed(trial, keys)
                for case in cases
                for trial in case.trials
                if case.expect.given & set(keys)
            ]
        )
        for name, keys in _ASPECTS.items()
    }
    latencies = sorted(t.latency_seconds for t in trials if t.error is None)
    repeat = max((len(case.trials) for case in cases), default=0)
    input_tokens = sum(int(t.usage.get("input_tokens", 0)) for t in trials)
    output_tokens = sum(int(t.usage.get("output_tokens", 0)) for t in trials)
    return EvalMetrics(
        cases=len(cases),
        runs=len(trials),
        passed_runs=sum(t.passed for t in trials),
        pass_rate=_share([t.passed for t in trials]),
        **aspects,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        total_tokens=input_tokens + output_tokens,
        total_cost_usd=round(sum(float(t.usage.get("cost_usd", 0.0)) for t in trials), 6),
        latency_p50=_round(percentile(latencies, 0.50)),
        latency_p95=_round(percentile(latencies, 0.95)),
        pass_at_k=_per_k(cases, repeat, pass_at_k) if repeat > 1 else {},
        pass_hat_k=_per_k(cases, repeat, pass_hat_k) if repeat > 1 else {},
    )


def _aspect_passed(trial: TrialResult, keys: tuple[str, ...]) -> bool:
    if trial.error is not None:
        return False
    return all(check.passed for check in trial.checks if check.name in keys)


def _share(outcomes: list[bool]) -> float | None:
    return round(sum(outcomes) / len(outcomes), 4) if outcomes else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _per_k(cases: Sequence[CaseResult], repeat: int, estimate: Any) -> dict[int, float]:
    return {
        k: round(sum(estimate(len(c.trials), c.passes, k) for c in cases) / len(cases), 4)
        for k in range(1, repeat + 1)
    }


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chance that at least one of ``k`` runs drawn from ``n`` (``c`` of them passed) passes.

    The unbiased estimator of Chen et al. (2021): ``1 - C(n-c, k) / C(n, k)``.
    """
    if k > n:
        raise ValueError(f"k={k} is more than the {n} runs of the case")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Chance that all of ``k`` runs drawn from ``n`` (``c`` of them passed) pass.

    tau-bench's pass^k: ``C(c, k) / C(n, k)``, averaged over cases by the caller.
    """
    if k > n:
        raise ValueError(f"k={k} is more than the {n} runs of the case")
    return math.comb(c, k) / math.comb(n, k)


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of ascending values, interpolating between neighbours."""
    if not sorted_values:
        return None
    position = (len(sorted_values) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    fraction = position - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * fraction
