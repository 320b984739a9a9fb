"""Usage per role per task, as the team graph recorded it, and summed per project.

The graph computes each node run's :class:`~relaygraph.events.Usage` record once, and its
events carry it (an agent's ``agent_finished``, the supervisor's and finalize's ``usage``);
a run that stops with a visit in progress sends that visit's record so far when it ends.
The ledger stores each record in its role's row by id, replacing the one it had under that
id (the node ran again, or the visit in progress finished later), and the row's figures are
its records' sum: nothing here re-derives usage.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from relaygraph.errors import ConfigError
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
            records={},
            **dict.fromkeys(COUNTS, 0),
            **dict.fromkeys(AMOUNTS, 0.0),
        )
        session.add(row)
    return row


def _figures(usage: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The counts and amounts of a usage record, checked."""
    values: dict[str, Any] = {
        name: check.count(usage.get(name), f"{where}.{name}") for name in COUNTS
    }
    values |= {name: check.amount(usage.get(name), f"{where}.{name}") for name in AMOUNTS}
    return values


def add_record(
    session: Session,
    task_id: str,
    usage: Mapping[str, Any],
    now: datetime,
    *,
    agent: str | None = None,
    where: str = "usage",
) -> None:
    """Store one usage record in its role's row (``agent``, else the record's own), in place
    of the row's record of the same id; the row's figures become its records' sum.

    Raises:
        ConfigError: A figure is not a number of its kind (it names ``where``), or the
            record names no role.
    """
    role = agent or usage.get("agent")
    if not isinstance(role, str) or not role:
        raise ConfigError(f"{where}.agent {role!r} must name the role that spent it")
    figures = _figures(usage, where) | {"estimated": bool(usage.get("estimated", False))}
    row = _row(session, task_id, role)
    record_id = usage.get("id")
    if not isinstance(record_id, str) or not record_id:
        # A record without an id (written by hand) is one of its own.
        record_id = f"{role}:{len(row.records) + 1}"
    records = {**row.records, record_id: figures}
    row.records = records
    for name in COUNTS:
        setattr(row, name, sum(int(r.get(name, 0)) for r in records.values()))
    for name in AMOUNTS:
        setattr(row, name, sum(float(r.get(name, 0.0)) for r in records.values()))
    row.estimated = any(bool(r.get("estimated")) for r in records.values())
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
