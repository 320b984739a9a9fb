"""Registered teams: each project's own team definitions (``/v1/teams``), the teams the
operator loads at start (``serve --team``), and which team each task runs.

A project's definition is built with the server's :class:`~relaygraph.team.TeamTrust`: it
may use built-in tools, Python tools from the modules the operator allows
(``RELAYGRAPH_TOOL_MODULES``) and MCP servers over HTTP on the hosts the operator allows
(``RELAYGRAPH_MCP_ALLOWED_HOSTS``), never a program, a file or a folder of the server. The
operator's own team files may use anything; every project runs them by name.

An operator's team and a project's never share a name silently. A project may not register
a name the operator's team has (409 ``team_name_taken``). A project that registered a name
before the operator loaded a team of that name keeps its own: for that project the name
means its registered team in every answer (tasks, versions, the list), and the server logs
a warning naming the project and the team at start.
"""

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relaygraph.api._errors import ErrorAnswer
from relaygraph.api._schemas import (
    TeamOrigin,
    TeamVersionOut,
)
from relaygraph.api._settings import ServiceSettings
from relaygraph.errors import ConfigError
from relaygraph.policies import TeamPolicy
from relaygraph.runner import RequestRefused, ServiceTeams, check_model_spec
from relaygraph.store import Ledger, TeamVersion
from relaygraph.team import DEFAULT_TEAM_NAME, Team

__all__ = ["NAME", "ChosenTeam", "TeamRegistry", "is_team_name", "model_allowed"]

logger = logging.getLogger(__name__)

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""What a registered team's name may be (as a project's)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ChosenTeam:
    """The team a task runs, where it comes from, and the policy a request may tighten."""

    team: Team
    version: int | None
    """The registered version; None for the built-in team and the server's own."""
    origin: TeamOrigin
    policy: TeamPolicy
    """The policy a request may tighten: the built-in team's is the server's ``--policy``;
    a registered team's, its own under that ceiling; a server team's, its own."""

    @property
    def record(self) -> dict[str, Any]:
        """What the task records of its team (``Team.record``)."""
        return self.team.record(version=self.version)


