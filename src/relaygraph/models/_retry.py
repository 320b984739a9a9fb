"""Retries of a model call's HTTP request: only what may pass, after the wait the server asks.

The OpenAI SDK's own retries are turned off (``max_retries=0``) and these take their place,
one layer below, in the HTTP client the SDK is given (as pydantic-ai's ``TenacityTransport``
does). They differ where it matters for servers other than OpenAI's:

- a 5xx whose body reports a validation error of the request is not retried: llama-cpp-python
  answers 500 to a ``response_format`` it does not know, and the same body fails again;
- ``Retry-After`` (or ``retry-after-ms``) is waited for as asked; a wait longer than
  :attr:`RetryPolicy.max_retry_after` is not waited for at all: the call fails with the
  server's answer instead of retrying early;
- a truncated body of a non-streamed answer is retried (it is read here, where the request
  can still be sent again).

A call retried until it succeeded is one call to the caller: usage and cost come from its
one answer. Each retry is reported (:class:`RetryNote`) to the model that made the call
(:func:`reporting_retries`), which sends it on as a ``model_retry`` event.

The clients are the process's, not a model's: a service that builds its models per task (a
team cache miss, a model picked per request) would otherwise pay for a new TLS context (the
CA bundle is loaded each time) and new connections with every model. :func:`shared_client`
hands the models of one server, timeout and retry policy one sync client and its connection
pool; async clients stay one per model, since their connections belong to the event loop
that opened them (a pooled connection used from another loop fails with "Event loop is
closed"), but share the process's TLS context (:func:`tls_context`).
"""

from __future__ import annotations

import asyncio
import email.utils
import os
import random
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx2
import openai

from relaygraph._calls import Call, Steps, run_async, run_sync
from relaygraph._deadline import seconds_left
from relaygraph.models._errors import server_message

__all__ = [
    "RETRY_STATUSES",
    "RetryNote",
    "RetryPolicy",
    "RetryingAsyncClient",
    "RetryingClient",
    "reporting_retries",
    "shared_client",
    "tls_context",
]

RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})
"""Statuses that may pass on a second try (as the OpenAI SDK has them, 5xx spelled out)."""
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    httpx2.TimeoutException,
    httpx2.NetworkError,
    httpx2.RemoteProtocolError,
)
"""Failures with no answer: a timeout, a refused or dropped connection, a cut-off body."""

attempts_made: ContextVar[int] = ContextVar("relaygraph_model_attempts", default=1)
"""How many times the last request of this context was sent (read after a failure)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """When and how long to wait before sending a failed request again."""

    max_retries: int = 2
    base_delay: float = 0.5
    """Seconds before the first retry without ``Retry-After``; doubled each time, jittered."""
    max_delay: float = 8.0
    """The longest wait of the backoff."""
    max_retry_after: float = 60.0
    """The longest ``Retry-After`` waited for; a server asking more fails the call."""

    def backoff(self, attempt: int) -> float:
        delay = min(self.base_delay * 2**attempt, self.max_delay)
        return delay * (0.75 + random.random() / 2)  # jitter


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryNote:
    """One failed attempt that will be retried."""

    attempt: int
    """The attempt that failed, from 1."""
    status: int | None
    """Its HTTP status; None when no answer came."""
    error: str
    wait_seconds: float
    retry_after: float | None = None
    """The server's ``Retry-After``, when it sent one."""


