"""What keeps tenants apart and faults contained, below the HTTP layer (issue 13).

- Thread ids are each project's own: the same id used by two projects is two threads, whose
  checkpoints never meet.
- An idempotency key names one whole request: reused with any other field, it is refused.
- A task whose runner dies on it every time is failed after a bounded number of starts.
- A cancel reaches a task whose runner is dead, and no runner picks that task up again.
- A request names scripted models only by file name, inside the operator's folder, and no
  code path opens the ledger's SQLite files as a script.

Every ledger test runs on SQLite and on PostgreSQL (the ``ledger`` fixture).
"""

from __future__ import annotations

import builtins
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from relaygraph.api import load_settings
from relaygraph.api._in_process import InProcessDispatch
from relaygraph.errors import ConfigError, ModelNotAllowed
from relaygraph.models.scripted import MAX_SCRIPT_BYTES, ScriptFolder, load_script
from relaygraph.runner import TaskRunner, run_task
from relaygraph.store import LOCAL_PROJECT_ID, Ledger, RecordConflict
from tests.conftest import EXAMPLE_RELAY

from ._scripts import call, one_visit, say

SCRIPTS = EXAMPLE_RELAY.parent


def runnable(spec: str) -> dict[str, Any]:
    """What a task needs to run on the default team with one model spec for every role."""
    from relaygraph.policies import policy_to_mapping
    from tests.builtin_team import default_policy

    roles = ("researcher", "coder", "writer", "supervisor", "finalize")
    return {"policy": policy_to_mapping(default_policy()), "models": dict.fromkeys(roles, spec)}


def lapse(ledger: Ledger, task_id: str, runner_id: str) -> None:
    """Make ``runner_id``'s lease on the task lapse, as if the runner died long ago."""
    assert ledger.renew_lease(task_id, runner_id, seconds=-60)


# Threads belong to a project


def test_two_projects_may_use_one_thread_id_without_meeting(ledger: Ledger) -> None:
    a, _ = ledger.create_project("alpha")
    b, _ = ledger.create_project("beta")
    first_b, _ = ledger.create_task(project_id=b.id, input="b1", thread_id="ticket-4711")
    assert not ledger.thread_exists("ticket-4711", project_id=a.id)
    assert ledger.active_task_on_thread("ticket-4711", project_id=a.id) is None
    assert ledger.thread_topology("ticket-4711", project_id=a.id) is None

    first_a, _ = ledger.create_task(
        project_id=a.id, input="a1", thread_id="ticket-4711", topology={"kind": "swarm"}
    )
    # Two threads: each project's checkpoints live under a key of their own.
    assert first_a.thread_id == first_b.thread_id == "ticket-4711"
    assert first_a.checkpoint_thread != first_b.checkpoint_thread
    assert ledger.active_task_on_thread("ticket-4711", project_id=a.id) == first_a
    assert ledger.active_task_on_thread("ticket-4711", project_id=b.id) == first_b
    assert ledger.thread_topology("ticket-4711", project_id=b.id) is None
    assert ledger.thread_topology("ticket-4711", project_id=a.id) == {"kind": "swarm"}

    # A project's later task on its thread continues the same checkpoints.
    second_a, _ = ledger.create_task(project_id=a.id, input="a2", thread_id="ticket-4711")
    assert second_a.checkpoint_thread == first_a.checkpoint_thread


def test_a_thread_of_an_api_project_is_unknown_to_the_cli(home: Path) -> None:
    from relaygraph.runner import ledger_for

    ledger = ledger_for(home)
    project, _ = ledger.create_project("api-project")
    ledger.create_task(project_id=project.id, input="x", thread_id="shared-id")
    with pytest.raises(ConfigError, match="'shared-id' has no earlier run"):
        run_task("x", model=f"scripted:{EXAMPLE_RELAY}", thread_id="shared-id", home=home)


