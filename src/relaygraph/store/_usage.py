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

from sqlalchemy import Connection, bindparam, case, func, insert, select, update
from sqlalchemy.orm import Session

from relaygraph.errors import ConfigError
from relaygraph.events import USAGE_AMOUNTS as AMOUNTS
from relaygraph.events import USAGE_COUNTS as COUNTS
from relaygraph.store import _validate as check
from relaygraph.store._models import TaskRow, UsageRow

CALL_SEPARATOR = "#"
"""Between a node run's record id and a call's, in a ``model_call`` event's record id."""

_ADD_ROW = insert(UsageRow)
_SET_ROW = (
    update(UsageRow)
    .where(UsageRow.task_id == bindparam("row_task"), UsageRow.agent == bindparam("row_agent"))
    .values(
        records=bindparam("records"),
        estimated=bindparam("estimated"),
        updated_at=bindparam("updated_at"),
        **{name: bindparam(name) for name in (*COUNTS, *AMOUNTS)},
    )
)
_ALL_RECORDS = select(UsageRow.agent, UsageRow.records).where(
    UsageRow.task_id == bindparam("task_id")
)


def _figures(usage: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The counts and amounts of a usage record, checked."""
    values: dict[str, Any] = {
        name: check.count(usage.get(name), f"{where}.{name}") for name in COUNTS
    }
    values |= {name: check.amount(usage.get(name), f"{where}.{name}") for name in AMOUNTS}
    return values


class UsageRows:
    """A task's usage rows inside one transaction, in SQLAlchemy Core: read together when
    they are first needed (one statement), changed in memory, and written by :meth:`write`
    (one statement for the new rows, one for the changed ones).

    A batch of a run's events carries several records, of several roles (each supervisor
    call sends one): read and written once per batch, the rows cost a relay-3 batch three
    statements instead of two per record. The transaction holds the task's row locked, so
    nothing else writes these rows meanwhile.
    """

    def __init__(self, connection: Connection, task_id: str) -> None:
        self._connection = connection
        self._task_id = task_id
        self._records: dict[str, dict[str, Any]] | None = None
        """Each role's records by record id, as the transaction leaves them (None: not
        read yet)."""
        self._stored: set[str] = set()
        """The roles that have a row in the database."""
        self._changed: dict[str, None] = {}

    def _rows(self) -> dict[str, dict[str, Any]]:
        if self._records is None:
            found = self._connection.execute(_ALL_RECORDS, {"task_id": self._task_id})
            self._records = {agent: dict(records) for agent, records in found}
            self._stored = set(self._records)
        return self._records

    def add_record(
        self, usage: Mapping[str, Any], *, agent: str | None = None, where: str = "usage"
    ) -> None:
        """Store one usage record in its role's row (``agent``, else the record's own), in
        place of the row's record of the same id.

        Raises:
            ConfigError: A figure is not a number of its kind (it names ``where``), or the
                record names no role.
        """
        role = agent or usage.get("agent")
        if not isinstance(role, str) or not role:
            raise ConfigError(f"{where}.agent {role!r} must name the role that spent it")
        figures = _figures(usage, where) | {"estimated": bool(usage.get("estimated", False))}
        records = self._rows().setdefault(role, {})
        record_id = usage.get("id")
        if not isinstance(record_id, str) or not record_id:
            # A record without an id (written by hand) is one of its own.
            record_id = f"{role}:{len(records) + 1}"
        if CALL_SEPARATOR not in record_id:
            # A node run's own record holds its model calls: the records each call sent
            # while it ran (``<id>#<call>``, the ``model_call`` events') go.
            calls = f"{record_id}{CALL_SEPARATOR}"
            for stale in [key for key in records if key.startswith(calls)]:
                del records[stale]
        records[record_id] = figures
        self._changed[role] = None

    def tokens_so_far(self) -> int:
        """Input plus output tokens the task's roles have used, as recorded so far (this
        transaction's records too)."""
        return sum(
            int(r.get("input_tokens", 0)) + int(r.get("output_tokens", 0))
            for records in self._rows().values()
            for r in records.values()
        )

    def write(self, now: datetime) -> None:
        """Write each changed role's row: its records, and its figures as their sum."""
        added: list[dict[str, Any]] = []
        changed: list[dict[str, Any]] = []
        for role in self._changed:
            records = self._rows()[role]
            values: dict[str, Any] = {
                name: sum(int(r.get(name, 0)) for r in records.values()) for name in COUNTS
            }
            values |= {
                name: sum(float(r.get(name, 0.0)) for r in records.values()) for name in AMOUNTS
            }
            values["estimated"] = any(bool(r.get("estimated")) for r in records.values())
            values["records"] = dict(records)
            values["updated_at"] = now
            if role in self._stored:
                changed.append({"row_task": self._task_id, "row_agent": role, **values})
            else:
                added.append({"task_id": self._task_id, "agent": role, **values})
        if added:
            self._connection.execute(_ADD_ROW, added)
        if changed:
            self._connection.execute(_SET_ROW, changed)
        self._stored.update(self._changed)
        self._changed.clear()


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