def retry_after(headers: Any) -> float | None:
    """Seconds the server asks to wait (``retry-after-ms``, ``retry-after`` in seconds or as
    an HTTP date), or None."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(float(millis) / 1000, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def is_request_error(text: str) -> bool:
    """Whether a 5xx body says the request itself is invalid (it would fail again)."""
    lowered = text.lower()
    return "validation error" in lowered or "'loc': ('body'" in lowered


def _decide(response: Any, attempt: int, policy: RetryPolicy) -> tuple[float | None, float | None]:
    """``(wait, retry_after)`` for a failed response; wait None: do not retry."""
    status = response.status_code
    should = response.headers.get("x-should-retry")
    if should == "false":
        return None, None
    if should != "true":
        if status not in RETRY_STATUSES:
            return None, None
        if status >= 500 and is_request_error(response.text):
            return None, None
    asked = retry_after(response.headers)
    if asked is None:
        return policy.backoff(attempt), None
    return (asked if asked <= policy.max_retry_after else None), asked


def _describe(response: Any) -> str:
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    return server_message(body, response.reason_phrase)


def _no_answer(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class TimeLimitReached(httpx2.TimeoutException):
    """The task's time limit (``max_seconds``) left no time for this request, or ran out
    while it was made (see :mod:`relaygraph._deadline`)."""


def _within_deadline(request: Any) -> None:
    """Give ``request`` no more time than the task's limit leaves: each of its timeouts (the
    connection, each read and write) at most the time left.

    Raises:
        TimeLimitReached: No time is left.
    """
    left = seconds_left()
    if left is None:
        return
    if left <= 0:
        raise TimeLimitReached("the task's time limit (max_seconds) left no time for the call")
    timeouts = dict(request.extensions.get("timeout") or {})
    request.extensions["timeout"] = {
        name: left if value is None else min(value, left)
        for name, value in (timeouts or dict.fromkeys(("connect", "read", "write", "pool"))).items()
    }


def _retry_fits(wait: float) -> bool:
    """Whether a retry after ``wait`` seconds can still end before the task's deadline."""
    left = seconds_left()
    return left is None or wait < left


OnRetry = Callable[[RetryNote], None]

_reporter: ContextVar[OnRetry | None] = ContextVar("relaygraph_retry_reporter", default=None)


@contextmanager
def reporting_retries(on_retry: OnRetry) -> Iterator[None]:
    """Send the retries of the requests made in this block (in this context) to
    ``on_retry``: the model that calls, since one client serves the models of every role."""
    token = _reporter.set(on_retry)
    try:
        yield
    finally:
        _reporter.reset(token)


def _report(note: RetryNote) -> None:
    on_retry = _reporter.get()
    if on_retry is not None:
        on_retry(note)


def _attempts(policy: RetryPolicy, request: Any, send: Call, *, stream: bool) -> Steps[Any]:
    """A request's attempts, written once as steps (:mod:`relaygraph._calls`) for the sync
    client and the async one: ``send`` sends it once; a failure that may pass on another
    try is reported and waited for, while the policy and the task's time limit allow.

    Returns the last attempt's response (an error status, when no retry was left or would
    help: the SDK raises it), or raises the last attempt's failure with no answer
    (:data:`TRANSIENT_ERRORS`).
    """
    attempt = 0
    while True:
        attempts_made.set(attempt + 1)
        last = attempt >= policy.max_retries
        _within_deadline(request)
        try:
            response = yield send
        except TRANSIENT_ERRORS as exc:
            if last or not _retry_fits(policy.backoff(attempt)):
                raise
            note = RetryNote(
                attempt=attempt + 1,
                status=None,
                error=_no_answer(exc),
                wait_seconds=policy.backoff(attempt),
            )
        else:
            if last or response.status_code < 400:
                return response
            if stream:
                yield Call(response.read, response.aread)
            wait, asked = _decide(response, attempt, policy)
            if wait is None or not _retry_fits(wait):
                return response
            note = RetryNote(
                attempt=attempt + 1,
                status=response.status_code,
                error=_describe(response),
                wait_seconds=wait,
                retry_after=asked,
            )
            yield Call(response.close, response.aclose)
        _report(note)
        yield Call(
            partial(time.sleep, note.wait_seconds), partial(asyncio.sleep, note.wait_seconds)
        )
        attempt += 1


def _no_sync() -> Any:
    raise RuntimeError("the async client makes no call on the thread")


