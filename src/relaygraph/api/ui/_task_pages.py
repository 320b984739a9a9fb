"""The task list and the task page, with what they post: decisions and cancels."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, time, timedelta
from time import monotonic
from typing import Any
from urllib.parse import urlencode

from anyio import to_thread
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from pydantic import ValidationError
from sse_starlette.sse import EventSourceResponse

from relaygraph.api._errors import ErrorAnswer, error_body
from relaygraph.api._schemas import DecisionIn
from relaygraph.api._streams import CountedEventSource
from relaygraph.api._tasks_service import decide, follow_events
from relaygraph.api.ui._dashboard import (
    SECURITY_HEADERS,
    Dashboard,
    dashboard_router,
    form_day,
    form_fields,
)
from relaygraph.api.ui._queries import (
    APPROVAL_FILTERS,
    TaskFilters,
    agent_names,
    artifact_response,
    find_tasks,
    read_artifact,
)
from relaygraph.api.ui._sessions import COOKIE, DashboardSession, same_token
from relaygraph.api.ui._task_view import TaskView, task_view
from relaygraph.api.ui._templates import render
from relaygraph.errors import ConfigError
from relaygraph.store import FINISHED_STATUSES, TASK_STATUSES, Task

PAGE_SIZE = 25
EVENT_POLL_SECONDS = 0.25
SESSION_CHECK_SECONDS = 5.0
TASK_SECTIONS = (
    "summary",
    "graph",
    "approvals",
    "violations",
    "budgets",
    "model_calls",
    "waterfall",
    "timeline",
    "answer",
    "policy",
)
"""The parts of the task page that follow the task live, each a template ``_task_<name>``."""
FILTER_KEYS = ("status", "agent", "team", "approvals", "violation", "since", "until", "q")


def task_router(dashboard: Dashboard) -> APIRouter:
    router = dashboard_router()

    @router.get("")
    def tasks(request: Request) -> Response:
        session = dashboard.signed_in(request)
        query = request.query_params
        error = None
        try:
            filters = _filters(query)
        except ValueError as exc:
            filters, error = TaskFilters(), str(exc)
        cursor = query.get("cursor") or None
        try:
            found = find_tasks(
                dashboard.ledger(), session.project_id, filters, limit=PAGE_SIZE, cursor=cursor
            )
        except ConfigError:
            found = find_tasks(dashboard.ledger(), session.project_id, filters, limit=PAGE_SIZE)
            error = "That page link is no longer valid; this is the first page."
            cursor = None
        live = cursor is None or any(t.status not in FINISHED_STATUSES for t in found.tasks)
        kept = {k: query[k] for k in FILTER_KEYS if query.get(k)}
        context: dict[str, Any] = {
            "found": found,
            "filters": filters,
            "query": query,
            "filtered": bool(kept),
            "cursor": cursor,
            "first_url": _url(kept),
            "next_url": _url({**kept, "cursor": found.next_cursor or ""}),
            "refresh_url": _url({**kept, "cursor": cursor or "", "fragment": "rows"}),
            "live": live,
            "statuses": TASK_STATUSES,
            "violation_kinds": _violation_kinds(),
            "refresh_ms": int(dashboard.settings.refresh_seconds * 1000),
            "error": error,
            "nav": "tasks",
        }
        if query.get("fragment") == "rows":
            html = render("_task_rows.html", request=request, session=session, **context)
            return JSONResponse({"html": html, "live": live}, headers=SECURITY_HEADERS)
        # The agent filter suggests the agents of the project's own tasks (of any team).
        agents = agent_names(dashboard.ledger(), session.project_id)
        return dashboard.page(request, "tasks.html", session, agents=agents, **context)

    @router.get("/")
    def tasks_slash() -> Response:
        return RedirectResponse("/ui", status_code=308)

    @router.get("/tasks/{task_id}")
    def task(task_id: str, request: Request) -> Response:
        session = dashboard.signed_in(request)
        found = dashboard.own_task(session, task_id)
        if found is None:
            if request.query_params.get("fragment"):
                return JSONResponse({"error": {"code": "task_not_found"}}, status_code=404)
            return dashboard.not_found(request, session, f"task {task_id}")
        view = task_view(dashboard.ledger(), dashboard.home, found)
        context: dict[str, Any] = {"view": view, "nav": "tasks", "form_error": None}
        if request.query_params.get("fragment"):
            return JSONResponse(_sections(request, session, context), headers=SECURITY_HEADERS)
        return dashboard.page(request, "task.html", session, **context)

    @router.get("/tasks/{task_id}/events")
    async def events(task_id: str, request: Request) -> Response:
        session = await to_thread.run_sync(dashboard.signed_in, request)
        found = await to_thread.run_sync(dashboard.own_task, session, task_id)
        if found is None:
            return JSONResponse({"error": {"code": "task_not_found"}}, status_code=404)
        after = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
        if not after.isdigit() or len(after) > 10:
            return JSONResponse({"error": {"code": "invalid_request"}}, status_code=422)
        slot = None
        if dashboard.streams is not None:
            try:
                slot = dashboard.streams.admit(session.project_id, session.project_name)
            except ErrorAnswer as refused:
                return JSONResponse(
                    error_body(refused.code, refused.message),
                    status_code=refused.status,
                    headers=refused.headers,
                )
        events = follow_events(
            dashboard.ledger,
            found,
            after=int(after),
            request=request,
            poll_seconds=EVENT_POLL_SECONDS,
            still_wanted=_session_alive(dashboard, request),
            notices=dashboard.notices(),
        )
        headers = {k: v for k, v in SECURITY_HEADERS.items() if k != "Cache-Control"}
        if slot is None:
            return EventSourceResponse(events, headers=headers)
        return CountedEventSource(events, slot=slot, headers=headers)

    @router.post("/tasks/{task_id}/approvals/{approval_id}")
    async def decide(task_id: str, approval_id: str, request: Request) -> Response:
        fields = await form_fields(request)
        return await to_thread.run_sync(_decide, dashboard, request, task_id, approval_id, fields)

    @router.post("/tasks/{task_id}/cancel")
    async def cancel(task_id: str, request: Request) -> Response:
        fields = await form_fields(request)
        token, confirmed = fields.get("csrf", ""), fields.get("confirm") == "yes"
        return await to_thread.run_sync(_cancel, dashboard, request, task_id, token, confirmed)

    @router.get("/tasks/{task_id}/artifacts/{name}")
    def artifact(task_id: str, name: str, request: Request) -> Response:
        session = dashboard.signed_in(request)
        if dashboard.own_task(session, task_id) is None:
            return dashboard.not_found(request, session, f"task {task_id}")
        try:
            data = read_artifact(dashboard.home, task_id, name)
        except ErrorAnswer:
            return dashboard.not_found(request, session, f"artifact {name}")
        return artifact_response(data, name, download=bool(request.query_params.get("download")))

    return router


def _url(query: dict[str, str]) -> str:
    kept = {k: v for k, v in query.items() if v}
    return f"/ui?{urlencode(kept)}" if kept else "/ui"


def _violation_kinds() -> tuple[str, ...]:
    from relaygraph.evals import VIOLATION_KINDS

    return tuple(VIOLATION_KINDS)


def _filters(query: Any) -> TaskFilters:
    """The list's filters from its query string; dates are whole UTC days, both included.

    Raises:
        ValueError: A filter that cannot be used, in words for the page.
    """
    status = query.get("status") or None
    if status is not None and status not in TASK_STATUSES:
        raise ValueError(f"status {status[:40]!r} is not one of {', '.join(TASK_STATUSES)}")
    since, until = form_day(query.get("since"), "from"), form_day(query.get("until"), "to")
    if since and until and since > until:
        raise ValueError("the 'from' day is after the 'to' day")
    approvals = query.get("approvals") or None
    if approvals is not None and approvals not in APPROVAL_FILTERS:
        raise ValueError(f"approvals {approvals[:40]!r} is not one of any, rejected")
    return TaskFilters(
        status=status,
        agent=(query.get("agent") or "").strip()[:64] or None,
        team=(query.get("team") or "").strip()[:64] or None,
        approvals=approvals,
        violation=(query.get("violation") or "").strip()[:64] or None,
        since=datetime.combine(since, time(), UTC) if since else None,
        until=datetime.combine(until + timedelta(days=1), time(), UTC) if until else None,
        text=(query.get("q") or "").strip()[:200] or None,
    )


def _sections(request: Request, session: DashboardSession, context: dict[str, Any]) -> dict:
    view: TaskView = context["view"]
    return {
        "status": view.task.status,
        "finished": view.task.status in FINISHED_STATUSES,
        "last_event_seq": view.task.last_event_seq,
        "sections": {
            name: render(f"_task_{name}.html", request=request, session=session, **context)
            for name in TASK_SECTIONS
        },
    }


def _session_alive(dashboard: Dashboard, request: Request) -> Callable[[], bool]:
    """Whether the request's session is still open, asked at most every
    ``SESSION_CHECK_SECONDS`` (a stream outlives the session that opened it otherwise)."""
    checked = monotonic()

    def alive() -> bool:
        nonlocal checked
        if monotonic() - checked <= SESSION_CHECK_SECONDS:
            return True
        checked = monotonic()
        session, _ = dashboard.sessions.find(request.cookies.get(COOKIE), touch=False)
        return session is not None

    return alive


def _posted(
    dashboard: Dashboard, request: Request, task_id: str, token: str
) -> tuple[DashboardSession, Task] | Response:
    """The session and task a form post acts on, or the answer that refuses it."""
    session = dashboard.signed_in(request)
    if not same_token(token, session.csrf):
        return _answer(request, 403, "forbidden", "The form had expired; reload the page.", None)
    task = dashboard.own_task(session, task_id)
    if task is None:
        return _answer(request, 404, "task_not_found", f"no task {task_id!r}", None)
    return session, task


def _decide(
    dashboard: Dashboard, request: Request, task_id: str, approval_id: str, form: dict[str, str]
) -> Response:
    posted = _posted(dashboard, request, task_id, form.get("csrf", ""))
    if isinstance(posted, Response):
        return posted
    session, task = posted
    try:
        body = _decision(form)
        decide(
            ledger=dashboard.ledger(),
            dispatch=dashboard.dispatch(),
            task_team=dashboard.task_team,
            task=task,
            approval_id=approval_id,
            body=body,
            decided_by=session.project_name,
        )
    except ErrorAnswer as exc:
        if _wants_json(request):
            return _answer(request, exc.status, exc.code, exc.message, exc.field)
        view = task_view(dashboard.ledger(), dashboard.home, task)
        error = {"approval": approval_id, "message": exc.message, "field": exc.field}
        return dashboard.page(
            request,
            "task.html",
            session,
            status=exc.status,
            view=view,
            nav="tasks",
            form_error=error,
        )
    if _wants_json(request):
        return JSONResponse({"ok": True}, status_code=202, headers=SECURITY_HEADERS)
    return RedirectResponse(f"/ui/tasks/{task_id}", status_code=303, headers=SECURITY_HEADERS)


def _decision(form: dict[str, str]) -> DecisionIn:
    """The decision a form posted, as the API's body.

    Raises:
        ErrorAnswer: 422 naming the field: arguments that are not a JSON object, a reject
            without a reason, an unknown decision.
    """
    decision = form.get("decision", "")
    reason = form.get("reason", "").strip() or None
    args = None
    if decision == "edit":
        try:
            args = json.loads(form.get("args", ""))
        except json.JSONDecodeError as exc:
            raise ErrorAnswer(
                422, "invalid_request", f"the arguments are not JSON: {exc}", "args"
            ) from None
        if not isinstance(args, dict):
            raise ErrorAnswer(422, "invalid_request", "the arguments must be a JSON object", "args")
    if decision == "reject" and reason is None:
        raise ErrorAnswer(422, "invalid_request", "say why you reject it", "reason")
    try:
        return DecisionIn.model_validate({"decision": decision, "args": args, "reason": reason})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "decision"
        raise ErrorAnswer(422, "invalid_request", f"{field}: {first['msg']}", field) from None


def _cancel(
    dashboard: Dashboard, request: Request, task_id: str, token: str, confirmed: bool
) -> Response:
    posted = _posted(dashboard, request, task_id, token)
    if isinstance(posted, Response):
        return posted
    session, task = posted
    if not confirmed:
        # A cancel cannot be undone: the form asks for a tick, and so does the server.
        return _answer(request, 422, "invalid_request", "tick 'Yes, cancel this task'", "confirm")
    if task.finished:
        return _answer(request, 409, "task_finished", f"the task already {task.status}", None)
    dashboard.dispatch().cancel(task.id, by=session.project_name, via="dashboard")
    if _wants_json(request):
        return JSONResponse({"ok": True}, status_code=202, headers=SECURITY_HEADERS)
    return RedirectResponse(f"/ui/tasks/{task_id}", status_code=303, headers=SECURITY_HEADERS)


def _wants_json(request: Request) -> bool:
    return "application/json" in request.headers.get("accept", "")


def _answer(request: Request, status: int, code: str, message: str, field: str | None) -> Response:
    body = {"error": {"code": code, "message": message, "field": field}}
    if _wants_json(request):
        return JSONResponse(body, status_code=status, headers=SECURITY_HEADERS)
    return Response(message, status_code=status, media_type="text/plain; charset=utf-8")