class TeamRegistry(ServiceTeams):
    """The teams this server runs (as :class:`~relaygraph.runner.ServiceTeams`: the team of
    any task, which is its runner's resolver), and what the API adds: a request's choice of
    team, the built-in team's policy under ``--policy``, the teams' bodies.

    Raises:
        ConfigError: A server team file is bad, is named ``default``, or two share a name.
    """

    def __init__(
        self, *, ledger: Callable[[], Ledger], settings: ServiceSettings, home: Path
    ) -> None:
        super().__init__(ledger=ledger, settings=settings, home=home)
        self.settings = settings

    def reserved(self, project_id: str, name: str) -> bool:
        """Whether ``name`` is the built-in team's or a server team's for this project
        (one it registered before the operator loaded a team of that name stays its own)."""
        if name == DEFAULT_TEAM_NAME:
            return True
        return name in self.server_teams and not self.shadows(project_id, name)

    def shadows(self, project_id: str, name: str) -> bool:
        """Whether the project registered a team of a server team's name, which for it
        is then its own (it registered the name before the operator's team had it)."""
        if name not in self.server_teams:
            return False
        return self._ledger().team_version(project_id, name) is not None

    def warn_of_shadowed(self, ledger: Ledger) -> list[tuple[str, str]]:
        """Log a warning for each project that registered a server team's name (its tasks
        keep running its own team of that name); the (project, team) names."""
        found = ledger.projects_with_teams(self.server_teams)
        for _, project, team in found:
            logger.warning(
                "project %r registered team %r before this server's own team of that name "
                "(%s): for project %r, %r stays its registered team; rename the server's "
                "team for that project to run it",
                project,
                team,
                self.server_teams[team].source,
                project,
                team,
            )
        return [(project, team) for _, project, team in found]

    def choose(self, project_id: str, name: str | None, version: int | None) -> ChosenTeam:
        """The team a request names for the project: the built-in team when None.

        Raises:
            ErrorAnswer: 404 ``team_not_found`` (another project's team too), naming ``team``
                or ``version``; 422 for a version of a team that has none, and
                ``invalid_team`` for a registered team that no longer builds.
        """
        if name is None or name == DEFAULT_TEAM_NAME:
            if version is not None:
                raise ErrorAnswer(
                    422,
                    "invalid_request",
                    f"version {version}: the built-in team has no versions",
                    "version",
                )
            return ChosenTeam(
                team=self.builtin, version=None, origin="builtin", policy=self.ceiling.policy
            )
        server = self.server_teams.get(name)
        if server is not None and not self.shadows(project_id, name):
            if version is not None:
                raise ErrorAnswer(
                    422,
                    "invalid_request",
                    f"version {version}: team {name!r} is the server's own (serve --team) "
                    "and has no versions",
                    "version",
                )
            return ChosenTeam(
                team=server, version=None, origin="server", policy=server.resolved_policy
            )
        found = (
            self._ledger().team_version(project_id, name, version) if is_team_name(name) else None
        )
        if found is None:
            if version is not None and self._ledger().team_version(project_id, name) is not None:
                raise ErrorAnswer(
                    404, "team_not_found", f"team {name!r} has no version {version}", "version"
                )
            raise ErrorAnswer(404, "team_not_found", f"no team {name!r}", "team")
        try:
            team = self.registered(found)
        except ConfigError as exc:
            raise ErrorAnswer(
                422, "invalid_team", f"team {name!r} version {found.version}: {exc}", "team"
            ) from None
        return ChosenTeam(
            team=team,
            version=found.version,
            origin="project",
            policy=self.capped(team.resolved_policy),
        )

    def models_in(self, definition: Mapping[str, Any]) -> None:
        """Refuse a model a definition names that a request could not name either (the
        allowlist, the scripts folder): a team must not open what a request may not.

        Raises:
            ErrorAnswer: 422 ``model_not_allowed`` or ``invalid_model``, naming the key.
        """
        named = [("definition.model", definition.get("model"))]
        agents = definition.get("agents")
        if isinstance(agents, Mapping):
            named += [
                (f"definition.agents.{agent}.model", table.get("model"))
                for agent, table in agents.items()
                if isinstance(table, Mapping)
            ]
        for field, spec in named:
            if isinstance(spec, str):
                model_allowed(self.settings, spec, field)

    def version_out(self, version: TeamVersion, *, definition: bool = False) -> TeamVersionOut:
        agents = version.definition.get("agents")
        return TeamVersionOut(
            name=version.name,
            version=version.version,
            digest=version.digest,
            origin="project",
            description=str(version.definition.get("description") or ""),
            agents=list(agents) if isinstance(agents, Mapping) else [],
            created_at=version.created_at,
            definition=version.definition if definition else None,
        )

    def own_team_out(self, project_id: str, name: str) -> TeamVersionOut | None:
        """The built-in team or a server team, as the API lists it to the project; None
        for other names (and for a server team's name the project registered itself)."""
        if name == DEFAULT_TEAM_NAME:
            team, origin = self.builtin, "builtin"
        elif name in self.server_teams and not self.shadows(project_id, name):
            team, origin = self.server_teams[name], "server"
        else:
            return None
        return TeamVersionOut(
            name=team.name,
            version=None,
            digest=team.digest,
            origin=origin,  # type: ignore[arg-type]
            description=team.description,
            agents=list(team.agent_names),
            created_at=None,
        )


def model_allowed(settings: ServiceSettings, spec: str, field: str) -> str:
    """The spec to record for a model a project's team names; a refusal is a 422 naming
    the field (as a request's model is refused: :func:`~relaygraph.runner.check_model_spec`)."""
    try:
        return check_model_spec(spec, field, settings.request_model)
    except RequestRefused as exc:
        raise ErrorAnswer.refused(exc) from None


def is_team_name(name: str) -> bool:
    """Whether ``name`` is one a project's team may have (:data:`NAME`)."""
    return NAME.fullmatch(name) is not None
