"""The worker mode as deployed: API servers and Celery workers as real processes on loopback.

Each test starts its own cluster (tests/worker_cluster.py): ``relaygraph serve`` processes in
broker mode and ``relaygraph worker`` processes on this machine's RabbitMQ and PostgreSQL,
sharing a data directory, a fresh database and a queue of their own, so no test sees
another's tasks or messages. Workers run through ``tests.worker_trace``, which records which
pool process took which task and when its run returned: a test knows which worker to kill or
freeze, and when a run is over, from the worker itself.

Nothing here waits a fixed time for correctness: every wait polls for a condition under a
generous deadline (a loaded 2-core machine). A program that must be running when a worker is
killed, frozen or cancelled waits for a file that the test creates (``go-<token>``, one per
start of the program), so the signal always lands mid-tool.

The tests skip when RabbitMQ or PostgreSQL is not reachable, unless
``RELAYGRAPH_REQUIRE_RABBITMQ=1`` / ``RELAYGRAPH_REQUIRE_POSTGRES=1`` (CI) make that a failure.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from relaygraph.agents._journal import replay
from relaygraph.client import Client

from ._scripts import one_visit, say
from ._service import FINISHED
from .conftest import EXAMPLE_RELAY
from .test_async_tools import shouters_team
from .worker_cluster import (
    ApiServer,
    Cluster,
    Run,
    free_port,
    fresh_database,
    gated_coder,
    process_gone,
    wait_until,
)

DEADLINE = 180.0
"""Seconds any one wait may take before the test fails (generous: a loaded 2-core machine)."""
DEFAULT_MODEL = f"scripted:{EXAMPLE_RELAY}"

Script = Callable[[dict[str, Any]], str]

# Each finalize turn repeats the last agent's reply: finalize answers with that reply without
# a model call unless the policy asks for one, and either way the answer is the same.
ARTIFACT_TEAM = one_visit(
    "writer",
    "write the report",
    "a deliverable",
    {
        "tool_calls": [
            {
                "name": "save_artifact",
                "args": {"name": "report.md", "content": "# Report\n"},
                "id": "save",
            }
        ]
    },
    say("Saved report.md."),
    finished="written",
    final="Saved report.md.",
)

APPROVED_CODE = "with open('effects.txt', 'a') as f:\n    f.write('ran\\n')\nprint('ran')"
APPROVAL_TEAM = one_visit(
    "coder",
    "compute",
    "code to run",
    {"tool_calls": [{"name": "run_python", "args": {"code": APPROVED_CODE}, "id": "ask"}]},
    say("It ran."),
    final="It ran.",
)
APPROVAL_POLICY = {"agents": {"coder": {"approval": ["run_python"]}}}

PLAIN_TEAM = one_visit(
    "writer", "write a line", "a deliverable", say("A line."), finished="written", final="A line."
)


# Services and the cluster


@pytest.fixture
def database(postgres_server: str) -> Iterator[str]:
    """A fresh database (``relaygraph_cluster_<random>``) for this test, dropped after it.

    One per test rather than per module: an API server picks up the queued tasks it finds
    in its ledger when it starts, so a task a failed test left behind must not be there."""
    with fresh_database(postgres_server) as url:
        yield url


@pytest.fixture
def cluster(tmp_path: Path, rabbitmq: str, database: str, scripts: Path) -> Iterator[Cluster]:
    """A cluster on this test's database and queue; every process group is killed after."""
    with Cluster(
        tmp_path / "cluster", database_url=database, broker=rabbitmq, scripts=scripts
    ) as made:
        yield made


# Helpers


def two_servers(cluster: Cluster) -> list[ApiServer]:
    """Two API servers (``api-1``, ``api-2``) on the default model, sharing the cluster's
    ledger and queue: a task submitted to one may be followed or decided on the other."""
    return [
        cluster.serve("api-1", model=DEFAULT_MODEL),
        cluster.serve("api-2", model=DEFAULT_MODEL),
    ]


def waited(
    cluster: Cluster, condition: Callable[[], Any], what: str, timeout: float = DEADLINE
) -> Any:
    """``wait_until``, failing the test with every process's output when it times out."""
    try:
        return wait_until(condition, timeout, what)
    except TimeoutError as exc:
        pytest.fail(f"{exc}\n{cluster.outputs()}", pytrace=False)


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [event["event"] for event in events]


