"""What the tests of the task service share: bearer headers, a free loopback port, a
server process's start and stop, and a client that makes projects in the ledger and waits
for a task's end over HTTP.

A test file builds its own app or server and hands its ``httpx.AsyncClient`` to
:class:`ServiceClient` (or a subclass adding that file's own requests); the ``scripts``
fixture, the server's scripts folder, is in ``conftest.py``.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from relaygraph.store import Ledger, QuotaOverrides

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = [
    "ENDED",
    "FINISHED",
    "ServiceClient",
    "auth",
    "free_port",
    "in_process",
    "in_process_service",
    "stop_process",
    "wait_answering",
]

FINISHED = ("succeeded", "degraded", "failed", "cancelled")
"""The statuses a task ends in."""
ENDED = (*FINISHED, "interrupted")
"""The statuses after which a task does nothing more until someone acts."""

WAIT_SECONDS = 60.0
"""How long a test waits for a task: generous, so a loaded machine slows a test, never fails
it."""


def auth(key: str) -> dict[str, str]:
    """The headers of a request made with the project key ``key``."""
    return {"Authorization": f"Bearer {key}"}


def free_port() -> int:
    """A loopback port that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_answering(
    process: subprocess.Popen[bytes],
    url: str,
    log: Path,
    *,
    seconds: float,
    name: str = "the server",
    pause: float = 0.1,
) -> None:
    """Wait until ``url`` answers 200; the test fails, showing the process's ``log``, if the
    process exits first or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{name} exited early:\n{log.read_text(errors='replace')}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(pause)
    pytest.fail(f"{name} did not answer {url} in {seconds} s:\n{log.read_text(errors='replace')}")


def stop_process(process: subprocess.Popen[bytes], seconds: float = 30) -> None:
    """Ask ``process`` to end (SIGTERM) and wait for it; killed if it takes ``seconds``."""
    process.terminate()
    try:
        process.wait(seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(seconds)


class ServiceClient:
    """The task service as a test sees it: ``client`` (in process through
    ``httpx.ASGITransport``, or a live server) and the ledger at ``ledger_url``.

    Args:
        client: The HTTP client of the service.
        ledger_url: The service's ledger, where :meth:`key` makes projects.
        ends: The statuses :meth:`wait` stops at when not told.
        seconds: How long :meth:`wait` waits.
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        ledger_url: str,
        *,
        ends: tuple[str, ...] = FINISHED,
        seconds: float = WAIT_SECONDS,
    ) -> None:
        self.client = client
        self.ledger_url = ledger_url
        self.ends = ends
        self.seconds = seconds

    def key(self, name: str, quotas: QuotaOverrides | None = None) -> str:
        """A new project ``name`` (with ``quotas``, if given); returns its key."""
        with Ledger(self.ledger_url) as ledger:
            key = ledger.create_project(name)[1]
            if quotas is not None:
                ledger.set_project_quotas(name, quotas)
            return key

    async def submit(self, key: str, **body: Any) -> httpx.Response:
        """``POST /v1/tasks`` with ``body`` as the project ``key``."""
        return await self.client.post("/v1/tasks", json=body, headers=auth(key))

    async def post_raw(self, path: str, body: bytes, key: str, **headers: str) -> httpx.Response:
        """``POST path`` with ``body`` as it is, declared JSON unless ``headers`` say else."""
        sent = {**auth(key), "Content-Type": "application/json", **headers}
        return await self.client.post(path, content=body, headers=sent)

    async def wait(
        self, task_id: str, key: str, statuses: tuple[str, ...] | None = None
    ) -> dict[str, Any]:
        """The task once its status is one of ``statuses`` (default: :attr:`ends`), polled.

        Raises:
            AssertionError: It did not get there within :attr:`seconds`.
        """
        wanted = statuses or self.ends
        deadline = time.monotonic() + self.seconds
        while time.monotonic() < deadline:
            got: dict[str, Any] = (
                await self.client.get(f"/v1/tasks/{task_id}", headers=auth(key))
            ).json()
            if got["status"] in wanted:
                return got
            await asyncio.sleep(0.05)
        raise AssertionError(f"task {task_id} did not reach {wanted}")


@asynccontextmanager
async def in_process(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client of ``app`` in process (``httpx.ASGITransport``), within the app's lifespan
    (run by hand: its task loop and workers start and stop around the block)."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


@asynccontextmanager
async def in_process_service(
    home: Path, *, ends: tuple[str, ...] = ENDED, **settings: Any
) -> AsyncIterator[ServiceClient]:
    """The task service on ``home`` with ``settings`` (``ServiceSettings``; by default it
    serves the example relay script), in process; its ledger is ``database_url`` when given,
    else the SQLite file of ``home``. :meth:`ServiceClient.wait` stops at ``ends``."""
    from relaygraph.api import ServiceSettings, create_app

    from .conftest import EXAMPLE_RELAY

    settings.setdefault("default_model", f"scripted:{EXAMPLE_RELAY}")
    ledger_url = settings.get("database_url") or f"sqlite:///{home / 'ledger.sqlite'}"
    app = create_app(ServiceSettings(home=home, **settings))
    async with in_process(app) as client:
        yield ServiceClient(client, ledger_url, ends=ends)
