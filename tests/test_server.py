"""The task service as deployed: a real ``relaygraph serve`` process on loopback, driven by
:class:`relaygraph.client.Client` (submit, stream, cancel, approve, restart recovery)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from relaygraph.client import ApiError, Client
from relaygraph.errors import ConfigError
from relaygraph.store import Ledger

from ._scripts import call, one_visit, say
from ._service import free_port, wait_answering
from .conftest import EXAMPLE_RELAY, unsafe_sandbox_env
from .test_cli import relaygraph

Script = Callable[[dict[str, Any]], str]

SLEEPY_CODE = (
    "import time\n"
    "time.sleep({seconds})\n"
    "with open('ran.txt', 'a') as f:\n"
    "    f.write('ran\\n')\n"
    "print('slept')"
)
"""The coder's program: slow, with a side effect that shows how often it ran."""


LEASE_SECONDS = 30
"""The servers' lease: long enough that a loaded machine renews it in time (a renewal that
comes too late stops the run, and another takes the task over). The tests do not wait out
a killed server's lease: :func:`lapse_lease` ends it, as its lapse would."""
START_SECONDS = 120
"""How long a test waits for a server to answer, or to come back for a client: a generous
bound on a stuck server, which a loaded machine's slow start stays well within."""
GATED_CALLS = 8
"""How many gated programs the coder of the two-servers test runs: each lasts at most the
sandbox's wall-clock limit, together longer than :data:`START_SECONDS`."""


GATED_CODE = (
    "import os, time\n"
    "deadline = time.monotonic() + 60\n"
    "while not os.path.exists('go') and time.monotonic() < deadline:\n"
    "    time.sleep(0.05)\n"
    "with open('ran.txt', 'a') as f:\n"
    "    f.write('ran\\n')\n"
    "print('went')"
)
"""The coder's program: runs until the test writes ``go`` into the task's workspace, or
until the sandbox's wall-clock limit (``SandboxLimits.wall_seconds``) ends it."""


def sleepy_coder(seconds: float = 3, *, code: str | None = None) -> dict[str, Any]:
    """A task where the coder runs a slow program once, then the team finishes."""
    code = code if code is not None else SLEEPY_CODE.format(seconds=seconds)
    return one_visit(
        "coder", "compute slowly", "math", call("run_python", code=code), say("Done: it slept.")
    )


def _env(home: Path) -> dict[str, str]:
    env = dict(os.environ)  # conftest: no API key, a dead OpenAI endpoint.
    env["RELAYGRAPH_HOME"] = str(home)
    env.pop("RELAYGRAPH_DATABASE_URL", None)  # The SQLite ledger in this test's home.
    env["RELAYGRAPH_LEASE_SECONDS"] = str(LEASE_SECONDS)
    # These tests follow what the service does around the coder's program (cancel,
    # approvals, restarts), not its isolation: where bubblewrap is missing it runs unisolated.
    env.update(unsafe_sandbox_env())
    return env


class Server:
    """One ``relaygraph serve`` process; a restart is a new Server on the same port."""

    def __init__(
        self,
        home: Path,
        model: str,
        port: int,
        log: Path,
        scripts: Path,
        *,
        env: dict[str, str] | None = None,
    ) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        command = [sys.executable, "-m", "relaygraph.cli", "serve", "--port", str(port)]
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [*command, "--model", model, "--scripts", str(scripts)],
                env=env if env is not None else _env(home),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def wait_ready(self, timeout: float = START_SECONDS) -> None:
        wait_answering(self.process, f"{self.url}/healthz", self.log, seconds=timeout, pause=0.05)

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = START_SECONDS) -> int:
        """Send ``sig`` and wait for the process to exit; returns its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            pytest.fail(f"the server did not stop on {sig.name}:\n{self.log.read_text()}")


@pytest.fixture
def serve(start_server: Callable[..., Server]) -> Callable[..., Server]:
    """Start servers on this test's home (``start_server``), on one port unless told
    another: a restart is a new server on the same port."""
    default_port = free_port()

    def start(model: str = f"scripted:{EXAMPLE_RELAY}", *, port: int | None = None) -> Server:
        return start_server(model=model, port=port or default_port)

    return start


def create_project(home: Path, name: str) -> str:
    """``relaygraph projects create NAME --json`` in its own process; returns the key."""
    done = relaygraph("projects", "create", name, "--json", home=home, env=_env(home))
    assert done.returncode == 0, done.stderr
    made = json.loads(done.stdout)
    assert made["project"] == name
    key: str = made["key"]
    return key


@pytest.fixture
def acme(serve: Callable[..., Server], home: Path) -> tuple[Server, str]:
    """A server started on this test's home, and the key of its project ``acme``."""
    server = serve()
    return server, create_project(home, "acme")


