"""A worker with tasks in flight (``relaygraph worker --tasks-in-flight N``) in a cluster of real
processes (tests/worker_cluster.py): one process holds many tasks at once, each waiting in
its tool, and when that process is killed every task it held goes to the other worker and
goes on from its checkpoint, each completed tool call run once.

Every wait polls for a condition under a generous deadline (the gated programs of
tests/worker_cluster.py wait for a file the test creates); nothing sleeps a fixed time.
"""

from __future__ import annotations

import signal

import pytest

from relaygraph.client import Client

from .test_worker_cluster import (  # noqa: F401  (fixtures)
    DEFAULT_MODEL,
    Cluster,
    Script,
    attempts,
    cluster,
    database,
    lines,
    release,
    started,
    tool_rows,
    waited,
)
from .worker_cluster import gated_coder, process_gone

IN_FLIGHT = 6


@pytest.mark.slow
def test_one_worker_holds_its_tasks_in_flight_and_another_continues_them_all_after_kill_9(
    cluster: Cluster,  # noqa: F811
    served_script: Script,
) -> None:
    server = cluster.serve("api", model=DEFAULT_MODEL)
    in_flight = {"RELAYGRAPH_TASKS_IN_FLIGHT": str(IN_FLIGHT)}
    holder = cluster.worker("w1", env=in_flight)
    key = cluster.create_project("acme")
    spec = served_script(gated_coder())
    with Client(server.url, key) as client:
        ids = [client.submit(f"compute slowly {i}", model=spec)["id"] for i in range(IN_FLIGHT)]

    # Every task's gated program runs at once, none let go: one process holds them all.
    first_tokens = {task_id: started(cluster, task_id, 1)[0] for task_id in ids}
    runs = cluster.trace.runs()
    assert sorted(run.task_id for run in runs) == sorted(ids)
    assert {run.pid for run in runs} == {holder.pid}

    # The holder dies with every task in flight: the other worker takes each message and
    # continues each task from its checkpoint, where its gated program starts again.
    other = cluster.worker("w2", env=in_flight)
    holder.signal_group(signal.SIGKILL)
    holder.popen.wait(30)
    waited(cluster, lambda: process_gone(holder.pid), "the killed worker gone")
    for task_id in ids:
        tokens = started(cluster, task_id, 2)
        assert tokens[0] == first_tokens[task_id]
        release(cluster, task_id, tokens[1])

    def all_done() -> bool:
        rows = cluster.sql("SELECT status FROM tasks")
        return all(row["status"] == "succeeded" for row in rows)

    waited(cluster, all_done, "every task succeeded on the other worker")
    retaken = [run for run in cluster.trace.runs() if run.pid == other.pid]
    assert sorted(run.task_id for run in retaken) == sorted(ids)
    for task_id in ids:
        assert attempts(cluster, task_id) == 2  # The killed worker's attempt, then the other's.
        # The gated program finished once: the killed run's copy never did.
        assert lines(cluster, task_id, "effects.txt") == [started(cluster, task_id, 2)[1]]
        rows = tool_rows(cluster, task_id)
        assert [(r["tool_call_id"], r["status"]) for r in rows] == [("gated", "success")], rows


@pytest.mark.slow
def test_a_worker_whose_pool_is_one_connection_runs_all_its_tasks_in_flight(
    cluster: Cluster,  # noqa: F811
) -> None:
    """``RELAYGRAPH_DATABASE_POOL_SIZE=1``: each process opens one connection for the ledger
    and one for the checkpoints, however many tasks it holds in flight; the runs wait for
    them and every task succeeds (with 64 checkpoint connections a process, two such workers
    ran PostgreSQL out of connections and tasks failed)."""
    pool = {"RELAYGRAPH_DATABASE_POOL_SIZE": "1"}
    server = cluster.serve("api", model=DEFAULT_MODEL, env=pool)
    cluster.worker("w1", env={**pool, "RELAYGRAPH_TASKS_IN_FLIGHT": str(IN_FLIGHT)})
    key = cluster.create_project("acme")
    with Client(server.url, key) as client:
        ids = [client.submit(f"write note {i}")["id"] for i in range(3 * IN_FLIGHT)]
    [row] = cluster.sql("SELECT current_database() AS name")
    seen: list[int] = []

    def all_done() -> bool:
        [open_now] = cluster.sql(
            "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = :name AND pid <> "
            "pg_backend_pid()",
            name=row["name"],
        )
        seen.append(int(open_now["n"]))
        rows = cluster.sql("SELECT status FROM tasks")
        return len(rows) == len(ids) and all(r["status"] == "succeeded" for r in rows)

    waited(cluster, all_done, "every task succeeded")
    # Two processes, two pools of one each, and the API server's LISTEN connection.
    assert 2 <= max(seen) <= 2 * 2 + 1, seen
