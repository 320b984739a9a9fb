"""Replay on ``serve --processes 2``: a real server on loopback (tests/worker_cluster.py,
SQLite, no broker) whose workers are spread over two processes that take queued tasks from
the ledger. A replay is recorded ``queued`` with its fork and its workspace copy already in
place, so whichever process takes it goes on from the step."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from relaygraph.client import ApiError, Client

from ._service import FINISHED
from .conftest import EXAMPLE_RELAY
from .test_replay_workspace import READS_EARLIER_FILE
from .worker_cluster import Cluster

DEADLINE = 120.0
"""Seconds any one wait may take (generous: a loaded 2-core machine)."""


def _tool_results(home: Path, task_id: str) -> list[tuple[str, str]]:
    with sqlite3.connect(home / "ledger.sqlite") as db:
        rows = db.execute(
            "SELECT tool, result_preview FROM tool_calls WHERE task_id = ? ORDER BY id",
            (task_id,),
        )
        return [(tool, preview or "") for tool, preview in rows]


@pytest.mark.slow  # A server and its task process, started as real processes.
def test_replays_run_on_serve_processes_from_their_step(tmp_path: Path) -> None:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "sum.json").write_text(json.dumps(READS_EARLIER_FILE), encoding="utf-8")
    with Cluster(tmp_path / "cluster", database_url=None, broker=None, scripts=scripts) as cluster:
        server = cluster.serve("api", model=f"scripted:{EXAMPLE_RELAY}", workers=2, processes=2)
        key = cluster.create_project("acme")
        with Client(server.url, key) as client:
            made = client.submit("Sum the numbers", model="scripted:sum.json")
            original = client.wait(made["id"], timeout=DEADLINE, until=FINISHED)
            assert original["status"] == "succeeded", original
            replays = [
                client.replay(original["id"], from_step=step, idempotency_key=f"sum-{step}")
                for step in (0, 2)
            ]
            # A retry is answered with the first try's replay, not a second one.
            again = client.replay(original["id"], from_step=2, idempotency_key="sum-2")
            assert again["id"] == replays[1]["id"]
            with pytest.raises(ApiError) as reused:
                client.replay(original["id"], from_step=1, idempotency_key="sum-2")
            assert reused.value.status == 409
            done = [client.wait(r["id"], timeout=DEADLINE, until=FINISHED) for r in replays]
            for replay, step in zip(done, (0, 2), strict=True):
                assert replay["status"] == "succeeded", replay
                assert (replay["replay_of"], replay["from_step"]) == (original["id"], step)
                diff = client.diff(original["id"], replay["id"])
                assert diff["summary"]["same"] is True, diff["steps"]
            # From the request the coder wrote the file again; from step 2 only its program
            # ran, in a copy of the original's workspace, and read what step 1 wrote.
            from_request, from_step = (_tool_results(cluster.home, r["id"]) for r in done)
            assert [tool for tool, _ in from_request] == ["write_file", "run_python"]
            [(tool, output)] = from_step
            assert tool == "run_python" and "sum 6" in output, output
