"""The Chat Completions double's HTTP side: the threaded server and its request handler,
which routes each request to :class:`~tests.openai_server.FakeOpenAI` and writes its answer,
faults included (tests/openai_server.py)."""

from __future__ import annotations

import json
import socket
import threading
import time
from contextlib import suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ._openai_answers import _unfinished
from ._openai_faults import ANSWER_FAULT_KINDS
from ._openai_requests import _APIError, _bad_request

if TYPE_CHECKING:
    from .openai_server import FakeOpenAI

_SERVER_ERRORS = {
    "500": "The server had an error while processing your request. Sorry about that!",
    "503": "The engine is currently overloaded, please try again later.",
}
"""The message of each server-error fault, in OpenAI's words."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type, app: FakeOpenAI) -> None:
        self.app = app
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, handler)

    def track(self, connection: socket.socket, *, add: bool) -> None:
        with self._connections_lock:
            if add:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)

    def drop_connections(self) -> None:
        """End keep-alive connections so their handler threads exit."""
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "relaygraph-fake-openai/1"
    timeout = 30  # idle keep-alive connections end after this many seconds
    # An answer goes out in two writes (the head, then the body). With Nagle's algorithm
    # the body waits for the ACK of the head, which a keep-alive client delays by up to
    # 40 ms: every call would take that much longer than its delay.
    disable_nagle_algorithm = True
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, add=False)

    def handle(self) -> None:
        with suppress(ConnectionResetError, BrokenPipeError):  # the client hung up
            super().handle()

    def log_message(self, format: str, *args: Any) -> None:  # quiet test output
        pass

    # -- plumbing ----------------------------------------------------------------------

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _proxy_headers(self) -> None:
        if self.server.app.profile.litellm:
            self.send_header("x-litellm-version", "1.74.0")

    def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-request-id", f"req_{id(payload):x}")
        self._proxy_headers()
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_stream(self, chunks: list[dict[str, Any]]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self._proxy_headers()
        self.end_headers()
        events = [f"data: {json.dumps(c)}\n\n".encode() for c in chunks]
        events.append(b"data: [DONE]\n\n")
        for event in events:
            self.wfile.write(f"{len(event):X}\r\n".encode() + event + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _hang_up(self) -> None:
        self.close_connection = True
        with suppress(OSError):
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)

    def _inject(self, fault: str, body: dict[str, Any]) -> None:
        """Answer with ``fault`` instead of the script's turn (which stays unplayed)."""
        faults = self.server.app.faults
        assert faults is not None
        if fault == "429":
            err = _APIError(
                429,
                f"Rate limit reached for requests. Please try again in {faults.retry_after:g}s.",
                type_="requests",
                code="rate_limit_exceeded",
            )
            self._send_json(429, err.body, {"Retry-After": f"{faults.retry_after:g}"})
        elif fault in _SERVER_ERRORS:
            status = int(fault)
            err = _APIError(status, _SERVER_ERRORS[fault], type_="server_error")
            self._send_json(status, err.body)
        elif fault == "timeout":
            time.sleep(faults.stall_seconds)
            self._hang_up()
        elif fault in ("empty_choices", "null_message"):
            choices = (
                []
                if fault == "empty_choices"
                else [{"index": 0, "message": None, "finish_reason": "stop", "logprobs": None}]
            )
            answer = {
                "id": "chatcmpl-malformed",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model"),
                "choices": choices,
                "usage": {"prompt_tokens": 11, "completion_tokens": 0, "total_tokens": 11},
            }
            self._send_json(200, answer)
        elif fault in ("not_json", "html"):
            page = (
                b"<html><body><h1>502 Bad Gateway</h1></body></html>"
                if fault == "html"
                else b"upstream said: ok"
            )
            kind = "text/html" if fault == "html" else "application/json"
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            with suppress(OSError):
                self.wfile.write(page)
        elif body.get("stream"):  # truncated: half a stream, no end
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            head = {
                "id": "chatcmpl-cut",
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": body.get("model"),
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Half an"}}],
            }
            event = f"data: {json.dumps(head)}\n\n".encode()
            with suppress(OSError):
                self.wfile.write(f"{len(event):X}\r\n".encode() + event + b"\r\n")
            self._hang_up()
        else:  # truncated: half a body
            data = json.dumps({"id": "chatcmpl-cut", "object": "chat.completion"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data) * 2))
            self.end_headers()
            with suppress(OSError):
                self.wfile.write(data)
            self._hang_up()

    def _authorized(self) -> bool:
        scheme, _, token = self.headers.get("Authorization", "").partition(" ")
        if scheme == "Bearer" and token.strip():
            return True
        self._send_json(
            401,
            _APIError(
                401,
                "You didn't provide an API key. You need to provide your API key in an "
                "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
            ).body,
        )
        return False

    def _not_found(self, method: str) -> None:
        err = _APIError(404, f"Invalid URL ({method} {urlsplit(self.path).path})")
        self._send_json(404, err.body)

    # -- endpoints ---------------------------------------------------------------------

    def do_GET(self) -> None:
        path = urlsplit(self.path).path.rstrip("/")
        if not path.startswith("/v1/models"):
            self._not_found("GET")
            return
        if not self._authorized():
            return
        app = self.server.app
        models = [
            {"id": name, "object": "model", "created": 0, "owned_by": "relaygraph"}
            for name in app.models
        ]
        if path == "/v1/models":
            self._send_json(200, {"object": "list", "data": models})
            return
        wanted = path.removeprefix("/v1/models/")
        for model in models:
            if model["id"] == wanted:
                self._send_json(200, model)
                return
        err = _APIError(
            404,
            f"The model `{wanted}` does not exist or you do not have access to it.",
            code="model_not_found",
        )
        self._send_json(404, err.body)

    def do_POST(self) -> None:
        raw = self._read_body()
        if urlsplit(self.path).path.rstrip("/") != "/v1/chat/completions":
            self._not_found("POST")
            return
        if not self._authorized():
            return
        app = self.server.app
        entry: dict[str, Any] | None = None
        try:
            try:
                body = json.loads(raw)
            except ValueError:
                raise _bad_request(
                    "We could not parse the JSON body of your request. (HINT: This likely "
                    "means you aren't using your HTTP library correctly. The OpenAI API "
                    "expects a JSON payload, but what was sent was not valid JSON.)"
                ) from None
            if not isinstance(body, dict):
                raise _bad_request("The request body must be a JSON object.")
            entry = app._record(body)
            if entry["fault"] == "unfinished_stream" and body.get("stream"):
                completion, chunks = app._answer(body, advance=False)
                assert chunks is not None
                self._send_stream(_unfinished(chunks))
                return
            if entry["fault"] == "broken_arguments" and not body.get("stream"):
                completion, _ = app._answer(body)
                for call in completion["choices"][0]["message"].get("tool_calls") or []:
                    arguments = call["function"]["arguments"]
                    call["function"]["arguments"] = arguments[: len(arguments) // 2]
                self._send_json(200, completion)
                return
            if entry["fault"] not in (None, *ANSWER_FAULT_KINDS):
                self._inject(entry["fault"], body)
                return
            if app.delay_seconds:
                time.sleep(app.delay_seconds)  # The model thinks; other requests go on.
            completion, chunks = app._answer(body)
            entry["status"], entry["usage"] = 200, completion["usage"]
        except _APIError as err:
            if entry is not None:
                entry["status"] = err.status
            self._send_json(err.status, err.body)
            return
        except Exception as exc:  # a server bug: fail the test at once, without retries
            bug = _APIError(500, f"fake OpenAI server error: {exc!r}", type_="server_error")
            self._send_json(500, bug.body, {"x-should-retry": "false"})
            return
        try:
            if chunks is None:
                self._send_json(200, completion)
            else:
                self._send_stream(chunks)
        except (BrokenPipeError, ConnectionResetError):  # the client hung up early
            self.close_connection = True
