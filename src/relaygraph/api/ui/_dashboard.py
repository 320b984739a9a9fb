"""What every dashboard page shares: the ledger, the sessions, and how a page is answered."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.routing import APIRoute

from relaygraph.api.ui._sessions import COOKIE, DashboardSession, SessionStore
from relaygraph.api.ui._settings import DashboardSettings
from relaygraph.api.ui._templates import render
from relaygraph.store import Ledger, Quotas, Task

if TYPE_CHECKING:
    from relaygraph.api._dispatch import TaskDispatch
    from relaygraph.api._streams import StreamGate
    from relaygraph.team import Team
    from relaygraph.worker import EventListener

REFRESH_HEADER = "X-Relaygraph-Refresh"
"""Sent by the page's own refreshes: they do not keep an idle session alive."""

SECURITY_HEADERS = {
    # Scripts and styles only from the dashboard's own files: nothing inline, nothing from
    # elsewhere, so text a model wrote can never run as script here.
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'; object-src 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True, kw_only=True)
class Dashboard:
    """The dashboard's state, given to each of its routers.

    Args:
        ledger: Returns the server's ledger (opened when the app starts).
        dispatch: Returns where the server hands its tasks on (its own task loop, or the
            broker in the worker mode): a decision resumes its task there, a cancel
            reaches it.
        task_team: The team a task records (the server's registry of teams).
        home: The data directory (artifacts live under it).
        settings: The dashboard's settings.
        sessions: Who is signed in.
        notices: Returns the worker mode's event listener (None in process): a task's
            live page wakes on its notices instead of polling the ledger.
        quotas: The server's quotas of every project (the usage page shows a project's).
    """

    ledger: Callable[[], Ledger]
    dispatch: Callable[[], TaskDispatch]
    task_team: Callable[[Task], Team]
    home: Path
    settings: DashboardSettings
    sessions: SessionStore
    notices: Callable[[], EventListener | None] = lambda: None
    streams: StreamGate | None = None
    """Admits a task page's live event stream (counted with the project's API streams)."""
    quotas: Quotas = field(default_factory=Quotas)

    def session(self, request: Request) -> tuple[DashboardSession | None, bool]:
        """The request's live session, and whether one ran out of time.

        A page a person opens counts as activity; the page's own refreshes do not. A
        session whose API key was revoked ends here.
        """
        touch = request.headers.get(REFRESH_HEADER) != "1"
        session, expired = self.sessions.find(request.cookies.get(COOKIE), touch=touch)
        if session is None:
            return None, expired
        keys = self.ledger().api_keys(session.project_id)
        if not any(k.id in session.key_ids and k.revoked_at is None for k in keys):
            self.sessions.end(session.id)
            return None, False
        return session, False

    def signed_in(self, request: Request) -> DashboardSession:
        """The request's live session (see :meth:`session`).

        Raises:
            SignInRequired: The request has none; the page's route answers with the
                sign-in page (:class:`DashboardRoute`).
        """
        session, expired = self.session(request)
        if session is None:
            raise SignInRequired(expired=expired)
        return session

    def own_task(self, session: DashboardSession, task_id: str) -> Task | None:
        """The session's project's task; None for a missing task or another project's."""
        if "\x00" in task_id or len(task_id) > 64:
            return None
        return self.ledger().get_task(task_id, project_id=session.project_id)

    def page(
        self,
        request: Request,
        template: str,
        session: DashboardSession | None,
        *,
        status: int = 200,
        nav: str = "",
        **context: Any,
    ) -> HTMLResponse:
        """``template`` as a page; ``nav`` is the section the navigation bar marks as the
        current one (``tasks``, ``evals``, ``usage``), none for the sign-in and error pages."""
        html = render(template, request=request, session=session, nav=nav, **context)
        return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)

    def not_found(self, request: Request, session: DashboardSession, what: str) -> HTMLResponse:
        return self.page(request, "not_found.html", session, status=404, what=what)


class SignInRequired(Exception):
    """A dashboard page was asked for without a live session.

    Attributes:
        expired: Whether a session ran out of time (the sign-in page says so).
    """

    def __init__(self, *, expired: bool) -> None:
        self.expired = expired
        super().__init__("sign in" + (" again: the session expired" if expired else ""))


class DashboardRoute(APIRoute):
    """A dashboard page's route: a :class:`SignInRequired` its handler raises sends the
    browser to the sign-in page (:func:`to_sign_in`)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except SignInRequired as exc:
                return to_sign_in(request, expired=exc.expired)

        return handle


async def form_fields(request: Request) -> dict[str, str]:
    """The fields of the form a page posted, each as text."""
    form = await request.form()
    return {key: str(value) for key, value in form.items()}


def form_day(text: str | None, field: str | None = None) -> date | None:
    """The day a date field of a page's query gives (``2026-01-31``); None when it is empty.

    Raises:
        ValueError: Text that is not such a day, in words for the page (naming ``field``,
            the field's label, when given).
    """
    if not text:
        return None
    try:
        return date.fromisoformat(text)
    except ValueError:
        named = f"{field} " if field else ""
        raise ValueError(f"{named}{text[:40]!r} is not a date like 2026-01-31") from None


def dashboard_router() -> APIRouter:
    """A router of dashboard pages, under ``/ui`` and left out of the OpenAPI document."""
    return APIRouter(prefix="/ui", include_in_schema=False, route_class=DashboardRoute)


def to_sign_in(request: Request, *, expired: bool) -> Response:
    """Send a browser without a session to the sign-in page (JSON 401 for the page's script)."""
    if request.headers.get(REFRESH_HEADER) == "1" or "text/html" not in request.headers.get(
        "accept", "text/html"
    ):
        return JSONResponse(
            {"error": {"code": "unauthorized", "message": "sign in again"}},
            status_code=401,
            headers=SECURITY_HEADERS,
        )
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    if request.method != "GET":  # A form posted after the session ended: back to the list.
        target = "/ui"
    location = f"/ui/login?next={quote(target, safe='')}" + ("&expired=1" if expired else "")
    return RedirectResponse(location, status_code=303, headers=SECURITY_HEADERS)


def safe_next(value: str | None) -> str:
    """Where to go after signing in: a dashboard address only, never another site."""
    if not value or not value.startswith("/ui") or value.startswith("//") or "\\" in value:
        return "/ui"
    return value
