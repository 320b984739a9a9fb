"""A task as its dashboard page shows it, gathered from the ledger in one place.

Every part is what an API endpoint answers for the task: the task (``GET /v1/tasks/{id}``),
its timeline (``/trace``), its handoffs (``/handoffs``), approvals (``/approvals``),
artifacts (``/artifacts``) and where its runs were traced (``/trace-links``); the budgets
set the policy the task ran under beside the timeline's usage.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relaygraph.api._errors import ErrorAnswer
from relaygraph.api._schemas import ApprovalOut, TaskOut
from relaygraph.api.ui._graph import HandoffGraph, Transfer, layout, transfers_of
from relaygraph.api.ui._queries import (
    ArtifactOut,
    TraceLink,
    read_artifact,
    task_artifacts,
    trace_links,
)
from relaygraph.store import Ledger, Task

SHOWN_BYTES = 64 * 1024
"""Artifacts up to this size are shown in the page as well as linked."""
_AGENT_LIMITS = (
    ("model calls", "max_model_calls", "model_calls", ""),
    ("tool calls", "max_tool_calls", "tool_calls", ""),
    ("tokens", "max_tokens", "tokens", ""),
    ("cost", "max_cost_usd", "cost_usd", "usd"),
    ("seconds", "max_seconds", "seconds", "s"),
)
_TEAM_LIMITS = (
    ("agent visits", "max_agent_runs", "visits", ""),
    ("tokens", "max_tokens", "tokens", ""),
    ("cost", "max_cost_usd", "cost_usd", "usd"),
    ("seconds", "max_seconds", "seconds", "s"),
)


@dataclass(frozen=True, kw_only=True, slots=True)
class BudgetBar:
    """One use against one limit."""

    label: str
    used: float
    limit: float | None
    """None: the policy sets no such limit."""
    unit: str
    """``""`` for counts, ``usd`` or ``s``."""

    @property
    def share(self) -> float:
        """Used over limit, from 0 to 1 (0 without a limit)."""
        if not self.limit:
            return 0.0
        return max(0.0, min(1.0, self.used / self.limit))

    @property
    def level(self) -> str:
        """``ok``, ``high`` (over 80 %) or ``spent``: what colour the bar gets."""
        if self.limit and self.used >= self.limit:
            return "spent"
        return "high" if self.share >= 0.8 else "ok"


@dataclass(frozen=True, kw_only=True, slots=True)
class Budget:
    who: str
    """An agent's name, or ``team``."""
    bars: tuple[BudgetBar, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskView:
    task: TaskOut
    team: dict[str, Any] | None
    policy_digest: str | None
    timeline: dict[str, Any]
    """``GET /v1/tasks/{id}/trace``, as is."""
    transfers: tuple[Transfer, ...]
    graph: HandoffGraph
    budgets: tuple[Budget, ...]
    approvals: tuple[ApprovalOut, ...]
    artifacts: tuple[ArtifactOut, ...]
    artifact_texts: dict[str, str]
    """The text of each artifact small enough to show in the page."""
    violations: int
    traces: tuple[TraceLink, ...]
    """Where the task's runs were traced, latest first; empty when none was."""

    @property
    def pending(self) -> tuple[ApprovalOut, ...]:
        return tuple(a for a in self.approvals if a.decision is None)


def task_view(ledger: Ledger, home: Path, task: Task) -> TaskView:
    """Everything the task page shows, read from the ledger (the task is the caller's own)."""
    from relaygraph.runner import policy_digest
    from relaygraph.tracing import build_timeline

    timeline = build_timeline(ledger, task.id, project_id=task.project_id)
    events = ledger.events_after(task.id)
    transfers = transfers_of(ledger.handoffs(task.id), events)
    policy = task.policy or {}
    roster = list((policy.get("agents") or {}).keys())
    artifacts = tuple(task_artifacts(home, task.id))
    return TaskView(
        task=TaskOut.of(task),
        team=task.team,
        policy_digest=policy_digest(task.policy) if task.policy else None,
        timeline=timeline,
        transfers=tuple(transfers),
        graph=layout(roster, transfers),
        budgets=budgets(policy, timeline),
        approvals=tuple(ApprovalOut.of(a) for a in ledger.approvals(task.id)),
        artifacts=artifacts,
        artifact_texts=_texts(home, task.id, artifacts),
        violations=sum(1 for node in walk(timeline["children"]) if node["kind"] == "violation"),
        traces=tuple(trace_links(events).runs),
    )


def _texts(home: Path, task_id: str, artifacts: tuple[ArtifactOut, ...]) -> dict[str, str]:
    texts = {}
    for artifact in artifacts:
        if artifact.size_bytes > SHOWN_BYTES:
            continue
        try:
            texts[artifact.name] = read_artifact(home, task_id, artifact.name).decode("utf-8")
        except (ErrorAnswer, UnicodeDecodeError):
            continue  # Gone meanwhile, or not text: the links still offer it.
    return texts


def walk(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The timeline's nodes, depth first, in order."""
    found = []
    for node in nodes:
        found.append(node)
        found += walk(node.get("children", []))
    return found


def budgets(policy: dict[str, Any], timeline: dict[str, Any]) -> tuple[Budget, ...]:
    """Each agent's use against its limits, then the team's, for the agents that have
    limits or used something."""
    usage = timeline["usage"]
    rows = []
    for agent, limits in (policy.get("agents") or {}).items():
        used = _used(usage["agents"].get(agent) or {})
        if not any(limits.get(key) for _, key, _, _ in _AGENT_LIMITS) and not any(used.values()):
            continue
        bars = tuple(
            BudgetBar(label=label, used=used[field], limit=limits.get(key), unit=unit)
            for label, key, field, unit in _AGENT_LIMITS
        )
        rows.append(Budget(who=agent, bars=bars))
    team_limits = policy.get("team") or {}
    visits = sum(1 for node in walk(timeline["children"]) if node["kind"] == "agent")
    team_used = {**_used(usage["total"]), "visits": visits}
    if timeline.get("duration_s") is not None:
        team_used["seconds"] = timeline["duration_s"]
    bars = tuple(
        BudgetBar(label=label, used=team_used[field], limit=team_limits.get(key), unit=unit)
        for label, key, field, unit in _TEAM_LIMITS
    )
    rows.append(Budget(who="team", bars=bars))
    return tuple(rows)


def _used(usage: dict[str, Any]) -> dict[str, float]:
    return {
        "model_calls": usage.get("model_calls", 0),
        "tool_calls": usage.get("tool_calls", 0),
        "tokens": usage.get("input_tokens", 0) + usage.get("output_tokens", 0),
        "cost_usd": usage.get("cost_usd", 0.0),
        "seconds": usage.get("seconds", 0.0),
    }
