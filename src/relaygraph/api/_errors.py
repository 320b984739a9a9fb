"""JSON errors with a stable ``code``: what every error response of the API looks like."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from relaygraph.errors import ConfigError


class ApiError(Exception):
    """An error answer: HTTP status, stable code, message naming the bad field."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field


def error_body(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message}
    if field is not None:
        body["field"] = field
    return {"error": body}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(error_body(exc.code, exc.message, exc.field), status_code=exc.status)

    @app.exception_handler(ConfigError)
    async def _config_error(request: Request, exc: ConfigError) -> JSONResponse:
        return JSONResponse(error_body("invalid_request", str(exc)), status_code=422)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems, first = [], None
        for err in exc.errors():
            if err["type"] == "json_invalid":  # Its loc is a character offset, not a field.
                problems.append(f"the body is not valid JSON: {err.get('ctx', {}).get('error')}")
                first = first or "body"
                continue
            loc = [str(p) for p in err["loc"] if p != "body"]
            field = ".".join(loc) or "body"
            first = first or field
            shown = "" if err["type"] == "missing" else f" (got {err.get('input')!r})"
            problems.append(f"{field}: {err['msg']}{shown}")
        return JSONResponse(
            error_body("invalid_request", "; ".join(problems), first), status_code=422
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse(error_body(code, str(exc.detail)), status_code=exc.status_code)


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