def test_same_thread_id_in_two_projects_keeps_two_conversations(home: Path) -> None:
    """Real runs: the second project's task on the same thread id sees none of the first's
    history (its checkpoints are not the first project's)."""
    from relaygraph.runner import ledger_for

    ledger = ledger_for(home)
    runner = TaskRunner(ledger=ledger, home=home)
    spec = f"scripted:{EXAMPLE_RELAY}"
    answers = []
    for name in ("alpha", "beta"):
        project, _ = ledger.create_project(name)
        task, _ = ledger.create_task(
            project_id=project.id,
            input=f"question of {name}",
            thread_id="ticket-4711",
            **runnable(spec),
        )
        result = runner.run(task, {"request": task.input})
        assert result.status == "succeeded", result
        answers.append(result)
    from relaygraph.runner._checkpoint import open_checkpointer

    with open_checkpointer(home) as saver:
        threads = {
            c.config["configurable"]["thread_id"]
            for c in saver.list(None)
            if c.config["configurable"].get("checkpoint_ns", "") == ""
        }
    assert len([t for t in threads if t.endswith("/ticket-4711")]) == 2


# Idempotency names the whole request


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"input": "another"}, "input"),
        ({"policy": {"agents": {"coder": {"tools": []}}}}, "policy"),
        ({"models": {"coder": "openai:gpt-4.1"}}, "models"),
        ({"topology": {"kind": "swarm"}}, "topology"),
        ({"metadata": {"ticket": 2}}, "metadata.ticket"),
        ({"metadata": {"ticket": 1.0}}, "metadata.ticket"),  # another number in JSON
        ({"metadata": {"ticket": 1, "policy_source": "p.toml"}}, "metadata.policy_source"),
        ({"metadata": None}, "metadata.ticket"),  # none is {}
        ({"thread_id": "another-thread"}, "thread_id"),
    ],
)
def test_an_idempotency_key_reused_for_another_request_is_refused(
    ledger: Ledger, change: dict[str, Any], field: str
) -> None:
    request: dict[str, Any] = {
        "project_id": LOCAL_PROJECT_ID,
        "input": "x",
        "policy": {"agents": {}},
        "models": {"coder": "openai:gpt-4o-mini"},
        "topology": {"kind": "structured"},
        "metadata": {"ticket": 1},
        "idempotency_key": "k-1",
    }
    first, created = ledger.create_task(**request)
    assert created
    again, created = ledger.create_task(**request)
    assert again.id == first.id and not created
    with pytest.raises(RecordConflict, match=rf"\({field} differ\)"):
        ledger.create_task(**{**request, **change})
    assert len(ledger.list_tasks(project_id=LOCAL_PROJECT_ID)[0]) == 1


def test_the_same_request_with_its_own_thread_returns_the_first_task(ledger: Ledger) -> None:
    first, _ = ledger.create_task(
        project_id=LOCAL_PROJECT_ID, input="x", thread_id="t-1", idempotency_key="k"
    )
    again, created = ledger.create_task(
        project_id=LOCAL_PROJECT_ID, input="x", thread_id="t-1", idempotency_key="k"
    )
    assert (again.id, created) == (first.id, False)
    with pytest.raises(RecordConflict, match="thread_id differ"):
        ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x", idempotency_key="k")


# Attempts: a task that kills its runner is not started forever


def test_a_task_whose_runners_die_is_failed_after_max_attempts(ledger: Ledger) -> None:
    task, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x")
    for attempt, runner in enumerate(("a", "b", "c"), start=1):
        assert ledger.settle_abandoned(task.id, max_attempts=3) is None
        taken = ledger.take_lease(task.id, runner, seconds=30)
        assert taken is not None and taken.attempts == attempt
        # Renewing or taking again its own lease is not another attempt.
        assert ledger.take_lease(task.id, runner, seconds=30).attempts == attempt  # type: ignore[union-attr]
        assert ledger.settle_abandoned(task.id, max_attempts=3) is None  # its lease is live
        lapse(ledger, task.id, runner)  # ... and the runner died.
    failed = ledger.settle_abandoned(task.id, max_attempts=3)
    assert failed is not None and failed.status == "failed"
    assert "started 3 times" in (failed.stop_reason or "")
    assert "RELAYGRAPH_MAX_ATTEMPTS" in (failed.stop_reason or "")
    assert ledger.take_lease(task.id, "d", seconds=30) is None
    last = ledger.events_after(task.id)[-1]
    assert last.type == "run_finished" and last.data["status"] == "failed"


