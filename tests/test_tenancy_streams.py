"""Event streams under pressure: one project holding many streams neither starves another
project's streams nor fails its tasks (issue 41). Each test runs the attack against a real
``relaygraph serve`` process: streams hold connections, which an in-process transport
does not."""

from __future__ import annotations

import contextlib
import resource
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from relaygraph.client import ApiError, Client

from ._scripts import call, one_visit, say
from .test_server import SLEEPY_CODE, create_project

PAUSED_TEAM = one_visit(
    "coder", "compute", "math", call("run_python", code=SLEEPY_CODE.format(seconds=0)), say("Done.")
)
"""B's task (``scripted:paused.json``): it pauses for an approval that never comes, so its
streams stay open."""
APPROVE_CODE = {"agents": {"coder": {"approval": ["run_python"]}}}


def _paused_task(client: Client) -> str:
    """A task of B's that waits for an approval: its event streams stay open."""
    task = client.submit("run it if allowed", model="scripted:paused.json", policy=APPROVE_CODE)
    assert client.wait(task["id"], timeout=60)["status"] == "interrupted"
    return str(task["id"])


def _open_stream(url: str, key: str, task_id: str) -> tuple[socket.socket, int, str]:
    """Open an event stream on a raw socket; returns it, its status and its head."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(
        f"GET /v1/tasks/{task_id}/events HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {key}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    text = head.decode("latin-1")
    status = int(text.split(" ", 2)[1]) if text.startswith("HTTP/") else 0
    return sock, status, text


def test_streams_past_the_project_quota_get_429_while_another_project_works(
    start_server: Any, home: Path
) -> None:
    server = start_server({"paused.json": PAUSED_TEAM}, RELAYGRAPH_PROJECT_MAX_STREAMS="3")
    key_a, key_b = create_project(home, "alpha"), create_project(home, "bravo")
    with contextlib.ExitStack() as held, Client(server.url, key_b) as b:
        paused = _paused_task(b)
        for _ in range(3):
            sock, status, _ = _open_stream(server.url, key_b, paused)
            held.callback(sock.close)
            assert status == 200
        extra, status, head = _open_stream(server.url, key_b, paused)
        extra.close()
        assert status == 429
        assert "retry-after: 5" in head.lower()
        with pytest.raises(ApiError) as refused:
            next(b.events(paused))
        assert (refused.value.status, refused.value.code) == (429, "quota_exceeded")
        assert "'bravo' has 3 of 3 event streams" in refused.value.message
        assert "RELAYGRAPH_PROJECT_MAX_STREAMS" in refused.value.message
        # B sees its streams against its quota; A sees none of B's.
        me = b.project()
        assert (me["quotas"]["max_streams"], me["usage"]["streams"]) == (3, 3)
        with Client(server.url, key_a) as a:
            assert a.project()["usage"]["streams"] == 0

        # Project A streams its own task to the end, and its task succeeds.
        with Client(server.url, key_a) as a:
            task = a.submit("When are checkpoints written?")
            events = list(a.events(task["id"]))
            assert events[-1]["data"]["status"] == "succeeded"
            assert a.get(task["id"])["status"] == "succeeded"

        held.close()  # B's streams end: their places come back.
        deadline = time.monotonic() + 30
        while True:
            sock, status, _ = _open_stream(server.url, key_b, paused)
            sock.close()
            if status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert status == 200


FILE_LIMIT = 200
"""The server's open-file limit in the next test: small, so that a few dozen streams reach it."""


def test_many_streams_near_the_file_limit_get_503_and_never_fail_another_projects_task(
    start_server: Any, home: Path
) -> None:
    server = start_server({"paused.json": PAUSED_TEAM}, RELAYGRAPH_PROJECT_MAX_STREAMS="10000")
    # Soft and hard: the server cannot raise it back (it raised its soft limit at start).
    resource.prlimit(server.process.pid, resource.RLIMIT_NOFILE, (FILE_LIMIT, FILE_LIMIT))
    key_a, key_b = create_project(home, "alpha"), create_project(home, "bravo")
    statuses: list[int] = []
    with contextlib.ExitStack() as held, Client(server.url, key_b) as b:
        paused = _paused_task(b)
        for _ in range(FILE_LIMIT + 50):
            sock, status, _ = _open_stream(server.url, key_b, paused)
            statuses.append(status)
            if status == 200:
                held.callback(sock.close)
            else:
                sock.close()
        assert set(statuses) == {200, 503}, statuses
        assert statuses.index(503) > 10  # Streams are admitted until the reserve.

        # While B holds every stream it could get, A's task runs and succeeds, and A's
        # reads are answered.
        with Client(server.url, key_a) as a:
            for _ in range(3):
                task = a.submit("When are checkpoints written?")
                done = a.wait(task["id"], timeout=120)
                assert done["status"] == "succeeded", done
            with httpx.stream(
                "GET",
                f"{server.url}/v1/tasks/{task['id']}/events",
                headers={"Authorization": f"Bearer {key_a}"},
                timeout=30,
            ) as stream:
                assert stream.status_code in (200, 503)
                if stream.status_code == 503:
                    stream.read()
                    assert stream.json()["error"]["code"] == "server_busy"
                    assert stream.headers["retry-after"] == "5"
    log = server.log.read_text()
    assert "Too many open files" not in log
    assert "Traceback" not in log
