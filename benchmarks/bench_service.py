"""6. Task service throughput: tasks per second against the bound, in process and on workers.

Forty-eight tasks are submitted at once over HTTP to a real ``relaygraph serve`` whose model
is the real ``ChatOpenAI`` client against ``tests/openai_server.py`` answering every call after
a fixed 200 ms (a model that takes time, and nothing else: the double does no work). Each
task is supervisor → writer → FINISH. Every task runs on the service's one model
(``openai:script-bench``), as a service's tasks do, so the process's team cache serves them
all; the double picks each task's turns by the job name in the request's messages
(``key_from``), so concurrent tasks never take each other's turns. Two deployments, one
after the other:

- **in process**: ``relaygraph serve --workers 8`` on SQLite, the single-machine mode;
- **worker mode**: one ``relaygraph serve`` in broker mode and 2 ``relaygraph worker``
  processes × ``--concurrency 4``, on PostgreSQL (a fresh database) and RabbitMQ (a queue of
  its own).

Both run 8 tasks at once, so both have the same bound: 8 ÷ the model time of one task (its
model calls, counted at the server, × 200 ms). Measured: tasks per second from the first
submission to the last task's ``finished_at`` (the ledger's clock, the same machine), after
an untimed warm-up round that has every runner compile its team. The issue asks for 50
tasks; 48 is the nearest multiple of the 8 places: 50 tasks take ⌈50 ÷ 8⌉ = 7 model times,
the last with 2 of the 8 places busy, so even a service with no overhead would reach only
50 ÷ (7 × 8) = 89% of the bound, under the 90% goal. 48 tasks are 6 full rounds, so the
bound is what a service with no overhead reaches.

The client polls as a careful client would: every 0.5 s, for one task still queued or
running (``?status=...&limit=1``); the full task list is read once, at the end. Polling
does not change the measured time (the ledger's clock), only the load on the API server.
The CPU time each process used in the timed rounds is reported per task: the API servers,
the workers with their pool processes, and the benchmark's own process (the client and the
model double); it stays put when other work shares the machine, where tasks per second do not.

Run alone: ``.venv/bin/python benchmarks/bench_service.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
if str(HERE.parent) not in sys.path:
    sys.path.insert(1, str(HERE.parent))  # for tests/openai_server.py, tests/worker_cluster.py

from _common import Section, Verdict, log, table  # noqa: E402

DELAY_SECONDS = 0.2
IN_PROCESS_WORKERS = 8
WORKERS, CONCURRENCY = 2, 4
TASKS = 48
"""Six full rounds of the 8 places (the issue's 50 would leave 6 of 8 idle in a 7th round,
capping the ratio at 89%: see the module docstring)."""
assert TASKS % IN_PROCESS_WORKERS == 0 and TASKS % (WORKERS * CONCURRENCY) == 0
MODEL = "openai:script-bench"
"""Every task's model: one name, so the service's team cache serves every task."""
POLL_SECONDS = 0.5
TARGET_OF_BOUND = 0.9
"""Tasks per second at least this share of the bound (issue 19, and issue 18 for workers)."""
TARGET_OF_IN_PROCESS = 0.9
"""The worker mode within 10% of the in-process mode's tasks per second (issue 18)."""
FINISHED = ("succeeded", "degraded", "failed", "cancelled")
WAIT_SECONDS = 600
_JOB = re.compile(r"\[job ([\w-]+)\]")


def _task_text(job: str) -> str:
    return f"[job {job}] Write one line."


def _turns(job: str) -> dict[str, list[dict[str, Any]]]:
    """One task's conversation, under its job's script key: three model calls (relaygraph
    answers with the writer's reply; the fourth turn is there for a finalize call)."""
    task = f"[job {job}] Write the line."
    return {
        job: [
            {"route": {"next": "writer", "task": task, "reason": "a deliverable"}},
            {"content": f"One line for [job {job}]."},
            {"route": {"next": "FINISH", "task": "", "reason": "written"}},
            {"content": f"Done: one line for [job {job}]."},
        ]
    }


def _job_of(body: dict[str, Any]) -> str | None:
    """The script key of a request: the job named in its messages (the supervisor sees the
    task, the writer the route's task, which names the job too)."""
    found = _JOB.search(json.dumps(body.get("messages")))
    return found.group(1) if found else None


