"""A task's trajectory, step by step, read from the ledger; and the diff of two.

A step is one agent visit: the transfer of work that started it (a supervisor's route, a
peer's handoff, or the user for a swarm's first agent), the agent's tool calls (name,
arguments, a digest of the recorded result), its violations and its usage. A replay from
step N (``runner.submit_replay``) ran only the steps after N: its trajectory is the
first N steps of the task it replays, then its own. The diff aligns two trajectories by
step, marks the first step where they part, and sums the differences.

A tool result's digest is of what the ledger keeps of it: its status and its preview (the
first ``events.PREVIEW_CHARS`` characters), less a program's run time (``run_python``'s
``exit code 0 after 0.09 s``), which differs on every run of the same program.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from relaygraph._names import FINISH
from relaygraph.evals._json import fields_json, json_value
from relaygraph.events import transfer_of

if TYPE_CHECKING:
    from relaygraph.store import Ledger, Task

__all__ = [
    "StepDiff",
    "ToolCallRecord",
    "Trajectory",
    "TrajectoryDiff",
    "TrajectoryStep",
    "diff_trajectories",
    "read_trajectory",
]

_USAGE_FIELDS = ("input_tokens", "output_tokens", "cost_usd", "seconds")
_RUN_TIME = re.compile(r"\bafter \d+(?:\.\d+)? s\b")
"""A program's run time in a sandbox result (``backends._sandbox_limits``)."""


