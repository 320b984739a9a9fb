"""Usage per role per task, as the team graph recorded it, and summed per project.

The graph computes each node run's :class:`~relaygraph.events.Usage` record once; the ledger
stores those figures: an ``agent_finished`` event's record is added to its agent's row (the
row remembers which records it holds, so a record sent again adds nothing), and a run's
result sets each role's totals, which its records add up to.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from relaygraph.events import USAGE_AMOUNTS as AMOUNTS
from relaygraph.events import USAGE_COUNTS as COUNTS
from relaygraph.store import _validate as check
from relaygraph.store._models import TaskRow, UsageRow


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


def _figures(usage: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The counts and amounts of a usage record or a role's totals, checked."""
    values: dict[str, Any] = {
        name: check.count(usage.get(name), f"{where}.{name}") for name in COUNTS
    }
    values |= {name: check.amount(usage.get(name), f"{where}.{name}") for name in AMOUNTS}
    return values


def add_visit(
    session: Session, task_id: str, agent: str, usage: Mapping[str, Any], now: datetime
) -> None:
    """Add one agent visit's usage record (an ``agent_finished`` event's) to the agent's row.

    A record whose id the row holds already adds nothing: its node ran again after a crash.
    """
    row = _row(session, task_id, agent)
    visit = usage.get("id")
    if isinstance(visit, str) and visit:
        if visit in row.visits:
            return
        row.visits = [*row.visits, visit]
    for name, value in _figures(usage, "agent_finished usage").items():
        setattr(row, name, getattr(row, name) + value)
    row.estimated = row.estimated or bool(usage.get("estimated", False))
    row.updated_at = now


def set_totals(
    session: Session, task_id: str, agent: str, totals: Mapping[str, Any], now: datetime
) -> None:
    """Replace ``agent``'s totals for the task with ``totals`` (a ``RunResult.usage`` entry)."""
    row = _row(session, task_id, agent)
    for name, value in _figures(totals, f"usage[{agent!r}]").items():
        setattr(row, name, value)
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