def lines(cluster: Cluster, task_id: str, name: str) -> list[str]:
    """The lines of a file in the task's workspace ([] while it does not exist)."""
    path = cluster.task_dir(task_id) / "workspace" / name
    return path.read_text().splitlines() if path.exists() else []


def release(cluster: Cluster, task_id: str, token: str) -> None:
    """Let the gated program that started with ``token`` finish."""
    (cluster.task_dir(task_id) / "workspace" / f"go-{token}").touch()


def started(cluster: Cluster, task_id: str, count: int) -> list[str]:
    """Wait until the gated program of the task has started ``count`` times; its tokens."""
    tokens: list[str] = waited(
        cluster,
        lambda: (found := lines(cluster, task_id, "starts.txt")) and len(found) >= count and found,
        f"the program of task {task_id} started {count} time(s)",
    )
    return tokens


def runs_of(cluster: Cluster, task_id: str, count: int) -> list[Run]:
    """Wait until ``count`` runs of the task have started on the workers; those runs."""
    runs: list[Run] = waited(
        cluster,
        lambda: (found := cluster.trace.runs(task_id)) and len(found) >= count and found,
        f"task {task_id} taken by a worker {count} time(s)",
    )
    return runs


class Follower:
    """Follows a task's event stream (SSE) on a thread of its own, from its first event."""

    def __init__(self, url: str, key: str, task_id: str) -> None:
        self.events: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self._args = (url, key, task_id)
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        url, key, task_id = self._args
        try:
            with Client(url, key) as client:
                for event in client.events(task_id, retry_for=60):
                    self.events.append(event)
        except BaseException as exc:
            self.error = exc

    def result(self, cluster: Cluster, timeout: float = DEADLINE) -> list[dict[str, Any]]:
        """The whole stream, once the server ended it (the task finished)."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            pytest.fail(
                f"the event stream of {self._args[2]} did not end within {timeout:g} s; "
                f"events so far: {kinds(self.events)}\n{cluster.outputs()}",
                pytrace=False,
            )
        if self.error is not None:
            raise self.error
        return self.events


def check_stream(events: list[dict[str, Any]], status: str) -> None:
    """Event ids 1, 2, 3, ... with no gap or repeat, and one terminal event, the last, of
    ``status`` (a run that paused for a person ended ``interrupted`` before it)."""
    assert [e["id"] for e in events] == list(range(1, len(events) + 1)), kinds(events)
    ends = [e["data"]["status"] for e in events if e["event"] == "run_finished"]
    assert [end for end in ends if end != "interrupted"] == [status], ends
    assert events[-1]["event"] == "run_finished", kinds(events)


def tool_events(events: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    """Every event's kind, with the call id of tool events (for failure messages)."""
    return [(e["event"], e["data"].get("tool_call_id")) for e in events]


def tool_rows(cluster: Cluster, task_id: str) -> list[dict[str, Any]]:
    return cluster.sql(
        "SELECT tool, tool_call_id, status, result_preview FROM tool_calls "
        "WHERE task_id = :task ORDER BY id",
        task=task_id,
    )


def journal(cluster: Cluster, task_id: str) -> dict[str, dict[str, Any]]:
    rows = cluster.sql(
        "SELECT call_id, record FROM tool_journal WHERE task_id = :task", task=task_id
    )
    return {row["call_id"]: row["record"] for row in rows}


def attempts(cluster: Cluster, task_id: str) -> int:
    """The task's attempt count, the fencing number of its latest attempt."""
    [row] = cluster.sql("SELECT attempts FROM tasks WHERE id = :task", task=task_id)
    return int(row["attempts"])


