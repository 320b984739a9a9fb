"""The endpoints the audit dashboard reads, beside the task service's own.

Everything the dashboard (``/ui``) shows comes from a documented ``/v1`` endpoint: the task
service's (a task, its trace, handoffs, approvals, events, usage) or one of these —

- ``GET /v1/task-summaries``: the project's tasks with who ran, tokens, cost, handoffs and
  violations, filtered by status, agent, violation kind, time and text;
- ``GET /v1/tasks/{id}/artifacts`` and ``.../artifacts/{name}``: a task's deliverables;
- ``GET /v1/tasks/{id}/trace-links``: where its runs were traced (OpenTelemetry, LangSmith);
- ``GET /v1/evals`` and ``/v1/evals/{run_id}``: the eval runs in the ledger;
- ``GET /v1/usage/daily``: the project's usage per day and role.

The dashboard's pages call the same functions as these endpoints (in
:mod:`relaygraph.api.ui._queries`), so a page never shows what the API would not answer.
"""

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response

from relaygraph.api._auth import own_task, project_auth
from relaygraph.api._errors import ErrorAnswer, error_responses
from relaygraph.api._params import time_query
from relaygraph.api._schemas import ErrorBody
from relaygraph.api.routes.tasks import PageCursor, PageLimit
from relaygraph.api.ui._queries import (
    ANY_VIOLATION,
    APPROVAL_FILTERS,
    DEFAULT_USAGE_DAYS,
    ArtifactList,
    DailyUsage,
    EvalRunList,
    EvalRunOut,
    TaskFilters,
    TaskSummaryPage,
    TraceLinks,
    artifact_response,
    daily_usage,
    eval_run,
    find_tasks,
    read_artifact,
    task_artifacts,
    trace_links,
    utc_time,
)
from relaygraph.errors import ConfigError
from relaygraph.events import VIOLATION_KINDS
from relaygraph.store import Ledger, Project

# -- the endpoints --------------------------------------------------------------------------

_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {
        "model": ErrorBody,
        "description": "`task_not_found` (another project's task too), `artifact_not_found`, "
        "`eval_run_not_found`.",
    }
}


