"""``/v1/usage``: what the calling project's tasks used; ``/v1/projects/me``: its quotas
and what it uses now."""

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from relaygraph.api._errors import ErrorAnswer, error_responses
from relaygraph.api._schemas import ProjectMe
from relaygraph.api._state import ServiceState
from relaygraph.api.ui._queries import project_me
from relaygraph.store import Project

__all__ = ["in_utc", "projects_router"]

_TIME: dict[str, Any] = {"format": "date-time"}


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
        since: Annotated[
            str | None,
            Query(description="ISO 8601 with a time zone; inclusive.", json_schema_extra=_TIME),
        ] = None,
        until: Annotated[
            str | None,
            Query(description="ISO 8601 with a time zone; exclusive.", json_schema_extra=_TIME),
        ] = None,
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
        usage = state.ledger().usage_for_project(project.id, start, end)
        # Deprecated: the project's id under its name from before projects (one release).
        return {**usage, "team_id": usage["project_id"]}

    return router


def in_utc(text: str | None, field: str) -> datetime | None:
    """A query's ISO 8601 time, in UTC; one that is not ISO 8601 (a bare number), has no
    time zone, or is outside what UTC can express is refused naming the field."""
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ErrorAnswer(
            422,
            "invalid_request",
            f"{field} {text[:60]!r} is not an ISO 8601 time, e.g. 2026-01-01T00:00:00Z",
            field,
        ) from None
    if value.tzinfo is None:
        raise ErrorAnswer(
            422,
            "invalid_request",
            f"{field} {value.isoformat()!r} has no time zone; add one, e.g. {value.isoformat()}Z",
            field,
        )
    try:
        return value.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00:00+14:00 is before the first UTC time.
        raise ErrorAnswer(
            422,
            "invalid_request",
            f"{field} {value.isoformat()!r} is outside the times UTC can express",
            field,
        ) from None
