"""The task service: FastAPI routes under ``/v1`` over the ledger and the task workers."""

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Annotated, Any

from anyio import to_thread
from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.responses import JSONResponse
from sse_starlette.sse import EventSourceResponse

from relaygraph._home import data_home
from relaygraph.api._auth import own_task, project_auth
from relaygraph.api._errors import (
    ApiError,
    BodyLimit,
    document_errors_only_as_answered,
    error_body,
    error_responses,
    install_error_handlers,
)
from relaygraph.api._schemas import (
    SSE_EVENT_SCHEMA,
    ApprovalList,
    DecisionIn,
    HandoffList,
    Status,
    TaskCreate,
    TaskOut,
    TaskPage,
    TeamRecord,
)
from relaygraph.api._settings import ServiceSettings
from relaygraph.api._tasks_service import decide as decide_approval
from relaygraph.api._tasks_service import follow_events
from relaygraph.api._teams import TeamRegistry, teams_router
from relaygraph.api._workers import TaskWorkers
from relaygraph.errors import ConfigError
from relaygraph.models import parse_model_spec
from relaygraph.runner import ModelRules, TaskRequest, submit_task
from relaygraph.store import TASK_STATUSES, Ledger, Project

__all__ = ["create_app"]

SSE_POLL_SECONDS = 0.2
MAX_EVENT_SEQ = 2**31 - 1
"""The largest event sequence number: the ledger keeps it in a 32-bit integer column."""
EVENT_ID = re.compile(r"[0-9]{1,19}")
_TIME: dict[str, Any] = {"format": "date-time"}
_TASK_LINKS = {
    link: {"operationId": operation, "parameters": {"task_id": "$response.body#/id"}}
    for link, operation in [
        ("GetTask", "get_task"),
        ("FollowEvents", "events"),
        ("CancelTask", "cancel"),
        ("ListApprovals", "approvals"),
        ("ListHandoffs", "handoffs"),
        ("GetTrace", "trace"),
    ]
}
"""What a created task's id opens (OpenAPI links)."""