def lapse_lease(home: Path, task_id: str) -> None:
    """End the lease a killed server held on the task, as its lapse would: the ledger no
    longer counts it live, and the next sweep of any server (or a server's start) continues
    the task. Waiting for the lapse itself would make a test as long as a lease that a
    loaded machine can renew in time."""
    with Ledger(f"sqlite:///{home / 'ledger.sqlite'}") as ledger:
        holder, _ = ledger.lease_of(task_id)
        assert holder is not None, f"no server holds task {task_id}"
        ledger.release_lease(task_id, holder)


def ran_lines(home: Path, task_id: str) -> list[str]:
    """The side-effect file of the sleepy program, one line per completed run."""
    path = home / "tasks" / task_id / "workspace" / "ran.txt"
    return path.read_text().splitlines() if path.exists() else []


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [event["event"] for event in events]


def test_submit_and_stream_events_to_the_end(acme: tuple[Server, str]) -> None:
    server, key = acme
    with Client(server.url, key) as client:
        task = client.submit("When are checkpoints written?", metadata={"ticket": "T-1"})
        assert task["status"] in ("queued", "running")
        events = list(client.events(task["id"]))
        assert [e["id"] for e in events] == list(range(1, len(events) + 1))
        assert events[0]["event"] == "run_started"
        assert events[-1]["event"] == "run_finished"
        assert events[-1]["data"]["status"] == "succeeded"
        assert all(e["data"]["type"] == e["event"] for e in events)
        assert {"route", "handoff", "tool_call", "tool_result", "final"} <= set(kinds(events))

        done = client.get(task["id"])
        assert done["status"] == "succeeded"
        assert "41 checkpoints" in done["answer"]
        assert done["metadata"] == {"ticket": "T-1"}
        assert done["last_event_seq"] == len(events)
        # A finished task replays from the ledger; `after` resumes without repetition.
        assert list(client.events(task["id"], after=5)) == events[5:]
        assert [(h["kind"], h["from"], h["to"]) for h in client.handoffs(task["id"])] == [
            ("route", "supervisor", "researcher"),
            ("direct", "researcher", "coder"),
            ("route", "supervisor", "writer"),
        ]
        assert [t["id"] for t in client.list(status="succeeded")["tasks"]] == [task["id"]]
        assert client.usage()["tasks"] == 1

        with pytest.raises(ApiError) as missing:
            client.get("no-such-task")
        assert (missing.value.status, missing.value.code) == (404, "task_not_found")
        with pytest.raises(ApiError) as bad:
            client.submit("x", model="acme:big")
        assert (bad.value.status, bad.value.code, bad.value.field) == (
            422,
            "invalid_model",
            "model",
        )
        with pytest.raises(ApiError) as misplaced:
            client.submit("x", topology="swarm", output_mode="full_history")
        assert (misplaced.value.status, misplaced.value.code, misplaced.value.field) == (
            422,
            "invalid_topology",
            "output_mode",
        )
    with Client(server.url, "rg_not-a-key") as stranger, pytest.raises(ApiError) as denied:
        stranger.get(task["id"])
    assert (denied.value.status, denied.value.code) == (401, "unauthorized")


def test_cancel_stops_a_running_task_at_the_next_step(
    acme: tuple[Server, str], home: Path, served_script: Script
) -> None:
    server, key = acme
    with Client(server.url, key) as client:
        task = client.submit("sleep on it", model=served_script(sleepy_coder(code=GATED_CODE)))
        events = []
        for event in client.events(task["id"]):
            events.append(event)
            if event["event"] == "tool_call":
                # The program runs until `go`, however late the event came: the cancel
                # waits for the step boundary.
                assert client.cancel(task["id"])["status"] == "running"
                (home / "tasks" / task["id"] / "workspace" / "go").touch()
        done = client.get(task["id"])
        assert (done["status"], done["stop_reason"]) == ("cancelled", "cancelled by request")
        assert done["answer"] is None
        # The step in progress finished (the program ran once); nothing after it ran:
        # no second coder turn, no route back, no finalize.
        # The cancel is on the record (once, who asked it) where it was asked: during the step.
        assert kinds(events).count("cancel_requested") == 1, kinds(events)
        run_kinds = [kind for kind in kinds(events) if kind != "cancel_requested"]
        assert run_kinds[-3:] == ["tool_call", "tool_result", "run_finished"], kinds(events)
        assert events[-1]["data"]["status"] == "cancelled"
        assert "final" not in kinds(events)
        assert ran_lines(home, task["id"]) == ["ran"]
        time.sleep(0.5)
        assert client.get(task["id"])["last_event_seq"] == len(events)
        assert "finalize" not in client.usage()["agents"]
        with pytest.raises(ApiError) as again:
            client.cancel(task["id"])
        assert (again.value.status, again.value.code) == (409, "task_finished")


