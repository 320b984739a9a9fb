"""The teams a service's tasks run, as any process that runs them finds them: the built-in
team, the operator's team files (``RELAYGRAPH_TEAM_FILES``) by name, and each project's
registered versions, built under the operator's trust and bounds and kept, with the MCP
servers the operator offers (``RELAYGRAPH_MCP_FILE``) in a session of the project's own;
and the policy each task runs under, capped by the operator's ceiling.

An API server's team registry and a worker resolve a task's team and its policy the same
way, from the same settings (:class:`~relaygraph.runner.RunnerSettings`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relaygraph.errors import ConfigError

if TYPE_CHECKING:
    from relaygraph.policies import Loosening, PolicyCeiling, TeamPolicy
    from relaygraph.runner._settings import RunnerSettings
    from relaygraph.store import Ledger, TeamVersion
    from relaygraph.team import Team, TeamBounds, TeamTrust

__all__ = ["KEPT_TEAMS", "ServiceTeams", "server_teams"]

KEPT_TEAMS = 64
"""Built registered teams kept per process (their MCP sessions and compiled graphs reused)."""


class ServiceTeams:
    """The team of any of the service's tasks (``TaskRunner(teams=ServiceTeams(...).resolve)``).

    Registered teams are built once per (project, name, version) and kept, least recently
    used dropped first: a version never changes, so its MCP sessions and its compiled graphs
    (the runner's team cache keys them by the team object) serve every task that runs it.

    The operator's policy (``settings.policy_file``, else the default policy) is the
    built-in team's and the :attr:`ceiling` of every task but a server team's, whose policy
    the operator wrote too: :meth:`policy_for` caps the policy a task recorded at each run,
    so a ceiling tightened after a team was registered (or a task queued) holds for it.

    Args:
        ledger: The ledger holding the projects' registered teams (or a function giving it,
            for a ledger opened later).
        settings: The operator's trust (tool modules, MCP hosts), team files, policy and
            bounds on a registered team.
        home: The data directory.

    Raises:
        ConfigError: A team file or the policy file is bad, a team file is named
            ``default``, or two share a name.
    """

    def __init__(
        self, *, ledger: Ledger | Callable[[], Ledger], settings: RunnerSettings, home: Path
    ) -> None:
        from relaygraph.policies import policy_ceiling
        from relaygraph.team import TeamBounds, TeamTrust, default_team, load_mcp_file

        self._ledger = ledger if callable(ledger) else (lambda: ledger)
        self.trust: TeamTrust = TeamTrust(
            local_files=False,
            modules=tuple(settings.tool_modules),
            mcp_hosts=tuple(settings.mcp_allowed_hosts),
        )
        self.offered_mcp = load_mcp_file(settings.mcp_file) if settings.mcp_file else ()
        """The MCP servers the operator offers to every project's registered teams."""
        # A registered definition names no files, so nothing is read from here; relative
        # paths it might hold are refused before they are resolved.
        self.base = home / "teams"
        self.bounds: TeamBounds = TeamBounds(
            max_agents=settings.team_max_agents,
            max_tools_per_agent=settings.team_max_tools_per_agent,
            max_depth=settings.team_max_depth,
        )
        self.builtin = default_team()
        self.ceiling: PolicyCeiling = policy_ceiling(
            self.builtin.policy_from(settings.policy_file)
            if settings.policy_file
            else self.builtin.resolved_policy,
            roster=self.builtin.roster,
        )
        self.server_teams = server_teams(settings.team_files)
        self._kept: OrderedDict[tuple[str, str, int], Team] = OrderedDict()
        self._lock = threading.Lock()
        self._building: dict[tuple[str, str, int], threading.Lock] = {}

    def build(
        self,
        name: str,
        definition: Mapping[str, Any],
        *,
        project_id: str,
        field: str = "definition",
    ) -> Team:
        """A project's team from its definition, under the operator's trust and bounds.

        The MCP servers the operator offers are the project's to use by name, each in a
        session of the project's own: one project's calls never share a session (or a
        stdio server's process) with another's.

        Args:
            name: The team's name.
            project_id: Whose team it is.
            definition: The team file's content.
            field: What the definition is called in messages (a request's body field).

        Raises:
            ConfigError: Anything wrong in it, a reference the operator does not allow, or
                a bound passed (``TeamFileError``, naming the table and the key; a bound's
                message names the bound and the value).
        """
        from relaygraph.team import check_bounds, check_tool_counts, parse_team

        check_bounds(definition, self.bounds, field=field)
        offered = tuple(replace(s, session_scope=project_id) for s in self.offered_mcp)
        trust = replace(self.trust, mcp_servers=offered)
        team = parse_team({**definition, "name": name}, base=self.base, trust=trust)
        check_tool_counts({agent.name: len(agent.tools) for agent in team.agents}, self.bounds)
        return team

    def loosenings(self, team: Team) -> list[Loosening]:
        """What ``team``'s definition asks for beyond the operator's ceiling (each key with
        both values); empty when nothing.

        Only keys the definition writes count (its ``[policy]`` table, an agent's ``tools``
        and ``handoffs``): a default it leaves alone is capped at each run instead, so that
        a tighter ``--policy`` does not refuse every team that says nothing of limits.
        """
        from relaygraph.policies import loosenings

        written = _written_keys(team.definition or {})
        found = loosenings(team.resolved_policy, self.ceiling, whose="the operator's")
        return [loosened for loosened in found if loosened.key in written]

    def capped(self, policy: TeamPolicy) -> TeamPolicy:
        """``policy`` under the operator's ceiling: key by key, the tighter of the two."""
        from relaygraph.policies import meet

        return meet(policy, self.ceiling)

    def policy_for(self, task: Any, recorded: TeamPolicy) -> TeamPolicy:
        """The policy ``task`` runs under: the one it recorded, capped by the ceiling this
        process has now (a server team's, the operator's own, as recorded)."""
        record = task.team or {}
        if record.get("version") is None and record.get("name") in self.server_teams:
            return recorded
        return self.capped(recorded)

    def keep(self, version: TeamVersion, team: Team) -> None:
        """Keep ``team``, built from ``version``, for the tasks that run it."""
        key = (version.project_id, version.name, version.version)
        with self._lock:
            self._kept.setdefault(key, team)
            self._kept.move_to_end(key)
            while len(self._kept) > KEPT_TEAMS:
                self._kept.popitem(last=False)

    def registered(self, version: TeamVersion) -> Team:
        """The team a registered version defines, built once and kept.

        Raises:
            ConfigError: It no longer builds (an MCP server that does not answer, a module
                the operator no longer allows).
        """
        key = (version.project_id, version.name, version.version)
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                self._kept.move_to_end(key)
                return kept
            building = self._building.setdefault(key, threading.Lock())
        with building:  # One build per version at a time: one set of MCP sessions.
            with self._lock:
                kept = self._kept.get(key)
            if kept is None:
                kept = self.build(version.name, version.definition, project_id=version.project_id)
                self.keep(version, kept)
        with self._lock:
            self._building.pop(key, None)
        return kept

    def resolve(self, task: Any) -> Team:
        """The team ``task`` records: the built-in team, a team file's team by name, or the
        registered version of the task's project.

        Raises:
            ConfigError: This process does not load that team, or the project has no such
                version.
        """
        from relaygraph.team import DEFAULT_TEAM_NAME

        record = task.team or {}
        name = record.get("name") or DEFAULT_TEAM_NAME
        version = record.get("version")
        if version is None:
            if name == DEFAULT_TEAM_NAME:
                return self.builtin
            if name in self.server_teams:
                return self.server_teams[name]
            raise ConfigError(
                f"task {task.id} ran team {name!r}, which this process does not load "
                "(serve --team FILE; RELAYGRAPH_TEAM_FILES for a worker)"
            )
        found = self._ledger().team_version(task.project_id, name, version)
        if found is None:
            raise ConfigError(
                f"task {task.id} ran team {name!r} version {version}, which its project "
                "does not have"
            )
        return self.registered(found)


