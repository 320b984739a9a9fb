"""Runs on an event loop (``TaskRunner.arun``, what ``serve`` runs tasks with): the same
events, results and ledger records as a run on a thread, many at once on one loop, and no
thread per run."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from relaygraph.policies import policy_to_mapping
from relaygraph.runner import TaskRunner
from relaygraph.runner._checkpoint import close_async_checkpointers
from relaygraph.store import LOCAL_PROJECT_ID, Ledger, Task
from relaygraph.topology import Topology
from tests.builtin_team import default_policy
from tests.conftest import EXAMPLE_RELAY


def _task(ledger: Ledger, request: str, thread_id: str | None = None) -> Task:
    roles = Topology().roles(tuple(default_policy().agents))
    task, _ = ledger.create_task(
        project_id=LOCAL_PROJECT_ID,
        input=request,
        policy=policy_to_mapping(default_policy()),
        models=dict.fromkeys(roles, f"scripted:{EXAMPLE_RELAY}"),
        topology=Topology().to_mapping(),
        **({"thread_id": thread_id} if thread_id else {}),
    )
    return task


def _counts(usage: dict[str, Any]) -> dict[str, Any]:
    """A run's usage without its wall-clock seconds."""
    return {
        role: {k: v for k, v in figures.items() if "second" not in k}
        for role, figures in usage.items()
    }


def _kinds(ledger: Ledger, task_id: str) -> list[str]:
    return [e.type for e in ledger.events_after(task_id)]


def test_runs_on_a_loop_match_a_run_on_a_thread(ledger: Ledger, home: Path) -> None:
    runner = TaskRunner(ledger=ledger, home=home)
    on_thread = _task(ledger, "When are checkpoints written?")
    expected = runner.run(on_thread, {"request": on_thread.input})
    assert expected.status == "succeeded"

    tasks = [_task(ledger, "When are checkpoints written?") for _ in range(6)]
    threads_seen: list[int] = []

    async def main() -> list[Any]:
        async def sample() -> None:
            while True:
                threads_seen.append(threading.active_count())
                await asyncio.sleep(0.01)

        sampler = asyncio.create_task(sample())
        try:
            return await asyncio.gather(
                *(runner.arun(task, {"request": task.input}) for task in tasks)
            )
        finally:
            sampler.cancel()
            await close_async_checkpointers()

    results = asyncio.run(main())
    for task, result in zip(tasks, results, strict=True):
        assert result.status == "succeeded", result.stop_reason
        assert result.answer == expected.answer
        assert _counts(result.usage) == _counts(expected.usage)
        assert _kinds(ledger, task.id) == _kinds(ledger, on_thread.id)
        stored = ledger.get_task(task.id, project_id=LOCAL_PROJECT_ID)
        assert stored is not None and stored.status == "succeeded"
        assert ledger.lease_of(task.id)[0] is None  # The lease went with the end.


def _job_turns(job: str) -> list[dict[str, Any]]:
    task = f"[job {job}] Write the line."
    return [
        {"route": {"next": "writer", "task": task, "reason": "a deliverable"}},
        {"content": f"One line for [job {job}]."},
        {"route": {"next": "FINISH", "task": "", "reason": "written"}},
        {"content": f"Done: one line for [job {job}]."},
    ]


def _job_of(body: dict[str, Any]) -> str | None:
    found = re.search(r"\[job ([\w-]+)\]", json.dumps(body.get("messages")))
    return found.group(1) if found else None


