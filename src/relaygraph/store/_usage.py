"""Usage per role per task: added up from events, set from a run's result, summed per project."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from relaygraph.store import _validate as check
from relaygraph.store._models import TaskRow, UsageRow

COUNTS = ("model_calls", "tool_calls", "input_tokens", "output_tokens")
AMOUNTS = ("cost_usd", "seconds")


def _row(session: Session, task_id: str, agent: str) -> UsageRow:
    row = session.get(UsageRow, (task_id, agent))
    if row is None:
        row = UsageRow(
            task_id=task_id,
            agent=agent,
            estimated=False,
            visits=[],
            **dict.fromkeys(COUNTS, 0),
            **dict.fromkeys(AMOUNTS, 0.0),
        )
        session.add(row)
    return row


def add_visit(
    session: Session, task_id: str, agent: str, usage: Mapping[str, Any], now: datetime
) -> None:
    """Add one agent visit's usage (an ``agent_finished`` event's) to the agent's total.

    A visit whose id was counted already adds nothing: its node ran again after a crash.
    """
    row = _row(session, task_id, agent)
    visit = usage.get("id")
    if isinstance(visit, str) and visit:
        if visit in row.visits:
            return
        row.visits = [*row.visits, visit]
    for name in COUNTS:
        added = check.count(usage.get(name), f"agent_finished usage.{name}")
        setattr(row, name, getattr(row, name) + added)
    for name in AMOUNTS:
        amount = check.amount(usage.get(name), f"agent_finished usage.{name}")
        setattr(row, name, getattr(row, name) + amount)
    row.estimated = row.estimated or bool(usage.get("estimated", False))
    row.updated_at = now


def set_totals(
    session: Session, task_id: str, agent: str, totals: Mapping[str, Any], now: datetime
) -> None:
    """Replace ``agent``'s totals for the task with ``totals`` (a ``RunResult.usage`` entry)."""
    row = _row(session, task_id, agent)
    for name in COUNTS:
        setattr(row, name, check.count(totals.get(name), f"usage[{agent!r}].{name}"))
    for name in AMOUNTS:
        setattr(row, name, check.amount(totals.get(name), f"usage[{agent!r}].{name}"))
    row.estimated = bool(totals.get("estimated", False))
    row.updated_at = now


def tokens_so_far(session: Session, task_id: str) -> int:
    """Input plus output tokens the task's roles have used, as recorded so far."""
    used = session.scalar(
        select(func.coalesce(func.sum(UsageRow.input_tokens + UsageRow.output_tokens), 0)).where(
            UsageRow.task_id == task_id
        )
    )
    return int(used or 0)


def project_usage(
    session: Session, project_id: str, start: datetime | None, end: datetime | None
) -> dict[str, Any]:
    """How many tasks the project created in ``[start, end)``, and their usage per role."""
    window = [TaskRow.project_id == project_id]
    if start is not None:
        window.append(TaskRow.created_at >= start)
    if end is not None:
        window.append(TaskRow.created_at < end)
    sums = [func.coalesce(func.sum(getattr(UsageRow, name)), 0) for name in (*COUNTS, *AMOUNTS)]
    estimated = func.max(case((UsageRow.estimated, 1), else_=0))
    tasks = session.scalar(select(func.count()).select_from(TaskRow).where(*window))
    rows = session.execute(
        select(UsageRow.agent, *sums, estimated)
        .join(TaskRow, TaskRow.id == UsageRow.task_id)
        .where(*window)
        .group_by(UsageRow.agent)
        .order_by(UsageRow.agent)
    ).all()
    agents = {row[0]: _entry(row[1:]) for row in rows}
    total = _entry(
        [sum(entry[name] for entry in agents.values()) for name in (*COUNTS, *AMOUNTS)]
        + [any(entry["estimated"] for entry in agents.values())]
    )
    return {"tasks": int(tasks or 0), "total": total, "agents": agents}


def _entry(values: Iterable[Any]) -> dict[str, Any]:
    entry: dict[str, Any] = dict(zip((*COUNTS, *AMOUNTS, "estimated"), values, strict=True))
    for name in COUNTS:
        entry[name] = int(entry[name] or 0)
    entry["cost_usd"] = round(float(entry["cost_usd"] or 0), 6)
    entry["seconds"] = round(float(entry["seconds"] or 0), 3)
    entry["estimated"] = bool(entry["estimated"])
    return entry
