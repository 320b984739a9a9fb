"""Who an API request speaks for: the project whose bearer key it sends, and that
project's tasks (every ``/v1`` router asks here, so all answer a bad key alike)."""

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from relaygraph.api._errors import ErrorAnswer
from relaygraph.store import Ledger, Project, Task

__all__ = ["BEARER", "own_task", "project_auth"]

BEARER = HTTPBearer(
    auto_error=False, description="A project's API key (`relaygraph projects create NAME`)."
)
"""The API's one security scheme (the OpenAPI document names it once)."""


def project_auth(ledger: Callable[[], Ledger]) -> Callable[..., Project]:
    """The dependency that answers a request's project from its bearer key.

    Args:
        ledger: Returns the server's ledger (it is opened when the app starts).

    Returns:
        A FastAPI dependency; it raises `ErrorAnswer` 401 ``unauthorized`` for a missing,
        blank, unknown or revoked key.
    """

    def project_of(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)],
    ) -> Project:
        key = credentials.credentials.strip() if credentials is not None else ""
        if not key:
            raise ErrorAnswer(401, "unauthorized", "send 'Authorization: Bearer <key>'")
        project = ledger().authenticate(key)
        if project is None:
            raise ErrorAnswer(401, "unauthorized", "the API key is not valid (or was revoked)")
        return project

    return project_of


def own_task(ledger: Ledger, task_id: str, project: Project) -> Task:
    """The project's task ``task_id``.

    Raises:
        ErrorAnswer: 404 ``task_not_found`` for a missing task and for another project's
            (absent to this project, not forbidden).
    """
    # An id the ledger could not hold (PostgreSQL text has no NUL) names no task.
    task = None if "\x00" in task_id else ledger.get_task(task_id, project_id=project.id)
    if task is None:
        raise ErrorAnswer(404, "task_not_found", f"no task {task_id!r}", "task_id")
    return task
