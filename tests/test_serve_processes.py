"""``serve --processes``: the server's workers spread over processes that share the ledger.

A real ``relaygraph serve`` on loopback (tests/worker_cluster.py, SQLite, no broker), its
tasks on ``openai:`` models answered by the local Chat Completions double after a delay, so
that they are running long enough to be seen. Every wait polls a condition under a generous
deadline; none waits a fixed time for correctness.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from relaygraph.api._in_process import InProcessDispatch
from relaygraph.api._processes import shares
from relaygraph.api._settings import ServiceSettings, load_settings
from relaygraph.client import Client
from relaygraph.errors import ConfigError
from relaygraph.store import Ledger

from ._scripts import one_visit, say
from ._service import FINISHED
from .openai_server import serve_script
from .test_containment import lapse, runnable
from .worker_cluster import ApiServer, Cluster, process_gone, process_stats, wait_until

DEADLINE = 120.0
"""Seconds any one wait may take (generous: a loaded 2-core machine)."""
DELAY = 6.0
"""Each model call's answer comes this late: the window in which both tasks are running."""


def _turns(job: str) -> list[dict[str, Any]]:
    return [
        {"route": {"next": "writer", "task": f"Write the line for {job}.", "reason": "asked"}},
        {"content": f"One line for {job}."},
        {"route": {"next": "FINISH", "task": "", "reason": "written"}},
    ]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    script = {job: _turns(job) for job in ("job-a", "job-b", "job-c", "job-d")}
    with serve_script(script, delay_seconds=DELAY) as double:
        env = {
            "OPENAI_BASE_URL": double.base_url,
            "OPENAI_API_KEY": "test-key",
            # Long leases: a cancel that reached a task only through its lease keeper would
            # come after the task had finished.
            "RELAYGRAPH_LEASE_SECONDS": "600",
        }
        with Cluster(tmp_path, database_url=None, broker=None, env=env) as cluster:
            yield cluster


def _holders(home: Path) -> dict[str, str | None]:
    with sqlite3.connect(home / "ledger.sqlite") as db:
        return dict(db.execute("SELECT id, runner_id FROM tasks WHERE status = 'running'"))


def _one_in_each_process(cluster: Cluster, client: Client) -> list[str]:
    """Submit two tasks to a server of 2 workers in 2 processes, and wait until both run
    at once: only if each process runs one, each under its own process's lease."""
    ids = [
        client.submit("Write one line.", model=model)["id"]
        for model in ("openai:script-job-a", "openai:script-job-b")
    ]
    holders = wait_until(
        lambda: len(found := _holders(cluster.home)) == 2 and found,
        DEADLINE,
        "both tasks running",
    )
    assert set(holders) == set(ids) and len(set(holders.values())) == 2, holders
    return ids


def _task_processes(server_pid: int) -> list[int]:
    return [
        pid
        for pid, _, fields in process_stats()
        if int(fields[1]) == server_pid
        and b"relaygraph.api._task_process" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]


def _serve_in_two_processes(cluster: Cluster, *, workers: int) -> tuple[ApiServer, int]:
    """Start ``serve --processes 2`` with ``workers`` workers and wait for its one task
    process (the other process is the server's own): the server and that process's pid."""
    server = cluster.serve("api", model="openai:script-job-a", workers=workers, processes=2)
    [child] = wait_until(lambda: _task_processes(server.pid), DEADLINE, "the task process")
    return server, child


