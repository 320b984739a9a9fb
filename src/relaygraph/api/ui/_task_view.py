"""A task as its dashboard page shows it, gathered from the ledger in one place.

Every part is what an API endpoint answers for the task: the task (``GET /v1/tasks/{id}``),
its timeline (``/trace``), its handoffs (``/handoffs``), approvals (``/approvals``),
artifacts (``/artifacts``) and where its runs were traced (``/trace-links``); the budgets
set the policy the task ran under beside the timeline's usage.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from relaygraph._names import FINALIZE, SUPERVISOR
from relaygraph.api._errors import ErrorAnswer
from relaygraph.api._schemas import ApprovalOut, TaskOut
from relaygraph.api.ui._audit import TaskAudit, audit_of
from relaygraph.api.ui._graph import HandoffGraph, Transfer, layout, transfers_of
from relaygraph.api.ui._model_calls import ModelCallView, model_calls_of
from relaygraph.api.ui._policy_text import PolicyLine, policy_lines, policy_origin
from relaygraph.api.ui._queries import (
    ArtifactOut,
    TaskSummary,
    TraceLink,
    read_artifact,
    summarize,
    task_artifacts,
    trace_links,
)
from relaygraph.api.ui._waterfall import Waterfall, waterfall
from relaygraph.events import CancelRequestedEvent
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
    # The time the roles spent working, as the server counts it against the limit: the
    # waits for a person are no part of it (docs/policies.md).
    ("seconds working", "max_seconds", "seconds", "s"),
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
    """A role's name (an agent, ``supervisor``, ``finalize``), or ``team``."""
    bars: tuple[BudgetBar, ...]
    cost_usd: float
    """What the role spent (the team's: the task's total), from the ledger's usage."""


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
    summary: TaskSummary
    """The task list's line for the task (``GET /v1/task-summaries``): the page's counts."""
    audit: TaskAudit
    policy_origin: str
    """Where the policy came from, without the server's paths."""
    policy_lines: tuple[PolicyLine, ...]
    refusing_rules: frozenset[str]
    """The policy keys behind the task's violations and budget hits (marked in its text)."""
    traces: tuple[TraceLink, ...]
    """Where the task's runs were traced, latest first; empty when none was."""
    waterfall: Waterfall
    model_calls: tuple[ModelCallView, ...]
    """Each model call: what the model saw and answered, and what it spent."""
    cancel_request: CancelRequestedEvent | None
    """Who asked to cancel the task, and where (the first such request); None: nobody."""

    @property
    def violations(self) -> int:
        return self.summary.violations

    @property
    def working_s(self) -> float | None:
        """The task's wall time less its waits for a person; None while it runs."""
        if self.timeline.get("duration_s") is None:
            return None
        return round(max(0.0, self.timeline["duration_s"] - self.summary.waited_s), 3)

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
    audit = audit_of(events)
    summary = summarize(ledger, task, events)
    rules = {v.rule for v in (*audit.violations, *audit.budget_hits) if v.rule}
    return TaskView(
        task=TaskOut.of(task),
        team=task.team,
        policy_digest=policy_digest(task.policy) if task.policy else None,
        timeline=timeline,
        transfers=tuple(transfers),
        graph=layout(roster, transfers, ran=summary.agents),
        budgets=budgets(policy, timeline),
        approvals=tuple(ApprovalOut.of(a) for a in ledger.approvals(task.id)),
        artifacts=artifacts,
        artifact_texts=_texts(home, task.id, artifacts),
        summary=summary,
        audit=audit,
        policy_origin=policy_origin(TaskOut.of(task).policy_source),
        policy_lines=policy_lines(policy),
        refusing_rules=frozenset(rules),
        traces=tuple(trace_links(events).runs),
        waterfall=waterfall(timeline, events, audit.waits),
        model_calls=model_calls_of(events),
        cancel_request=next(
            (cast(CancelRequestedEvent, e.data) for e in events if e.type == "cancel_requested"),
            None,
        ),
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
    """Each role's use against its limits, then the team's: the supervisor, the agents that
    have limits or used something, any other role that used something, and finalize (the
    supervisor and finalize have no limits of their own; the team's count them). The roles'
    costs add up to the team's, which is the task's total."""
    usage = timeline["usage"]
    agents = policy.get("agents") or {}
    others = [r for r in usage["agents"] if r not in agents and r not in (SUPERVISOR, FINALIZE)]
    rows = []
    for role in (SUPERVISOR, *agents, *sorted(others), FINALIZE):
        limits = agents.get(role) or {}
        role_usage = usage["agents"].get(role) or {}
        used = _used(role_usage)
        if not any(limits.get(key) for _, key, _, _ in _AGENT_LIMITS) and not any(used.values()):
            continue
        bars = tuple(
            BudgetBar(label=label, used=used[field], limit=limits.get(key), unit=unit)
            for label, key, field, unit in _AGENT_LIMITS
        )
        rows.append(Budget(who=role, bars=bars, cost_usd=role_usage.get("cost_usd", 0.0)))
    team_limits = policy.get("team") or {}
    # A visit its run was paused in goes on in the next run: one visit, as the server counts.
    visits = sum(
        1 for node in walk(timeline["children"]) if node["kind"] == "agent" and not node["resumes"]
    )
    team_used = {**_used(usage["total"]), "visits": visits}
    bars = tuple(
        BudgetBar(label=label, used=team_used[field], limit=team_limits.get(key), unit=unit)
        for label, key, field, unit in _TEAM_LIMITS
    )
    rows.append(Budget(who="team", bars=bars, cost_usd=usage["total"]["cost_usd"]))
    return tuple(rows)


def _used(usage: dict[str, Any]) -> dict[str, float]:
    return {
        "model_calls": usage.get("model_calls", 0),
        "tool_calls": usage.get("tool_calls", 0),
        "tokens": usage.get("input_tokens", 0) + usage.get("output_tokens", 0),
        "cost_usd": usage.get("cost_usd", 0.0),
        "seconds": usage.get("seconds", 0.0),
    }
