"""JSON errors with a stable ``code``: what every error response of the API looks like."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from relaygraph.api._schemas import ErrorBody, shown
from relaygraph.errors import ConfigError, QuotaExceeded
from relaygraph.runner import RequestRefused
from relaygraph.store import DATABASE_RETRY_SECONDS, is_database_unavailable, is_disk_full

log = logging.getLogger("relaygraph.api")

DISK_FULL_RETRY_SECONDS = 60
"""The ``Retry-After`` of a 507: room comes back when an operator (or the retention sweep)
frees some."""

ERROR_CODES: dict[int, str] = {
    401: "`unauthorized`: no key, a malformed header, an unknown or revoked key.",
    404: "`task_not_found` (another project's task too), `approval_not_found`, "
    "`team_not_found` (another project's team too).",
    409: "`thread_busy`, `idempotency_key_reused`, `task_finished`, `not_waiting`, "
    "`team_name_taken`.",
    413: "`body_too_large`: the body is over the server's limit, declared or chunked.",
    422: "`invalid_request` (a missing, unknown or ill-typed field, a body that is not JSON "
    "or nests too deeply, a bad query parameter or header), `invalid_model`, "
    "`model_not_allowed`, `invalid_policy`, `policy_loosens`, `invalid_topology`, "
    "`invalid_team` (a team file's mistake, or a reference the server does not allow).",
    429: "`quota_exceeded`: the project is at one of its quotas, which the message names "
    "(`RELAYGRAPH_PROJECT_MAX_QUEUED` or the operator's for the project: tasks queued; "
    "`RELAYGRAPH_PROJECT_MAX_STREAMS`: open event streams); `budget_exhausted`: the project "
    "spent its daily budget (`RELAYGRAPH_PROJECT_DAILY_COST_USD`) today, UTC. The message "
    "names the quota and its value; `Retry-After` says when to try again (for the budget: "
    "at 00:00 UTC). Nothing is recorded.",
    503: "`server_busy`: the server is near its limit of open files and keeps the rest for "
    "running tasks, so it opens no new event stream now (`Retry-After`); `not_ready`: "
    "the database is unreachable or not migrated (with a broker: or the broker, or the "
    "event listener, is unreachable); `database_unavailable`: the database could not serve "
    "this request now (down, restarting, at its connection limit, or every connection of "
    "this server's pool busy): try again after `Retry-After`; "
    "`broker_unavailable` (with a broker): the task is recorded `queued` but the broker did "
    "not take its message; it is published again later.",
    507: "`insufficient_storage`: the server's disk is full (the ledger's database or the "
    "data directory): nothing of the request was recorded; try again later (`Retry-After`).",
}
"""What each error status means; the OpenAPI document lists it per endpoint."""


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` of an endpoint's errors: each an :class:`ErrorBody`."""
    return {status: {"model": ErrorBody, "description": ERROR_CODES[status]} for status in statuses}


REFUSAL_STATUS = {"invalid": 422, "not_found": 404, "conflict": 409}
"""The HTTP status of each kind of the runner's refusals (``RequestRefused.kind``)."""
REQUEST_FIELDS = {"idempotency_key": "Idempotency-Key"}
"""The runner's request fields that the API takes from elsewhere than the body, as the API
names them; the others are body fields of the same name."""