def test_tasks_run_in_every_process_and_a_cancel_reaches_each(cluster: Cluster) -> None:
    server, child = _serve_in_two_processes(cluster, workers=2)
    key = cluster.create_project("acme")
    with Client(server.url, key) as client:
        ids = _one_in_each_process(cluster, client)

        # Cancelled mid-call, each stops at its next step boundary: in the task process
        # too, told by the server at once (its lease keeper would see it in 200 s).
        for task_id in ids:
            client.cancel(task_id)

        def ended() -> list[dict[str, Any]] | None:
            tasks = [client.get(task_id) for task_id in ids]
            return tasks if all(t["status"] in FINISHED for t in tasks) else None

        done = wait_until(ended, DEADLINE, "both tasks ended")
        assert [t["status"] for t in done] == ["cancelled", "cancelled"], done

        # A task queued later runs in whichever process has a worker free.
        later = client.submit("Write one line.", model="openai:script-job-c")["id"]
        ended = wait_until(
            lambda: (t := client.get(later))["status"] in FINISHED and t,
            DEADLINE,
            "the later task ended",
        )
        assert ended["status"] == "succeeded", ended

    # The server stops its task process when it stops.
    server.signal_group(signal.SIGTERM)
    wait_until(lambda: process_gone(server.pid), DEADLINE, "the server stopped")
    wait_until(lambda: process_gone(child), DEADLINE, "the task process stopped")


