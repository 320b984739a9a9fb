"""``GET /v1/tasks/{id}/events``: a task's events as they happen (Server-Sent Events)."""

import re
from typing import Annotated

from anyio import to_thread
from fastapi import APIRouter, Depends, Header, Query, Request
from sse_starlette.sse import EventSourceResponse

from relaygraph.api._auth import own_task
from relaygraph.api._errors import ErrorAnswer, error_responses
from relaygraph.api._schemas import SSE_EVENT_SCHEMA
from relaygraph.api._state import ServiceState
from relaygraph.api._streams import CountedEventSource
from relaygraph.api._tasks_service import follow_events
from relaygraph.store import Project

__all__ = [
    "MAX_EVENT_SEQ",
    "SSE_FALLBACK_POLL_SECONDS",
    "SSE_NOTICE_TIMEOUT_SECONDS",
    "SSE_POLL_SECONDS",
    "events_router",
]

SSE_POLL_SECONDS = 0.2
"""Between reads of the ledger when this server runs the tasks itself."""
SSE_NOTICE_TIMEOUT_SECONDS = 15.0
"""The worker mode: the longest a stream waits for an event notice before it reads the ledger
anyway (a safety net; the notices set the pace)."""
SSE_FALLBACK_POLL_SECONDS = 1.0
"""The worker mode while the event listener's connection is down: between reads of the
ledger. Slower than in process: every API server's streams poll the one shared database."""
MAX_EVENT_SEQ = 2**31 - 1
"""The largest event sequence number: the ledger keeps it in a 32-bit integer column."""
EVENT_ID = re.compile(r"[0-9]{1,19}")


def events_router(state: ServiceState) -> APIRouter:
    """``GET /v1/tasks/{id}/events``."""
    router = APIRouter()
    ProjectDep = Annotated[Project, Depends(state.project_of)]

    @router.get(
        "/v1/tasks/{task_id}/events",
        response_class=EventSourceResponse,
        responses={
            200: {
                "description": "Server-Sent Events: `id` the event's sequence number, `event` "
                "its type, `data` the event as JSON. A finished task's stream closes after "
                "its last event.",
                "content": {"text/event-stream": {"schema": SSE_EVENT_SCHEMA}},
            },
            **error_responses(401, 404, 422, 429, 503),
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
        task = await to_thread.run_sync(lambda: own_task(state.ledger(), task_id, project))
        resumed = _event_id(last_event_id)  # Checked even when `after` is given.
        start = after if after is not None else resumed
        slot = state.streams.admit(project.id, project.name)
        notices = state.listener
        # With the worker mode's notices, polling is only what the stream falls back on
        # while the listener's connection is down.
        poll_seconds = SSE_POLL_SECONDS if notices is None else SSE_FALLBACK_POLL_SECONDS
        return CountedEventSource(
            follow_events(
                state.ledger,
                task,
                after=start,
                request=request,
                poll_seconds=poll_seconds,
                notices=notices,
                notice_timeout_seconds=SSE_NOTICE_TIMEOUT_SECONDS,
            ),
            slot=slot,
        )

    return router


def _event_id(value: str | None) -> int:
    if value is None or not value.strip():
        return 0
    if not EVENT_ID.fullmatch(value.strip()) or int(value) > MAX_EVENT_SEQ:
        raise ErrorAnswer(
            422,
            "invalid_request",
            f"Last-Event-ID {value[:40]!r} is not a sequence number (0 to {MAX_EVENT_SEQ})",
            "Last-Event-ID",
        )
    return int(value)
