"""``/v1/tasks/{id}/approvals``: a task's pauses for a person, and deciding one."""

from typing import Annotated

from fastapi import APIRouter, Depends

from relaygraph.api._auth import own_task
from relaygraph.api._errors import error_responses
from relaygraph.api._schemas import ApprovalList, DecisionIn, TaskOut
from relaygraph.api._state import ServiceState
from relaygraph.api._tasks_service import decide as decide_approval
from relaygraph.store import Project

__all__ = ["approvals_router"]


def approvals_router(state: ServiceState) -> APIRouter:
    """``GET /v1/tasks/{id}/approvals`` and ``POST /v1/tasks/{id}/approvals/{approval_id}``."""
    router = APIRouter(prefix="/v1/tasks/{task_id}/approvals")
    ProjectDep = Annotated[Project, Depends(state.project_of)]

    @router.get("", response_model=ApprovalList, responses=error_responses(401, 404))
    def approvals(task_id: str, project: ProjectDep) -> ApprovalList:
        """The task's pauses for a person, decided or not."""
        own_task(state.ledger(), task_id, project)
        return ApprovalList.of(state.ledger().approvals(task_id))

    @router.post(
        "/{approval_id}",
        status_code=202,
        response_model=TaskOut,
        responses=error_responses(401, 404, 409, 413, 422, 503, 507),
    )
    def decide(task_id: str, approval_id: str, body: DecisionIn, project: ProjectDep) -> TaskOut:
        """Decide a pending approval; the task resumes from its checkpoint."""
        decide_approval(
            ledger=state.ledger(),
            dispatch=state.dispatch(),
            task_team=state.teams.resolve,
            task=own_task(state.ledger(), task_id, project),
            approval_id=approval_id,
            body=body,
            decided_by=project.name,
        )
        return TaskOut.of(own_task(state.ledger(), task_id, project))

    return router
