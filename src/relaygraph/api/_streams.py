"""Open event streams: at most so many per project, and never so many that the server runs
out of file descriptors.

An event stream holds a connection (a file descriptor) for as long as its task runs. One
project holding a thousand of them on a server whose limit was 1,024 open files made every
other project's task fail with ``Too many open files`` (a task opens files too: the ledger,
checkpoints, the sandbox's pipes). So a new stream is admitted only

- while its project holds fewer than ``RELAYGRAPH_PROJECT_MAX_STREAMS`` (else 429
  ``quota_exceeded``), and
- while the process has more than a reserve of descriptors left below its limit
  (``RLIMIT_NOFILE``), kept for tasks and short requests (else 503 ``server_busy``).

The count is the API process's own. ``serve --processes`` starts task processes that run
tasks only; every connection is the server process's, so the quota holds per server.
Several API servers behind a load balancer each count their own streams.
"""

from __future__ import annotations

import logging
import os
import resource
from collections.abc import Callable
from typing import Any

from sse_starlette.sse import EventSourceResponse
from starlette.types import Receive, Scope, Send

from relaygraph.api._errors import ErrorAnswer

__all__ = [
    "STREAM_RETRY_SECONDS",
    "CountedEventSource",
    "StreamGate",
    "open_file_descriptors",
    "raise_open_file_limit",
]

log = logging.getLogger("relaygraph.api")

STREAM_RETRY_SECONDS = 5
"""The ``Retry-After`` of a refused stream: streams end with their tasks, so room comes back
within seconds."""
MIN_FD_RESERVE = 128
"""Descriptors always kept free of event streams, whatever the limit: enough for the tasks
running and the requests in flight (a task's ledger and checkpoint connections, a sandboxed
run's pipes and memory files)."""
FD_RESERVE_SHARE = 4
"""At larger limits, a quarter of the limit is kept free of event streams."""


def open_file_descriptors() -> int:
    """How many descriptors this process has open: the entries of ``/proc/self/fd`` (one
    ``getdents`` of a small folder; no descriptor is opened per entry)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # No /proc (not Linux): count what is open, up to the limit.
        limit = _file_limit()
        return sum(1 for fd in range(min(limit, 65536)) if _is_open(fd))


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _file_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def raise_open_file_limit() -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit, as servers do at start
    (a soft limit of 1,024 is a default for shells, not for a server of many connections).
    Returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open file limit from %d to %d: %s", soft, hard, exc)
            return soft
    return _file_limit()


class StreamGate:
    """Admits event streams: a quota per project, and a reserve of file descriptors.

    Args:
        max_per_project: Open streams a project may hold (``RELAYGRAPH_PROJECT_MAX_STREAMS``).
        file_limit: The process's descriptor limit, read at each admission (an operator may
            change it while the server runs).
        open_fds: How many descriptors the process has open now.
    """

    def __init__(
        self,
        *,
        max_per_project: int,
        file_limit: Callable[[], int] = _file_limit,
        open_fds: Callable[[], int] = open_file_descriptors,
    ) -> None:
        self.max_per_project = max_per_project
        self._file_limit = file_limit
        self._open_fds = open_fds
        self._open: dict[str, int] = {}
        """Open streams by project id. Only the event loop's thread touches it."""

    def open_streams(self, project_id: str) -> int:
        """The streams the project holds open now."""
        return self._open.get(project_id, 0)

    def admit(self, project_id: str, project_name: str) -> StreamSlot:
        """A slot for one more stream of the project, held until the slot is released.

        Raises:
            ErrorAnswer: 429 ``quota_exceeded`` when the project holds its quota of streams;
                503 ``server_busy`` when the server is near its limit of open files.
        """
        held = self.open_streams(project_id)
        if held >= self.max_per_project:
            raise ErrorAnswer(
                429,
                "quota_exceeded",
                f"project {project_name!r} has {held} of {self.max_per_project} event streams "
                "open (RELAYGRAPH_PROJECT_MAX_STREAMS); close one, or wait for a task to end",
                headers={"Retry-After": str(STREAM_RETRY_SECONDS)},
            )
        limit = self._file_limit()
        reserve = max(MIN_FD_RESERVE, limit // FD_RESERVE_SHARE)
        in_use = self._open_fds()
        if in_use >= limit - reserve:
            # The connection is closed after this answer: a refused client that keeps it
            # open would hold a descriptor all the same.
            raise ErrorAnswer(
                503,
                "server_busy",
                f"the server has {in_use} of its {limit} open files in use and keeps {reserve} "
                "for running tasks; no new event stream now, try again later",
                headers={"Retry-After": str(STREAM_RETRY_SECONDS), "Connection": "close"},
            )
        self._open[project_id] = held + 1
        return StreamSlot(self, project_id)

    def _release(self, project_id: str) -> None:
        left = self._open.get(project_id, 0) - 1
        if left > 0:
            self._open[project_id] = left
        else:
            self._open.pop(project_id, None)


class StreamSlot:
    """One admitted stream's place in its project's count; :meth:`release` gives it back
    (once, however often it is called)."""

    def __init__(self, gate: StreamGate, project_id: str) -> None:
        self._gate: StreamGate | None = gate
        self.project_id = project_id

    def release(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate._release(self.project_id)


class CountedEventSource(EventSourceResponse):
    """An :class:`EventSourceResponse` that holds a :class:`StreamSlot` while it is sent:
    the slot goes back however the stream ends (its task ended, the client left, the
    server stops), since the ASGI call itself is what holds it."""

    def __init__(self, content: Any, *, slot: StreamSlot, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.slot = slot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.slot.release()