def digest(value: Any) -> str:
    """A short, stable digest of a JSON value (keys sorted)."""
    text = json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolCallRecord:
    """One tool call of a step, as the diff compares it."""

    name: str
    args_digest: str
    result_digest: str
    """The digest of the result's status and its recorded preview ("" if none came back)."""
    args: dict[str, Any] = field(compare=False, default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class TrajectoryStep:
    """One agent visit and the transfer that started it."""

    number: int
    """From 1, in the task's order."""
    agent: str
    source: str
    """Who gave the work: ``supervisor``, a peer, or ``user``."""
    task: str
    reason: str
    tool_calls: tuple[ToolCallRecord, ...] = ()
    violations: tuple[str, ...] = ()
    """Each violation as ``kind: detail``."""
    ended: str | None = None
    usage: dict[str, float] = field(default_factory=dict)
    """The visit's tokens, cost (USD) and seconds."""
    inherited: bool = False
    """A replay's step before its ``from_step``: the replayed task's, not run again."""

    def key(self) -> tuple[Any, ...]:
        """What two steps must share to be the same step (usage and timing aside)."""
        return (self.agent, self.source, self.task, self.reason, self.tool_calls, self.violations)


@dataclass(frozen=True, kw_only=True, slots=True)
class Trajectory:
    """What a task did, step by step, and how it ended."""

    task_id: str
    status: str
    steps: tuple[TrajectoryStep, ...]
    answer: str | None
    finish_reason: str | None
    """The supervisor's reason to finish, when it routed to FINISH."""
    violations: tuple[str, ...] = ()
    """Violations outside any visit (a supervisor's ping-pong, a team budget)."""
    per_agent: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per role (agents, ``supervisor``, ``finalize``): tokens, cost (USD) and seconds."""
    replay_of: str | None = None
    from_step: int | None = None

    @property
    def routes(self) -> tuple[str, ...]:
        """The route sequence: each step's agent, in order."""
        return tuple(step.agent for step in self.steps)


def read_trajectory(ledger: Ledger, task: Task) -> Trajectory:
    """``task``'s trajectory from the ledger (a replay's with its inherited steps).

    Raises:
        RecordNotFound: A replay whose original is gone (deleted by retention).
    """
    from relaygraph.store import RecordNotFound

    events = _events_of(ledger, task, RecordNotFound)
    return _build(task, events)


def _events_of(ledger: Ledger, task: Task, missing: type[Exception]) -> list[dict[str, Any]]:
    """The task's events, a replay's after the events of the steps it inherited."""
    own = [{"type": e.type, **e.data} for e in ledger.events_after(task.id)]
    for event in own:
        event.setdefault("inherited", False)
    if not task.replay_of or not task.from_step:
        return own
    original = ledger.get_task(task.replay_of, project_id=task.project_id)
    if original is None:
        raise missing("task", task.replay_of)
    inherited = _first_steps(_events_of(ledger, original, missing), task.from_step)
    return [{**event, "inherited": True} for event in inherited] + own


def _first_steps(events: Sequence[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """The events up to the end of the ``count``-th visit, with the handoff its agent made
    (the handoff is part of the visit: a fork after it goes straight to the peer)."""
    kept: list[dict[str, Any]] = []
    finished = 0
    for event in events:
        if finished == count and event["type"] != "handoff":
            break
        if event["type"] in ("run_started", "run_finished", "final"):
            continue
        kept.append(event)
        if event["type"] == "agent_finished":
            finished += 1
    return kept


def _usage_of(record: Mapping[str, Any] | None) -> dict[str, float]:
    record = record or {}
    return {name: float(record.get(name) or 0) for name in _USAGE_FIELDS}


class _Builder:
    """Folds a task's events into steps."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.transfer: dict[str, Any] | None = None
        self.calls: dict[str, dict[str, Any]] = {}
        self.loose_violations: list[str] = []
        self.finish_reason: str | None = None
        self.usage: dict[str, dict[str, Any]] = {}

    def add(self, event: Mapping[str, Any]) -> None:
        kind = event["type"]
        if kind in ("route", "handoff"):
            if kind == "route" and event.get("next") == FINISH:
                self.finish_reason = str(event.get("reason") or "")
                return
            handoff = transfer_of(event)
            if handoff is not None and event.get("carried_out") is not False:
                self.transfer = {
                    "source": handoff["source"],
                    "task": handoff["task"],
                    "reason": handoff["reason"],
                }
        elif kind == "agent_started":
            transfer = self.transfer or {
                "source": str(event.get("source") or ""),
                "task": str(event.get("task") or ""),
                "reason": "",
            }
            self.transfer = None
            self.steps.append(
                {
                    **transfer,
                    "agent": str(event.get("agent") or ""),
                    "calls": [],
                    "violations": [],
                    "ended": None,
                    "usage": {},
                    "inherited": bool(event.get("inherited")),
                }
            )
        elif kind == "tool_call" and self.steps:
            call: dict[str, Any] = {
                "name": event.get("tool"),
                "args": dict(event.get("args") or {}),
                "result": "",
            }
            self.steps[-1]["calls"].append(call)
            self.calls[str(event.get("tool_call_id"))] = call
        elif kind == "tool_result":
            answered = self.calls.get(str(event.get("tool_call_id")))
            if answered is not None:
                preview = _RUN_TIME.sub("after … s", str(event.get("preview") or ""))
                answered["result"] = digest([event.get("status"), preview])
        elif kind == "violation":
            text = f"{event.get('kind')}: {event.get('detail')}"
            if event.get("agent") and self.steps and self.steps[-1]["agent"] == event["agent"]:
                self.steps[-1]["violations"].append(text)
            else:
                self.loose_violations.append(text)
        elif kind == "agent_finished" and self.steps:
            self.steps[-1]["ended"] = event.get("ended")
            self.steps[-1]["usage"] = _usage_of(event.get("usage"))
            self._count(event.get("usage"))
        elif kind == "usage":
            self._count(event.get("usage"))

    def _count(self, record: Any) -> None:
        # A record sent again (its node ran again) replaces the one it had: keyed by id.
        if isinstance(record, Mapping) and record.get("agent"):
            self.usage[str(record.get("id") or len(self.usage))] = dict(record)

    def per_agent(self) -> dict[str, dict[str, float]]:
        totals: dict[str, dict[str, float]] = {}
        for record in self.usage.values():
            mine = totals.setdefault(str(record["agent"]), dict.fromkeys(_USAGE_FIELDS, 0.0))
            for name, value in _usage_of(record).items():
                mine[name] += value
        return {agent: totals[agent] for agent in sorted(totals)}


def _build(task: Task, events: Iterable[Mapping[str, Any]]) -> Trajectory:
    builder = _Builder()
    for event in events:
        builder.add(event)
    steps = tuple(
        TrajectoryStep(
            number=index,
            agent=step["agent"],
            source=step["source"],
            task=step["task"],
            reason=step["reason"],
            tool_calls=tuple(
                ToolCallRecord(
                    name=str(call["name"]),
                    args_digest=digest(call["args"]),
                    result_digest=call["result"],
                    args=call["args"],
                )
                for call in step["calls"]
            ),
            violations=tuple(step["violations"]),
            ended=step["ended"],
            usage=step["usage"],
            inherited=step["inherited"],
        )
        for index, step in enumerate(builder.steps, start=1)
    )
    return Trajectory(
        task_id=task.id,
        status=task.status,
        steps=steps,
        answer=task.answer,
        finish_reason=builder.finish_reason,
        violations=tuple(builder.loose_violations),
        per_agent=builder.per_agent(),
        replay_of=task.replay_of,
        from_step=task.from_step,
    )


# -- the diff ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class StepDiff:
    """Step ``number`` of both tasks (None where one has no such step) and what differs."""

    number: int
    a: TrajectoryStep | None
    b: TrajectoryStep | None
    differences: tuple[str, ...]
    """The fields that differ: ``agent``, ``source``, ``task``, ``reason``, ``tool_calls``,
    ``violations``, or ``missing`` when one task has no such step."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrajectoryDiff:
    """Two trajectories side by side, aligned by step."""

    a: Trajectory
    b: Trajectory
    steps: tuple[StepDiff, ...]
    first_divergence: int | None
    """The first step where the two part; None when no step differs."""
    answer_same: bool
    per_agent: dict[str, dict[str, dict[str, float]]]
    """Per role: ``a``'s and ``b``'s tokens, cost and seconds, and ``delta`` (b - a)."""

    @property
    def same(self) -> bool:
        """No step, answer, status or violation differs (usage and timing aside)."""
        return (
            self.first_divergence is None
            and self.answer_same
            and self.a.status == self.b.status
            and self.a.violations == self.b.violations
        )

    def summary(self) -> dict[str, Any]:
        """The differences, summed."""
        differing = [s for s in self.steps if s.differences]
        totals = {
            side: {
                name: round(sum(u.get(name, 0.0) for u in t.per_agent.values()), 6)
                for name in _USAGE_FIELDS
            }
            for side, t in (("a", self.a), ("b", self.b))
        }
        return {
            "same": self.same,
            "first_divergence": self.first_divergence,
            "steps": {"a": len(self.a.steps), "b": len(self.b.steps)},
            "steps_differing": len(differing),
            "tool_calls_differing": sum(1 for s in differing if "tool_calls" in s.differences),
            "routes_differing": sum(
                1 for s in differing if {"agent", "missing"} & set(s.differences)
            ),
            "answer_same": self.answer_same,
            "status": {"a": self.a.status, "b": self.b.status},
            "totals": totals,
            "delta": {
                name: round(totals["b"][name] - totals["a"][name], 6) for name in _USAGE_FIELDS
            },
        }

    def to_json(self) -> dict[str, Any]:
        """The diff as one JSON object (``relaygraph diff --json``, the API)."""
        return {
            "a": _trajectory_json(self.a),
            "b": _trajectory_json(self.b),
            "steps": [
                {
                    "step": s.number,
                    "differences": list(s.differences),
                    "a": json_value(s.a),
                    "b": json_value(s.b),
                }
                for s in self.steps
            ],
            "per_agent": self.per_agent,
            "summary": self.summary(),
        }


def _trajectory_json(t: Trajectory) -> dict[str, Any]:
    """The trajectory without its steps and usage (the diff shows both side by side)."""
    return {**fields_json(t, leave_out={"steps", "per_agent"}), "routes": list(t.routes)}


def _differences(a: TrajectoryStep | None, b: TrajectoryStep | None) -> tuple[str, ...]:
    if a is None or b is None:
        return ("missing",)
    names = ("agent", "source", "task", "reason", "tool_calls", "violations")
    return tuple(name for name in names if getattr(a, name) != getattr(b, name))


def diff_trajectories(a: Trajectory, b: Trajectory) -> TrajectoryDiff:
    """``a`` and ``b`` aligned by step, with the first step where they part."""
    count = max(len(a.steps), len(b.steps))
    steps = []
    for index in range(count):
        step_a = a.steps[index] if index < len(a.steps) else None
        step_b = b.steps[index] if index < len(b.steps) else None
        steps.append(
            StepDiff(number=index + 1, a=step_a, b=step_b, differences=_differences(step_a, step_b))
        )
    first = next((s.number for s in steps if s.differences), None)
    roles = sorted(set(a.per_agent) | set(b.per_agent))
    per_agent: dict[str, dict[str, dict[str, float]]] = {}
    for role in roles:
        mine_a = a.per_agent.get(role, dict.fromkeys(_USAGE_FIELDS, 0.0))
        mine_b = b.per_agent.get(role, dict.fromkeys(_USAGE_FIELDS, 0.0))
        per_agent[role] = {
            "a": mine_a,
            "b": mine_b,
            "delta": {n: round(mine_b[n] - mine_a[n], 6) for n in _USAGE_FIELDS},
        }
    return TrajectoryDiff(
        a=a,
        b=b,
        steps=tuple(steps),
        first_divergence=first,
        answer_same=(a.answer or "") == (b.answer or ""),
        per_agent=per_agent,
    )
