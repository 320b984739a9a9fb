"""The dashboard's replay action (a task page's "Replay" form) and its diff page: two of the
project's tasks side by side, aligned by step, with the first step where they part."""

from __future__ import annotations

from collections.abc import Callable

from anyio import to_thread
from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from pydantic import ValidationError

from relaygraph.api._errors import ErrorAnswer
from relaygraph.api.routes.replays import ReplayCreate
from relaygraph.api.ui._dashboard import SECURITY_HEADERS, Dashboard, dashboard_router, form_fields
from relaygraph.api.ui._sessions import same_token
from relaygraph.runner import RequestRefused
from relaygraph.store import Task

__all__ = ["ReplaySubmit", "replay_pages_router"]

ReplaySubmit = Callable[[str, Task, ReplayCreate], Task]
"""Submits a replay of a project's task (``routes.replays.replay_in_project``)."""


def replay_pages_router(dashboard: Dashboard, submit: ReplaySubmit) -> APIRouter:
    """``POST /ui/tasks/{id}/replay`` and ``GET /ui/diff/{a}/{b}``."""
    router = dashboard_router()

    @router.post("/tasks/{task_id}/replay")
    async def replay(task_id: str, request: Request) -> Response:
        fields = await form_fields(request)
        return await to_thread.run_sync(_replay, dashboard, submit, request, task_id, fields)

    @router.get("/diff/{task_a}/{task_b}")
    def diff(task_a: str, task_b: str, request: Request) -> Response:
        from relaygraph.evals import diff_trajectories, read_trajectory

        session = dashboard.signed_in(request)
        a, b = dashboard.own_task(session, task_a), dashboard.own_task(session, task_b)
        for task_id, task in ((task_a, a), (task_b, b)):
            if task is None:
                return dashboard.not_found(request, session, f"task {task_id}")
        assert a is not None and b is not None
        ledger = dashboard.ledger()
        result = diff_trajectories(read_trajectory(ledger, a), read_trajectory(ledger, b))
        return dashboard.page(
            request, "diff.html", session, diff=result, summary=result.summary(), nav="tasks"
        )

    return router


def _replay(
    dashboard: Dashboard,
    submit: ReplaySubmit,
    request: Request,
    task_id: str,
    fields: dict[str, str],
) -> Response:
    session = dashboard.signed_in(request)
    if not same_token(fields.get("csrf", ""), session.csrf):
        return _text(403, "The form had expired; reload the page.")
    original = dashboard.own_task(session, task_id)
    if original is None:
        return _text(404, f"no task {task_id!r}")
    body = {"from_step": fields.get("from_step") or "0"}
    if fields.get("model", "").strip():
        body["model"] = fields["model"].strip()
    try:
        replayed = submit(session.project_id, original, ReplayCreate.model_validate(body))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = str(first["loc"][0]) if first["loc"] else "from_step"
        return _text(422, f"{where}: {first['msg']} (got {body.get(where)!r})")
    except (ErrorAnswer, RequestRefused) as exc:
        return _text(422, str(exc.message if isinstance(exc, ErrorAnswer) else exc))
    return RedirectResponse(f"/ui/tasks/{replayed.id}", status_code=303, headers=SECURITY_HEADERS)


def _text(status: int, message: str) -> Response:
    return Response(
        message,
        status_code=status,
        media_type="text/plain; charset=utf-8",
        headers=SECURITY_HEADERS,
    )
