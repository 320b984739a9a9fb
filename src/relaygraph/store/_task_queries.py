"""Which recorded tasks a replay eval or a golden-set export takes: a project's tasks by team
and version, time range and status; and which replays a task has."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select

from relaygraph.errors import ConfigError
from relaygraph.store._models import TaskRow
from relaygraph.store._records import TASK_STATUSES, Task
from relaygraph.store._repository import Repository
from relaygraph.store._task_rows import task_of_row

__all__ = ["TaskQueryRepository", "TaskSelection"]

MAX_SELECTED = 1000
"""The most tasks one selection returns."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskSelection:
    """A query over a project's recorded tasks (every field but the project narrows it)."""

    project_id: str
    team: str | None = None
    """The team's name as the task recorded it (``default`` for the built-in team)."""
    version: int | None = None
    """The registered version of ``team``."""
    since: datetime | None = None
    """Created at or after."""
    until: datetime | None = None
    """Created before."""
    status: str | None = None
    limit: int = 50
    """The newest ``limit`` tasks that match, from 1 to :data:`MAX_SELECTED`."""
    originals_only: bool = True
    """Leave out tasks that are replays themselves."""

    def check(self) -> None:
        """Raises ConfigError naming the bad field."""
        if self.status is not None and self.status not in TASK_STATUSES:
            raise ConfigError(f"status {self.status!r} is not one of {', '.join(TASK_STATUSES)}")
        if isinstance(self.limit, bool) or not 1 <= self.limit <= MAX_SELECTED:
            raise ConfigError(
                f"limit {self.limit!r} must be a whole number from 1 to {MAX_SELECTED}"
            )
        if self.version is not None and self.team is None:
            raise ConfigError(f"version {self.version} needs a team name to be a version of")
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ConfigError(
                f"the time range is empty: since {self.since.isoformat()} is not before "
                f"until {self.until.isoformat()}"
            )


class TaskQueryRepository(Repository):
    """Selections of recorded tasks, newest first."""

    def select_tasks(self, selection: TaskSelection) -> list[Task]:
        """The tasks ``selection`` matches, newest first, at most its ``limit``.

        Raises:
            ConfigError: A bad field of the selection, named.
        """
        selection.check()
        query = select(TaskRow).where(TaskRow.project_id == selection.project_id)
        if selection.status is not None:
            query = query.where(TaskRow.status == selection.status)
        if selection.since is not None:
            query = query.where(TaskRow.created_at >= selection.since)
        if selection.until is not None:
            query = query.where(TaskRow.created_at < selection.until)
        if selection.originals_only:
            query = query.where(TaskRow.replay_of.is_(None))
        query = query.order_by(TaskRow.created_at.desc(), TaskRow.id.desc())
        found: list[Task] = []
        with self._core.read() as session:
            # The team is a JSON value, read differently by each database's dialect: it
            # is matched here, on rows streamed in batches, until the limit is reached.
            for row in session.scalars(query.execution_options(yield_per=200)):
                task = task_of_row(row)
                if _team_matches(task, selection):
                    found.append(task)
                    if len(found) == selection.limit:
                        break
        return found

    def replays_of(self, task_id: str, *, project_id: str) -> list[Task]:
        """The replays of the project's task ``task_id``, oldest first."""
        query = (
            select(TaskRow)
            .where(TaskRow.project_id == project_id, TaskRow.replay_of == task_id)
            .order_by(TaskRow.created_at, TaskRow.id)
        )
        with self._core.read() as session:
            return [task_of_row(row) for row in session.scalars(query)]


def _team_matches(task: Task, selection: TaskSelection) -> bool:
    if selection.team is None:
        return True
    record = task.team or {}
    if record.get("name", "default") != selection.team:
        return False
    return selection.version is None or record.get("version") == selection.version