def test_approval_round_trip(acme: tuple[Server, str], home: Path, served_script: Script) -> None:
    server, key = acme
    spec = served_script(
        one_visit(
            "coder",
            "compute",
            "math",
            call("run_python", code=SLEEPY_CODE.format(seconds=0)),
            say("Done, with approval."),
        )
    )
    with Client(server.url, key) as client:
        task = client.submit(
            "run it if allowed",
            model=spec,
            policy={"agents": {"coder": {"approval": ["run_python"]}}},
        )
        waiting = client.wait(task["id"], timeout=30)
        assert waiting["status"] == "interrupted"
        assert ran_lines(home, task["id"]) == []  # Nothing ran before the approval.
        [approval] = client.approvals(task["id"])
        assert (approval["agent"], approval["tool"], approval["decision"]) == (
            "coder",
            "run_python",
            None,
        )
        resumed = client.approve(task["id"], reason="looks safe")
        assert resumed["status"] in ("running", "succeeded")
        done = client.wait(task["id"], timeout=30, until=("succeeded", "degraded", "failed"))
        assert (done["status"], done["answer"]) == ("succeeded", "Done, with approval.")
        assert ran_lines(home, task["id"]) == ["ran"]  # The approved tool ran once.
        [decided] = client.approvals(task["id"])
        assert (decided["decision"], decided["decided_by"], decided["reason"]) == (
            "approve",
            "acme",
            "looks safe",
        )
        events = list(client.events(task["id"]))
        assert [e["id"] for e in events] == list(range(1, len(events) + 1))
        assert kinds(events).count("interrupted") == 1
        assert kinds(events).count("run_started") == 2
        assert events[-1]["data"]["status"] == "succeeded"
        with pytest.raises(ConfigError, match="0 pending approvals"):
            client.approve(task["id"])
        with pytest.raises(ApiError) as again:
            client.approve(task["id"], approval["id"])
        assert (again.value.status, again.value.code) == (409, "not_waiting")


def test_busy_thread_is_refused_or_enqueued(
    acme: tuple[Server, str], home: Path, served_script: Script
) -> None:
    server, key = acme
    # The first task's program runs until `go`: the thread stays busy for the checks.
    turns = sleepy_coder(code=GATED_CODE)
    # The thread's second request plays the next turns of the same script.
    turns["supervisor"] += [
        {"route": {"next": "writer", "task": "sum up", "reason": "a follow-up"}},
        {"route": {"next": "FINISH", "task": "", "reason": "done"}},
    ]
    turns["writer"] = [{"content": "Still done."}]
    spec = served_script(turns)
    with Client(server.url, key) as client:
        first = client.submit("sleep on it", model=spec)
        with pytest.raises(ApiError) as busy:
            client.submit("and then?", model=spec, thread_id=first["thread_id"])
        assert (busy.value.status, busy.value.code, busy.value.field) == (
            409,
            "thread_busy",
            "thread_id",
        )
        second = client.submit(
            "and then?", model=spec, thread_id=first["thread_id"], multitask="enqueue"
        )
        assert second["status"] == "queued"
        assert client.get(second["id"])["status"] == "queued"  # Waits while the first runs.
        for event in client.events(first["id"], retry_for=START_SECONDS):
            if event["event"] == "tool_call":  # Its program runs, in its workspace.
                (home / "tasks" / first["id"] / "workspace" / "go").touch()
        ended = ("succeeded", "degraded", "failed")
        one = client.wait(first["id"], timeout=START_SECONDS, until=ended)
        two = client.wait(second["id"], timeout=START_SECONDS, until=ended)
        assert (one["status"], two["status"]) == ("succeeded", "succeeded"), two
        assert two["answer"] == "Still done."
        assert two["started_at"] >= one["finished_at"]  # ISO 8601 in UTC sorts as text.
        assert ran_lines(home, first["id"]) == ["ran"]


