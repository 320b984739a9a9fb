"""The worker mode's Celery app: its settings, and real workers on this machine's RabbitMQ.

The real cases start ``celery worker`` processes (tests/worker_probe_app.py: relaygraph's app
with a probe for a hook) on a queue and a control exchange of the test's own, each worker in a
process group of its own so that ``kill -9`` takes its pool children too, and delete the
queue and exchanges afterwards. They skip when RabbitMQ is not reachable, unless
``RELAYGRAPH_REQUIRE_RABBITMQ=1`` (CI) makes that a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection

from relaygraph.errors import ConfigError
from relaygraph.worker import (
    RECORD_NO_ROOM,
    RUN_TASK,
    WorkerSettings,
    create_celery_app,
    default_node_name,
    load_worker_settings,
    publish_run,
    run_ledger_task,
    worker_argv,
)

REPO = Path(__file__).resolve().parents[1]
BROKER = "amqp://guest:guest@127.0.0.1:5672//"
KILLED_WORKER_HEARTBEAT = 60.0
"""The workers' heartbeat where a test tells a killed worker's socket close from a missed
heartbeat: the most ``WorkerSettings.broker_heartbeat`` allows."""


# The app's settings (no broker needed: building the app connects to nothing).


def test_the_celery_settings_are_what_their_comments_say() -> None:
    settings = WorkerSettings(
        broker_url=BROKER,
        queues=["rg-a", "rg-b"],
        broker_heartbeat=4,
        consumer_timeout_seconds=120,
        control_exchange="rg-ctl",
    )
    conf = create_celery_app(settings).conf
    assert conf.task_acks_late is True
    assert conf.task_reject_on_worker_lost is True
    assert conf.task_acks_on_failure_or_timeout is True
    assert conf.worker_prefetch_multiplier == 1
    assert conf.worker_cancel_long_running_tasks_on_connection_loss is True
    assert conf.broker_heartbeat == 4
    assert conf.broker_transport_options == {"confirm_publish": True}
    assert conf.task_ignore_result is True
    assert conf.result_backend is None
    assert conf.task_serializer == "json"
    assert list(conf.accept_content) == ["json"]
    assert conf.control_exchange == "rg-ctl"
    assert conf.task_routes == {RUN_TASK: {"queue": "rg-a"}, RECORD_NO_ROOM: {"queue": "rg-a"}}
    assert conf.task_default_queue == "rg-a"
    queues = {queue.name: queue for queue in conf.task_queues}
    assert set(queues) == {"rg-a", "rg-b"}
    for queue in queues.values():
        assert queue.durable
        assert queue.consumer_arguments == {"x-consumer-timeout": 120_000}


def test_the_defaults() -> None:
    settings = WorkerSettings()
    assert settings.broker_url is None
    assert settings.queues == ["relaygraph"]
    assert settings.concurrency == 2
    assert settings.broker_heartbeat == 10
    assert settings.consumer_timeout_seconds == 6 * 3600
    assert settings.events_channel == "relaygraph_events"


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAYGRAPH_BROKER_URL", BROKER)
    monkeypatch.setenv("RELAYGRAPH_QUEUES", '["fast", "slow"]')
    monkeypatch.setenv("RELAYGRAPH_CONCURRENCY", "4")
    settings = load_worker_settings()
    assert (settings.broker_url, settings.queues, settings.concurrency) == (
        BROKER,
        ["fast", "slow"],
        4,
    )
    assert load_worker_settings(concurrency=8).concurrency == 8


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("RELAYGRAPH_CONCURRENCY", "0", "RELAYGRAPH_CONCURRENCY / --concurrency '0'"),
        ("RELAYGRAPH_QUEUES", '["a b"]', "RELAYGRAPH_QUEUES / --queues"),
        ("RELAYGRAPH_QUEUES", "relaygraph", "RELAYGRAPH_QUEUES 'relaygraph' is not valid JSON"),
        ("RELAYGRAPH_EVENTS_CHANNEL", "Events-1", "RELAYGRAPH_EVENTS_CHANNEL 'Events-1'"),
        ("RELAYGRAPH_BROKER_HEARTBEAT", "1", "RELAYGRAPH_BROKER_HEARTBEAT '1'"),
    ],
)
def test_a_bad_setting_names_its_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, named: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match="bad worker setting") as caught:
        load_worker_settings()
    assert named in str(caught.value)


def test_no_broker_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="RELAYGRAPH_BROKER_URL"):
        create_celery_app(WorkerSettings())


WITHOUT_CELERY = """
import asyncio, os, sys

sys.modules["celery"] = sys.modules["kombu"] = None  # Not installed: every import fails.