def create_app(settings: ServiceSettings | None = None, *, start_workers: bool = True) -> FastAPI:
    """Build the API app. Migrations run and unfinished tasks restart when it starts.

    Args:
        settings: Service settings; read from the environment when None.
        start_workers: Pick up unfinished tasks at start-up (tests of a stopped server
            turn it off).
    """
    settings = settings or ServiceSettings()
    home = data_home(settings.home)
    parse_model_spec(settings.default_model)
    state: dict[str, Any] = {}

    def ledger() -> Ledger:
        return state["ledger"]

    # The teams tasks run: the built-in one, the operator's team files (read now: a bad
    # one stops the server from starting) and the projects' registered teams.
    teams = TeamRegistry(ledger=ledger, settings=settings, home=home)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        import os

        from relaygraph.store import DATABASE_URL_ENV

        url = settings.database_url
        if url is None and not os.environ.get(DATABASE_URL_ENV):
            url = f"sqlite:///{home / 'ledger.sqlite'}"
        ledger = Ledger(url)
        await to_thread.run_sync(ledger.upgrade)
        workers = TaskWorkers(
            ledger,
            home=home,
            workers=settings.workers,
            lease_seconds=settings.lease_seconds,
            max_attempts=settings.max_attempts,
            sandbox_isolation_required=not settings.unsafe_sandbox,
            teams=teams.resolve,
        )
        state.update(ledger=ledger, workers=workers)
        if start_workers:
            await to_thread.run_sync(workers.recover)
            workers.sweep()
        try:
            yield
        finally:
            # Running tasks stop at their next step boundary and stay `running`, for the
            # next start to continue; the ledger closes after their last writes.
            await to_thread.run_sync(lambda: workers.shutdown(wait=True))
            ledger.close()

    app = FastAPI(
        title="relaygraph",
        version="0.1.0",
        description="Submit tasks to a supervised team of agents and follow them as they run.",
        lifespan=lifespan,
        openapi_url="/openapi.json",
        # Operation ids are the routes' names (`create_task`, `cancel`): the links use them.
        generate_unique_id_function=lambda route: route.name,
    )
    app.state.teams = teams
    install_error_handlers(app)
    document_errors_only_as_answered(app)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)

    model_rules = ModelRules(default=settings.default_model, allow=settings.request_model)
    project_of = project_auth(ledger)
    ProjectDep = Annotated[Project, Depends(project_of)]
    app.include_router(teams_router(teams, ledger=ledger, project_of=project_of))

    @app.get("/healthz", response_model=Status)
    def healthz() -> dict[str, str]:
        """Answers while the process is up."""
        return {"status": "ok"}

    @app.get(
        "/readyz",
        response_model=Status,
        responses={200: {"description": '`{"status": "ready"}`'}, **error_responses(503)},
    )
    def readyz() -> JSONResponse:
        """Ready when the database is reachable and migrated."""
        try:
            current = ledger().is_current()
        except Exception as exc:  # Any database failure means not ready.
            return JSONResponse(error_body("not_ready", f"database: {exc}"), status_code=503)
        if not current:
            return JSONResponse(error_body("not_ready", "migrations pending"), status_code=503)
        return JSONResponse({"status": "ready"})

    @app.post(
        "/v1/tasks",
        status_code=202,
        response_model=TaskOut,
        responses={
            202: {"description": "The task, `queued` or `running`.", "links": _TASK_LINKS},
            **error_responses(401, 404, 409, 413, 422),
        },
    )
    def create_task(
        body: TaskCreate,
        project: ProjectDep,
        idempotency_key: Annotated[
            str | None,
            Header(
                min_length=1,
                max_length=200,
                description="A retry with the same key and body returns the first task.",
            ),
        ] = None,
    ) -> TaskOut:
        """Submit a task (202): it runs when a worker is free."""
        if idempotency_key is not None:
            if not idempotency_key.strip():
                raise ApiError(
                    422, "invalid_request", "Idempotency-Key is blank", "Idempotency-Key"
                )
            check_idempotency_key(idempotency_key)
        # A retry of a task already created names the team version the first try ran (a
        # newer one pushed since is not another request).
        first_try = (
            ledger().task_by_idempotency_key(project.id, idempotency_key)
            if idempotency_key is not None
            else None
        )
        version = body.version
        if first_try is not None and version is None and body.team is not None:
            ran = first_try.team or {}
            version = ran.get("version") if ran.get("name") == body.team else None
        chosen = teams.choose(project.id, body.team, version)
        submitted = submit_task(
            TaskRequest(
                input=body.input,
                team=chosen.team,
                team_version=chosen.version,
                # The server's own teams name models the operator chose; a project's team
                # names only models a request could name.
                trust_team=chosen.origin != "project",
                policy=chosen.policy,
                policy_override=body.policy,
                project_id=project.id,
                thread_id=body.thread_id,
                thread_must_exist=False,
                model=body.model,
                agent_models=body.agent_models or {},
                topology=body.topology,
                start_agent=body.start_agent,
                output_mode=body.output_mode,
                metadata=body.metadata,
                multitask=body.multitask,
                idempotency_key=idempotency_key,
            ),
            ledger=ledger(),
            model_rules=model_rules,
            enqueue=state["workers"].enqueue,
        )
        return TaskOut.of(submitted.task)

    @app.get("/v1/tasks", response_model=TaskPage, responses=error_responses(401, 422))
    def list_tasks(
        project: ProjectDep,
        # Checked here rather than by the schema, for an error that lists the statuses.
        status: Annotated[
            str | None,
            Query(
                description="Only tasks in this status.",
                json_schema_extra={"enum": list(TASK_STATUSES)},
            ),
        ] = None,
        limit: Annotated[int, Query(ge=1, le=200)] = 50,
        cursor: Annotated[
            str | None, Query(description="`next_cursor` of the page before.")
        ] = None,
    ) -> TaskPage:
        """The project's tasks, newest first."""
        if status is not None and status not in TASK_STATUSES:
            raise ApiError(
                422,
                "invalid_request",
                f"status {status!r} is not one of {', '.join(TASK_STATUSES)}",
                "status",
            )
        try:
            tasks, next_cursor = ledger().list_tasks(
                project_id=project.id, status=status, limit=limit, cursor=cursor
            )
        except ConfigError as exc:  # The status is known good: the cursor is at fault.
            raise ApiError(422, "invalid_request", str(exc), "cursor") from None
        return TaskPage(tasks=[TaskOut.of(t) for t in tasks], next_cursor=next_cursor)

    @app.get("/v1/tasks/{task_id}", response_model=TaskOut, responses=error_responses(401, 404))
    def get_task(task_id: str, project: ProjectDep) -> TaskOut:
        """One task."""
        return TaskOut.of(own_task(ledger(), task_id, project))

    @app.get(
        "/v1/tasks/{task_id}/handoffs",
        response_model=HandoffList,
        responses=error_responses(401, 404),
    )
    def handoffs(task_id: str, project: ProjectDep) -> HandoffList:
        """Every transfer of work, in order."""
        own_task(ledger(), task_id, project)
        return HandoffList.of(ledger().handoffs(task_id))

    @app.get(
        "/v1/tasks/{task_id}/approvals",
        response_model=ApprovalList,
        responses=error_responses(401, 404),
    )
    def approvals(task_id: str, project: ProjectDep) -> ApprovalList:
        """The task's pauses for a person, decided or not."""
        own_task(ledger(), task_id, project)
        return ApprovalList.of(ledger().approvals(task_id))

    @app.post(
        "/v1/tasks/{task_id}/cancel",
        status_code=202,
        response_model=TaskOut,
        responses=error_responses(401, 404, 409),
    )
    def cancel(task_id: str, project: ProjectDep) -> TaskOut:
        """Cancel the task: at once when it waits, at its next step boundary when it runs."""
        task = own_task(ledger(), task_id, project)
        if task.finished:
            raise ApiError(409, "task_finished", f"task {task_id} already {task.status}")
        return TaskOut.of(state["workers"].cancel(task_id))

    @app.post(
        "/v1/tasks/{task_id}/approvals/{approval_id}",
        status_code=202,
        response_model=TaskOut,
        responses=error_responses(401, 404, 409, 413, 422),
    )
    def decide(task_id: str, approval_id: str, body: DecisionIn, project: ProjectDep) -> TaskOut:
        """Decide a pending approval; the task resumes from its checkpoint."""
        decide_approval(
            ledger=ledger(),
            workers=state["workers"],
            team_of=teams.resolve,
            task=own_task(ledger(), task_id, project),
            approval_id=approval_id,
            body=body,
            decided_by=project.name,
        )
        return TaskOut.of(own_task(ledger(), task_id, project))

    @app.get("/v1/tasks/{task_id}/trace", responses=error_responses(401, 404))
    def trace(task_id: str, project: ProjectDep) -> dict[str, Any]:
        """The task's timeline (the span-tree shape): visits, routes, handoffs, violations."""
        from relaygraph.tracing import build_timeline

        own_task(ledger(), task_id, project)
        timeline = build_timeline(ledger(), task_id, project_id=project.id)
        # A project sees its team's name, version and digest; not where the server keeps
        # a file of its own.
        timeline["team"] = TeamRecord.of(timeline.get("team")).model_dump()
        return timeline

    @app.get("/v1/usage", responses=error_responses(401, 422))
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
            raise ApiError(
                422,
                "invalid_request",
                f"since {since!r} is after until {until!r}",
                "since",
            )
        usage = ledger().usage_for_project(project.id, start, end)
        # Deprecated: the project's id under its name from before projects (one release).
        return {**usage, "team_id": usage["project_id"]}

    @app.get(
        "/v1/tasks/{task_id}/events",
        response_class=EventSourceResponse,
        responses={
            200: {
                "description": "Server-Sent Events: `id` the event's sequence number, `event` "
                "its type, `data` the event as JSON. A finished task's stream closes after "
                "its last event.",
                "content": {"text/event-stream": {"schema": SSE_EVENT_SCHEMA}},
            },
            **error_responses(401, 404, 422),
        },
    )
    async def events(
        task_id: str,
        request: Request,
        project: ProjectDep,
        last_event_id: Annotated[
            str | None,
            Header(
                description="Resume after this event's sequence number (a reconnect).",
                json_schema_extra={"pattern": "^[0-9]{0,10}$"},
            ),
        ] = None,
        after: Annotated[
            int | None,
            Query(ge=0, le=MAX_EVENT_SEQ, description="As Last-Event-ID, in the query."),
        ] = None,
    ) -> EventSourceResponse:
        """The task's events as they happen (Server-Sent Events)."""
        task = await to_thread.run_sync(lambda: own_task(ledger(), task_id, project))
        resumed = _event_id(last_event_id)  # Checked even when `after` is given.
        start = after if after is not None else resumed
        return EventSourceResponse(
            follow_events(ledger, task, after=start, request=request, poll_seconds=SSE_POLL_SECONDS)
        )

    # The audit dashboard (/ui) and the /v1 endpoints it reads beyond the ones above.
    from relaygraph.api._dashboard_api import dashboard_api_router
    from relaygraph.api._ui import ui_router
    from relaygraph.api.ui import DashboardSettings

    dashboard = DashboardSettings()
    app.include_router(
        dashboard_api_router(ledger=ledger, home=home, show_evals=dashboard.show_evals)
    )
    app.include_router(
        ui_router(
            ledger=ledger,
            workers=lambda: state["workers"],
            team_of=teams.resolve,
            home=home,
            settings=dashboard,
        )
    )

    return app