class ErrorAnswer(Exception):
    """Raised by a route to answer with an error body: HTTP status, stable code, and a
    message naming the bad field.

    The server's side of the error a client reads as :class:`relaygraph.client.ApiError`
    (the same four fields, from the body this answer becomes).
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        field: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field
        self.headers = dict(headers or {})
        """Headers of the answer, such as ``Retry-After``."""

    @classmethod
    def refused(cls, refusal: RequestRefused) -> ErrorAnswer:
        """The answer to a request the runner refused: its kind's status, its code, and its
        field as the API names it."""
        field = refusal.field and REQUEST_FIELDS.get(refusal.field, refusal.field)
        return cls(REFUSAL_STATUS[refusal.kind], refusal.code, str(refusal), field)


def document_errors_only_as_answered(app: FastAPI) -> None:
    """Make the app's OpenAPI document list as errors only what the API answers.

    FastAPI describes a 422 of its own (``HTTPValidationError``) for every endpoint with a
    parameter; this API answers 422 with an :class:`ErrorBody`, on the endpoints that
    declare it, and never on one that does not (a path parameter cannot fail validation).
    """
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = generate()
        for operations in document.get("paths", {}).values():
            for operation in operations.values():
                responses = operation.get("responses", {})
                if "HTTPValidationError" in str(responses.get("422", "")):
                    del responses["422"]
        schemas = document.get("components", {}).get("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        return document

    app.openapi = openapi  # type: ignore[method-assign]


def error_body(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    """The JSON of an error answer. A lone surrogate quoted from the request is written as
    its escape, so that the answer is always valid UTF-8."""
    body: dict[str, Any] = {"code": code, "message": shown(message)}
    if field is not None:
        body["field"] = shown(field)
    return {"error": body}


def _body_unreadable(cause: BaseException | None) -> str | None:
    """Why FastAPI could not parse a JSON body (it answers 400 for these), or None."""
    if isinstance(cause, UnicodeDecodeError):
        return f"the body is not valid UTF-8 ({cause.reason} at byte {cause.start})"
    if isinstance(cause, RecursionError):
        return "the body nests too deeply to parse"
    if isinstance(cause, ValueError):  # Python refuses integers of over 4,300 digits.
        return f"the body is not JSON this server reads: {cause}"
    return None


def one_value_per_query_parameter(request: Request) -> None:
    """Refuse an API request that gives a query parameter twice (``?status=a&status=b``):
    every parameter of the API takes one value, and FastAPI would silently keep the last.

    Raises:
        ErrorAnswer: 422 ``invalid_request`` naming the parameter.
    """
    if not request.url.path.startswith("/v1/"):
        return  # The dashboard's pages read their own forms.
    seen: dict[str, int] = {}
    for name, _ in request.query_params.multi_items():
        seen[name] = seen.get(name, 0) + 1
    for name, count in seen.items():
        if count > 1:
            raise ErrorAnswer(
                422,
                "invalid_request",
                f"query parameter {name!r} is given {count} times; give it once",
                name,
            )


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ErrorAnswer)
    async def _error_answer(request: Request, exc: ErrorAnswer) -> JSONResponse:
        return JSONResponse(
            error_body(exc.code, exc.message, exc.field),
            status_code=exc.status,
            headers=exc.headers,
        )

    @app.exception_handler(RequestRefused)
    async def _refused(request: Request, exc: RequestRefused) -> JSONResponse:
        return await _error_answer(request, ErrorAnswer.refused(exc))

    @app.exception_handler(QuotaExceeded)
    async def _quota(request: Request, exc: QuotaExceeded) -> JSONResponse:
        return JSONResponse(
            error_body(exc.code, str(exc), exc.quota),
            status_code=429,
            headers={"Retry-After": str(exc.retry_after_seconds)},
        )

    @app.exception_handler(ConfigError)
    async def _config_error(request: Request, exc: ConfigError) -> JSONResponse:
        return JSONResponse(error_body("invalid_request", str(exc)), status_code=422)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems, first = [], None
        for err in exc.errors():
            context = err.get("ctx") or {}
            if err["type"] == "json_invalid":  # Its loc is a character offset, not a field.
                problems.append(f"the body is not valid JSON: {context.get('error')}")
                first = first or "body"
                continue
            if "field" in context:  # A check of the whole body that names the field.
                problems.append(err["msg"])
                first = first or context["field"]
                continue
            where, *path = err["loc"] or ("body",)  # body, query, path or header
            if where == "body" and not path and isinstance(err.get("input"), bytes | str):
                # The body was read as text, not JSON: its Content-Type said otherwise.
                kind = request.headers.get("content-type") or "none"
                problems.append(
                    "the body must be a JSON object sent with Content-Type: application/json "
                    f"(the request's Content-Type is {_quoted(kind)})"
                )
                first = first or "body"
                continue
            field = _header_name(str(path[-1])) if where == "header" else _path(path)
            first = first or field
            got = "" if err["type"] == "missing" else f" (got {_quoted(err.get('input'))})"
            problems.append(f"{field}: {err['msg']}{got}")
        return JSONResponse(
            error_body("invalid_request", "; ".join(problems), first), status_code=422
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        unreadable = _body_unreadable(exc.__cause__) if exc.status_code == 400 else None
        if unreadable is not None:
            return JSONResponse(error_body("invalid_request", unreadable, "body"), status_code=422)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # Starlette names the methods of the first route on the path; `Allow` lists
            # those of every route on it (GET and POST /v1/tasks are two routes).
            headers["Allow"] = _allowed_methods(request)
        return JSONResponse(
            error_body(code, str(exc.detail)), status_code=exc.status_code, headers=headers
        )

    @app.exception_handler(OSError)
    @app.exception_handler(SQLAlchemyError)
    @app.exception_handler(psycopg.Error)  # The checkpoints' pool (psycopg_pool).
    async def _storage(request: Request, exc: Exception) -> JSONResponse:
        # Registered by class, so answered here rather than by Starlette's last-resort
        # handler, which logs a traceback per request: a full disk is a state of the
        # server, logged once per request as a line, not a bug.
        if is_disk_full(exc):
            log.error("%s %s: no room on disk: %s", request.method, request.url.path, exc)
            return JSONResponse(
                error_body(
                    "insufficient_storage",
                    "the server's disk is full: nothing of this request was recorded; try "
                    "again later",
                ),
                status_code=507,
                headers={"Retry-After": str(DISK_FULL_RETRY_SECONDS)},
            )
        if is_database_unavailable(exc):
            # Like a full disk, a state of the database, not a bug: a line, no traceback.
            where = f"{request.method} {request.url.path}"
            log.error("%s: the database is unavailable: %s", where, exc)
            return JSONResponse(
                error_body(
                    "database_unavailable",
                    "the database could not serve this request now; try again later",
                ),
                status_code=503,
                headers={"Retry-After": str(DATABASE_RETRY_SECONDS)},
            )
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return await _bug(request, exc)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        # Starlette logs the traceback and re-raises; the client still gets the error body.
        return JSONResponse(
            error_body("internal_error", "the server failed on this request; see its log"),
            status_code=500,
        )


_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def _allowed_methods(request: Request) -> str:
    """The methods some route takes on the request's path: each is asked whether it would
    match the request in that method (the routes of included routers as well)."""
    routes = request.app.router.routes
    allowed = [
        method
        for method in _METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes
        )
    ]
    return ", ".join(allowed)


def _path(loc: list[int | str]) -> str:
    """A body location as the docs write it: ``metadata.tags[1]``; ``body`` for the whole."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text or "body"


