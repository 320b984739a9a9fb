"""7. Fair shares: one project's task latency while another keeps 200 tasks queued.

A real ``relaygraph serve`` (2 workers, in process; and in the worker mode, 2
``relaygraph worker`` processes × concurrency 1 on PostgreSQL and RabbitMQ, publishing as
many tasks as the workers have free slots, the default), its model the
real ``ChatOpenAI`` client against ``tests/openai_server.py`` answering every call after
``DELAY_SECONDS``. Each task is supervisor → writer → FINISH (three calls: one task's
duration is about 3 × the delay).

Project A submits ``A_TASKS`` tasks one after the other, each when the one before has
finished, and its latency is the ledger's ``finished_at`` − ``created_at``: first alone,
then while project B has ``FLOOD`` tasks queued (submitted at once just before). The ratio
is A's median latency under the flood to its median alone. Issue 41's goal: under the flood
A's latency is at most 2 × its latency alone plus one task's duration (a free worker goes
to A next: A waits for one of B's running tasks to end, then runs). Before fair shares, A's
task waited behind B's whole queue (minutes).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _common import Section, Verdict, log, table

DELAY_SECONDS = 0.2
"""Each model call's answer comes this late."""
CALLS_PER_TASK = 3
FLOOD = 200
"""B's tasks queued at once."""
A_TASKS = 5
"""A's tasks measured in each phase, one after the other."""
MODEL = "openai:script-fair"
DEADLINE = 300.0


def _turns(job: str) -> list[dict[str, Any]]:
    return [
        {"route": {"next": "writer", "task": f"Write the line for {job}.", "reason": "asked"}},
        {"content": f"One line for {job}."},
        {"route": {"next": "FINISH", "task": "", "reason": "written"}},
    ]


def _jobs(mode: str) -> list[str]:
    return (
        [f"{mode}-a-alone-{i}" for i in range(A_TASKS)]
        + [f"{mode}-a-flood-{i}" for i in range(A_TASKS)]
        + [f"{mode}-b-{i}" for i in range(FLOOD)]
    )


def _job_of(body: dict[str, Any]) -> str | None:
    import json
    import re

    found = re.search(r"[a-z-]+-(?:a-alone|a-flood|b)-[0-9]+", json.dumps(body.get("messages")))
    return found.group(0) if found else None


def _latency(client: Any, task_id: str) -> float:
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        task = client.get(task_id)
        if task["status"] in ("succeeded", "degraded", "failed", "cancelled"):
            if task["status"] != "succeeded":
                raise RuntimeError(f"task {task_id} ended {task['status']}: {task}")
            from datetime import datetime

            created = datetime.fromisoformat(task["created_at"])
            finished = datetime.fromisoformat(task["finished_at"])
            return (finished - created).total_seconds()
        time.sleep(0.02)
    raise TimeoutError(f"task {task_id} did not finish in {DEADLINE:g} s")


def _phase(client: Any, mode: str, phase: str) -> list[float]:
    return [
        _latency(client, client.submit(f"Write one line for {mode}-a-{phase}-{i}.")["id"])
        for i in range(A_TASKS)
    ]


def measure(cluster: Any, url: str, mode: str) -> tuple[list[float], list[float]]:
    """A's latencies alone, then under B's flood."""
    from relaygraph.client import Client

    a_key, b_key = cluster.create_project("a"), cluster.create_project("b")
    with Client(url, a_key) as a, Client(url, b_key) as b:
        alone = _phase(a, mode, "alone")
        for i in range(FLOOD):
            b.submit(f"Write one line for {mode}-b-{i}.")
        flooded = _phase(a, mode, "flood")
    return alone, flooded


@contextmanager
def _in_process(root: Path, env: dict[str, str]) -> Iterator[tuple[Any, str]]:
    from tests.worker_cluster import Cluster

    with Cluster(root / "in-process", database_url=None, broker=None, env=env) as cluster:
        server = cluster.serve("api", model=MODEL, workers=2, processes=1)
        yield cluster, server.url