async def _no_async() -> Any:
    raise RuntimeError("the sync client makes no call on the event loop")


CONNECTION_LIMITS = httpx2.Limits(max_connections=1000, max_keepalive_connections=1000)
"""The SDK's limits (``openai.DEFAULT_CONNECTION_LIMITS``) but for the connections kept
open between calls: the SDK keeps 100, and a model that a server's hundreds of tasks in
flight call at once would open a new connection for every call past the hundredth. An idle
connection still closes after httpx's keep-alive expiry (5 s)."""


class _WithRetryPolicy:
    """What the sync client and the async one share: the policy their attempts follow,
    given beside the SDK client's own arguments, and :data:`CONNECTION_LIMITS`."""

    def __init__(self, *, policy: RetryPolicy, **kwargs: Any) -> None:
        kwargs.setdefault("limits", CONNECTION_LIMITS)
        super().__init__(**kwargs)
        self._policy = policy


class RetryingClient(_WithRetryPolicy, openai.DefaultHttpxClient):
    """The SDK's HTTP client, sending a failed request again where that may help, and
    reporting each retry to the caller's :func:`reporting_retries`."""

    def __del__(self) -> None:
        # A client dropped with its model (one not shared) closes its connections, as the
        # SDK's own client does.
        with suppress(Exception):
            if not self.is_closed:
                self.close()

    def send(self, request: Any, *, stream: bool = False, **kwargs: Any) -> Any:
        parent = super().send
        sending = Call(lambda: parent(request, stream=stream, **kwargs), _no_async)
        return run_sync(_attempts(self._policy, request, sending, stream=stream))


class RetryingAsyncClient(_WithRetryPolicy, openai.DefaultAsyncHttpxClient):
    """:class:`RetryingClient` for the SDK's async client."""

    def __del__(self) -> None:
        with suppress(Exception):
            if not self.is_closed:
                asyncio.get_running_loop().create_task(self.aclose())

    async def send(self, request: Any, *, stream: bool = False, **kwargs: Any) -> Any:
        parent = super().send
        sending = Call(_no_sync, lambda: parent(request, stream=stream, **kwargs))
        return await run_async(_attempts(self._policy, request, sending, stream=stream))


def _environment() -> tuple[Any, ...]:
    """What of the environment a new client reads: its proxies (``HTTPS_PROXY``,
    ``NO_PROXY``, ...) and its CA certificates (``SSL_CERT_FILE``, ``SSL_CERT_DIR``)."""
    return (
        tuple(sorted(urllib.request.getproxies().items())),
        os.environ.get("SSL_CERT_FILE"),
        os.environ.get("SSL_CERT_DIR"),
    )


_tls_contexts: dict[tuple[Any, ...], ssl.SSLContext] = {}
_clients: dict[tuple[Any, ...], RetryingClient] = {}
_shared_lock = threading.Lock()


def tls_context() -> ssl.SSLContext:
    """The TLS context a new client would build (httpx's default, which reads
    ``SSL_CERT_FILE`` and ``SSL_CERT_DIR``), built once per process and value of those."""
    key = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    with _shared_lock:
        context = _tls_contexts.get(key)
        if context is None:
            context = _tls_contexts[key] = httpx2.create_ssl_context()
        return context


def shared_client(*, base_url: str, timeout: Any, policy: RetryPolicy) -> RetryingClient:
    """The process's sync client for the models of ``base_url`` with this timeout and
    policy (and the environment's proxies and CA certificates): one connection pool for
    them all, whichever role calls. A client someone closed is replaced."""
    timeouts = httpx2.Timeout(timeout).as_dict()
    key = (base_url, tuple(sorted(timeouts.items())), policy, _environment())
    context = tls_context()
    with _shared_lock:
        client = _clients.get(key)
        if client is None or client.is_closed:
            client = _clients[key] = RetryingClient(policy=policy, timeout=timeout, verify=context)
        return client