def test_a_run_that_ends_resets_the_attempts(ledger: Ledger) -> None:
    task, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x")
    ledger.take_lease(task.id, "a", seconds=30)
    lapse(ledger, task.id, "a")
    ledger.take_lease(task.id, "b", seconds=30)
    # b pauses the task for an approval: its run ended on its own.
    ledger.end_run(task.id, usage={}, runner_id="b", status="interrupted")
    paused = ledger.get_task(task.id, project_id=LOCAL_PROJECT_ID)
    assert paused is not None and paused.attempts == 0
    assert ledger.take_lease(task.id, "c", seconds=30, only_from=("interrupted",)).attempts == 1  # type: ignore[union-attr]


# Cancel


def test_cancel_ends_a_task_whose_runner_is_dead_at_once(ledger: Ledger) -> None:
    task, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x")
    ledger.take_lease(task.id, "dead", seconds=30)
    lapse(ledger, task.id, "dead")
    cancelled = ledger.request_cancel(task.id)
    assert cancelled.status == "cancelled" and cancelled.finished_at is not None
    last = ledger.events_after(task.id)[-1]
    assert (last.type, last.data["status"]) == ("run_finished", "cancelled")
    assert cancelled.last_event_seq == last.seq
    assert ledger.lease_of(task.id) == (None, None)
    assert ledger.take_lease(task.id, "other", seconds=30) is None  # never picked up again
    assert ledger.unfinished_tasks() == []


def test_cancel_of_a_task_held_by_a_live_runner_waits_for_it(ledger: Ledger) -> None:
    task, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x")
    ledger.take_lease(task.id, "live", seconds=30)
    asked = ledger.request_cancel(task.id)
    assert asked.status == "running" and asked.cancel_requested_at is not None
    assert ledger.cancel_requested(task.id)
    # If that runner dies before it acts, the task is cancelled once its lease lapses
    # instead of being run by another.
    lapse(ledger, task.id, "live")
    assert ledger.take_lease(task.id, "other", seconds=30) is None
    settled = ledger.settle_abandoned(task.id, max_attempts=3)
    assert settled is not None and settled.status == "cancelled"


def _two_slow_programs(script: Any) -> str:
    """A scripted team whose coder runs two programs of 3 s each, one step apart: a run
    asked to stop during the first stops at the boundary after it, before the second."""
    slow = "import time\ntime.sleep(3)\nprint('slept')"
    return str(
        script(
            one_visit(
                "coder",
                "compute",
                "code",
                call("run_python", code=slow),
                call("run_python", code=slow),
                say("done"),
                final="done",
            )
        )
    )


def test_a_cancel_asked_elsewhere_reaches_the_runner_through_its_lease(
    home: Path, script: Any
) -> None:
    """A real run, held by one runner, is cancelled through the ledger alone (as a cancel
    sent to another server is): it stops at a step boundary, ``cancelled``."""
    from relaygraph.runner import ledger_for

    ledger = ledger_for(home)
    spec = _two_slow_programs(script)
    task, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x", **runnable(spec))
    runner = TaskRunner(ledger=ledger, home=home, lease_seconds=1.0)
    calling = threading.Event()

    def on_event(event: dict[str, Any]) -> None:
        if event.get("type") == "tool_call":
            calling.set()

    outcome: list[Any] = []
    thread = threading.Thread(
        target=lambda: outcome.append(runner.run(task, {"request": "x"}, on_event=on_event))
    )
    thread.start()
    assert calling.wait(60), "the coder never called its tool"
    asked = ledger.request_cancel(task.id)  # Held by a live runner: it is asked, not ended.
    assert asked.status == "running" and asked.cancel_requested_at is not None
    thread.join(120)
    assert not thread.is_alive()
    result = outcome[0]
    assert result.status == "cancelled", result
    stored = ledger.get_task(task.id, project_id=LOCAL_PROJECT_ID)
    assert stored is not None and stored.status == "cancelled"
    assert stored.cancel_requested_at is None
    # It stopped at the boundary after the first program: the second never ran.
    assert [e.type for e in ledger.events_after(task.id)].count("tool_call") == 1


