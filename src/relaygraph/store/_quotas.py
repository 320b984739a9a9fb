"""A project's quotas and what it uses now: the operator's overrides, the counts a
submission is checked against, and the fair order in which free workers take queued tasks."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, bindparam, func, or_, select, update
from sqlalchemy.orm import aliased

from relaygraph.errors import ConfigError, QuotaExceeded
from relaygraph.store._core import LedgerCore
from relaygraph.store._errors import RecordNotFound
from relaygraph.store._models import ProjectRow, TaskRow, UsageRow
from relaygraph.store._records import ProjectLoad, QuotaOverrides, Quotas
from relaygraph.store._task_rows import EARLIER_ACTIVE_ON_THREAD, utc_now
from relaygraph.store._worker_slots import free_worker_slots

__all__ = [
    "QUEUED_RETRY_AFTER_SECONDS",
    "UNREPORTED_PUBLISH_AHEAD",
    "QuotaRepository",
    "refuse_over_quota",
]

QUEUED_RETRY_AFTER_SECONDS = 10
"""``Retry-After`` of a submission over the queued quota: its queue moves as its tasks
start, so a retry soon may pass (a client that waits longer loses nothing)."""
UNREPORTED_PUBLISH_AHEAD = 4
"""Published tasks that may wait for a worker while no worker's pool process has reported
its slots (none started yet): the first to start has work at once, and reports itself."""
NO_LIMIT = 2**31 - 1
"""A running quota of no limit, as the fair queue's statement compares it."""


def day_start(now: datetime) -> datetime:
    """00:00 UTC of ``now``'s day: when a project's daily spend starts from 0."""
    return now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def _cost_since(project_id: Any, start: Any, excluding: Any) -> Any:
    """The statement of a project's spend since ``start`` (its usage rows updated since, of
    tasks not finished before it), leaving out the task ``excluding`` (None: none)."""
    return (
        select(func.coalesce(func.sum(UsageRow.cost_usd), 0.0))
        .join(TaskRow, TaskRow.id == UsageRow.task_id)
        .where(
            TaskRow.project_id == project_id,
            or_(TaskRow.finished_at.is_(None), TaskRow.finished_at >= start),
            UsageRow.updated_at >= start,
            or_(excluding.is_(None), TaskRow.id != excluding),
        )
    )


_COST_TODAY = _cost_since(
    bindparam("project_id"), bindparam("since"), bindparam("excluding", type_=TaskRow.id.type)
)
_COUNT_BY_STATUS = (
    select(TaskRow.status, func.count())
    .where(TaskRow.project_id == bindparam("project_id"), TaskRow.status.in_(("queued", "running")))
    .group_by(TaskRow.status)
)
_QUOTA_COLUMNS = (ProjectRow.max_running, ProjectRow.max_queued, ProjectRow.daily_cost_usd)


def _fair_queue(*, excluding: bool, worker_mode: bool) -> Any:
    """The statement of the queued tasks that may start now, in the order free workers
    take them: fair shares between projects.

    A task's *share* is its project's tasks holding a worker, plus its place among its
    project's tasks that may start (1 for the oldest): taking tasks in the order of their
    shares hands the next worker to the project with the fewest running, and, as each
    take raises its project's count, goes round the projects with queued work (among
    equal shares, the project whose last task started longest ago first). A project at its
    running quota is left out: its tasks stay queued and the worker serves another project.
    Only a thread's oldest active task is a candidate (``EARLIER_ACTIVE_ON_THREAD``).

    ``worker_mode``: a task published to the workers and not yet started (``queued``,
    ``dispatch`` above 0) holds a worker already; the candidates are those not published.
    """
    holds = TaskRow.status == "running"
    candidate = [TaskRow.status == "queued", ~EARLIER_ACTIVE_ON_THREAD]
    if worker_mode:
        holds = or_(holds, and_(TaskRow.status == "queued", TaskRow.dispatch > 0))
        candidate.append(TaskRow.dispatch == 0)
    if excluding:
        candidate.append(TaskRow.project_id != bindparam("exclude"))
    holding = (
        select(TaskRow.project_id, func.count().label("holding"))
        .where(holds)
        .group_by(TaskRow.project_id)
        .subquery("holding")
    )
    candidates = (
        select(
            TaskRow.id,
            TaskRow.project_id,
            TaskRow.created_at,
            func.row_number()
            .over(partition_by=TaskRow.project_id, order_by=(TaskRow.created_at, TaskRow.id))
            .label("place"),
        )
        .where(*candidate)
        .subquery("candidates")
    )
    share = func.coalesce(holding.c.holding, 0) + candidates.c.place
    cap = func.coalesce(ProjectRow.max_running, bindparam("default_max_running"))
    # Among equal shares, the project served longest ago goes first (then the oldest
    # task): with one worker, a project that just had a task is not served again before
    # the others have had theirs, however much older its backlog is. The index on
    # (project_id, started_at) makes this a lookup per project.
    started = aliased(TaskRow, name="started")
    last_start = (
        select(func.max(started.started_at))
        .where(started.project_id == candidates.c.project_id)
        .scalar_subquery()
    )
    return (
        select(candidates.c.id)
        .select_from(
            candidates.join(ProjectRow, ProjectRow.id == candidates.c.project_id).outerjoin(
                holding, holding.c.project_id == candidates.c.project_id
            )
        )
        .where(share <= cap)
        .order_by(share, last_start.asc().nulls_first(), candidates.c.created_at, candidates.c.id)
        .limit(bindparam("limit"))
    )