def test_a_server_holds_many_tasks_in_flight_on_few_threads(
    ledger: Ledger, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``InProcessDispatch`` runs every task in flight on its loop: with a model that takes its
    time, all of them wait for it at once, on a handful of threads, and ``load()`` says so."""
    from relaygraph.api._in_process import InProcessDispatch
    from relaygraph.runner._event_writer import WRITE_THREADS
    from tests.openai_server import serve_script

    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    count = 60
    jobs = [f"j{i}" for i in range(count)]
    gate = threading.Event()
    arrived: set[str] = set()

    def key_from(body: dict[str, Any]) -> str | None:
        job = _job_of(body)
        if job is not None:
            arrived.add(job)
            # The model answers no task's first call until every task has made one: they
            # are all in flight at once, or the test times out.
            gate.wait(60)
        return job

    script = {job: _job_turns(job) for job in jobs}
    with serve_script(script, key_from=key_from) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        roles = Topology().roles(tuple(default_policy().agents))
        tasks = []
        for job in jobs:
            task, _ = ledger.create_task(
                project_id=LOCAL_PROJECT_ID,
                input=f"[job {job}] Write one line.",
                policy=policy_to_mapping(default_policy()),
                models=dict.fromkeys(roles, "openai:script-bench"),
                topology=Topology().to_mapping(),
            )
            tasks.append(task)
        before = set(threading.enumerate())
        workers = InProcessDispatch(ledger, home=home, workers=count, sync_threads=4)
        try:
            for task in tasks:
                workers.enqueue(task)
            deadline = time.monotonic() + 120
            while len(arrived) < count and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(arrived) == count  # Every task waits for its model at once...
            load = workers.load()
            assert (load.in_flight, load.waiting, load.capacity) == (count, 0, count)
            # ...on a bounded set of threads, not one each (the model double's own are not
            # ours). The process's task loop is shared: an earlier test in this process may
            # have started it with its default executor, whose size then bounds it.
            ours = [
                t.name
                for t in set(threading.enumerate()) - before
                if t.name.startswith("relaygraph")
            ]
            sync = workers._loop._executor._max_workers  # The loop's default executor.
            bound = sync + WRITE_THREADS + 4  # The loop, lease and cancel watchers.
            assert bound < count
            assert len(ours) <= bound, ours
            gate.set()
            for task in tasks:
                while time.monotonic() < deadline:
                    stored = ledger.get_task(task.id, project_id=LOCAL_PROJECT_ID)
                    if stored is not None and stored.status not in ("queued", "running"):
                        break
                    time.sleep(0.05)
                assert stored is not None and stored.status == "succeeded", stored
        finally:
            gate.set()
            workers.shutdown(wait=True)
    assert workers.load().in_flight == 0


def test_metrics_show_the_tasks_in_flight_and_the_loops_lag() -> None:
    from datetime import UTC, datetime

    from relaygraph.api._in_process import WorkersLoad
    from relaygraph.api.routes.metrics import metrics_text

    load = WorkersLoad(
        in_flight=187, waiting=3, capacity=200, loop_lag_seconds=0.0042, sync_queue=1
    )
    text = metrics_text({}, None, now=datetime.now(UTC), load=load)
    lines = set(text.splitlines())
    assert {
        "relaygraph_tasks_in_flight 187",
        "relaygraph_tasks_in_flight_max 200",
        "relaygraph_tasks_waiting 3",
        "relaygraph_event_loop_lag_seconds 0.0042",
        "relaygraph_sync_steps_waiting 1",
    } <= lines
    # The worker mode's API servers run no tasks: no such gauges.
    assert "tasks_in_flight" not in metrics_text({}, None, now=datetime.now(UTC))


def test_tasks_in_flight_past_the_limit_are_refused_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from relaygraph.api._settings import load_settings
    from relaygraph.errors import ConfigError

    monkeypatch.delenv("RELAYGRAPH_PROCESSES", raising=False)
    with pytest.raises(ConfigError, match="--workers"):
        load_settings(workers=10_001)
    assert load_settings(workers=10_000).workers == 10_000


def test_the_task_loop_runs_on_uvloop_unless_told_asyncio(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """uvloop (a dependency) is the task loop's and the HTTP server's by default;
    ``RELAYGRAPH_EVENT_LOOP=asyncio`` keeps asyncio's own loop, and a value that is neither
    is refused by name."""
    import uvloop

    from relaygraph.errors import ConfigError
    from relaygraph.runner import EVENT_LOOP_ENV, TaskLoop, event_loop_kind

    def loop_type() -> type:
        tasks = TaskLoop(sync_threads=1, name="kind")
        return type(tasks.loop)  # The loop is left to its daemon thread, as a process's is.

    monkeypatch.delenv(EVENT_LOOP_ENV, raising=False)
    assert event_loop_kind() == "auto"
    assert issubclass(loop_type(), uvloop.Loop)
    monkeypatch.setenv(EVENT_LOOP_ENV, "asyncio")
    assert not issubclass(loop_type(), uvloop.Loop)
    monkeypatch.setenv(EVENT_LOOP_ENV, "uvloop")
    assert issubclass(loop_type(), uvloop.Loop)
    monkeypatch.setenv(EVENT_LOOP_ENV, "trio")
    with pytest.raises(ConfigError, match=r"RELAYGRAPH_EVENT_LOOP='trio'"):
        event_loop_kind()
