"""The audit dashboard at ``/ui``: tasks, their handoff graphs, timelines, budgets and
approvals, eval runs and usage, served by the task service itself.

Server-rendered Jinja2 templates with one small script (``ui/static/dashboard.js``) that
follows a running task's event stream and swaps in the page's parts as they change: the
pages are plain HTML a Python developer edits without a JavaScript build, and every figure
comes from the same functions as the ``/v1`` endpoints (see :mod:`relaygraph.api._dashboard_api`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.responses import Response

from relaygraph.api._dispatch import TaskDispatch
from relaygraph.api.ui._auth import auth_router
from relaygraph.api.ui._dashboard import Dashboard, to_sign_in
from relaygraph.api.ui._replay_pages import ReplaySubmit, replay_pages_router
from relaygraph.api.ui._report_pages import report_router
from relaygraph.api.ui._sessions import SessionStore
from relaygraph.api.ui._settings import DashboardSettings
from relaygraph.api.ui._task_pages import task_router
from relaygraph.store import Ledger, Quotas, Task
from relaygraph.team import Team

if TYPE_CHECKING:
    from relaygraph.api._streams import StreamGate
    from relaygraph.worker import EventListener


def ui_router(
    *,
    ledger: Callable[[], Ledger],
    dispatch: Callable[[], TaskDispatch],
    notices: Callable[[], EventListener | None] = lambda: None,
    task_team: Callable[[Task], Team],
    home: Path,
    settings: DashboardSettings | None = None,
    streams: StreamGate | None = None,
    quotas: Quotas | None = None,
    replay: ReplaySubmit | None = None,
) -> APIRouter:
    """The dashboard's pages, under ``/ui`` (left out of the OpenAPI document).

    Args:
        ledger: Returns the server's ledger (it is opened when the app starts).
        dispatch: Returns where the server hands its tasks on (its own task loop, or the
            broker in the worker mode): a decision resumes its task there, a cancel
            reaches it.
        notices: Returns the worker mode's event listener (None in process).
        task_team: The team a task records (its tools check an edit's arguments).
        home: The data directory (the tasks' artifacts are under it).
        settings: Idle time, eval runs, refresh; from ``RELAYGRAPH_UI_*`` when None.
        streams: Admits a task page's live event stream, counted with the project's API
            streams (``RELAYGRAPH_PROJECT_MAX_STREAMS``); None: not counted.
        quotas: The server's quotas of every project, which the usage page shows (each
            project's own over them); the settings' defaults when None.
        replay: Submits a replay of a project's task (a task page's "Replay"); None: no
            replay action.
    """
    settings = settings or DashboardSettings()
    dashboard = Dashboard(
        ledger=ledger,
        dispatch=dispatch,
        notices=notices,
        task_team=task_team,
        home=home,
        settings=settings,
        sessions=SessionStore(idle_seconds=settings.idle_minutes * 60),
        streams=streams,
        quotas=quotas or Quotas(),
    )
    router = APIRouter(include_in_schema=False)
    router.include_router(auth_router(dashboard))
    router.include_router(task_router(dashboard))
    router.include_router(report_router(dashboard))
    if replay is not None:
        router.include_router(replay_pages_router(dashboard, replay))

    @router.get("/ui/{rest:path}")
    def no_such_page(rest: str, request: Request) -> Response:
        """Any other address under ``/ui``: the dashboard's own not-found page, not the
        framework's bare JSON (after sign-in, so it tells nothing to a stranger)."""
        session, expired = dashboard.session(request)
        if session is None:
            return to_sign_in(request, expired=expired)
        return dashboard.not_found(request, session, f"page /ui/{rest[:80]}")

    return router