@dataclass
class Round:
    """One round of one mode."""

    seconds: float
    tasks: int
    statuses: dict[str, int]
    model_calls: int
    cpu_seconds: float
    """CPU time the deployment's processes used in the round (API servers, workers, their
    pool processes; not PostgreSQL, RabbitMQ or the model double)."""
    cpu_by_process: dict[str, float]
    """CPU seconds of the round by process: the API servers, the workers (with their pool
    processes), and this process (the client and the model double)."""
    problems: list[str]
    """The stop reasons of the tasks that did not succeed, each once."""

    @property
    def per_second(self) -> float:
        return self.tasks / self.seconds


@dataclass
class Mode:
    """A deployment under test and what its rounds measured."""

    name: str
    concurrency: int
    rounds: list[Round]
    warmup: Round | None = None
    problem: str | None = None
    """Why the mode was not measured."""
    failed: bool = False
    """The mode was started and failed (its problem says how), rather than not started."""

    def median_per_second(self) -> float:
        return statistics.median(r.per_second for r in self.rounds)

    def model_seconds_per_task(self) -> float:
        calls = sum(r.model_calls for r in self.rounds) / sum(r.tasks for r in self.rounds)
        return calls * DELAY_SECONDS

    def cpu_seconds_per_task(self) -> float:
        return sum(r.cpu_seconds for r in self.rounds) / sum(r.tasks for r in self.rounds)

    def cpu_ms_per_task_by_process(self) -> dict[str, float]:
        tasks = sum(r.tasks for r in self.rounds)
        return {
            name: 1000 * sum(r.cpu_by_process[name] for r in self.rounds) / tasks
            for name in self.rounds[0].cpu_by_process
        }

    def bound(self) -> float:
        return self.concurrency / self.model_seconds_per_task()


