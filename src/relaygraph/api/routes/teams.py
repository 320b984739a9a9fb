"""``/v1/teams``: a project registers versions of its own teams and reads the teams it may
run (the built-in team, the server's own, its own)."""

import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Response
from pydantic_core import PydanticCustomError

from relaygraph.api._errors import ErrorAnswer, error_responses
from relaygraph.api._schemas import (
    TeamHistory,
    TeamIn,
    TeamList,
    TeamVersionOut,
    check_json_text,
)
from relaygraph.api._state import ServiceState
from relaygraph.api._teams import is_team_name
from relaygraph.errors import ConfigError
from relaygraph.store import Project
from relaygraph.team import DEFAULT_TEAM_NAME, TeamBounds, TeamFileError, read_toml

__all__ = ["teams_router"]

VERSION = re.compile(r"[0-9]{1,10}")


def _definition(body: TeamIn, bounds: TeamBounds) -> tuple[dict[str, Any], str]:
    """The team file's content, and the body field it came in."""
    if body.definition is not None:
        return body.definition, "definition"
    try:
        data = read_toml(body.toml or "", bounds=bounds)
    except ConfigError as exc:
        raise ErrorAnswer(422, "invalid_team", str(exc), "toml") from None
    try:
        check_json_text(data, "toml")
    except PydanticCustomError as exc:
        raise ErrorAnswer(422, "invalid_request", exc.message(), "toml") from None
    return data, "toml"


def _field(exc: ConfigError, source: str) -> str:
    """The body field a team-file error is at: ``definition.agents.reviewer.tools`` for a
    mistake in ``[agents.reviewer] tools``, else the definition (or toml) as a whole."""
    if not isinstance(exc, TeamFileError):
        return source
    return ".".join(part for part in (source, exc.table, exc.key) if part)


def teams_router(state: ServiceState) -> APIRouter:
    """``PUT /v1/teams/{name}``, ``GET /v1/teams``, ``GET /v1/teams/{name}`` and
    ``GET /v1/teams/{name}/versions/{version}``."""
    router = APIRouter(prefix="/v1/teams", tags=["teams"])
    ProjectDep = Annotated[Project, Depends(state.project_of)]
    registry, ledger = state.teams, state.ledger

    @router.put(
        "/{name}",
        response_model=TeamVersionOut,
        status_code=201,
        responses={
            200: {"model": TeamVersionOut, "description": "Unchanged: its latest version."},
            201: {"description": "A new version."},
            **error_responses(401, 409, 413, 422),
        },
    )
    def push_team(name: str, body: TeamIn, project: ProjectDep, response: Response) -> Any:
        """Register a version of a team for this project (201), or find it unchanged (200).

        A definition past the operator's bounds (agents, tools per agent, nesting) is 422
        ``invalid_team``; one whose policy allows more than the operator's policy, 422
        ``policy_loosens`` naming each key with both values."""
        if not is_team_name(name):
            raise ErrorAnswer(
                422,
                "invalid_request",
                f"team name {name[:80]!r} is invalid: use 1-64 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit",
                "name",
            )
        if registry.reserved(project.id, name):
            raise ErrorAnswer(
                409,
                "team_name_taken",
                f"team {name!r} is "
                + ("the built-in team" if name == DEFAULT_TEAM_NAME else "the server's own")
                + "; register yours under another name",
                "name",
            )
        definition, source = _definition(body, registry.bounds)
        registry.models_in(definition)
        try:
            team = registry.build(name, definition, project_id=project.id, field=source)
        except ConfigError as exc:
            raise ErrorAnswer(422, "invalid_team", str(exc), _field(exc, source)) from None
        loosens = registry.loosenings(team)
        if loosens:
            raise ErrorAnswer(
                422,
                "policy_loosens",
                f"team {name!r}: its policy loosens the operator's ({registry.ceiling.source}): "
                + "; ".join(map(str, loosens)),
                f"{source}.policy",
            )
        try:
            version, created = ledger().register_team(
                project.id, name, definition={**definition, "name": name}, digest=team.digest
            )
        except ConfigError as exc:  # Content JSON cannot hold (a TOML date).
            raise ErrorAnswer(422, "invalid_team", str(exc), source) from None
        if created:
            registry.keep(version, team)
        else:
            response.status_code = 200
        return registry.version_out(version).model_copy(update={"created": created})

    @router.get("", response_model=TeamList, responses=error_responses(401))
    def list_teams(project: ProjectDep) -> TeamList:
        """The teams this project may run: the built-in team, the server's and its own."""
        own = [registry.own_team_out(project.id, DEFAULT_TEAM_NAME)]
        own += [registry.own_team_out(project.id, name) for name in sorted(registry.server_teams)]
        mine = [registry.version_out(v) for v in ledger().teams(project.id)]
        return TeamList(teams=[t for t in own if t is not None] + mine)

    @router.get(
        "/{name}",
        response_model=TeamHistory,
        responses=error_responses(401, 404),
    )
    def get_team(name: str, project: ProjectDep) -> TeamHistory:
        """A team with every version, oldest first (another project's team is 404)."""
        own = registry.own_team_out(project.id, name)
        if own is not None:
            return TeamHistory(name=name, origin=own.origin, latest=own, versions=[])
        versions = ledger().team_versions(project.id, name) if is_team_name(name) else []
        if not versions:
            raise ErrorAnswer(404, "team_not_found", f"no team {name[:80]!r}", "name")
        shown = [registry.version_out(v) for v in versions]
        return TeamHistory(name=name, origin="project", latest=shown[-1], versions=shown)

    @router.get(
        "/{name}/versions/{version}",
        response_model=TeamVersionOut,
        responses=error_responses(401, 404),
    )
    def get_team_version(name: str, version: str, project: ProjectDep) -> TeamVersionOut:
        """One version of the project's team, with its definition as registered."""
        number = int(version) if VERSION.fullmatch(version) else 0
        found = (
            ledger().team_version(project.id, name, number)
            if is_team_name(name) and 1 <= number <= 2**31 - 1
            else None
        )
        if found is None:
            raise ErrorAnswer(
                404,
                "team_not_found",
                f"team {name[:80]!r} has no version {version[:20]!r}",
                "version",
            )
        return registry.version_out(found, definition=True)

    return router