def _header_name(name: str) -> str:
    """``idempotency-key`` as the header is spelled: ``Idempotency-Key``."""
    parts = name.replace("_", "-").split("-")
    return (
        "Last-Event-ID"
        if parts == ["last", "event", "id"]
        else "-".join(part.capitalize() for part in parts)
    )


def _quoted(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "…"


class BodyLimit:
    """Refuses request bodies over ``limit`` bytes with 413, whether or not they declare a
    Content-Length.

    A body that declares none (chunked) is read here first, up to the limit, and handed on
    whole: refused while the app parsed it, FastAPI would answer 400 for a body it could
    not read. Memory stays bounded by the limit.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit():
            if int(declared) > self.limit:
                await self._refuse(send)
                return
            await self.app(scope, receive, send)
            return
        buffered: list[Message] = []
        seen = 0
        while True:
            message = await receive()
            buffered.append(message)
            if message["type"] != "http.request":
                break  # The client went away: the app sees the disconnect.
            seen += len(message.get("body", b""))
            if seen > self.limit:
                await self._refuse(send)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return buffered.pop(0) if buffered else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send) -> None:
        response = JSONResponse(
            error_body("body_too_large", f"the request body is over {self.limit} bytes"),
            status_code=413,
        )
        await response({"type": "http"}, _no_receive, send)


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}