_FAIR = {
    (excluding, worker_mode): _fair_queue(excluding=excluding, worker_mode=worker_mode)
    for excluding in (False, True)
    for worker_mode in (False, True)
}
"""The fair queue's statements, built once: read whenever a worker frees up."""
_IN_FLIGHT = select(func.count()).where(TaskRow.status == "queued", TaskRow.dispatch > 0)


def refuse_over_quota(
    connection: Connection, project: Any, quotas: Quotas, *, now: datetime
) -> None:
    """Refuse a new task of ``project`` (its row: name and overrides) over its queued
    quota or its daily spend, inside the transaction that would record it.

    Raises:
        QuotaExceeded: The quota, its value and what the project uses.
    """
    mine = quotas.overridden(
        QuotaOverrides(
            max_queued=project.max_queued,
            daily_cost_usd=project.daily_cost_usd,
        )
    )
    if mine.max_queued is not None:
        counts = dict(connection.execute(_COUNT_BY_STATUS, {"project_id": project.id}).all())
        queued = int(counts.get("queued", 0))
        if queued >= mine.max_queued:
            raise QuotaExceeded(
                project=project.name,
                quota="max_queued",
                limit=mine.max_queued,
                used=queued,
                retry_after_seconds=QUEUED_RETRY_AFTER_SECONDS,
            )
    if mine.daily_cost_usd is not None:
        spent = _spent_today(connection, project.id, now=now)
        if spent >= mine.daily_cost_usd:
            tomorrow = day_start(now) + timedelta(days=1)
            raise QuotaExceeded(
                project=project.name,
                quota="daily_cost_usd",
                limit=mine.daily_cost_usd,
                used=round(spent, 6),
                retry_after_seconds=max(1, math.ceil((tomorrow - now).total_seconds())),
            )


def _spent_today(
    connection: Connection, project_id: str, *, now: datetime, excluding: str | None = None
) -> float:
    found = connection.execute(
        _COST_TODAY, {"project_id": project_id, "since": day_start(now), "excluding": excluding}
    ).scalar()
    return float(found or 0.0)


def _checked_overrides(overrides: QuotaOverrides) -> QuotaOverrides:
    for name in ("max_running", "max_queued"):
        value = getattr(overrides, name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= NO_LIMIT
        ):
            raise ConfigError(f"{name} {value!r} must be a whole number from 1 to {NO_LIMIT}")
    cost = overrides.daily_cost_usd
    if cost is not None and (
        isinstance(cost, bool)
        or not isinstance(cost, int | float)
        or not math.isfinite(cost)
        or cost < 0
    ):
        raise ConfigError(f"daily_cost_usd {cost!r} must be a number of USD, 0 or more")
    return overrides


