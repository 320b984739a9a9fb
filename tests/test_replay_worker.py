"""Replay in the worker mode: a replay is submitted through an API server in broker mode and
run by a Celery worker like any task, from the step its submission forked (the checkpoints
on PostgreSQL, copied to the replay's thread before its id is published)."""

from __future__ import annotations

import pytest

from relaygraph.client import Client

from .test_worker_cluster import (  # noqa: F401  (fixtures)
    DEADLINE,
    DEFAULT_MODEL,
    FINISHED,
    Cluster,
    cluster,
    database,
    journal,
    tool_rows,
)


@pytest.mark.slow  # A cluster of processes, as the other worker-mode cluster tests.
def test_a_worker_runs_a_replay_from_a_middle_step(cluster: Cluster) -> None:  # noqa: F811
    server = cluster.serve("api-1", model=DEFAULT_MODEL)
    cluster.worker("w1")
    key = cluster.create_project("acme")
    with Client(server.url, key) as client:
        original = client.wait(
            client.submit("When are checkpoints written?")["id"], timeout=DEADLINE
        )
        assert original["status"] == "succeeded", original
        replay = client.replay(original["id"], from_step=2)
        done = client.wait(replay["id"], timeout=DEADLINE, until=FINISHED)
        assert done["status"] == "succeeded", done
        assert done["answer"] == original["answer"]
        # Only the writer's step ran on the worker: the search and the coder's program of
        # the first two steps are in neither the replay's tool calls nor its journal.
        assert [row["tool"] for row in tool_rows(cluster, replay["id"])] == ["save_artifact"]
        assert "call_coder_1_0" in journal(cluster, original["id"])
        assert "call_coder_1_0" not in journal(cluster, replay["id"])
        diff = client.diff(original["id"], replay["id"])
        assert diff["summary"]["same"] is True, diff["steps"]
        assert [s["b"]["inherited"] for s in diff["steps"]] == [True, True, False]