def test_a_run_whose_renewals_hang_stops_before_its_lease_can_lapse(
    home: Path, script: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real run whose lease renewals hang (a database that stopped answering) stops at
    the next step boundary on its own, before another runner could take the task over: it
    stays ``running`` with the reason, its lease given up for the next runner, and the step
    after the boundary never ran."""
    from relaygraph.runner import LEASE_LOST, ledger_for

    ledger = ledger_for(home)
    spec = _two_slow_programs(script)
    task, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="x", **runnable(spec))
    calling, answering = threading.Event(), threading.Event()
    renew = ledger.renew_leases

    def hanging_renewal(*args: Any, **kwargs: Any) -> Any:
        # The ledger stops answering once the first program runs (not before: a slow
        # start on a loaded machine must not stop the run ahead of that step).
        if calling.is_set():
            answering.wait(120)
        return renew(*args, **kwargs)

    def on_event(event: dict[str, Any]) -> None:
        if event.get("type") == "tool_call":
            calling.set()

    monkeypatch.setattr(ledger, "renew_leases", hanging_renewal)
    runner = TaskRunner(ledger=ledger, home=home, lease_seconds=1.0)
    try:
        result = runner.run(task, {"request": "x"}, on_event=on_event)
    finally:
        answering.set()
    assert result.status == "running" and result.stop_reason == LEASE_LOST, result
    stored = ledger.get_task(task.id, project_id=LOCAL_PROJECT_ID)
    assert stored is not None and stored.status == "running"
    assert ledger.lease_of(task.id)[0] is None  # given up: the next runner may take it
    # It stopped at the boundary after the first program: the second never ran.
    assert [e.type for e in ledger.events_after(task.id)].count("tool_call") == 1


def test_workers_settle_a_dead_servers_task_instead_of_running_it(
    ledger: Ledger, tmp_path: Path
) -> None:
    project, _ = ledger.create_project("t")
    task, _ = ledger.create_task(project_id=project.id, input="x", thread_id="th")
    behind, _ = ledger.create_task(project_id=project.id, input="y", thread_id="th")
    for runner in ("s1", "s2", "s3"):
        ledger.take_lease(task.id, runner, seconds=30)
        lapse(ledger, task.id, runner)
    workers = InProcessDispatch(ledger, home=tmp_path, workers=1, max_attempts=3)
    started: list[str] = []

    def start(task: Any, graph_input: Any = None, *, project: str) -> None:
        workers._cancel.setdefault(task.id, threading.Event())  # as the real one does
        started.append(task.id)

    workers.start = start  # type: ignore[method-assign]
    try:
        workers.recover()
    finally:
        workers.shutdown()
    stored = ledger.get_task(task.id, project_id=project.id)
    assert stored is not None and stored.status == "failed"
    assert started == [behind.id]  # the task queued behind it on its thread goes on


# Scripted models: a folder, file names only, never the ledger


@pytest.fixture
def folder(tmp_path: Path) -> ScriptFolder:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    shutil.copy(EXAMPLE_RELAY, scripts / "relay.json")
    return ScriptFolder(path=scripts)


@pytest.mark.parametrize(
    "name",
    [
        "../relay.json",
        "/etc/passwd",
        "sub/relay.json",
        ".hidden.json",
        "relay",
        "ledger.sqlite",
        "missing.json",
        "link.json",
        "dir.json",
        "zero.json",
        "relay.json\x00",
        "relay\udfff.json",
    ],
)
def test_a_script_folder_resolves_plain_file_names_only(
    folder: ScriptFolder, tmp_path: Path, name: str
) -> None:
    (tmp_path / "outside.json").write_text("{}", encoding="utf-8")
    (folder.path / "link.json").symlink_to(tmp_path / "outside.json")
    (folder.path / "dir.json").mkdir()
    (folder.path / "zero.json").symlink_to("/dev/zero")
    (folder.path / ".hidden.json").write_text("{}", encoding="utf-8")
    with pytest.raises(ModelNotAllowed, match="is not allowed on this server") as caught:
        folder.resolve(name)
    # The message says nothing of the server's files beyond the folder's own names.
    assert str(tmp_path) not in str(caught.value)
    assert folder.resolve("relay.json") == folder.path.resolve() / "relay.json"


def test_load_script_refuses_devices_big_files_and_other_kinds(tmp_path: Path) -> None:
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    with pytest.raises(ConfigError, match="not a regular file"):
        load_script(tmp_path / "zero.json")
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_SCRIPT_BYTES + 1))
    with pytest.raises(ConfigError, match="the limit is"):
        load_script(big)
    with pytest.raises(ConfigError, match=r"must be a \.json file"):
        load_script(tmp_path / "ledger.sqlite")


def test_no_script_path_opens_the_ledgers_database_files(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening and closing a SQLite file in the process that holds it drops its POSIX
    locks (finding 1): a spec naming the ledger must be refused before any open."""
    from relaygraph.runner import ledger_for

    ledger = ledger_for(home)
    ledger.create_project("x")
    databases = {str(home / name) for name in ("ledger.sqlite", "checkpoints.sqlite")}
    (home / "checkpoints.sqlite").touch()
    opened: list[str] = []
    real_open = builtins.open
    real_os_open = os.open

    def spy_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    def spy_os_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(str(path))
        return real_os_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy_open)
    monkeypatch.setattr(os, "open", spy_os_open)
    monkeypatch.setattr(Path, "open", lambda self, *a, **k: spy_open(self, *a, **k))
    settings = load_settings(home=home, default_model="local:smollm2", scripts_dir=home)
    for path in databases:
        for spec in (f"scripted:{path}", f"scripted:{Path(path).name}"):
            with pytest.raises(ConfigError):
                settings.request_model(spec)
        with pytest.raises(ConfigError):
            load_script(path)
    assert not databases & set(opened)