class QuotaRepository:
    """A project's quotas and what it uses now; the fair order of the queued tasks."""

    def __init__(self, core: LedgerCore) -> None:
        self._core = core

    def set_project_quotas(self, name: str, overrides: QuotaOverrides) -> QuotaOverrides:
        """Set the operator's quotas of project ``name`` (None: the server's setting).

        Raises:
            ConfigError: A quota out of range, named with its value.
            RecordNotFound: No such project.
        """
        checked = _checked_overrides(overrides)
        with self._core.write_connection() as connection:
            done = connection.execute(
                update(ProjectRow)
                .where(ProjectRow.name == name)
                .values(
                    max_running=checked.max_running,
                    max_queued=checked.max_queued,
                    daily_cost_usd=checked.daily_cost_usd,
                )
            )
            if done.rowcount == 0:
                raise RecordNotFound("project", name)
        return checked

    def project_quotas(self, project_id: str) -> QuotaOverrides:
        """The operator's quotas of the project (all None: the server's settings apply).

        Raises:
            RecordNotFound: No such project.
        """
        with self._core.read_connection() as connection:
            row = connection.execute(
                select(*_QUOTA_COLUMNS).where(ProjectRow.id == project_id)
            ).first()
        if row is None:
            raise RecordNotFound("project", project_id)
        return QuotaOverrides(**row._mapping)

    def project_load(self, project_id: str, *, now: datetime | None = None) -> ProjectLoad:
        """What the project uses now: its tasks running and queued, and today's spend."""
        now = now or utc_now()
        with self._core.read_connection() as connection:
            counts = dict(connection.execute(_COUNT_BY_STATUS, {"project_id": project_id}).all())
            spent = _spent_today(connection, project_id, now=now)
        return ProjectLoad(
            running=int(counts.get("running", 0)),
            queued=int(counts.get("queued", 0)),
            cost_today_usd=spent,
        )

    def spent_today(
        self, project_id: str, *, excluding: str | None = None, now: datetime | None = None
    ) -> float:
        """What the project's tasks (but ``excluding``) spent since 00:00 UTC, in USD."""
        with self._core.read_connection() as connection:
            return _spent_today(connection, project_id, now=now or utc_now(), excluding=excluding)

    def queued_tasks(
        self,
        *,
        limit: int,
        exclude_project: str | None = None,
        max_running: int | None = None,
    ) -> list[str]:
        """The ids of the ``queued`` tasks that may start now, up to ``limit``, of every
        project but ``exclude_project``, in the order a server process with workers free
        takes them (``InProcessDispatch.pull``): fair shares between projects
        (:func:`_fair_queue`), each project's running quota obeyed (its own, else
        ``max_running``; None: no limit). A task is left out while an older task of its
        thread is active (queued, running or waiting for a person): it starts after that
        one, as ``active_task_on_thread`` orders them."""
        return self._fair(limit, exclude_project, max_running, worker_mode=False)

    def tasks_to_publish(
        self,
        *,
        budget: int | None = None,
        exclude_project: str | None = None,
        max_running: int | None = None,
    ) -> list[str]:
        """The worker mode's :meth:`queued_tasks`: the queued tasks not yet published to
        the workers to publish now, so that at most ``budget`` published tasks wait for a
        worker, in the fair order (a published task waiting counts as running for its
        project).

        Args:
            budget: Published tasks that may wait for a worker. None (automatic): the free
                slots of the workers' live pool processes (``free_worker_slots``), or
                :data:`UNREPORTED_PUBLISH_AHEAD` while none has reported itself.
            exclude_project: A project whose tasks are not the workers' to run.
            max_running: A project's running quota unless the operator set its own.
        """
        with self._core.read_connection() as connection:
            if budget is None:
                free = free_worker_slots(connection, now=utc_now())
                budget = UNREPORTED_PUBLISH_AHEAD if free is None else free
            waiting = int(connection.execute(_IN_FLIGHT).scalar() or 0)
        if waiting >= budget:
            return []
        return self._fair(budget - waiting, exclude_project, max_running, worker_mode=True)

    def _fair(
        self, limit: int, exclude: str | None, max_running: int | None, *, worker_mode: bool
    ) -> list[str]:
        statement = _FAIR[(exclude is not None, worker_mode)]
        values = {
            "limit": limit,
            "exclude": exclude,
            "default_max_running": NO_LIMIT if max_running is None else max_running,
        }
        with self._core.read_connection() as connection:
            return [row.id for row in connection.execute(statement, values)]