def test_cancelling_a_waiting_task_starts_the_next_on_its_thread(
    acme: tuple[Server, str], served_script: Script
) -> None:
    server, key = acme
    spec = served_script(
        {
            "supervisor": [
                {"route": {"next": "coder", "task": "compute", "reason": "math"}},
                {"route": {"next": "writer", "task": "write instead", "reason": "follow-up"}},
                {"route": {"next": "FINISH", "task": "", "reason": "done"}},
            ],
            "coder": [{"tool_calls": [{"name": "run_python", "args": {"code": "print(1)"}}]}],
            "writer": [{"content": "The follow-up is done."}],
        }
    )
    policy = {"agents": {"coder": {"approval": ["run_python"]}}}
    with Client(server.url, key) as client:
        first = client.submit("compute", model=spec, policy=policy)
        assert client.wait(first["id"], timeout=30)["status"] == "interrupted"
        second = client.submit(
            "write", model=spec, thread_id=first["thread_id"], multitask="enqueue"
        )
        time.sleep(0.3)
        assert client.get(second["id"])["status"] == "queued"  # Behind the waiting task.
        assert client.cancel(first["id"])["status"] == "cancelled"
        done = client.wait(second["id"], timeout=30)
        assert (done["status"], done["answer"]) == ("succeeded", "The follow-up is done.")


def test_a_stream_that_drops_as_the_task_finishes_replays_what_it_missed() -> None:
    """The server's stream closes (a restart) after two events; the task finishes, with
    four, before the client looks: the client reconnects for the two it missed."""
    events = [
        {"type": "run_started"},
        {"type": "route"},
        {"type": "final"},
        {"type": "run_finished"},
    ]
    asked_after: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/events"):
            after = int(request.headers.get("Last-Event-ID", "0"))
            asked_after.append(after)
            shown = events[after:] if after else events[:2]  # The first stream drops early.
            body = "".join(
                f"id: {after + i}\nevent: {e['type']}\ndata: {json.dumps(e)}\n\n"
                for i, e in enumerate(shown, start=1)
            )
            return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json={"status": "succeeded", "last_event_seq": len(events)})

    with Client("http://test", "key", transport=httpx.MockTransport(handler)) as client:
        got = list(client.events("t-1"))
    assert [(e["id"], e["event"]) for e in got] == [
        (1, "run_started"),
        (2, "route"),
        (3, "final"),
        (4, "run_finished"),
    ]
    assert asked_after == [0, 2]