def checkpoint_rows(cluster: Cluster, task_id: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the task's checkpoint thread, table by table (``checkpoints``, the
    tasks' pending ``checkpoint_writes``, the channels' ``checkpoint_blobs``)."""
    [row] = cluster.sql("SELECT checkpoint_thread FROM tasks WHERE id = :task", task=task_id)
    rows = {
        table: cluster.sql(
            f"SELECT * FROM {table} WHERE thread_id = :thread", thread=row["checkpoint_thread"]
        )
        for table in ("checkpoints", "checkpoint_writes", "checkpoint_blobs")
    }
    return {
        table: sorted(
            tuple(json.dumps(v, sort_keys=True, default=str) for v in r.values()) for r in found
        )
        for table, found in rows.items()
    }


def journaled_text(record: dict[str, Any]) -> str:
    """What the journaled call returned into the graph (the tool message's text)."""
    return str(replay(record).content)  # type: ignore[union-attr]


# 1. Many tasks, two servers, two workers


@pytest.mark.slow
def test_forty_tasks_across_two_servers_and_two_workers_run_once_each(
    cluster: Cluster, served_script: Script
) -> None:
    spec = served_script(ARTIFACT_TEAM)
    servers = two_servers(cluster)
    workers = [cluster.worker("w1", concurrency=2), cluster.worker("w2", concurrency=2)]
    key = cluster.create_project("acme")

    submitted: list[tuple[str, int]] = []  # (task id, index of the server that took it)
    with Client(servers[0].url, key) as one, Client(servers[1].url, key) as two:
        for i in range(40):
            took = i % 2
            task = (one, two)[took].submit(f"Write report {i}", model=spec)
            assert task["status"] in ("queued", "running")
            submitted.append((task["id"], took))

    def follow(entry: tuple[str, int]) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
        """Read the task's events (live or replayed) and state through the other server."""
        task_id, took = entry
        with Client(servers[1 - took].url, key) as other:
            events = list(other.events(task_id, retry_for=60))
            return task_id, events, other.get(task_id)

    pool = ThreadPoolExecutor(max_workers=10)
    try:
        futures = [pool.submit(follow, entry) for entry in submitted]
        deadline = time.monotonic() + 2 * DEADLINE
        try:
            results = [f.result(timeout=max(1, deadline - time.monotonic())) for f in futures]
        except FuturesTimeout:
            pytest.fail(f"not every task's stream ended\n{cluster.outputs()}", pytrace=False)
    finally:
        # A stream still open ends when the fixture kills the servers.
        pool.shutdown(wait=False, cancel_futures=True)

    for task_id, events, task in results:
        assert task["status"] == "succeeded", (task_id, task["stop_reason"], kinds(events))
        assert task["answer"] == "Saved report.md."
        check_stream(events, "succeeded")
        counted = Counter(kinds(events))
        assert counted["run_started"] == 1, kinds(events)
        assert counted["final"] == 1, kinds(events)
        saved = [e for e in events if e["event"] == "tool_result"]
        assert [(e["data"]["tool"], e["data"]["ran"]) for e in saved] == [("save_artifact", True)]
        assert task["last_event_seq"] == len(events)
        artifacts = cluster.task_dir(task_id) / "artifacts"
        assert sorted(p.name for p in artifacts.iterdir()) == ["report.md"]

    ids = [task_id for task_id, _ in submitted]
    # The ledger: one tool call and one journal record per task, all succeeded.
    rows = cluster.sql(
        "SELECT task_id, count(*) AS n FROM tool_calls WHERE tool = 'save_artifact' "
        "GROUP BY task_id"
    )
    assert {row["task_id"]: row["n"] for row in rows} == dict.fromkeys(ids, 1)
    rows = cluster.sql("SELECT task_id, count(*) AS n FROM tool_journal GROUP BY task_id")
    assert {row["task_id"]: row["n"] for row in rows} == dict.fromkeys(ids, 1)
    statuses = cluster.sql("SELECT status, count(*) AS n FROM tasks GROUP BY status")
    assert {row["status"]: row["n"] for row in statuses} == {"succeeded": 40}
    # The workers: each task taken once, by one of the two, and both took some.
    runs = cluster.trace.runs()
    assert Counter(run.task_id for run in runs) == dict.fromkeys(ids, 1)
    assert {run.ppid for run in runs} == {worker.pid for worker in workers}
    assert waited(cluster, lambda: not cluster.trace.busy(), "every run returned")
    assert cluster.queue_counts()[0] == 0


# 2. kill -9 of a worker mid-tool


@pytest.mark.slow
def test_kill_9_of_a_worker_mid_tool_continues_the_task_on_the_other_once(
    cluster: Cluster, served_script: Script
) -> None:
    server = cluster.serve("api", model=DEFAULT_MODEL)
    cluster.worker("w1")
    cluster.worker("w2")
    key = cluster.create_project("acme")
    with Client(server.url, key) as client:
        task_id = client.submit("compute slowly", model=served_script(gated_coder(first=True)))[
            "id"
        ]
    stream = Follower(server.url, key, task_id)

    # The quick program ran; the gated one is running: kill its worker's whole group.
    [first_token] = started(cluster, task_id, 1)
    assert lines(cluster, task_id, "effects.txt") == ["first"]
    [first_run] = runs_of(cluster, task_id, 1)
    holder = cluster.worker_of(first_run)
    [other] = [w for w in cluster.workers if w is not holder]
    holder.signal_group(signal.SIGKILL)
    holder.popen.wait(30)
    waited(cluster, lambda: process_gone(first_run.pid), "the killed pool process gone")

    # RabbitMQ gives the unacknowledged message to the other worker, which continues the
    # task from its checkpoint: the gated program starts again, and only that run may end.
    second_run = runs_of(cluster, task_id, 2)[1]
    assert second_run.ppid == other.pid
    assert second_run.dispatch == first_run.dispatch
    tokens = started(cluster, task_id, 2)
    assert tokens[0] == first_token
    release(cluster, task_id, tokens[1])

    events = stream.result(cluster)
    with Client(server.url, key) as client:
        done = client.get(task_id)
    assert (done["status"], done["answer"]) == ("succeeded", "It ran."), done
    # One stream across both attempts: no gap, one end.
    check_stream(events, "succeeded")
    assert kinds(events).count("run_started") == 2, kinds(events)
    assert kinds(events).count("final") == 1, kinds(events)
    assert done["last_event_seq"] == len(events)
    assert attempts(cluster, task_id) == 2  # The killed worker's attempt, then the other's.
    # Completed steps were not run again: the supervisor routed to the coder once.
    assert [e["data"]["next"] for e in events if e["event"] == "route"] == ["coder", "FINISH"]
    # Completed tool calls were not repeated: the quick program ran once, the gated one
    # finished once (the killed run's copy never did), and the ledger holds one call each.
    assert lines(cluster, task_id, "effects.txt") == ["first", tokens[1]]
    assert lines(cluster, task_id, "starts.txt") == tokens
    rows = tool_rows(cluster, task_id)
    assert sorted((r["tool"], r["tool_call_id"], r["status"]) for r in rows) == [
        ("run_python", "first", "success"),
        ("run_python", "gated", "success"),
    ], (rows, tool_events(events))
    records = journal(cluster, task_id)
    assert set(records) == {"first", "gated"}
    assert f"went {tokens[1]}" in journaled_text(records["gated"])
    results = [e["data"] for e in events if e["event"] == "tool_result"]
    assert [r["tool_call_id"] for r in results].count("gated") == 1, results
    assert waited(cluster, lambda: cluster.trace.returned(second_run), "the second run returned")


# 3. A frozen worker comes back: its late writes are refused


@pytest.mark.slow
def test_a_frozen_worker_that_comes_back_cannot_overwrite_the_new_attempt(
    cluster: Cluster, served_script: Script
) -> None:
    # A low heartbeat: RabbitMQ gives a frozen worker's task away after about 3 of them.
    fast = {"RELAYGRAPH_BROKER_HEARTBEAT": "2"}
    server = cluster.serve("api", model=DEFAULT_MODEL)
    cluster.worker("w1", env=fast)
    cluster.worker("w2", env=fast)
    key = cluster.create_project("acme")
    with Client(server.url, key) as client:
        task_id = client.submit("compute slowly", model=served_script(gated_coder()))["id"]

    [old_token] = started(cluster, task_id, 1)
    [old_run] = runs_of(cluster, task_id, 1)
    frozen = cluster.worker_of(old_run)
    [other] = [w for w in cluster.workers if w is not frozen]
    # Freeze the worker, its main process and its pool (the sandboxed program, in a
    # session of its own, keeps waiting for its file).
    frozen.signal_group(signal.SIGSTOP)
    try:
        new_run = runs_of(cluster, task_id, 2)[1]
        assert new_run.ppid == other.pid
        new_token = started(cluster, task_id, 2)[1]
        release(cluster, task_id, new_token)
        with Client(server.url, key) as client:
            done = waited(
                cluster,
                lambda: (task := client.get(task_id))["status"] in FINISHED and task,
                "the new attempt finished the task",
            )
            events = list(client.events(task_id))
        assert (done["status"], done["answer"]) == ("succeeded", "It ran."), done
        check_stream(events, "succeeded")
        ledger_then = (tool_rows(cluster, task_id), journal(cluster, task_id))
        checkpoints_then = checkpoint_rows(cluster, task_id)
        assert f"went {new_token}" in journaled_text(ledger_then[1]["gated"])

        # The old attempt's program ends too, while its pool process is still frozen; then
        # that pool process alone goes on (before its worker can stop it), with a completed
        # tool call in hand and every later step of the task to run: its writes must all be
        # refused.
        release(cluster, task_id, old_token)
        waited(
            cluster,
            lambda: old_token in lines(cluster, task_id, "effects.txt"),
            "the old attempt's program finished",
        )
        os.kill(old_run.pid, signal.SIGCONT)
        waited(cluster, lambda: cluster.trace.returned(old_run), "the old attempt returned")
    finally:
        frozen.signal_group(signal.SIGCONT)

    with Client(server.url, key) as client:
        after = client.get(task_id)
        events_after = list(client.events(task_id))
    # The ledger shows the new attempt's work only: the same events, the same status and
    # answer, the same tool call and journal record (the new program's result).
    assert events_after == events
    assert {k: after[k] for k in ("status", "answer", "stop_reason", "last_event_seq")} == {
        k: done[k] for k in ("status", "answer", "stop_reason", "last_event_seq")
    }
    assert (tool_rows(cluster, task_id), journal(cluster, task_id)) == ledger_then
    # Nor did its checkpoints reach the thread the new attempt went on from: no newer
    # checkpoint, no step's writes over the new attempt's.
    assert checkpoint_rows(cluster, task_id) == checkpoints_then
    assert attempts(cluster, task_id) == 2  # The frozen worker's, fenced, and the new one.
    assert [(r["tool_call_id"], r["status"]) for r in ledger_then[0]] == [("gated", "success")]
    # The frozen worker is back on the queue.
    waited(cluster, lambda: cluster.queue_counts()[1] == 2, "the frozen worker consumes again")


# 4. A task waiting for a person holds no worker


@pytest.mark.slow
def test_tasks_waiting_for_approval_hold_no_worker_and_resume_on_any(
    cluster: Cluster, served_script: Script
) -> None:
    servers = two_servers(cluster)
    cluster.worker("w1")
    cluster.worker("w2")  # Two places to run tasks, for ten waiting tasks.
    key = cluster.create_project("acme")
    asking = served_script(APPROVAL_TEAM)
    with Client(servers[0].url, key) as one, Client(servers[1].url, key) as two:
        ids = [
            one.submit(f"compute {i}", model=asking, policy=APPROVAL_POLICY)["id"]
            for i in range(10)
        ]
        for task_id in ids:
            waiting = one.wait(task_id, timeout=DEADLINE)
            assert waiting["status"] == "interrupted", waiting
            assert lines(cluster, task_id, "effects.txt") == []  # Nothing ran unapproved.
        # All ten are paused, and no pool process is in a run: each run returned when it
        # paused, and nothing waits in the queue.
        assert waited(cluster, lambda: not cluster.trace.busy(), "every paused run returned")
        assert Counter(run.task_id for run in cluster.trace.runs()) == dict.fromkeys(ids, 1)
        assert cluster.queue_counts()[0] == 0

        # So one more task runs at once, on the other server.
        plain = two.submit("write a line", model=served_script(PLAIN_TEAM))
        done = two.wait(plain["id"], timeout=DEADLINE)
        assert done["status"] == "succeeded", done
        assert {one.get(task_id)["status"] for task_id in ids} == {"interrupted"}

        # Each decision (through the other server) continues its task on some worker.
        for task_id in ids:
            assert two.approve(task_id, reason="fine")["status"] in (
                "queued",
                "running",
                "succeeded",
            )
        for task_id in ids:
            done = two.wait(task_id, timeout=DEADLINE, until=FINISHED)
            assert (done["status"], done["answer"]) == ("succeeded", "It ran."), done
            assert lines(cluster, task_id, "effects.txt") == ["ran"]
            events = list(one.events(task_id))
            check_stream(events, "succeeded")
            assert kinds(events).count("interrupted") == 1
            assert kinds(events).count("run_started") == 2
            [decided] = two.approvals(task_id)
            assert (decided["decision"], decided["decided_by"]) == ("approve", "acme")
    for task_id in ids:
        runs = cluster.trace.runs(task_id)
        assert len(runs) == 2, runs
        assert runs[1].dispatch > runs[0].dispatch  # The decision was a new message.


# 5. Cancel reaches the worker


@pytest.mark.slow
def test_cancel_stops_a_task_on_a_worker_at_the_step_boundary(
    cluster: Cluster, served_script: Script
) -> None:
    servers = two_servers(cluster)
    cluster.worker("w1")
    cluster.worker("w2")
    key = cluster.create_project("acme")
    with Client(servers[0].url, key) as client:
        task_id = client.submit("compute slowly", model=served_script(gated_coder()))["id"]
    stream = Follower(servers[1].url, key, task_id)
    [token] = started(cluster, task_id, 1)
    with Client(servers[1].url, key) as other:
        cancelling = other.cancel(task_id)
        # The program is running: the cancel waits for the step boundary.
        assert cancelling["status"] == "running", cancelling
        assert cancelling["cancel_requested_at"] is not None
        release(cluster, task_id, token)
        events = stream.result(cluster)
        [run] = cluster.trace.runs(task_id)
        waited(cluster, lambda: cluster.trace.returned(run), "the cancelled run returned")
        done = other.get(task_id)
    assert (done["status"], done["stop_reason"]) == ("cancelled", "cancelled by request"), done
    assert done["answer"] is None
    check_stream(events, "cancelled")
    # The step in progress finished (its program ran once); nothing after it ran: no
    # second coder turn, no route back, no other agent, no finalize.
    # The cancel is on the record (once, who asked it) where it was asked: during the step.
    assert kinds(events).count("cancel_requested") == 1, kinds(events)
    run_kinds = [kind for kind in kinds(events) if kind != "cancel_requested"]
    assert run_kinds[-3:] == ["tool_call", "tool_result", "run_finished"], kinds(events)
    assert "final" not in kinds(events)
    assert [e["data"]["next"] for e in events if e["event"] == "route"] == ["coder"]
    assert [e["data"]["agent"] for e in events if e["event"] == "agent_started"] == ["coder"]
    assert lines(cluster, task_id, "effects.txt") == [token]
    assert done["last_event_seq"] == len(events)  # The run returned: nothing comes later.


# 6. A task that kills its worker every time is failed, not run forever


@pytest.mark.slow
def test_a_task_whose_worker_dies_at_each_attempt_ends_failed_at_the_limit(
    cluster: Cluster, served_script: Script
) -> None:
    server = cluster.serve("api", model=DEFAULT_MODEL)
    cluster.worker("w1", env={"RELAYGRAPH_MAX_ATTEMPTS": "2"})
    key = cluster.create_project("acme")
    with Client(server.url, key) as client:
        task_id = client.submit("compute slowly", model=served_script(gated_coder()))["id"]
    stream = Follower(server.url, key, task_id)
    # Each attempt's pool process dies mid-tool (as under the OOM killer); the worker
    # requeues the task and a new pool process takes it.
    for count in (1, 2):
        started(cluster, task_id, count)
        run = runs_of(cluster, task_id, count)[count - 1]
        os.kill(run.pid, signal.SIGKILL)
        waited(cluster, partial(process_gone, run.pid), "the killed pool process gone")

    events = stream.result(cluster)
    with Client(server.url, key) as client:
        done = client.get(task_id)
    assert done["status"] == "failed", done
    assert "started 2 times" in done["stop_reason"], done
    assert "RELAYGRAPH_MAX_ATTEMPTS" in done["stop_reason"], done
    check_stream(events, "failed")
    assert kinds(events).count("run_started") == 2, kinds(events)
    assert attempts(cluster, task_id) == 2
    # The third delivery ended the task instead of running it: the tool started twice.
    runs = waited(
        cluster, lambda: len(found := cluster.trace.runs(task_id)) >= 3 and found, "3 runs"
    )
    waited(cluster, lambda: cluster.trace.returned(runs[2]), "the third delivery returned")
    tokens = lines(cluster, task_id, "starts.txt")
    assert len(tokens) == 2
    assert cluster.queue_counts()[0] == 0
    for token in tokens:  # The killed runs' programs may end now.
        release(cluster, task_id, token)


# 7. /readyz checks the database (the broker and the listener: tests/test_api_worker_mode.py)


@pytest.mark.slow
def test_readyz_of_an_api_server_says_when_its_ledger_is_behind(
    cluster: Cluster, database: str
) -> None:
    server = cluster.serve("api", model=DEFAULT_MODEL)
    assert httpx.get(f"{server.url}/readyz", timeout=30).json() == {"status": "ready"}
    # The ledger falls behind the shipped schema (a release rolled out before its migration
    # ran): not ready, saying why; ready again once it is at the head.
    [head] = cluster.sql("SELECT version_num FROM relaygraph_alembic_version")
    engine = create_engine(database)
    try:
        with engine.begin() as connection:
            connection.execute(text("UPDATE relaygraph_alembic_version SET version_num = 'old'"))
        behind = httpx.get(f"{server.url}/readyz", timeout=30)
        assert behind.status_code == 503, behind.text
        assert behind.json()["error"]["code"] == "not_ready"
        assert behind.json()["error"]["message"] == "migrations pending"
        with engine.begin() as connection:
            connection.execute(
                text("UPDATE relaygraph_alembic_version SET version_num = :head"),
                {"head": head["version_num"]},
            )
    finally:
        engine.dispose()
    assert httpx.get(f"{server.url}/readyz", timeout=30).json() == {"status": "ready"}


# 8. Starting workers as docs/deploy.md shows them, and workers that cannot start


def run_worker(cluster: Cluster, *args: str, env: dict[str, str] | None = None) -> Any:
    """``relaygraph worker ARGS`` to its end (it must not start); its completed process."""
    return subprocess.run(
        [sys.executable, "-m", "relaygraph.cli", "worker", "--queues", cluster.queue, *args],
        env={**cluster.env, **(env or {})},
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )


def one_error_line(done: Any) -> str:
    """The one ``relaygraph: error:`` line a worker that could not start printed, checked to
    be the whole story: no traceback."""
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    errors = [line for line in done.stderr.splitlines() if "relaygraph: error:" in line]
    assert len(errors) == 1, done.stderr
    return errors[0]


@pytest.mark.slow
def test_two_workers_started_alike_on_one_host_run_tasks_side_by_side(
    cluster: Cluster, served_script: Script
) -> None:
    """`relaygraph worker --concurrency N` twice, no --hostname: both start (each takes its
    own node name) and both run tasks; with Celery's default name the second one crashed."""
    server = cluster.serve("api", model=DEFAULT_MODEL)
    workers = [cluster.worker("w1"), cluster.worker("w2")]
    assert all(worker.running() for worker in workers)
    ready = {record["pid"]: record["hostname"] for record in cluster.trace.find(kind="ready")}
    host = socket.gethostname()
    assert ready == {worker.pid: f"relaygraph-{worker.pid}@{host}" for worker in workers}
    key = cluster.create_project("acme")
    with Client(server.url, key) as client:
        first = client.submit("Compute slowly", model=served_script(gated_coder()))
        # The first task's program holds its worker; the second task runs on the other.
        tokens = started(cluster, first["id"], 1)
        second = client.submit("Write a line", model=served_script(PLAIN_TEAM))
        assert client.wait(second["id"], timeout=DEADLINE)["status"] == "succeeded"
        release(cluster, first["id"], tokens[0])
        assert client.wait(first["id"], timeout=DEADLINE)["status"] == "succeeded"
    took = {run.task_id: run.ppid for run in cluster.trace.runs()}
    assert {took[first["id"]], took[second["id"]]} == {worker.pid for worker in workers}


ASYNC_TOOLS_PY = '''
import asyncio
import os
import threading


async def shout(text: str) -> str:
    """Shout a text.

    Args:
        text: What to shout.
    """
    await asyncio.sleep(0)
    return f"{text.upper()}! (pid {os.getpid()}, {threading.current_thread().name})"
'''

ASYNC_TEAM = one_visit(
    "shouter",
    "shout it",
    "shouting",
    {"tool_calls": [{"name": "shout", "args": {"text": "hi"}, "id": "shout"}]},
    say("Shouted."),
    finished="shouted",
    final="Shouted.",
)


@pytest.mark.slow
def test_an_async_tool_of_an_operators_team_file_runs_on_a_worker(
    cluster: Cluster, served_script: Script, tmp_path: Path
) -> None:
    """An operator's team file (RELAYGRAPH_TEAM_FILES, set alike for the server and the
    worker) with an ``async def`` tool: the worker's pool process runs its coroutine on the
    process's tool loop, and the ledger records the call."""
    team_file = shouters_team(tmp_path, ASYNC_TOOLS_PY)
    env = {"RELAYGRAPH_TEAM_FILES": json.dumps([str(team_file)])}
    server = cluster.serve("api", model=DEFAULT_MODEL, env=env)
    cluster.worker("w1", env=env)
    key = cluster.create_project("acme")
    with Client(server.url, key) as client:
        task = client.submit("Shout", model=served_script(ASYNC_TEAM), team="shouters")
        done = client.wait(task["id"], timeout=DEADLINE)
    assert done["status"] == "succeeded", (done["stop_reason"], cluster.outputs())
    [run] = cluster.trace.runs(task["id"])
    [row] = [r for r in tool_rows(cluster, task["id"]) if r["tool"] == "shout"]
    assert row["status"] == "success", row
    assert f"HI! (pid {run.pid}, relaygraph-async-tools)" in row["result_preview"], row


@pytest.mark.slow
def test_a_worker_that_cannot_start_says_why_and_exits_non_zero(cluster: Cluster) -> None:
    running = cluster.worker("w1", traced=False, hostname="taken@%h")
    # A node name in use: refused before Celery starts (its traceback and exit 0 before).
    done = run_worker(cluster, "--hostname", "taken@%h")
    assert done.returncode == 2
    line = one_error_line(done)
    assert f"another worker runs as 'taken@{socket.gethostname()}'" in line and "--hostname" in line
    assert running.running()
    # A broker that is not there: a few tries, then one line (Celery retried forever).
    port = free_port()
    done = run_worker(
        cluster, env={"RELAYGRAPH_BROKER_URL": f"amqp://guest:guest@127.0.0.1:{port}//"}
    )
    assert done.returncode == 2
    assert f"cannot reach the broker at amqp://guest:**@127.0.0.1:{port}//" in one_error_line(done)
    # A broker that refuses the login: the password is not shown.
    wrong = cluster.broker.replace("guest:guest@", "guest:not-the-password@")  # type: ignore[union-attr]
    done = run_worker(cluster, env={"RELAYGRAPH_BROKER_URL": wrong})
    assert done.returncode == 2
    line = one_error_line(done)
    assert "refused the worker" in line and "ACCESS_REFUSED" in line
    assert "not-the-password" not in done.stderr + done.stdout
    # A ledger that is not there.
    ledger = f"postgresql+psycopg://postgres@127.0.0.1:{port}/test"
    done = run_worker(cluster, env={"RELAYGRAPH_DATABASE_URL": ledger})
    assert done.returncode == 2
    assert "cannot reach the ledger at" in one_error_line(done)


RACING_WORKER = """
import sys

import relaygraph.worker
from relaygraph.cli import main

# Two workers that start at the same moment under one name both pass the check; the one
# that loses the race fails inside Celery. Skipping the check stands in for that race.
relaygraph.worker.check_broker = lambda app, name: None
sys.exit(main(sys.argv[1:]))
"""


RACED = ("--hostname", "raced@%h")


@pytest.mark.slow
def test_a_worker_that_fails_inside_celery_exits_non_zero_in_one_line(cluster: Cluster) -> None:
    cluster.worker("w1", traced=False, hostname=RACED[1])
    done = subprocess.run(
        [sys.executable, "-c", RACING_WORKER, "worker", "--queues", cluster.queue, *RACED],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    output = done.stderr + done.stdout
    assert "Traceback" not in output, output[-3000:]
    assert "relaygraph: error: the worker stopped: ResourceLocked" in output, output[-3000:]