def _parse_time(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _play(cluster: Any, url: str, key: str, prefix: str, count: int, fake: Any) -> Round:
    """Submit ``count`` tasks at once (jobs ``<prefix>-<i>``, in a project of their own) and
    wait until every one has finished."""
    from relaygraph.client import Client

    logged = len(fake.log)
    with Client(url, key, timeout=60) as client:
        by_role, own = cluster.cpu_seconds_by_role(), _own_cpu_seconds()
        started = time.time()
        with ThreadPoolExecutor(max_workers=10) as pool:
            submitted = list(
                pool.map(lambda i: client.submit(_task_text(f"{prefix}-{i}")), range(count))
            )
        ids = {task["id"] for task in submitted}
        deadline = time.monotonic() + WAIT_SECONDS
        while any(client.list(status=s, limit=1)["tasks"] for s in ("queued", "running")):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{count} tasks not finished within {WAIT_SECONDS} s")
            time.sleep(POLL_SECONDS)
        after = cluster.cpu_seconds_by_role()
        cpu_by_process = {name: after[name] - by_role[name] for name in after}
        cpu_by_process["client and model double"] = _own_cpu_seconds() - own
        mine = [task for task in client.list(limit=200)["tasks"] if task["id"] in ids]
    stuck = sorted(f"{t['id']}: {t['status']}" for t in mine if t["status"] not in FINISHED)
    if len(mine) != count or stuck:
        raise RuntimeError(f"of {count} tasks, {len(mine)} listed; not finished: {stuck}")
    statuses = dict(Counter(task["status"] for task in mine))
    problems = sorted(
        {str(t["stop_reason"]).splitlines()[0] for t in mine if t["status"] != "succeeded"}
    )
    finished = max(_parse_time(t["finished_at"]) for t in mine)
    # The deployment's own calls: the double served nothing else during the round.
    calls = sum(1 for entry in fake.log[logged:] if entry["status"] == 200)
    cpu = cpu_by_process["API servers"] + cpu_by_process["workers"]
    return Round(finished - started, count, statuses, calls, cpu, cpu_by_process, problems)


def _own_cpu_seconds() -> float:
    """CPU time of this process so far: the client's threads and the model double's."""
    times = os.times()
    return times.user + times.system


def _measure(
    name: str,
    concurrency: int,
    start: Callable[[Path, dict[str, str]], Any],
    fake: Any,
    rounds: int,
    root: Path,
) -> Mode:
    """Start a deployment (``start`` returns its cluster and API URL), warm it up, time it."""
    mode = Mode(name, concurrency, [])
    env = {"OPENAI_API_KEY": "bench", "OPENAI_BASE_URL": fake.base_url}
    cluster, url = start(root, env)
    with cluster:
        for number in range(rounds + 1):
            key = cluster.create_project(f"bench-{number}")
            count = 2 * concurrency if number == 0 else TASKS
            measured = _play(cluster, url, key, f"{name}-{number}", count, fake)
            log(
                f"  {name}, {'warm-up' if number == 0 else f'round {number}'}: "
                f"{measured.tasks} tasks in {measured.seconds:.2f} s "
                f"({measured.per_second:.2f}/s, {measured.cpu_seconds:.1f} CPU s), "
                f"{measured.statuses} {'; '.join(measured.problems)}"
            )
            if number == 0:
                mode.warmup = measured
            else:
                mode.rounds.append(measured)
    return mode


def _in_process(root: Path, env: dict[str, str]) -> tuple[Any, str]:
    from tests.worker_cluster import Cluster

    cluster = Cluster(root / "in-process", database_url=None, broker=None, env=env)
    try:
        server = cluster.serve("api", model=MODEL, workers=IN_PROCESS_WORKERS)
    except BaseException:
        cluster.close()
        raise
    return cluster, server.url


def _worker_mode(database_url: str, broker: str) -> Callable[[Path, dict[str, str]], Any]:
    def start(root: Path, env: dict[str, str]) -> tuple[Any, str]:
        from tests.worker_cluster import Cluster

        cluster = Cluster(root / "workers", database_url=database_url, broker=broker, env=env)
        try:
            server = cluster.serve("api", model=MODEL)
            for n in range(WORKERS):
                cluster.worker(f"w{n + 1}", concurrency=CONCURRENCY, traced=False)
        except BaseException:
            cluster.close()
            raise
        return cluster, server.url

    return start


def _script(rounds: int) -> dict[str, list[dict[str, Any]]]:
    script: dict[str, list[dict[str, Any]]] = {}
    for name, concurrency in (("in-process", IN_PROCESS_WORKERS), ("workers", 8)):
        for number in range(rounds + 1):
            count = 2 * concurrency if number == 0 else TASKS
            for i in range(count):
                script.update(_turns(f"{name}-{number}-{i}"))
    return script


def run(quick: bool) -> Section:
    """Measure both modes (one timed round each with ``quick``, else three)."""
    from tests.openai_server import serve_script
    from tests.worker_cluster import broker_problem, broker_url, fresh_database, postgres_server

    rounds = 1 if quick else 3
    section = Section("6. Task service throughput")
    modes: list[Mode] = []
    with (
        tempfile.TemporaryDirectory(prefix="relaygraph-bench-service-") as tmp,
        serve_script(_script(rounds), delay_seconds=DELAY_SECONDS, key_from=_job_of) as fake,
    ):
        root = Path(tmp)
        log(f"  in process: serve --workers {IN_PROCESS_WORKERS}, SQLite")
        modes.append(_measure("in-process", IN_PROCESS_WORKERS, _in_process, fake, rounds, root))
        broker = broker_url()
        server, why = postgres_server()
        problem = broker_problem(broker) or (why if server is None else None)
        if problem is not None or server is None:
            log(f"  worker mode not measured: {problem}")
            modes.append(Mode("workers", WORKERS * CONCURRENCY, [], problem=problem))
        else:
            log(f"  worker mode: {WORKERS} workers x concurrency {CONCURRENCY}")
            try:
                with fresh_database(server, prefix="relaygraph_bench") as database:
                    modes.append(
                        _measure(
                            "workers",
                            WORKERS * CONCURRENCY,
                            _worker_mode(database, broker),
                            fake,
                            rounds,
                            root,
                        )
                    )
            except (RuntimeError, TimeoutError, OSError) as exc:
                # Reported as a target not met, with the reason, rather than ending the
                # whole benchmark run.
                log(f"  worker mode failed: {exc}")
                modes.append(
                    Mode("workers", WORKERS * CONCURRENCY, [], problem=str(exc), failed=True)
                )
    _report(section, modes, rounds)
    return section


def _report(section: Section, modes: list[Mode], rounds: int) -> None:
    labels = {
        "in-process": f"in process: `serve --workers {IN_PROCESS_WORKERS}`, SQLite",
        "workers": f"worker mode: {WORKERS} workers × concurrency {CONCURRENCY}, "
        "PostgreSQL + RabbitMQ",
    }
    cores = len(os.sched_getaffinity(0))
    rows = []
    for mode in modes:
        if mode.problem is not None:
            rows.append([labels[mode.name], *["—"] * 7])
            continue
        per_second = [f"{r.per_second:.2f}" for r in mode.rounds]
        failed = sum(n for r in mode.rounds for s, n in r.statuses.items() if s != "succeeded")
        rows.append(
            [
                labels[mode.name],
                f"{mode.median_per_second():.2f} ({', '.join(per_second)})",
                f"{mode.model_seconds_per_task():.2f}",
                f"{mode.bound():.2f}",
                f"{mode.median_per_second() / mode.bound():.0%}",
                f"{mode.cpu_seconds_per_task():.3f}",
                f"{cores / mode.cpu_seconds_per_task():.1f}",
                str(failed),
            ]
        )
    section.add(
        f"{TASKS} tasks submitted at once (10 client threads) to a real `relaygraph serve` "
        f"over HTTP, all on one model (`{MODEL}`, the service's team cache serving every "
        f"task); every model call answered after {DELAY_SECONDS * 1000:.0f} ms by "
        "`tests/openai_server.py` through `ChatOpenAI`; tasks per second from the first "
        f"submission to the last `finished_at`, median of {rounds} timed round(s) after an "
        "untimed warm-up (each round in brackets). The bound is the concurrency ÷ the model "
        "time of one task (its model calls, counted at the server, × the delay); "
        f"{TASKS} tasks are {math.ceil(TASKS / 8)} full rounds of the 8 places, so a "
        "service with no overhead reaches it (the issue's 50 would need 7 rounds, the last "
        "with 2 places busy: 89% at best). *CPU s/task* is the CPU time of the "
        "deployment's own processes (servers, workers, pool processes) per task; "
        f"*CPU limit* is what {cores} cores allow at that cost, whatever the concurrency.",
        "",
        *table(
            [
                "deployment",
                "tasks/s",
                "model s/task",
                "bound tasks/s",
                "of bound",
                "CPU s/task",
                "CPU limit tasks/s",
                "not succeeded",
            ],
            rows,
        ),
        "",
    )
    measured_modes = [m for m in modes if m.problem is None and m.rounds]
    if measured_modes:
        section.add(
            "CPU per task by process, in ms (the figure that stays put when other work "
            "shares the machine; PostgreSQL and RabbitMQ not counted): "
            + "; ".join(
                f"{labels[m.name].split(':')[0]}: "
                + ", ".join(
                    f"{name} {ms:.1f}"
                    for name, ms in m.cpu_ms_per_task_by_process().items()
                    if ms  # no worker processes in process
                )
                for m in measured_modes
            )
            + ".",
            "",
        )
    for mode in modes:
        if mode.warmup is not None and mode.warmup.problems:
            section.add(
                f"In the untimed warm-up of the {mode.name} mode, "
                f"{mode.warmup.tasks - mode.warmup.statuses.get('succeeded', 0)} of "
                f"{mode.warmup.tasks} tasks did not succeed: "
                + "; ".join(f"`{problem}`" for problem in mode.warmup.problems),
                "",
            )
        problems = sorted({p for r in mode.rounds for p in r.problems})
        if problems:
            section.add(
                f"Tasks of the {mode.name} mode that did not succeed said: "
                + "; ".join(f"`{problem}`" for problem in problems),
                "",
            )
        if mode.problem is not None:
            what = "failed" if mode.failed else "was not measured"
            section.add(f"The worker mode {what}:", "", "```text", mode.problem[-3000:], "```", "")
            section.verdicts.append(
                Verdict(
                    "6. service throughput",
                    f"worker mode ≥ {TARGET_OF_BOUND:.0%} of the bound",
                    "failed" if mode.failed else "not measured",
                    False if mode.failed else None,
                    mode.problem.splitlines()[0],
                )
            )
            continue
        ratio = mode.median_per_second() / mode.bound()
        section.verdicts.append(
            Verdict(
                "6. service throughput",
                f"{labels[mode.name].split(':')[0]} ≥ {TARGET_OF_BOUND:.0%} of the bound "
                f"({mode.bound():.2f} tasks/s)",
                f"{mode.median_per_second():.2f} tasks/s, {ratio:.0%}",
                ratio >= TARGET_OF_BOUND,
            )
        )
    measured = {m.name: m for m in modes if m.problem is None}
    if len(measured) == 2:
        ratio = measured["workers"].median_per_second() / measured["in-process"].median_per_second()
        section.verdicts.append(
            Verdict(
                "6. service throughput",
                f"worker mode ≥ {TARGET_OF_IN_PROCESS:.0%} of the in-process tasks/s",
                f"{ratio:.2f}×",
                ratio >= TARGET_OF_IN_PROCESS,
            )
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="one timed round per mode")
    args = parser.parse_args(argv)
    section = run(args.quick)
    print(f"## {section.title}\n")
    print("\n".join(section.body))
    for v in section.verdicts:
        met = {True: "met", False: "NOT met", None: "not measured"}[v.met]
        print(f"- {v.target}: {v.measured} — {met}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
