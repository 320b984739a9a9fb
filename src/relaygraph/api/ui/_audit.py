"""What an auditor signs for a task, counted once from its events: the policy violations
(each once, however often a resumed run reported it), the budget hits apart from them, the
rule of the policy behind each, the calls a person rejected, and the waits for a person.

The task list's line (:func:`~relaygraph.api.ui._queries.summarize`, ``GET
/v1/task-summaries``) and the task page both count from :func:`audit_of`, so the two never
disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from relaygraph.store import Event

RULE_OF_KIND = {
    "tool_not_allowed": "tools",
    "handoff_not_allowed": "handoffs",
}
"""The agent's key of the policy that refuses a violation of each kind (the rest are the
host's or the tool's, or a whole section of the policy: see :func:`refusing_rule`)."""


def refusing_rule(kind: str, agent: str | None, budget: Mapping[str, Any] | None) -> str | None:
    """The key of the policy file that refused or stopped it, as the file writes it
    (``agents.coder.tools``, ``team.max_tokens``, ``ping_pong.max_bounces``); None for a
    refusal no policy key makes (arguments that do not fit the tool, a tool the host cannot
    run, a repeated call)."""
    if kind == "budget" and budget:
        limit = str(budget.get("limit") or "")
        if budget.get("scope") == "agent" and budget.get("agent"):
            return f"agents.{budget['agent']}.{limit}"
        if budget.get("scope") == "team":
            return f"team.{limit}"
        return None
    if kind == "ping_pong":
        return "ping_pong.max_bounces"
    key = RULE_OF_KIND.get(kind)
    return f"agents.{agent}.{key}" if key and agent else None


@dataclass(frozen=True, kw_only=True, slots=True)
class Violation:
    """One thing the policy refused or stopped."""

    seq: int
    """The event that reported it first."""
    agent: str | None
    kind: str
    detail: str
    rule: str | None
    """The policy key behind it (:func:`refusing_rule`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PersonWait:
    """A stretch in which the task waited for a person (an approval, a ping-pong sent to a
    person): no run was going, and no budget counts it."""

    start: datetime
    end: datetime | None
    """When the next run started; None while the task still waits."""
    what: str


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskAudit:
    violations: tuple[Violation, ...]
    """Policy violations, each once; budget hits are not among them."""
    budget_hits: tuple[Violation, ...]
    waits: tuple[PersonWait, ...]
    rejected: int
    """Tool calls a person rejected."""

    @property
    def kinds(self) -> list[str]:
        """The violations' kinds, sorted, each once."""
        return sorted({v.kind for v in self.violations})

    def waited_s(self, now: datetime) -> float:
        """Seconds spent waiting for a person (until ``now`` for a wait still going)."""
        return round(sum(((w.end or now) - w.start).total_seconds() for w in self.waits), 3)


def audit_of(events: Iterable[Event]) -> TaskAudit:
    """The task's violations, budget hits, rejections and waits, from its events in order."""
    violations: list[Violation] = []
    hits: list[Violation] = []
    seen: set[str] = set()
    waits: list[PersonWait] = []
    waiting: tuple[datetime, str] | None = None
    rejected = 0
    for event in events:
        data = event.data
        if event.type == "violation":
            # A resumed run may report a violation again; its id says it is the same one.
            key = str(data.get("id") or f"#{event.seq}")
            if key in seen:
                continue
            seen.add(key)
            kind = str(data.get("kind") or "unknown")
            agent = data.get("agent")
            found = Violation(
                seq=event.seq,
                agent=agent,
                kind=kind,
                detail=str(data.get("detail") or ""),
                rule=refusing_rule(kind, agent, data.get("budget")),
            )
            (hits if kind == "budget" else violations).append(found)
        elif event.type == "interrupted" and waiting is None:
            what = data.get("tool") or data.get("detail") or data.get("waits_for") or "a person"
            waiting = (event.created_at, str(what))
        elif event.type == "run_started" and waiting is not None:
            waits.append(PersonWait(start=waiting[0], end=event.created_at, what=waiting[1]))
            waiting = None
        elif event.type == "run_finished" and waiting is not None:
            if data.get("status") != "interrupted":  # Cancelled while it waited.
                waits.append(PersonWait(start=waiting[0], end=event.created_at, what=waiting[1]))
                waiting = None
        elif event.type == "approval" and data.get("decision") == "reject":
            rejected += 1
    if waiting is not None:
        waits.append(PersonWait(start=waiting[0], end=None, what=waiting[1]))
    return TaskAudit(
        violations=tuple(violations), budget_hits=tuple(hits), waits=tuple(waits), rejected=rejected
    )
