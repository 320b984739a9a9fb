"""``/v1/tasks``: submit a task, list the project's tasks, read one, its handoffs and its
timeline, cancel it."""

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query

from relaygraph.api._auth import own_task
from relaygraph.api._errors import ErrorAnswer, error_responses
from relaygraph.api._schemas import HandoffList, TaskCreate, TaskOut, TaskPage, TeamRecord
from relaygraph.api._state import ServiceState
from relaygraph.errors import ConfigError
from relaygraph.runner import SubmittedTask, TaskRequest, submit_task
from relaygraph.store import TASK_STATUSES, Project

__all__ = [
    "SUBMISSION_ERRORS",
    "PageCursor",
    "PageLimit",
    "idempotency_key_header",
    "submitted_task_out",
    "tasks_router",
]

SUBMISSION_ERRORS = error_responses(401, 404, 409, 413, 422, 429, 503, 507)
"""What a submission, of a task or of a replay, may be answered instead of 202."""

PageLimit = Annotated[int, Query(ge=1, le=200)]
"""``limit``: how many items a page of a list holds at most."""
PageCursor = Annotated[str | None, Query(description="`next_cursor` of the page before.")]
"""``cursor``: where a page of a list goes on from."""

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


def tasks_router(state: ServiceState) -> APIRouter:
    """``POST /v1/tasks``, ``GET /v1/tasks``, ``GET /v1/tasks/{id}`` with its
    ``/handoffs`` and ``/trace``, and ``POST /v1/tasks/{id}/cancel``."""
    router = APIRouter(prefix="/v1/tasks")
    ProjectDep = Annotated[Project, Depends(state.project_of)]

    @router.post(
        "",
        status_code=202,
        response_model=TaskOut,
        responses={
            202: {"description": "The task, `queued` or `running`.", "links": _TASK_LINKS},
            **SUBMISSION_ERRORS,
        },
    )
    def create_task(
        body: TaskCreate,
        project: ProjectDep,
        idempotency_key: Annotated[str | None, idempotency_key_header("task")],
    ) -> TaskOut:
        """Submit a task (202): it runs when a worker is free.

        A project at its queued quota, or past its daily budget, gets 429 (``Retry-After``).

        With a broker, 202 means the ledger has the task and the broker every id published
        for it now (the next in the fair order, while few wait for a worker; the others are
        published in turn). 503 ``broker_unavailable``: it is recorded but not published; a
        retry with the same ``Idempotency-Key`` publishes it in its turn.
        """
        # A retry of a task already created names the team version the first try ran (a
        # newer one pushed since is not another request).
        first_try = (
            state.ledger().task_by_idempotency_key(project.id, idempotency_key)
            if idempotency_key is not None
            else None
        )
        version = body.version
        if first_try is not None and version is None and body.team is not None:
            ran = first_try.team or {}
            version = ran.get("version") if ran.get("name") == body.team else None
        chosen = state.teams.choose(project.id, body.team, version)
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
            state.intake(),
        )
        return submitted_task_out(state, submitted, project)

    @router.get("", response_model=TaskPage, responses=error_responses(401, 422))
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
        limit: PageLimit = 50,
        cursor: PageCursor = None,
    ) -> TaskPage:
        """The project's tasks, newest first."""
        if status is not None and status not in TASK_STATUSES:
            raise ErrorAnswer(
                422,
                "invalid_request",
                f"status {status!r} is not one of {', '.join(TASK_STATUSES)}",
                "status",
            )
        try:
            tasks, next_cursor = state.ledger().list_tasks(
                project_id=project.id, status=status, limit=limit, cursor=cursor
            )
        except ConfigError as exc:  # The status is known good: the cursor is at fault.
            raise ErrorAnswer(422, "invalid_request", str(exc), "cursor") from None
        return TaskPage(tasks=[TaskOut.of(t) for t in tasks], next_cursor=next_cursor)

    @router.get("/{task_id}", response_model=TaskOut, responses=error_responses(401, 404))
    def get_task(task_id: str, project: ProjectDep) -> TaskOut:
        """One task."""
        return TaskOut.of(own_task(state.ledger(), task_id, project))

    @router.get(
        "/{task_id}/handoffs",
        response_model=HandoffList,
        responses=error_responses(401, 404),
    )
    def handoffs(task_id: str, project: ProjectDep) -> HandoffList:
        """Every transfer of work, in order."""
        own_task(state.ledger(), task_id, project)
        return HandoffList.of(state.ledger().handoffs(task_id))

    @router.post(
        "/{task_id}/cancel",
        status_code=202,
        response_model=TaskOut,
        responses=error_responses(401, 404, 409, 507),
    )
    def cancel(task_id: str, project: ProjectDep) -> TaskOut:
        """Cancel the task: at once when it waits, at its next step boundary when it runs."""
        task = own_task(state.ledger(), task_id, project)
        if task.finished:
            raise ErrorAnswer(409, "task_finished", f"task {task_id} already {task.status}")
        return TaskOut.of(state.dispatch().cancel(task_id, by=project.name, via="api"))

    @router.get("/{task_id}/trace", responses=error_responses(401, 404))
    def trace(task_id: str, project: ProjectDep) -> dict[str, Any]:
        """The task's timeline (the span-tree shape): visits, routes, handoffs, violations."""
        from relaygraph.tracing import build_timeline

        own_task(state.ledger(), task_id, project)
        timeline = build_timeline(state.ledger(), task_id, project_id=project.id)
        # A project sees its team's name, version and digest; not where the server keeps
        # a file of its own.
        timeline["team"] = TeamRecord.of(timeline.get("team")).model_dump()
        return timeline

    return router


def submitted_task_out(state: ServiceState, submitted: SubmittedTask, project: Project) -> TaskOut:
    """The 202 answer to a submission (of a task or of a replay).

    A retry of a submission whose publish may have failed (503) publishes the task again:
    that is safe, the earlier message (if any) is stale once the task's dispatch moves.
    """
    if not submitted.created and state.worker_mode and submitted.task.status == "queued":
        state.broker().republish(submitted.task)
        return TaskOut.of(own_task(state.ledger(), submitted.task.id, project))
    return TaskOut.of(submitted.task)


def idempotency_key_header(first: str) -> Any:
    """The ``Idempotency-Key`` header of a submission, checked by
    :func:`_check_idempotency_key` (a dependency); its documentation says that a retry
    returns the ``first`` one (``task``, ``replay``)."""

    def header(
        idempotency_key: Annotated[
            str | None,
            Header(
                min_length=1,
                max_length=200,
                description=f"A retry with the same key and body returns the first {first}.",
            ),
        ] = None,
    ) -> str | None:
        if idempotency_key is not None:
            _check_idempotency_key(idempotency_key)
        return idempotency_key

    return Depends(header)


def _check_idempotency_key(key: str) -> None:
    """Refuse an ``Idempotency-Key`` header that is blank, or that the ledger cannot store
    (a header is Latin-1 text, NUL included)."""
    if not key.strip():
        raise ErrorAnswer(422, "invalid_request", "Idempotency-Key is blank", "Idempotency-Key")
    if "\x00" in key:
        raise ErrorAnswer(
            422, "invalid_request", "Idempotency-Key contains a NUL character", "Idempotency-Key"
        )