def test_the_server_records_a_requested_script_by_its_path_in_the_folder(
    folder: ScriptFolder, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = load_settings(home=home, scripts_dir=folder.path)
    stored = settings.request_model("scripted:relay.json")
    assert stored == f"scripted:{folder.path.resolve() / 'relay.json'}"
    with pytest.raises(ModelNotAllowed):
        settings.request_model(f"scripted:{EXAMPLE_RELAY}")  # a path, even a good one
    without = load_settings(home=home)
    with pytest.raises(ModelNotAllowed, match="takes no scripted models"):
        without.request_model("scripted:relay.json")
    with pytest.raises(ModelNotAllowed, match="is not allowed"):
        without.request_model("openai-responses:gpt-4o")
    # The operator's own default is allowed by any path, and kept absolute.
    monkeypatch.chdir(SCRIPTS)
    relative = load_settings(home=home, default_model="scripted:relay.json")
    assert relative.default_model == f"scripted:{EXAMPLE_RELAY}"
    assert relative.request_model(relative.default_model) == relative.default_model


async def test_a_request_names_the_servers_relative_default_script_as_the_operator_wrote_it(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``serve --model scripted:examples/scripts/relay.json`` (a relative path): a request
    naming that model, as written, is the server's default, which a request may always
    name (it was refused, 422 model_not_allowed, the server taking no scripted models).
    Another file beside it is still refused, and the request's path is never looked up."""
    import httpx

    from relaygraph.api import create_app

    monkeypatch.chdir(SCRIPTS.parents[1])
    written = "scripted:examples/scripts/relay.json"
    app = create_app(load_settings(home=home, default_model=written))
    looked_up: list[str] = []
    real_resolve = Path.resolve

    def resolve(path: Path, strict: bool = False) -> Path:
        looked_up.append(str(path))
        return real_resolve(path, strict=strict)

    async with app.router.lifespan_context(app):
        with Ledger(f"sqlite:///{home / 'ledger.sqlite'}") as ledger:
            key = ledger.create_project("acme")[1]
        headers = {"Authorization": f"Bearer {key}"}
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            monkeypatch.setattr(Path, "resolve", resolve)
            for spec in (
                written,
                "scripted:./examples/scripts/relay.json",
                f"scripted:{EXAMPLE_RELAY}",
            ):
                made = await client.post(
                    "/v1/tasks", json={"input": "x", "model": spec}, headers=headers
                )
                assert made.status_code == 202, (spec, made.text)
                assert made.json()["models"]["supervisor"] == f"scripted:{EXAMPLE_RELAY}"
            other = await client.post(
                "/v1/tasks",
                json={"input": "x", "model": "scripted:examples/scripts/docs-review.json"},
                headers=headers,
            )
            assert other.status_code == 422, other.text
            assert other.json()["error"]["code"] == "model_not_allowed"
            assert not [p for p in looked_up if "docs-review" in p]


def test_serve_refuses_a_scripts_setting_that_is_no_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--scripts"):
        load_settings(home=tmp_path, scripts_dir=tmp_path / "nope")


# A task that kills its server, on real servers


KILL_PARENT = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('survived')"


@pytest.mark.slow
def test_a_task_that_kills_its_server_is_failed_after_max_attempts(
    home: Path, tmp_path: Path, script: Any
) -> None:
    """Finding 4 as it was: sandbox code (here without isolation, which an operator may
    allow with ``--unsafe-sandbox``) kills its server. Each restart continues the task,
    which kills the server again; after ``RELAYGRAPH_MAX_ATTEMPTS`` starts the next server
    fails the task instead, stays up, and its tenant can still cancel and submit."""
    import signal
    import subprocess
    import sys
    import time

    import httpx

    from tests._service import free_port
    from tests.test_server import create_project

    killer = script(
        {
            "supervisor": [{"route": {"next": "coder", "task": "run it", "reason": "code"}}],
            "coder": [{"tool_calls": [{"name": "run_python", "args": {"code": KILL_PARENT}}]}],
        }
    )
    env = {
        **os.environ,
        "RELAYGRAPH_HOME": str(home),
        "RELAYGRAPH_LEASE_SECONDS": "1",
        "RELAYGRAPH_MAX_ATTEMPTS": "2",
        "RELAYGRAPH_BWRAP": "",  # no filesystem isolation: the program can reach its parent
    }
    env.pop("RELAYGRAPH_DATABASE_URL", None)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    command = [
        sys.executable, "-m", "relaygraph.cli", "serve", "--port", str(port),
        "--model", killer, "--unsafe-sandbox",
    ]  # fmt: skip

    def start() -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if process.poll() is not None:
                return process  # It died at once (the task killed it while starting).
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    return process
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        process.kill()
        pytest.fail(f"the server did not start:\n{log.read_text()}")

    def wait_exit(process: subprocess.Popen[bytes], timeout: float = 90) -> int | None:
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    key = create_project(home, "acme")
    headers = {"Authorization": f"Bearer {key}"}
    deaths = 0
    server = start()
    try:
        task = httpx.post(f"{url}/v1/tasks", json={"input": "go"}, headers=headers).json()
        # Each server that starts the task dies of it, until the attempts are spent.
        while True:
            code = wait_exit(server, timeout=20)
            if code is None:
                break  # This one stayed up.
            assert code == -signal.SIGKILL, log.read_text()
            deaths += 1
            assert deaths <= 2, f"the task killed a server a {deaths}th time:\n{log.read_text()}"
            server = start()
        assert deaths == 2
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            got = httpx.get(f"{url}/v1/tasks/{task['id']}", headers=headers).json()
            if got["status"] != "running":
                break
            time.sleep(0.2)
        assert got["status"] == "failed", got
        assert "started 2 times" in got["stop_reason"]
        assert server.poll() is None
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            if wait_exit(server, timeout=30) is None:
                server.kill()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("openai:gpt-4o-mini?header.X-Team=other", "header"),
        ("openai:gpt-4o-mini?body.user=someone-else", "body"),
        ("openai:gpt-4o-mini?timeout=3600", "timeout=3600"),
        ("openai:gpt-4o-mini?max_retries=10", "max_retries=10"),
    ],
)
def test_a_request_cannot_set_what_the_server_sends_for_it(
    home: Path, monkeypatch: pytest.MonkeyPatch, spec: str, message: str
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    settings = load_settings(home=home)
    with pytest.raises(ModelNotAllowed, match=message):
        settings.request_model(spec)
    assert settings.request_model("openai:gpt-4o-mini?timeout=30&max_retries=1").startswith(
        "openai:gpt-4o-mini?"
    )
    operator = load_settings(home=home, default_model=spec)
    assert operator.request_model(spec) == spec  # The operator's own spec sets them.