def _follow_through_restart(
    serve: Callable[..., Server], home: Path, served_script: Script, sig: signal.Signals
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """Submit a sleepy task and another enqueued behind it on its thread, stop the server
    with ``sig`` while the program runs, start a new server on the same home and port, and
    follow the first task's events to the end. Returns both tasks at the end, and the events.
    """
    # After a SIGKILL the program waits for `go`, so the kill always comes while it runs,
    # however slow the machine is; `go` comes once the new server is up, for the re-run of
    # the step. A graceful stop (SIGTERM) drains the step: its program sleeps, so that the
    # stop reaches the run before the step is over.
    turns = sleepy_coder(seconds=3, code=GATED_CODE if sig == signal.SIGKILL else None)
    turns["supervisor"] += [
        {"route": {"next": "writer", "task": "sum up", "reason": "a follow-up"}},
        {"route": {"next": "FINISH", "task": "", "reason": "done"}},
    ]
    turns["writer"] = [{"content": "Still done."}]
    spec = served_script(turns)
    server = serve()
    key = create_project(home, "acme")
    with Client(server.url, key) as client:
        task = client.submit("sleep on it", model=spec)
        queued = client.submit(
            "and then?", model=spec, thread_id=task["thread_id"], multitask="enqueue"
        )
        events = []
        for event in client.events(task["id"], retry_for=START_SECONDS):
            events.append(event)
            if event["event"] == "tool_call" and kinds(events).count("tool_call") == 1:
                server.stop(sig)
                if sig == signal.SIGKILL:
                    lapse_lease(home, task["id"])  # A graceful stop gave its lease up.
                server = serve()  # Same home, same port: the client reconnects.
                (home / "tasks" / task["id"] / "workspace" / "go").touch()
        second = client.wait(queued["id"], timeout=START_SECONDS)
        return client.get(task["id"]), events, second


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_restart_continues_the_task_once(
    serve: Callable[..., Server], home: Path, served_script: Script, sig: signal.Signals
) -> None:
    done, events, second = _follow_through_restart(serve, home, served_script, sig)
    assert done["status"] == "succeeded"
    assert done["answer"] == "Done: it slept."
    # One stream across both servers: increasing ids, none lost or repeated.
    assert [e["id"] for e in events] == list(range(1, len(events) + 1))
    assert done["last_event_seq"] == len(events)
    assert kinds(events).count("run_started") == 2  # The first server's run and the continuation.
    assert kinds(events).count("run_finished") == 1  # ... which finished once.
    assert kinds(events).count("final") == 1
    assert events[-1]["data"]["status"] == "succeeded"
    # Continued from the checkpoint: the supervisor did not route to the coder again.
    assert [e["data"]["next"] for e in events if e["event"] == "route"] == ["coder", "FINISH"]
    # The task enqueued behind it stayed queued through the restart and ran after it.
    assert (second["status"], second["answer"]) == ("succeeded", "Still done.")
    assert second["started_at"] >= done["finished_at"]
    if sig == signal.SIGTERM:
        # A graceful stop drains: the program finished, its result was checkpointed, the
        # task stayed `running`, and the new server went on from there.
        assert kinds(events).count("run_suspended") == 1
        assert kinds(events).count("tool_call") == 1
        assert kinds(events).count("tool_result") == 1
        assert ran_lines(home, done["id"]) == ["ran"]
        return
    # Killed mid-step: that step (the tool call) runs again, once, and nothing else does.
    assert "run_suspended" not in kinds(events)
    assert kinds(events).count("tool_call") == 2
    assert kinds(events).count("tool_result") == 1
    time.sleep(0.5)  # Let an orphan of the killed server finish, if it is still running.
    lines = ran_lines(home, done["id"])
    # The killed server's sandbox child died with it (parent-death signal), so only the
    # re-run finished the program.
    assert lines == ["ran"]


def test_two_servers_on_one_ledger_run_a_task_once(
    serve: Callable[..., Server], home: Path, served_script: Script
) -> None:
    """A second server on the same ledger leaves the first's running task alone while the
    first holds its lease, and continues it, once, when the first dies."""
    # The coder's programs run until the test lets them end. Each is ended by the sandbox's
    # wall-clock limit at the latest, so the coder runs one after another: the task stays
    # running while the second server starts, however slowly.
    turns = sleepy_coder(code=GATED_CODE)
    # Each program differs (a comment): the same call again would be refused by the
    # policy's repeated-call check, and the task would end after the first program.
    turns["coder"][:1] = [
        call("run_python", code=f"{GATED_CODE}\n# program {n}") for n in range(GATED_CALLS)
    ]
    spec = served_script(turns)
    first = serve()
    key = create_project(home, "acme")
    with Client(first.url, key) as client:
        task = client.submit("sleep on it", model=spec)
        events = []
        for event in client.events(task["id"], retry_for=START_SECONDS):
            events.append(event)
            if event["event"] == "tool_call":
                break
        # The second server starts while the first runs the program: before it answers, it
        # has looked for unfinished tasks (the start's sweep), and left the first's alone.
        second = serve(port=free_port())
        with Client(second.url, key) as other:
            assert other.get(task["id"])["status"] == "running"
        with Ledger(f"sqlite:///{home / 'ledger.sqlite'}") as ledger:
            assert [e.type for e in ledger.events_after(task["id"])].count("run_started") == 1
            assert ledger.lease_of(task["id"])[0] is not None  # Still the first's.
        # The first dies mid-step; once its lease has lapsed the second's next sweep (every
        # half lease) continues the task, whose program (run again) may now end.
        first.stop(signal.SIGKILL)
        lapse_lease(home, task["id"])
        (home / "tasks" / task["id"] / "workspace" / "go").touch()
        with Client(second.url, key) as other:
            done = other.wait(task["id"], timeout=LEASE_SECONDS + START_SECONDS)
            every = list(other.events(task["id"]))
    assert done["status"] == "succeeded", done["stop_reason"]
    assert kinds(every).count("run_started") == 2
    assert kinds(every).count("run_finished") == 1
    assert kinds(every).count("final") == 1
    assert [e["id"] for e in every] == list(range(1, len(every) + 1))


@pytest.mark.parametrize("unsafe", [False, True], ids=["refused", "unsafe"])
def test_serve_says_at_start_when_it_cannot_isolate_code(
    home: Path, tmp_path: Path, scripts: Path, unsafe: bool
) -> None:
    """On a host without bubblewrap the operator learns it when the server starts, not from
    a tenant's first refused call."""
    env = {**_env(home), "RELAYGRAPH_BWRAP": ""}
    env.pop("RELAYGRAPH_UNSAFE_SANDBOX", None)
    if unsafe:
        env["RELAYGRAPH_UNSAFE_SANDBOX"] = "true"
    server = Server(
        home, f"scripted:{EXAMPLE_RELAY}", free_port(), tmp_path / "serve.log", scripts, env=env
    )
    try:
        server.wait_ready()
    finally:
        server.stop()
    log = server.log.read_text()
    if unsafe:
        assert "--unsafe-sandbox: tenants' run_python code runs with this server's files" in log
    else:
        assert "no filesystem isolation (bubblewrap) on this host: tasks' run_python" in log