@contextmanager
def _worker_mode(root: Path, env: dict[str, str]) -> Iterator[tuple[Any, str]]:
    from tests.worker_cluster import (
        Cluster,
        broker_problem,
        broker_url,
        fresh_database,
        postgres_server,
    )

    broker = broker_url()
    server_url, why = postgres_server()
    problem = broker_problem(broker) or (why if server_url is None else None)
    if problem is not None or server_url is None:
        raise RuntimeError(f"worker mode not measured: {problem}")
    with (
        fresh_database(server_url, prefix="relaygraph_bench") as database,
        Cluster(
            root / "workers",
            database_url=database,
            broker=broker,
            # No RELAYGRAPH_PUBLISH_AHEAD: the workers' free slots, as by default.
            env=env,
        ) as cluster,
    ):
        server = cluster.serve("api", model=MODEL)
        cluster.worker("w1", concurrency=1, traced=False)
        cluster.worker("w2", concurrency=1, traced=False)
        yield cluster, server.url


MODES: dict[str, tuple[str, Callable[[Path, dict[str, str]], Any]]] = {
    "in-process": ("in process (`serve --workers 2 --processes 1`, SQLite)", _in_process),
    "workers": (
        "worker mode (2 workers × 1, publishing for free slots, PostgreSQL, RabbitMQ)",
        _worker_mode,
    ),
}


def run(quick: bool) -> Section:
    """Measure each mode: A alone, then A under B's flood."""
    from tests.openai_server import serve_script

    section = Section("7. Fair shares: a project's latency under another's flood")
    task_seconds = CALLS_PER_TASK * DELAY_SECONDS
    rows = []
    script = {job: _turns(job) for mode in MODES for job in _jobs(mode)}
    with (
        tempfile.TemporaryDirectory(prefix="relaygraph-bench-fair-") as tmp,
        serve_script(script, delay_seconds=DELAY_SECONDS, key_from=_job_of) as fake,
    ):
        env = {"OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": "bench"}
        for mode, (label, start) in MODES.items():
            log(f"  {mode}: A alone, then A while B has {FLOOD} tasks queued")
            try:
                with start(Path(tmp), env) as (cluster, url):
                    alone, flooded = measure(cluster, url, mode)
            except (RuntimeError, TimeoutError, OSError) as exc:
                log(f"  {mode} not measured: {exc}")
                rows.append([label, "—", "—", "—", f"not measured: {exc}"])
                section.verdicts.append(
                    Verdict(
                        benchmark=f"fairness, {mode}",
                        target="A's latency under B's flood ≤ 2 × alone + one task",
                        measured=f"not measured: {exc}",
                        met=None,
                        issue=41,
                    )
                )
                continue
            alone_s, flood_s = statistics.median(alone), statistics.median(flooded)
            bound = 2 * alone_s + task_seconds
            rows.append(
                [
                    label,
                    f"{alone_s:.2f} s",
                    f"{flood_s:.2f} s",
                    f"{flood_s / alone_s:.2f}×",
                    f"≤ {bound:.2f} s",
                ]
            )
            section.verdicts.append(
                Verdict(
                    benchmark=f"fairness, {mode}",
                    target="A's latency under B's flood ≤ 2 × alone + one task",
                    measured=f"{flood_s:.2f} s vs {alone_s:.2f} s alone ({flood_s / alone_s:.2f}×)",
                    met=flood_s <= bound,
                    issue=41,
                )
            )
    section.add(
        f"Project A's task latency (median of {A_TASKS}, submitted one after the other), "
        f"alone and while project B has {FLOOD} tasks queued; a model call takes "
        f"{DELAY_SECONDS * 1000:.0f} ms, a task {CALLS_PER_TASK} calls "
        f"({task_seconds:.1f} s). Goal (issue 41): under the flood ≤ 2 × alone + one task.",
        "",
        *table(["deployment", "A alone", "A under B's flood", "ratio", "goal"], rows),
        "",
    )
    return section
