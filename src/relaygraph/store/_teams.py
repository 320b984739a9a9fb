"""Registered teams: each project's own named team definitions, versioned."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from relaygraph.store import _team_versions
from relaygraph.store import _validate as check
from relaygraph.store._errors import RecordNotFound
from relaygraph.store._models import (
    ProjectRow,
    TeamVersionRow,
)
from relaygraph.store._records import (
    TeamVersion,
    snapshot,
)
from relaygraph.store._repository import Repository
from relaygraph.store._task_rows import utc_now


class TeamRepository(Repository):
    """Registered teams: each project's own named team definitions, versioned."""

    def register_team(
        self, project_id: str, name: str, *, definition: Mapping[str, Any], digest: str
    ) -> tuple[TeamVersion, bool]:
        """Record a version of the project's team ``name``, unless it is no change.

        Args:
            project_id: The project that registers it.
            name: The team's name, as tasks name it.
            definition: The team file's content, as a JSON object.
            digest: The built team's digest (``Team.digest``): when it is the latest
                version's, and the latest lists the agents in the same order, nothing is
                written.

        Returns:
            The version, and True when this call made it (False: the latest version is
            already this team).

        Raises:
            ConfigError: A bad field, named in the message.
            RecordNotFound: No such project.
        """
        check.name(name, "team")
        stored = check.json_object(definition, "definition")
        digest = check.text(digest, "digest", max_chars=100)
        while True:
            try:
                with self._core.write() as session:
                    if session.get(ProjectRow, project_id) is None:
                        raise RecordNotFound("project", project_id)
                    latest = _team_versions.latest(session, project_id, name)
                    if (
                        latest is not None
                        and latest.digest == digest
                        and _agent_order(latest.definition) == _agent_order(stored)
                    ):
                        return snapshot(TeamVersion, latest), False
                    row = TeamVersionRow(
                        project_id=project_id,
                        name=name,
                        version=(latest.version if latest is not None else 0) + 1,
                        definition=stored,
                        digest=digest,
                        created_at=utc_now(),
                    )
                    session.add(row)
                return snapshot(TeamVersion, row), True
            except IntegrityError:
                # Another push took this version number meanwhile (PostgreSQL; SQLite's
                # writers take turns): read the latest again. Each retry follows a commit
                # by another push, so this ends.
                continue

    def team_version(
        self, project_id: str, name: str, version: int | None = None
    ) -> TeamVersion | None:
        """The project's team ``name`` at ``version`` (the latest when None), if it has one."""
        with self._core.read() as session:
            if version is None:
                row = _team_versions.latest(session, project_id, name)
            else:
                row = _team_versions.one(session, project_id, name, version)
            return snapshot(TeamVersion, row) if row is not None else None

    def team_versions(self, project_id: str, name: str) -> list[TeamVersion]:
        """Every version of the project's team ``name``, oldest first."""
        with self._core.read() as session:
            rows = _team_versions.every_version(session, project_id, name)
            return [snapshot(TeamVersion, row) for row in rows]

    def teams(self, project_id: str) -> list[TeamVersion]:
        """The latest version of each team the project registered, by name."""
        with self._core.read() as session:
            rows = _team_versions.latest_of_each(session, project_id)
            return [snapshot(TeamVersion, row) for row in rows]

    def projects_with_teams(self, names: Collection[str]) -> list[tuple[str, str, str]]:
        """Which projects registered a team of one of ``names``: (project id, project
        name, team name) each, by project name then team name."""
        if not names:
            return []
        with self._core.read() as session:
            rows = session.execute(
                select(ProjectRow.id, ProjectRow.name, TeamVersionRow.name)
                .join(ProjectRow, ProjectRow.id == TeamVersionRow.project_id)
                .where(TeamVersionRow.name.in_(list(names)))
                .distinct()
                .order_by(ProjectRow.name, TeamVersionRow.name)
            )
            return [(project_id, project, team) for project_id, project, team in rows]


def _agent_order(definition: Mapping[str, Any]) -> list[str]:
    """The agents a definition names, in its order.

    The digest covers their order already, but a version stored in PostgreSQL's jsonb
    before revision 0013 lost it and kept the digest of the team as pushed: its agents'
    order tells such a version from the same file pushed again.
    """
    agents = definition.get("agents")
    return list(agents) if isinstance(agents, Mapping) else []