import httpx

from relaygraph.api import ServiceSettings, create_app
from relaygraph.errors import ConfigError

settings = ServiceSettings(default_model=sys.argv[1])


async def ready():
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return (await client.get("/readyz")).json()


print(asyncio.run(ready()))
os.environ["RELAYGRAPH_BROKER_URL"] = "amqp://guest:guest@127.0.0.1:5672//"
try:
    create_app(settings)
except ConfigError as exc:
    print(exc)
"""


def test_the_single_machine_server_needs_no_celery() -> None:
    """Without the ``workers`` extra, ``serve`` is ready (it runs tasks in process); asked
    for a broker, it names the extra to install."""
    from .conftest import EXAMPLE_RELAY

    env = {k: v for k, v in os.environ.items() if k != "RELAYGRAPH_BROKER_URL"}
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_CELERY, f"scripted:{EXAMPLE_RELAY}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    ready, refused = done.stdout.splitlines()[-2:]
    assert ready == "{'status': 'ready'}"
    assert "RELAYGRAPH_BROKER_URL is set, but the worker mode is not installed" in refused
    assert "pip install 'relaygraph[workers]'" in refused


def test_run_task_calls_the_hook_it_is_given_once() -> None:
    calls: list[tuple[str, int]] = []
    app = create_celery_app(WorkerSettings(broker_url=BROKER), run=lambda *args: calls.append(args))
    app.tasks[RUN_TASK].apply(args=("task-1", 3)).get()
    assert calls == [("task-1", 3)]


def test_a_failure_for_lack_of_room_is_tried_again_until_the_ledger_takes_it() -> None:
    """``relaygraph.record_no_room`` retries (a new message each time, which the broker
    keeps across a worker's end) while the ledger refuses the write, and stops once it
    took it."""
    calls: list[tuple[str, int, str]] = []

    def record(task_id: str, attempt: int, reason: str) -> bool:
        calls.append((task_id, attempt, reason))
        return len(calls) == 3  # No room twice, then room.

    app = create_celery_app(WorkerSettings(broker_url=BROKER), record=record)
    app.tasks[RECORD_NO_ROOM].apply(args=("task-1", 2, "error: no room on disk: x")).get()
    assert calls == [("task-1", 2, "error: no room on disk: x")] * 3


def test_a_worker_hands_a_failure_the_ledger_refused_to_the_broker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker's run stopped on a full disk whose failure the ledger did not take: the
    run's message is done with (never run again), its failure goes to the broker, and the
    worker that takes that writes it: the task ``failed``, with the reason."""
    from relaygraph.errors import NoRoomOnDisk
    from relaygraph.runner import load_runner_settings
    from relaygraph.worker import WorkerRuntime

    later: list[tuple[str, int, str]] = []
    runtime = WorkerRuntime(
        load_runner_settings(),
        WorkerSettings(broker_url=BROKER),
        record_later=lambda *args: later.append(args),
    )
    try:
        project, _ = runtime.ledger.create_project("bravo")
        task, _ = runtime.ledger.create_task(project_id=project.id, input="fill it")
        dispatch = runtime.ledger.queue_for_workers(task.id)
        reason = "error: no room on disk: OperationalError: database or disk is full"

        def stopped(task: Any, *args: Any, attempt: int, **kwargs: Any) -> None:
            raise NoRoomOnDisk(task.id, recorded=False, reason=reason)

        monkeypatch.setattr(runtime.runner, "run", stopped)
        assert runtime.run(task.id, dispatch) is None
        assert later == [(task.id, 1, reason)]
        running = runtime.ledger.get_task(task.id, project_id=project.id)
        assert running is not None and running.status == "running"
        assert runtime.record_no_room(*later[0])
        failed = runtime.ledger.get_task(task.id, project_id=project.id)
        assert failed is not None and (failed.status, failed.stop_reason) == ("failed", reason)
        # The run's message again (a redelivery): nothing runs.
        assert runtime.run(task.id, dispatch) is None
        assert len(later) == 1
    finally:
        runtime.close()


def test_the_default_hook_runs_the_ledgers_task_and_drops_what_it_cannot_run() -> None:
    """Wired to the runner: a message whose task is not in the ledger (or whose dispatch is
    stale) is acknowledged and dropped, not retried (tests/test_worker_fencing.py runs tasks)."""
    from relaygraph.store import Ledger
    from relaygraph.worker import close_worker_runtime

    app = create_celery_app(WorkerSettings(broker_url=BROKER))
    try:
        assert run_ledger_task("no-such-task", 1) is None
        assert app.tasks[RUN_TASK].apply(args=("no-such-task", 1)).get() is None
        with Ledger() as ledger:  # The worker brought the ledger's schema up to date.
            assert ledger.is_current()
            assert ledger.count_tasks_by_status()["running"] == 0
    finally:
        close_worker_runtime()
        app.close()


def test_the_runtime_is_kept_while_its_settings_are_unchanged(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A message does not read the settings again: the process's runtime stays while the
    RELAYGRAPH_* variables do, and is made again when one of them changes."""
    from relaygraph.worker import close_worker_runtime, worker_runtime

    monkeypatch.setenv("RELAYGRAPH_DATABASE_URL", f"sqlite:///{tmp_path / 'one.sqlite'}")
    try:
        first = worker_runtime()
        monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # not a setting
        assert worker_runtime() is first
        monkeypatch.setenv("RELAYGRAPH_DATABASE_URL", f"sqlite:///{tmp_path / 'two.sqlite'}")
        second = worker_runtime()
        assert second is not first
        assert second.ledger.url.endswith("two.sqlite")
    finally:
        close_worker_runtime()


def test_worker_argv() -> None:
    settings = WorkerSettings(broker_url=BROKER, queues=["a", "b"], concurrency=3)
    argv = worker_argv(settings, hostname="w1@box")
    assert argv[0] == "worker"
    assert {"--pool=prefork", "--concurrency=3", "--queues=a,b", "--hostname=w1@box"} <= set(argv)
    # Without --hostname, each process has a node name of its own on its host (Celery's
    # default, celery@<host>, is one name for every worker of the host).
    default = worker_argv(settings)
    assert f"--hostname=relaygraph-{os.getpid()}@{socket.gethostname()}" in default
    assert default_node_name(123) != default_node_name(124)


# Real workers on RabbitMQ.


class Workers:
    """Real worker processes on a queue of their own, and what their probes recorded."""

    def __init__(self, url: str, tmp_path: Path) -> None:
        name = f"rg-test-{uuid.uuid4().hex[:10]}"
        self.url = url
        self.log = tmp_path / "probe.log"
        self.log.touch()
        self.release = tmp_path / "release"
        self.release.mkdir()
        self.env = {
            **os.environ,
            "RELAYGRAPH_BROKER_URL": url,
            "RELAYGRAPH_QUEUES": json.dumps([name]),
            "RELAYGRAPH_CONCURRENCY": "1",
            "RELAYGRAPH_CONTROL_EXCHANGE": f"{name}-ctl",
            "PROBE_LOG": str(self.log),
            "PROBE_RELEASE": str(self.release),
        }
        self.settings = WorkerSettings(
            broker_url=url, queues=[name], control_exchange=f"{name}-ctl"
        )
        self.app = create_celery_app(self.settings)
        self.queue = name
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._outputs = tmp_path

    def start(self, name: str, *, heartbeat: float | None = None) -> subprocess.Popen[bytes]:
        """Start worker ``name`` in a new session (its own process group) and wait until
        it consumes; ``heartbeat``: its AMQP heartbeat, if not the default."""
        env = dict(self.env)
        if heartbeat is not None:
            env["RELAYGRAPH_BROKER_HEARTBEAT"] = str(heartbeat)
        with (self._outputs / f"{name}.out").open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "tests.worker_probe_app", f"{name}@probe"],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes[name] = process
        ready = self.wait_for(lambda r: r["kind"] == "ready" and r["pid"] == process.pid, 60)
        assert ready, f"worker {name} not ready in 60 s:\n{self.output(name)}"
        return process

    def name_of(self, pid: int) -> str:
        return next(name for name, process in self.processes.items() if process.pid == pid)

    def output(self, name: str) -> str:
        return (self._outputs / f"{name}.out").read_text(errors="replace")[-4000:]

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]

    def wait_for(
        self, match: Callable[[dict[str, Any]], bool], timeout: float
    ) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for record in self.records():
                if match(record):
                    return record
            time.sleep(0.02)
        return None

    def let_finish(self, task_id: str = "all") -> None:
        """Let the probe's run of ``task_id`` (of every task: ``all``) return."""
        (self.release / task_id).touch()

    def acknowledged_before(self, name: str, task_id: str) -> None:
        """Wait until worker ``name`` acknowledged its message: with one process and a
        prefetch of one, RabbitMQ gives it the next message only then."""
        publish_run(self.app, "task-held", 0)
        held = self.wait_for(lambda r: r["kind"] == "start" and r["task_id"] == "task-held", 30)
        assert held, f"{task_id} was never acknowledged\n{self.output(name)}"
        assert self.name_of(held["ppid"]) == name

    def kill(self, name: str, sig: signal.Signals = signal.SIGKILL) -> None:
        """Signal worker ``name``'s whole process group: its main process and its pool."""
        os.killpg(self.processes[name].pid, sig)

    def ready_messages(self) -> int:
        """Messages waiting in the queue (not the ones a consumer holds unacknowledged)."""
        with Connection(self.url) as connection:
            _, count, _ = connection.default_channel.queue_declare(self.queue, passive=True)
            return int(count)

    def close(self) -> None:
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        self.app.close()
        with Connection(self.url) as connection:
            channel = connection.default_channel
            channel.queue_delete(self.queue)
            channel.exchange_delete(self.queue)
            control = self.settings.control_exchange
            channel.exchange_delete(f"{control}.pidbox")
            channel.exchange_delete(f"reply.{control}.pidbox")


@pytest.fixture
def workers(rabbitmq: str, tmp_path: Path) -> Iterator[Workers]:
    workers = Workers(rabbitmq, tmp_path)
    try:
        yield workers
    finally:
        workers.close()


def test_a_worker_runs_a_task_and_acknowledges_it(workers: Workers) -> None:
    workers.let_finish("task-ack")
    worker = workers.start("w1")
    publish_run(workers.app, "task-ack", 1)
    end = workers.wait_for(lambda r: r["kind"] == "end", 30)
    assert end, workers.output("w1")
    assert (end["task_id"], end["dispatch"], end["ppid"]) == ("task-ack", 1, worker.pid)
    workers.acknowledged_before("w1", "task-ack")
    # The worker's death puts back the message it holds unacknowledged, and only that one.
    workers.kill("w1")
    worker.wait(10)
    assert workers.ready_messages() == 1
    runs = [(r["kind"], r["task_id"]) for r in workers.records() if r["kind"] != "ready"]
    assert runs == [("start", "task-ack"), ("end", "task-ack"), ("start", "task-held")]


def test_kill_9_of_a_worker_mid_task_gives_the_task_to_another(workers: Workers) -> None:
    # The longest heartbeat the settings allow: RabbitMQ would notice a silent worker only
    # after several heartbeats (WorkerSettings.broker_heartbeat), far past the wait below,
    # so a redelivery within it is RabbitMQ seeing the killed worker's socket close. The
    # wait is only a bound on a stuck test, generous for a loaded machine; how soon the
    # task comes back is not asserted.
    workers.start("w1", heartbeat=KILLED_WORKER_HEARTBEAT)
    workers.start("w2", heartbeat=KILLED_WORKER_HEARTBEAT)
    publish_run(workers.app, "task-kill", 7)
    first = workers.wait_for(lambda r: r["kind"] == "start", 30)
    assert first, workers.output("w1") + workers.output("w2")
    holder = workers.name_of(first["ppid"])
    other = "w2" if holder == "w1" else "w1"

    killed_at = time.time()
    workers.kill(holder)
    redelivery = KILLED_WORKER_HEARTBEAT
    again = workers.wait_for(lambda r: r["kind"] == "start" and r["t"] > killed_at, redelivery)
    assert again, f"not redelivered within {redelivery} s\n{workers.output(other)}"
    assert workers.name_of(again["ppid"]) == other
    assert (again["task_id"], again["dispatch"]) == ("task-kill", 7)

    workers.let_finish("task-kill")
    assert workers.wait_for(lambda r: r["kind"] == "end", 30)
    workers.acknowledged_before(other, "task-kill")
    runs = [(r["kind"], r["ppid"]) for r in workers.records() if r["kind"] != "ready"][:3]
    assert runs == [("start", first["ppid"]), ("start", again["ppid"]), ("end", again["ppid"])]
    workers.kill(other)
    workers.processes[other].wait(10)
    assert workers.ready_messages() == 1  # task-held only: task-kill was acknowledged.


def test_kill_9_of_the_pool_child_requeues_the_task(workers: Workers) -> None:
    """task_reject_on_worker_lost: the worker lives on, the child's task is run again."""
    workers.start("w1")
    publish_run(workers.app, "task-child", 2)
    first = workers.wait_for(lambda r: r["kind"] == "start", 30)
    assert first
    killed_at = time.time()
    os.kill(first["pid"], signal.SIGKILL)
    # The pool notices a dead child by itself; the deadline only bounds a stuck test.
    again = workers.wait_for(lambda r: r["kind"] == "start" and r["t"] > killed_at, 30)
    assert again, workers.output("w1")
    assert again["pid"] != first["pid"] and again["ppid"] == first["ppid"]
    workers.let_finish()
    assert workers.wait_for(lambda r: r["kind"] == "end", 30)
