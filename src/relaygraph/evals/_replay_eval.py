"""Replay as an eval: rerun the recorded tasks a ledger selection picks on another team
version, model or policy, and report per task whether it still routes the same way, where it
parts, how alike its answer is, and at what cost and time; and export recorded tasks as
golden cases whose expected trajectory is the recorded one.

The summary's gate works as the golden-set eval's does: a share under ``min_same_rate``, or a
task that routed the same way in a baseline report and does not now (a regression), fails.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relaygraph.errors import ConfigError, RelaygraphError
from relaygraph.evals._trajectory import Trajectory, diff_trajectories, read_trajectory

if TYPE_CHECKING:
    from relaygraph.policies import TeamPolicy
    from relaygraph.runner import ReplayChanges
    from relaygraph.store import Ledger, Task
    from relaygraph.team import Team

__all__ = [
    "ReplayCase",
    "ReplayEvalReport",
    "export_golden",
    "golden_case_of",
    "run_replay_eval",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplayCase:
    """One recorded task and its replay, compared."""

    task_id: str
    replay_id: str | None
    status: str
    replay_status: str | None
    same_routes: bool
    """The replay's route sequence (each step's agent) is the original's."""
    first_divergence: int | None
    """The first step where the two trajectories part; None when none does."""
    answer_similarity: float
    """0 to 1: how alike the two answers' texts are."""
    cost_ratio: float | None
    """The replay's cost over the original's; None when the original cost nothing."""
    tokens_ratio: float | None
    time_ratio: float | None
    """The replay's model and tool seconds over the original's."""
    error: str | None = None
    """Why the task could not be replayed (its team cannot be rebuilt, ...)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplayEvalReport:
    """Every selected task's replay, and what the gate says of them."""

    cases: tuple[ReplayCase, ...]
    changes: dict[str, Any] = field(default_factory=dict)
    """What the replays changed (team, model, policy, from_step), as given."""
    baseline: str | None = None
    regressions: tuple[str, ...] = ()
    """Tasks that routed the same way in the baseline and do not now."""
    fixed: tuple[str, ...] = ()

    def summary(self) -> dict[str, Any]:
        """The report in a few numbers."""
        ran = [c for c in self.cases if c.error is None]
        same = sum(1 for c in ran if c.same_routes)

        def mean(values: Sequence[float | None]) -> float | None:
            known = [v for v in values if v is not None]
            return round(sum(known) / len(known), 4) if known else None

        return {
            "tasks": len(self.cases),
            "replayed": len(ran),
            "errors": len(self.cases) - len(ran),
            "same_routes": same,
            "same_route_rate": round(same / len(ran), 4) if ran else None,
            "diverged": [c.task_id for c in ran if c.first_divergence is not None],
            "mean_answer_similarity": mean([c.answer_similarity for c in ran]),
            "mean_cost_ratio": mean([c.cost_ratio for c in ran]),
            "mean_tokens_ratio": mean([c.tokens_ratio for c in ran]),
            "mean_time_ratio": mean([c.time_ratio for c in ran]),
        }

    def gate(self, *, min_same_rate: float | None = None) -> list[str]:
        """Why the report fails the gate; empty when it passes."""
        reasons = []
        rate = self.summary()["same_route_rate"]
        if min_same_rate is not None and (rate is None or rate < min_same_rate):
            reasons.append(f"same-route rate {rate} is under {min_same_rate}")
        if self.regressions:
            reasons.append(
                f"{len(self.regressions)} task(s) route differently than in "
                f"{self.baseline}: {', '.join(self.regressions)}"
            )
        errors = [c for c in self.cases if c.error is not None]
        if errors:
            reasons.append(f"{len(errors)} task(s) could not be replayed")
        return reasons

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "replay",
            "changes": self.changes,
            "summary": self.summary(),
            "cases": [asdict(case) for case in self.cases],
            "baseline": self.baseline,
            "regressions": list(self.regressions),
            "fixed": list(self.fixed),
        }

    def write(self, folder: Path) -> Path:
        """Write ``folder/report.json``; returns its path."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "report.json"
        path.write_text(json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n")
        return path


def _ratio(new: float, old: float) -> float | None:
    return round(new / old, 4) if old > 0 else None


def _total(trajectory: Trajectory, name: str) -> float:
    return sum(usage.get(name, 0.0) for usage in trajectory.per_agent.values())


def similarity(a: str | None, b: str | None) -> float:
    """How alike two answers are, 0 to 1 (difflib's ratio: the standard library's measure,
    offline and deterministic, unlike a model's judgement)."""
    return round(difflib.SequenceMatcher(None, a or "", b or "").ratio(), 4)


def compare(original: Trajectory, replayed: Trajectory, *, replay_status: str) -> ReplayCase:
    """A task and its replay as one case of the report."""
    diff = diff_trajectories(original, replayed)
    tokens = ("input_tokens", "output_tokens")
    return ReplayCase(
        task_id=original.task_id,
        replay_id=replayed.task_id,
        status=original.status,
        replay_status=replay_status,
        same_routes=original.routes == replayed.routes,
        first_divergence=diff.first_divergence,
        answer_similarity=similarity(original.answer, replayed.answer),
        cost_ratio=_ratio(_total(replayed, "cost_usd"), _total(original, "cost_usd")),
        tokens_ratio=_ratio(
            sum(_total(replayed, n) for n in tokens), sum(_total(original, n) for n in tokens)
        ),
        time_ratio=_ratio(_total(replayed, "seconds"), _total(original, "seconds")),
    )


def _baseline(path: Path | None) -> dict[str, bool]:
    """Each task's ``same_routes`` in an earlier replay report (its file or its folder)."""
    if path is None:
        return {}
    file = path / "report.json" if path.is_dir() else path
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"baseline {str(path)!r} cannot be read: {exc}") from None
    if not isinstance(data, dict) or data.get("kind") != "replay":
        raise ConfigError(f"baseline {str(path)!r} is no replay eval report")
    return {case["task_id"]: bool(case["same_routes"]) for case in data.get("cases", [])}