def _catches_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has a handler of its own for SIGTERM (/proc's SigCgt)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def test_a_task_process_that_ends_is_logged_and_started_again(cluster: Cluster) -> None:
    """Killed, or stopped by SIGTERM on its own (which it takes as the end of its stdin:
    exit code 0), a task process is replaced while the server runs, and the new one runs
    tasks."""
    server, first = _serve_in_two_processes(cluster, workers=2)
    os.kill(first, signal.SIGKILL)
    [second] = wait_until(
        lambda: [p for p in _task_processes(server.pid) if p != first] or None,
        DEADLINE,
        "another task process",
    )
    wait_until(
        lambda: f"task process {first} ended (exit code -9)" in server.output(),
        DEADLINE,
        "the server logged the killed task process",
    )
    wait_until(lambda: _catches_sigterm(second), DEADLINE, "the new process's SIGTERM handler")
    os.kill(second, signal.SIGTERM)
    wait_until(
        lambda: f"task process {second} ended (exit code 0)" in server.output(),
        DEADLINE,
        "the second task process stopped on SIGTERM",
    )
    [third] = wait_until(
        lambda: [p for p in _task_processes(server.pid) if p not in (first, second)] or None,
        DEADLINE,
        "a third task process",
    )
    key = cluster.create_project("acme")
    with Client(server.url, key) as client:
        ids = _one_in_each_process(cluster, client)  # the new process runs one

        def statuses() -> list[str] | None:
            found = [client.get(task_id)["status"] for task_id in ids]
            return found if all(status in FINISHED for status in found) else None

        done = wait_until(statuses, DEADLINE, "both tasks ended")
        assert done == ["succeeded", "succeeded"]
    assert third in _task_processes(server.pid)


def test_workers_are_shared_out_and_processes_are_checked() -> None:
    assert shares(8, 2) == [4, 4]
    assert shares(5, 3) == [2, 2, 1]
    assert shares(3, 1) == [3]
    with pytest.raises(ConfigError, match=r"--processes 3 is more than the workers \(2\)"):
        load_settings(workers=2, processes=3)


def test_serve_spreads_its_tasks_in_flight_a_thousand_to_a_process_unless_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RELAYGRAPH_PROCESSES", raising=False)
    monkeypatch.delenv("RELAYGRAPH_BROKER_URL", raising=False)
    # serve's default 100 in flight stay in the server process (its event loop); past a
    # thousand, a process per thousand, at most 16.
    sizes = (1, 100, 1000, 1001, 10_000)
    assert [load_settings(workers=n).processes for n in sizes] == [1, 1, 1, 2, 10]
    assert load_settings().processes == 1
    assert load_settings().workers == 100
    # Told, by the flag or the environment, serve does as told.
    assert load_settings(workers=8, processes=1).processes == 1
    monkeypatch.setenv("RELAYGRAPH_PROCESSES", "2")
    assert load_settings(workers=8).processes == 2
    # In the worker mode the server runs no tasks, so it starts no task process.
    monkeypatch.delenv("RELAYGRAPH_PROCESSES")
    monkeypatch.setenv("RELAYGRAPH_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
    assert load_settings(workers=8).processes == 1
    # An app made in a caller's own process runs its tasks there, whatever the workers.
    assert ServiceSettings(workers=8).processes == 1


def test_serve_with_processes_starts_task_processes(cluster: Cluster) -> None:
    server, child = _serve_in_two_processes(cluster, workers=4)
    key = cluster.create_project("acme")
    with Client(server.url, key) as client:
        ids = [
            client.submit("Write one line.", model=f"openai:script-job-{job}")["id"]
            for job in "abcd"
        ]
        # Four at once: two in each process, each under its own process's lease.
        holders = wait_until(
            lambda: len(found := _holders(cluster.home)) == 4 and found,
            DEADLINE,
            "four tasks running",
        )
        assert set(holders) == set(ids) and len(set(holders.values())) == 2, holders
    server.signal_group(signal.SIGTERM)
    wait_until(lambda: process_gone(child), DEADLINE, "the task process stopped")


def _recording(workers: InProcessDispatch) -> list[str]:
    """Make ``workers`` record the tasks it starts instead of running them."""
    started: list[str] = []

    def start(task: Any, graph_input: Any = None, *, project: str, taken: bool = False) -> None:
        assert taken and graph_input == {"request": task.input}
        with workers._lock:  # as the real one does: a busy worker until the test frees it
            workers._cancel.setdefault(task.id, threading.Event())
            workers._futures.add(Future())
        started.append(task.id)

    workers.start = start  # type: ignore[method-assign]
    return started


def test_pulling_processes_take_only_what_their_free_workers_run(
    ledger: Ledger, tmp_path: Path
) -> None:
    project, _ = ledger.create_project("t")
    first, _ = ledger.create_task(project_id=project.id, input="a", thread_id="t1")
    behind, _ = ledger.create_task(project_id=project.id, input="b", thread_id="t1")
    other, _ = ledger.create_task(project_id=project.id, input="c", thread_id="t2")
    last, _ = ledger.create_task(project_id=project.id, input="d", thread_id="t3")
    one = InProcessDispatch(ledger, home=tmp_path, workers=1, pull=True)
    two = InProcessDispatch(ledger, home=tmp_path, workers=2, pull=True)
    taken_by_one, taken_by_two = _recording(one), _recording(two)
    try:
        assert one.pull() == 1 and taken_by_one == [first.id]  # the oldest, one worker
        assert one.pull() == 0  # no worker free
        # The other process skips the task behind `first` on its thread.
        assert two.pull() == 2 and taken_by_two == [other.id, last.id]
    finally:
        one.shutdown(wait=False)
        two.shutdown(wait=False)
    holders = {t: ledger.get_task(t, project_id=project.id) for t in (first.id, other.id)}
    assert {t.status for t in holders.values() if t} == {"running"}
    waiting = ledger.get_task(behind.id, project_id=project.id)
    assert waiting is not None and waiting.status == "queued"


def test_tasks_behind_a_paused_thread_do_not_starve_other_threads(
    ledger: Ledger, tmp_path: Path
) -> None:
    """A hostile (or just busy) tenant pauses a thread on an approval and queues more tasks
    behind it than a pull reads at once: another tenant's task still gets the free worker."""
    hostile, _ = ledger.create_project("hostile")
    paused, _ = ledger.create_task(project_id=hostile.id, input="p", thread_id="held")
    assert ledger.take_lease(paused.id, "elsewhere", seconds=600, only_from=("queued",))
    ledger.set_status(paused.id, "interrupted", stop_reason="awaiting approval")
    behind = [
        ledger.create_task(project_id=hostile.id, input=f"b{i}", thread_id="held")[0]
        for i in range(6)
    ]
    victim, _ = ledger.create_project("victim")
    theirs, _ = ledger.create_task(project_id=victim.id, input="v", thread_id="own")
    workers = InProcessDispatch(ledger, home=tmp_path, workers=1, pull=True)
    started = _recording(workers)
    try:
        assert workers.pull() == 1 and started == [theirs.id]
    finally:
        workers.shutdown(wait=False)
    assert ledger.queued_tasks(limit=10) == []  # all behind the paused one: none may start
    left = [ledger.get_task(t.id, project_id=hostile.id) for t in behind]
    assert {t.status for t in left if t} == {"queued"}


def test_a_cancel_between_the_take_and_the_run_ends_the_task(home: Path, script: Any) -> None:
    """A task taken for a free worker and cancelled before its run takes the lease again
    is cancelled at once, not left ``running`` under the lease until it lapses."""

    ledger, project, task = one_task(
        home, script({"supervisor": [{"route": {"next": "FINISH", "task": "", "reason": "x"}}]})
    )
    workers = InProcessDispatch(ledger, home=home, workers=1, pull=True)
    try:
        taken = workers.take(task.id, only_from=("queued",))
        assert taken is not None
        asked = ledger.request_cancel(task.id)  # held: asked, not ended
        assert asked.status == "running" and asked.cancel_requested_at is not None
        workers.start(taken, {"request": "x"}, project=project.id, taken=True)
        ended = task_end(ledger, task.id, project.id)
    finally:
        workers.shutdown(wait=True)
    assert ended.status == "cancelled" and ended.stop_reason == "cancelled by request"


def test_a_taken_start_that_another_runner_continued_cancels_nothing(
    home: Path, script: Any
) -> None:
    """A task taken here (a decision's resume) whose lease lapsed while it waited for a
    worker, and which another server continued meanwhile, is left to that server when its
    start here comes: not cancelled (the start's refused take is no cancel), not run twice."""

    ledger, project, task = one_task(home, script(WRITER_TURNS))
    workers = InProcessDispatch(ledger, home=home, workers=1)
    try:
        taken = workers.take(task.id, only_from=("queued",))
        assert taken is not None
        lapse(ledger, task.id, workers.runner.runner_id)
        assert ledger.take_lease(task.id, "other-server", seconds=600)
        started = threading.Event()
        run = workers.runner.arun

        async def recorded(*args: Any, **kwargs: Any) -> Any:
            try:
                return await run(*args, **kwargs)
            finally:
                started.set()

        workers.runner.arun = recorded  # type: ignore[method-assign]
        workers.start(taken, {"request": "x"}, project=project.id, taken=True)
        assert started.wait(DEADLINE), "the start ran"
    finally:
        workers.shutdown(wait=True)
    now = ledger.get_task(task.id, project_id=project.id)
    assert now is not None and now.status == "running" and now.cancel_requested_at is None
    assert ledger.lease_of(task.id)[0] == "other-server"
    assert ledger.events_after(task.id) == []


def _occupy_the_only_slot(workers: InProcessDispatch, busy: threading.Event) -> Future[None]:
    """A busy worker: hold the room of the workers' one task in flight until ``busy``."""

    async def occupy() -> None:
        async with workers._slots:
            await asyncio.to_thread(busy.wait, DEADLINE)

    return workers._loop.submit(occupy())


def test_a_taken_task_waiting_for_a_worker_keeps_its_lease(
    home: Path, script: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task taken here that waits for a busy worker (a decision's resume on a server
    whose workers all run) has its lease renewed by the sweeper while it waits, so that
    it does not lapse for another server to take."""

    ledger, project, task = one_task(home, script(WRITER_TURNS))
    workers = InProcessDispatch(ledger, home=home, workers=1, lease_seconds=2.0)
    busy, renewed = threading.Event(), threading.Event()
    renew = ledger.renew_lease

    def watched(task_id: str, runner_id: str, **kwargs: Any) -> bool:
        ok = renew(task_id, runner_id, **kwargs)
        if task_id == task.id and ok:
            renewed.set()
        return ok

    monkeypatch.setattr(ledger, "renew_lease", watched)
    try:
        blocker = _occupy_the_only_slot(workers, busy)
        taken = workers.take(task.id, only_from=("queued",))
        assert taken is not None
        workers.start(taken, {"request": "x"}, project=project.id, taken=True)
        workers.sweep()
        assert renewed.wait(DEADLINE), "the waiting task's lease was renewed"
        busy.set()
        blocker.result(DEADLINE)
        ended = task_end(ledger, task.id, project.id)
    finally:
        busy.set()
        workers.shutdown(wait=True)
    assert ended.status == "succeeded", ended.stop_reason


def test_a_taken_task_waiting_for_a_worker_is_cancelled_at_once(home: Path, script: Any) -> None:
    """A task taken here that waits for a busy worker is cancelled at once when asked: no
    run of it has begun, so its lease is let go (it was renewed, and the cancel waited for
    a worker to free up), and its start, when a worker frees, runs nothing."""

    ledger, project, task = one_task(home, script(WRITER_TURNS))
    workers = InProcessDispatch(ledger, home=home, workers=1)
    busy = threading.Event()
    try:
        blocker = _occupy_the_only_slot(workers, busy)
        taken = workers.take(task.id, only_from=("queued",))
        assert taken is not None
        workers.start(taken, {"request": "x"}, project=project.id, taken=True)
        cancelled = workers.cancel(task.id)
        assert cancelled.status == "cancelled", cancelled
        assert ledger.lease_of(task.id) == (None, None)
        busy.set()
        blocker.result(DEADLINE)
    finally:
        busy.set()
        workers.shutdown(wait=True)
    now = ledger.get_task(task.id, project_id=project.id)
    assert now is not None and now.status == "cancelled"
    assert [e.type for e in ledger.events_after(task.id)] == ["run_finished"]


@pytest.mark.parametrize(
    "record",
    [{"policy": {}}, {"topology": {"kind": "mesh"}}],
    ids=["no stored policy", "an unknown topology"],
)
def test_a_queued_task_whose_record_cannot_be_read_fails_once(
    home: Path, script: Any, takes: list[Any], record: dict[str, Any]
) -> None:
    """A task whose stored policy or topology the runner cannot read (a record of another
    version, one written by hand) fails with the reason, once: it was left queued, and the
    server took it again at once, and again (a tight loop of 'could not start')."""
    from relaygraph.runner import ledger_for

    ledger = ledger_for(home)
    project, _ = ledger.create_project("t")
    fields = {**runnable(script(WRITER_TURNS)), **record}
    task, _ = ledger.create_task(project_id=project.id, input="x", **fields)
    ended = run_on_one_worker(ledger, home, task, project.id)
    assert ended.status == "failed", ended
    assert ended.stop_reason
    assert takes == [("queued",)]
    assert ledger.lease_of(task.id) == (None, None)


def task_end(ledger: Any, task_id: str, project_id: str, deadline: float = DEADLINE) -> Any:
    """The task once it has finished (waiting for it up to ``deadline`` seconds)."""
    return wait_until(
        lambda: (t := ledger.get_task(task_id, project_id=project_id)) and t.finished and t,
        deadline,
        "the task ended",
    )


def run_on_one_worker(ledger: Any, home: Path, task: Any, project_id: str) -> Any:
    """Start ``task`` on a server's one in-process worker: the task once it has finished."""
    workers = InProcessDispatch(ledger, home=home, workers=1)
    try:
        workers.start(task, project=project_id)
        return task_end(ledger, task.id, project_id)
    finally:
        workers.shutdown(wait=True)


def one_task(home: Path, spec: str) -> tuple[Any, Any, Any]:
    """The data directory's ledger, a project of its own and one queued task on ``spec``."""
    from relaygraph.runner import ledger_for

    ledger = ledger_for(home)
    project, _ = ledger.create_project("t")
    task, _ = ledger.create_task(project_id=project.id, input="x", **runnable(spec))
    return ledger, project, task


WRITER_TURNS: dict[str, Any] = one_visit("writer", "write it", "x", say("Written."))
"""A task that runs and succeeds: the writer's one reply, then FINISH."""


@pytest.fixture
def takes(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Each ``Ledger.take_lease`` call from now on, as its ``only_from`` (None: not given)."""
    seen: list[Any] = []
    take_lease = Ledger.take_lease

    def counted(self: Ledger, task_id: str, runner_id: str, **kwargs: Any) -> Any:
        seen.append(kwargs.get("only_from"))
        return take_lease(self, task_id, runner_id, **kwargs)

    monkeypatch.setattr(Ledger, "take_lease", counted)
    return seen


def test_a_worker_takes_a_queued_task_once_and_a_second_start_runs_nothing(
    home: Path, script: Any, takes: list[Any]
) -> None:
    """A server's worker starts a queued task with one take of its lease, the run's own
    (not a take and the run's take again: one ledger write less per task); a second start
    of it finds the task no longer queued and runs nothing."""

    ledger, project, task = one_task(home, script(WRITER_TURNS))
    workers = InProcessDispatch(ledger, home=home, workers=1)
    try:
        workers.start(task, project=project.id)
        ended = task_end(ledger, task.id, project.id)
        workers.start(task, project=project.id)  # a duplicate start of the queued task
        wait_until(lambda: len(takes) == 2, DEADLINE, "the second start tried its take")
    finally:
        workers.shutdown(wait=True)
    assert ended.status == "succeeded", ended.stop_reason
    assert takes == [("queued",), ("queued",)]  # one take per start; the second refused
    assert [e.type for e in ledger.events_after(task.id)].count("run_started") == 1
    assert ledger.get_task(task.id, project_id=project.id) == ended  # left as it was


def test_a_queued_task_whose_team_cannot_be_built_fails_on_the_record(
    home: Path, tmp_path: Path
) -> None:
    """The server's worker takes the task before it builds its team: a model that cannot be
    built (its script went missing) fails the task with the reason, rather than leaving it
    queued (or running under a lease nobody renews) to be started again and again."""

    ledger, project, task = one_task(home, f"scripted:{tmp_path / 'gone.json'}")
    ended = run_on_one_worker(ledger, home, task, project.id)
    assert ended.status == "failed"
    assert "gone.json" in (ended.stop_reason or "")
    assert ledger.lease_of(task.id) == (None, None)
    assert [e.type for e in ledger.events_after(task.id)] == ["run_finished"]


@pytest.mark.parametrize("how", ["queued", "taken", "orphaned"])
def test_a_task_whose_knowledge_base_cannot_be_made_ready_fails_on_the_record(
    home: Path, script: Any, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A knowledge base that cannot be made ready (a folder gone, a broken file) fails the
    task with the reason, whether the run took the task, was handed it taken, or picked it
    up from a runner that died: it is not left queued, nor running under a lease nobody
    renews, to be started again and again."""
    from relaygraph.runner import _task_runner

    def broken(*args: Any) -> Any:
        raise ConfigError("knowledge base folder 'docs' is gone")

    monkeypatch.setattr(_task_runner, "_prepared_knowledge_base", broken)
    ledger, project, task = one_task(
        home, script({"supervisor": [{"route": {"next": "FINISH", "task": "", "reason": "x"}}]})
    )
    if how == "orphaned":
        assert ledger.take_lease(task.id, "dead", seconds=30)
        lapse(ledger, task.id, "dead")
    workers = InProcessDispatch(ledger, home=home, workers=1)
    try:
        if how == "taken":
            held = workers.take(task.id, only_from=("queued",))
            assert held is not None
            workers.start(held, {"request": "x"}, project=project.id, taken=True)
        elif how == "orphaned":
            assert workers.recover() == 1
        else:
            workers.start(task, project=project.id)
        ended = task_end(ledger, task.id, project.id, 30.0)
    finally:
        workers.shutdown(wait=True)
    assert ended.status == "failed"
    assert "knowledge base folder 'docs' is gone" in (ended.stop_reason or "")
    assert ledger.lease_of(task.id) == (None, None)
    assert [e.type for e in ledger.events_after(task.id)] == ["run_finished"]


def test_a_start_that_cannot_take_its_task_writes_nothing_of_it(
    home: Path, script: Any, monkeypatch: pytest.MonkeyPatch, takes: list[Any]
) -> None:
    """A start of a task cancelled while it waited for a worker, whose set-up would fail
    too, is refused at its take: nothing is written of the task (no failed end after its
    cancel), and the set-up is not even tried."""
    from relaygraph.runner import _task_runner

    tried: list[Any] = []

    def broken(*args: Any) -> Any:
        tried.append(args)
        raise ConfigError("knowledge base folder 'docs' is gone")

    monkeypatch.setattr(_task_runner, "_prepared_knowledge_base", broken)
    ledger, project, task = one_task(
        home, script({"supervisor": [{"route": {"next": "FINISH", "task": "", "reason": "x"}}]})
    )
    assert ledger.request_cancel(task.id).status == "cancelled"
    events = [e.type for e in ledger.events_after(task.id)]
    workers = InProcessDispatch(ledger, home=home, workers=1)
    try:
        workers.start(task, project=project.id)  # the start handed over before the cancel
        wait_until(lambda: takes, DEADLINE, "the start tried its take")
    finally:
        workers.shutdown(wait=True)
    after = ledger.get_task(task.id, project_id=project.id)
    assert after is not None and after.status == "cancelled"
    assert [e.type for e in ledger.events_after(task.id)] == events
    assert tried == []


@pytest.mark.parametrize("start", ["queued", "continue"])
def test_a_start_refused_at_its_take_leaves_the_task_to_a_later_sweep(
    home: Path, script: Any, takes: list[Any], start: str
) -> None:
    """Another server took the task first (a queued task, or a dead runner's task that
    both servers pick up): this server's start, refused at its take, forgets it, so that
    its sweep picks the task up if the winner dies too."""
    from relaygraph.runner import CONTINUE

    ledger, project, task = one_task(home, script(WRITER_TURNS))
    running = ledger.take_lease(task.id, "other", seconds=30)  # the server that won
    assert running is not None
    workers = InProcessDispatch(ledger, home=home, workers=1)
    try:
        if start == "queued":
            workers.start(task, project=project.id)
        else:
            workers.start(running, CONTINUE, project=project.id)
        # The winner's take, then this server's.
        wait_until(lambda: len(takes) == 2, DEADLINE, "the start tried its take")
        lapse(ledger, task.id, "other")  # ... and the server that won dies.
        assert wait_until(lambda: workers.recover() == 1, DEADLINE, "the sweep picks it up")
        ended = task_end(ledger, task.id, project.id)
    finally:
        workers.shutdown(wait=True)
    assert ended.status == "succeeded", ended.stop_reason


def test_two_starts_of_a_queued_task_waiting_for_one_worker_run_it_once(
    home: Path, script: Any, takes: list[Any]
) -> None:
    """The second start waits for the worker the first runs the task on; it then finds the
    task taken and runs nothing, and the first run's end stands."""

    ledger, project, task = one_task(home, script(WRITER_TURNS))
    workers = InProcessDispatch(ledger, home=home, workers=1)
    try:
        workers.start(task, project=project.id)
        workers.start(task, project=project.id)
        wait_until(lambda: len(takes) == 2, DEADLINE, "the second start tried its take")
    finally:
        workers.shutdown(wait=True)
    ended = ledger.get_task(task.id, project_id=project.id)
    assert ended is not None and ended.status == "succeeded", ended
    assert [e.type for e in ledger.events_after(task.id)].count("run_finished") == 1