def _written_keys(definition: Mapping[str, Any]) -> set[str]:
    """The policy keys a team definition writes, as a policy file names them
    (``team.max_seconds``, ``agents.coder.tools``, ``prices.gpt-4o``)."""
    written: set[str] = set()
    policy = definition.get("policy")
    for section, table in policy.items() if isinstance(policy, Mapping) else ():
        if not isinstance(table, Mapping):
            continue
        if section == "agents":
            for name, keys in table.items():
                if isinstance(keys, Mapping):
                    written.update(f"agents.{name}.{key}" for key in keys)
        else:
            written.update(f"{section}.{key}" for key in table)
    agents = definition.get("agents")
    for name, table in agents.items() if isinstance(agents, Mapping) else ():
        if isinstance(table, Mapping):
            written.update(f"agents.{name}.{key}" for key in ("tools", "handoffs") if key in table)
    return written


def server_teams(files: list[Path]) -> dict[str, Team]:
    """The operator's team files' teams, by name.

    Raises:
        ConfigError: A file is bad, its team is named ``default``, or two share a name.
    """
    from relaygraph.team import DEFAULT_TEAM_NAME, load_team

    teams: dict[str, Team] = {}
    for file in files:
        team = load_team(file)  # The operator's own file: it may reference anything.
        if team.name == DEFAULT_TEAM_NAME:
            raise ConfigError(
                f"team file {str(file)!r} is named {DEFAULT_TEAM_NAME!r}, the built-in team's "
                "name; give it a name of its own"
            )
        if team.name in teams:
            raise ConfigError(
                f"team files {str(teams[team.name].source)!r} and {str(file)!r} are both named "
                f"{team.name!r}; a server team is named by its name alone"
            )
        teams[team.name] = team
    return teams