def _event_id(value: str | None) -> int:
    if value is None or not value.strip():
        return 0
    if not EVENT_ID.fullmatch(value.strip()) or int(value) > MAX_EVENT_SEQ:
        raise ApiError(
            422,
            "invalid_request",
            f"Last-Event-ID {value[:40]!r} is not a sequence number (0 to {MAX_EVENT_SEQ})",
            "Last-Event-ID",
        )
    return int(value)


def in_utc(text: str | None, field: str) -> datetime | None:
    """A query's ISO 8601 time, in UTC; one that is not ISO 8601 (a bare number), has no
    time zone, or is outside what UTC can express is refused naming the field."""
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ApiError(
            422,
            "invalid_request",
            f"{field} {text[:60]!r} is not an ISO 8601 time, e.g. 2026-01-01T00:00:00Z",
            field,
        ) from None
    if value.tzinfo is None:
        raise ApiError(
            422,
            "invalid_request",
            f"{field} {value.isoformat()!r} has no time zone; add one, e.g. {value.isoformat()}Z",
            field,
        )
    try:
        return value.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00:00+14:00 is before the first UTC time.
        raise ApiError(
            422,
            "invalid_request",
            f"{field} {value.isoformat()!r} is outside the times UTC can express",
            field,
        ) from None


def check_idempotency_key(key: str) -> None:
    """Refuse a key the ledger cannot store (a header is Latin-1 text, NUL included)."""
    if "\x00" in key:
        raise ApiError(
            422, "invalid_request", "Idempotency-Key contains a NUL character", "Idempotency-Key"
        )