def run_replay_eval(
    tasks: Sequence[Task],
    changes: ReplayChanges,
    *,
    ledger: Ledger,
    home: Path | None = None,
    baseline: Path | None = None,
    described: dict[str, Any] | None = None,
    on_progress: Callable[[int, int, ReplayCase], None] | None = None,
    teams: Callable[[Task], Team] | None = None,
    policies: Callable[[Task, TeamPolicy], TeamPolicy] | None = None,
) -> ReplayEvalReport:
    """Replay each of ``tasks`` (recorded in ``ledger``) in this process with ``changes``,
    one after the other, and compare each replay with its original. ``teams`` and
    ``policies`` are :func:`~relaygraph.runner.replay_task`'s (an API project's tasks).

    Raises:
        ConfigError: The baseline cannot be read.
    """
    from relaygraph.runner import replay_task

    before = _baseline(baseline)
    cases = []
    for index, task in enumerate(tasks, start=1):
        try:
            result = replay_task(
                task.id,
                changes,
                home=home,
                project_id=task.project_id,
                teams=teams,
                policies=policies,
            )
            replayed = ledger.get_task(result.task_id, project_id=task.project_id)
            if replayed is None:  # pragma: no cover - the ledger just recorded it
                raise ConfigError(f"replay {result.task_id} is not in the ledger")
            case = compare(
                read_trajectory(ledger, task),
                read_trajectory(ledger, replayed),
                replay_status=replayed.status,
            )
        except RelaygraphError as exc:
            case = ReplayCase(
                task_id=task.id,
                replay_id=None,
                status=task.status,
                replay_status=None,
                same_routes=False,
                first_divergence=None,
                answer_similarity=0.0,
                cost_ratio=None,
                tokens_ratio=None,
                time_ratio=None,
                error=str(exc),
            )
        cases.append(case)
        if on_progress is not None:
            on_progress(index, len(tasks), case)
    ran = {c.task_id: c.same_routes for c in cases if c.error is None}
    return ReplayEvalReport(
        cases=tuple(cases),
        changes=described or {},
        baseline=None if baseline is None else str(baseline),
        regressions=tuple(t for t, same in ran.items() if before.get(t) is True and not same),
        fixed=tuple(t for t, same in ran.items() if before.get(t) is False and same),
    )


def golden_case_of(ledger: Ledger, task: Task) -> dict[str, Any]:
    """``task`` as a golden case (a line of a golden file): its request, and its recorded
    trajectory as the expected one (agents in order, direct handoffs, tools, status,
    violations); its script when every role ran on the same scripted model."""
    from relaygraph.models import parse_model_spec

    trajectory = read_trajectory(ledger, task)
    agents = [step.agent for step in trajectory.steps]
    handoffs = [
        [step.source, step.agent]
        for step in trajectory.steps
        if step.source not in ("supervisor", "user")
    ]
    tools: list[str] = []
    for step in trajectory.steps:
        for call in step.tool_calls:
            if call.name not in tools:
                tools.append(call.name)
    violations = sorted(
        {v.split(":", 1)[0] for s in trajectory.steps for v in s.violations}
        | {v.split(":", 1)[0] for v in trajectory.violations}
    )
    case: dict[str, Any] = {
        "id": f"task-{task.id}",
        "input": task.input,
        "expect": {
            "first_agent": agents[0] if agents else None,
            "agents": agents,
            "agents_match": "strict",
            "handoffs": handoffs,
            "tools_used": tools,
            "status": task.status,
            "violations": violations,
        },
        "tags": ["exported", str((task.team or {}).get("name", "default"))],
    }
    if not agents:
        del case["expect"]["first_agent"]
    specs = set(task.models.values())
    if len(specs) == 1:
        parsed = parse_model_spec(specs.pop())
        if parsed.provider == "scripted":
            case["script"] = parsed.name
    return case


def export_golden(ledger: Ledger, tasks: Sequence[Task], out: Path) -> int:
    """Write ``tasks`` as golden cases to the JSON Lines file ``out``; returns how many."""
    lines = [json.dumps(golden_case_of(ledger, task), ensure_ascii=False) for task in tasks]
    out.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return len(lines)
