"""``/v1/usage``: what the calling project's tasks used; ``/v1/projects/me``: its quotas
and what it uses now."""

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from relaygraph.api._errors import ErrorAnswer, error_responses
from relaygraph.api._params import in_utc, time_query
from relaygraph.api._schemas import ProjectMe
from relaygraph.api._state import ServiceState
from relaygraph.api.ui._queries import project_me
from relaygraph.store import Project

__all__ = ["projects_router"]


def projects_router(state: ServiceState) -> APIRouter:
    """``GET /v1/usage`` and ``GET /v1/projects/me``: the project's own figures (a key
    speaks for one project)."""
    router = APIRouter()
    ProjectDep = Annotated[Project, Depends(state.project_of)]

    @router.get("/v1/projects/me", response_model=ProjectMe, responses=error_responses(401))
    def me(project: ProjectDep) -> ProjectMe:
        """The calling project: its quotas as they apply to it, and what it uses now."""
        return project_me(
            state.ledger(),
            state.settings.quotas,
            project_id=project.id,
            name=project.name,
            streams=state.streams,
        )

    @router.get("/v1/usage", responses=error_responses(401, 422))
    def usage(
        project: ProjectDep,
        since: Annotated[str | None, time_query("ISO 8601 with a time zone; inclusive.")] = None,
        until: Annotated[str | None, time_query("ISO 8601 with a time zone; exclusive.")] = None,
    ) -> dict[str, Any]:
        """The project's usage per role over the tasks created in ``[since, until)``."""
        start, end = in_utc(since, "since"), in_utc(until, "until")
        if start is not None and end is not None and start > end:
            raise ErrorAnswer(
                422,
                "invalid_request",
                f"since {since!r} is after until {until!r}",
                "since",
            )
        return state.ledger().usage_for_project(project.id, start, end)

    return router