def dashboard_api_router(
    *, ledger: Callable[[], Ledger], home: Path, show_evals: bool = False
) -> APIRouter:
    """The ``/v1`` endpoints the dashboard needs beyond the task service's own.

    Args:
        ledger: Returns the server's ledger (it is opened when the app starts).
        home: The data directory (the tasks' artifacts are under it).
        show_evals: Whether projects see the eval runs (they belong to no project: the
            operator records them with ``relaygraph eval``); without it ``/v1/evals`` is
            empty and every run is not found.
    """
    router = APIRouter(prefix="/v1")

    ProjectDep = Annotated[Project, Depends(project_auth(ledger))]

    @router.get(
        "/task-summaries", response_model=TaskSummaryPage, responses=error_responses(401, 422)
    )
    def task_summaries(
        project: ProjectDep,
        status: Annotated[str | None, Query(description="Only tasks in this status.")] = None,
        agent: Annotated[
            str | None, Query(max_length=64, description="Only tasks this agent ran in.")
        ] = None,
        violation: Annotated[
            str | None,
            Query(
                max_length=64,
                description="Only tasks with a violation of this kind; `any`: of any kind; "
                "`budget`: that hit a budget.",
            ),
        ] = None,
        team: Annotated[
            str | None,
            Query(max_length=64, description="Only tasks of this team (`built-in`: the server's)."),
        ] = None,
        approvals: Annotated[
            str | None,
            Query(
                max_length=16,
                description="`any`: only tasks that asked a person; `rejected`: only those "
                "with a tool call a person rejected.",
            ),
        ] = None,
        since: Annotated[
            str | None, time_query("Created at or after; ISO 8601 with a time zone.")
        ] = None,
        until: Annotated[
            str | None, time_query("Created before; ISO 8601 with a time zone.")
        ] = None,
        q: Annotated[
            str | None,
            Query(
                max_length=200,
                description="Text in the request, answer, stop reason, id or metadata.",
            ),
        ] = None,
        limit: PageLimit = 50,
        cursor: PageCursor = None,
    ) -> TaskSummaryPage:
        """The project's tasks as the dashboard lists them, newest first, filtered."""
        if violation and violation not in (ANY_VIOLATION, *VIOLATION_KINDS):
            raise ErrorAnswer(
                422,
                "invalid_request",
                f"violation {violation!r} is not a violation kind "
                f"(one of {ANY_VIOLATION}, {', '.join(VIOLATION_KINDS)})",
                "violation",
            )
        if approvals and approvals not in APPROVAL_FILTERS:
            raise ErrorAnswer(
                422,
                "invalid_request",
                f"approvals {approvals!r} is not one of {', '.join(APPROVAL_FILTERS)}",
                "approvals",
            )
        filters = TaskFilters(
            status=status,
            agent=agent or None,
            team=team or None,
            approvals=approvals or None,
            violation=violation or None,
            since=utc_time(since, "since"),
            until=utc_time(until, "until"),
            text=q or None,
        )
        try:
            return find_tasks(ledger(), project.id, filters, limit=limit, cursor=cursor)
        except ConfigError as exc:
            field = "status" if "status" in str(exc) else "cursor"
            raise ErrorAnswer(422, "invalid_request", str(exc), field) from None

    @router.get(
        "/tasks/{task_id}/artifacts",
        response_model=ArtifactList,
        responses=error_responses(401, 404),
    )
    def artifacts(task_id: str, project: ProjectDep) -> ArtifactList:
        """The task's deliverables (what its agents saved with `save_artifact`)."""
        own_task(ledger(), task_id, project)
        return ArtifactList(artifacts=task_artifacts(home, task_id))

    @router.get(
        "/tasks/{task_id}/artifacts/{name}",
        response_class=Response,
        responses={
            200: {
                "description": "The artifact's bytes, as a download.",
                "content": {"application/octet-stream": {"schema": {"type": "string"}}},
            },
            **error_responses(401),
            **_NOT_FOUND,
        },
    )
    def artifact(task_id: str, name: str, project: ProjectDep) -> Response:
        """One deliverable, as a file download."""
        own_task(ledger(), task_id, project)
        return artifact_response(read_artifact(home, task_id, name), name, download=True)

    @router.get(
        "/tasks/{task_id}/trace-links",
        response_model=TraceLinks,
        responses=error_responses(401, 404),
    )
    def task_trace_links(task_id: str, project: ProjectDep) -> TraceLinks:
        """Where the task's runs were traced outside relaygraph, latest first: each run's
        OpenTelemetry trace id and LangSmith run (and its page, when known)."""
        own_task(ledger(), task_id, project)
        return trace_links(ledger().events_after(task_id))

    @router.get("/evals", response_model=EvalRunList, responses=error_responses(401, 422))
    def evals(project: ProjectDep, limit: PageLimit = 20) -> EvalRunList:
        """The latest eval runs in the ledger, newest first, without their cases; none
        unless the operator shows them (`RELAYGRAPH_UI_SHOW_EVALS=true`)."""
        if not show_evals:
            return EvalRunList(eval_runs=[])
        runs = ledger().eval_runs(limit)
        return EvalRunList(eval_runs=[EvalRunOut.of(run, cases=False) for run in runs])

    @router.get(
        "/evals/{run_id}",
        response_model=EvalRunOut,
        responses={**error_responses(401), **_NOT_FOUND},
    )
    def evals_run(run_id: str, project: ProjectDep) -> EvalRunOut:
        """One eval run with every case's checks, expected and actual."""
        if not show_evals or "\x00" in run_id:
            raise ErrorAnswer(404, "eval_run_not_found", f"no eval run {run_id!r}", "run_id")
        return EvalRunOut.of(eval_run(ledger(), run_id), cases=True)

    @router.get("/usage/daily", response_model=DailyUsage, responses=error_responses(401, 422))
    def usage_daily(
        project: ProjectDep,
        since: Annotated[
            str | None,
            time_query(f"ISO 8601 with a time zone; default {DEFAULT_USAGE_DAYS} days ago."),
        ] = None,
        until: Annotated[str | None, time_query("ISO 8601 with a time zone; default now.")] = None,
    ) -> DailyUsage:
        """The project's usage per UTC day and role, over the tasks created in the range."""
        end = utc_time(until, "until") or datetime.now(UTC)
        start = utc_time(since, "since") or end - timedelta(days=DEFAULT_USAGE_DAYS)
        return daily_usage(ledger(), project.id, start, end)

    return router
