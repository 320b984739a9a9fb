"""8. Tasks in flight: one ``relaygraph serve`` holding hundreds of slow tasks at once,
against bare LangGraph (``ainvoke`` on one event loop) in the same run (issue 44).

The model is the benchmark's own Chat Completions double (``tests/openai_server.py``)
answering every call after **2 s**, through the real ``ChatOpenAI`` client; each task is
supervisor → writer → FINISH, three model calls (6 s of model time), so the bound at ``N``
in flight is ``N ÷ 6 s``. For each level (50, 200, 500, 1,000 in flight; ``--quick``: 50 and
200) both sides are handed ``3 × N`` tasks at once:

- **bare**: bare ``create_supervisor`` over ``create_agent`` workers (``_bare.py``), every task
  an ``ainvoke`` on one event loop, ``N`` at once (a semaphore), ``AsyncSqliteSaver``, in a
  process of its own (``_bare_inflight.py``);
- **relaygraph**: ``relaygraph serve --workers N --processes 1`` on SQLite, the tasks
  submitted over HTTP by 16 client threads, every task on the server's event loop.

Tasks per second is counted over the last two waves (finishes ``N`` to ``3N``: the first
wave pays the start); % of bound is that ÷ ``N / 6 s``. RSS is the peak resident memory,
summed over the service's processes (sampled every 0.5 s for relaygraph; the bare process's
own peak). MB per task in flight is (RSS − the idle server's RSS) ÷ ``N``. The API's p99 is
over the submissions and a ``GET`` of a task every 50 ms while the tasks run. CPU per task is
the CPU time the side's processes spent while its tasks ran (from the first submission to the
last finish; the bare process's own count) ÷ ``3 × N``: on a machine shared with other work,
tasks/s follows what the others leave, and this is what a side costs.

Run alone: ``.venv/bin/python benchmarks/bench_inflight.py [--quick] [--levels 50 200]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))

from _common import Section, Verdict, log, table  # noqa: E402
from bench_service import _bare_turns, _job_of, _task_text, _turns  # noqa: E402

DELAY_SECONDS = 2.0
CALLS_PER_TASK = 3
LEVELS = (50, 200, 500, 1000)
QUICK_LEVELS = (50, 200)
WAVES = 3
MODEL = "openai:script-bench"
WAIT_SECONDS = 900
ISSUE = 44


@dataclass
class Side:
    """One side at one level."""

    level: int
    finished: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    rss_mb: float = 0.0
    idle_rss_mb: float = 0.0
    post_ms: list[float] = field(default_factory=list)
    """Each submission's round trip."""
    get_ms: list[float] = field(default_factory=list)
    """Each ``GET`` of a task's round trip while the tasks run."""
    lag_s: list[float] = field(default_factory=list)
    """The task loop's lag (``/metrics``), sampled every 0.5 s while the tasks run."""
    sync_waiting: list[int] = field(default_factory=list)
    """Sync steps waiting for a thread (``/metrics``), sampled with the lag."""
    cpu_seconds: float = 0.0
    """CPU time of the side's processes while its tasks ran."""

    @property
    def tasks_per_second(self) -> float:
        done = sorted(self.finished)
        first, last = self.level - 1, len(done) - 1
        if last <= first or done[last] <= done[first]:
            return 0.0
        return (last - first) / (done[last] - done[first])

    @property
    def of_bound(self) -> float:
        return self.tasks_per_second / (self.level / (CALLS_PER_TASK * DELAY_SECONDS))

    @property
    def mb_per_task(self) -> float:
        return max(0.0, self.rss_mb - self.idle_rss_mb) / self.level

    @property
    def cpu_ms_per_task(self) -> float:
        return 1000 * self.cpu_seconds / (WAVES * self.level)

    @property
    def p99_ms(self) -> float | None:
        return _p99(self.post_ms + self.get_ms)


def _p99(values: list[float]) -> float | None:
    if len(values) < 2:
        return None
    return statistics.quantiles(values, n=100)[98]


def _gauge(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(f"relaygraph_{name} "):
            return float(line.split()[1])
    return None


def _jobs(side: str, level: int) -> list[str]:
    return [f"{side}-{level}-{i}" for i in range(WAVES * level)]


def _rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def _cpu_seconds(pids: list[int]) -> float:
    """User and system CPU time of ``pids`` so far (from /proc)."""
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (from /proc)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    tree, frontier = [pid], [pid]
    while frontier:
        frontier = [child for child, parent in parents.items() if parent in frontier]
        tree += frontier
    return tree


def _bare(level: int, base_url: str, home: Path) -> Side:
    side = Side(level)
    argv = [sys.executable, str(HERE / "_bare_inflight.py"), f"--base-url={base_url}"]
    argv += ["--model=script-bench", f"--home={home}", f"--in-flight={level}"]
    done = subprocess.run(
        argv,
        input=json.dumps(_jobs("bare", level)) + "\n",
        capture_output=True,
        text=True,
        timeout=WAIT_SECONDS,
        cwd=HERE.parent,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the bare process failed: {done.stderr[-2000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    side.finished, side.failures, side.rss_mb = out["finished"], out["failures"], out["rss_mb"]
    side.cpu_seconds = out["cpu_seconds"]
    return side


def _service_env(base_url: str, jobs: list[str]) -> dict[str, str]:
    """The environment of relaygraph's processes: the model double, and room for the jobs."""
    return {
        "OPENAI_BASE_URL": base_url,
        "OPENAI_API_KEY": "bench",
        # Every task is handed over at once: the project's queue must hold them all.
        "RELAYGRAPH_PROJECT_MAX_QUEUED": str(len(jobs)),
    }


def _relaygraph(level: int, root: Path, base_url: str) -> Side:
    from tests.worker_cluster import Cluster

    from relaygraph.client import Client

    side = Side(level)
    jobs = _jobs("rg", level)
    env = _service_env(base_url, jobs)
    with Cluster(root / f"serve-{level}", database_url=None, broker=None, env=env) as cluster:
        server = cluster.serve("api", model=MODEL, workers=level, processes=1)
        key = cluster.create_project("bench")
        pid = server.pid
        side.idle_rss_mb = _rss_mb(_tree(pid))
        peak = [side.idle_rss_mb]
        cpu_at_start = _cpu_seconds(_tree(pid))
        cpu = [cpu_at_start]
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.5):
                tree = _tree(pid)
                peak[0] = max(peak[0], _rss_mb(tree))
                cpu[0] = max(cpu[0], _cpu_seconds(tree))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        ids: list[str] = []
        with Client(server.url, key, timeout=60) as client:

            def submit(job: str) -> str:
                began = time.perf_counter()
                task_id = str(client.submit(_task_text(job))["id"])
                side.post_ms.append((time.perf_counter() - began) * 1000)
                return task_id

            def probe() -> None:
                while not stop.wait(0.05) and ids:
                    began = time.perf_counter()
                    client.get(ids[0])
                    side.get_ms.append((time.perf_counter() - began) * 1000)

            def watch_loop() -> None:
                with httpx.Client(base_url=server.url, timeout=60) as http:
                    while not stop.wait(0.5):
                        text = http.get("/metrics").text
                        lag, waiting = (
                            _gauge(text, "event_loop_lag_seconds"),
                            _gauge(text, "sync_steps_waiting"),
                        )
                        if lag is not None and waiting is not None:
                            side.lag_s.append(lag)
                            side.sync_waiting.append(int(waiting))

            with ThreadPoolExecutor(max_workers=16) as pool:
                ids.extend(pool.map(submit, jobs))
            prober = threading.Thread(target=probe, daemon=True)
            prober.start()
            watcher = threading.Thread(target=watch_loop, daemon=True)
            watcher.start()
            ledger = cluster.home / "ledger.sqlite"
            deadline = time.monotonic() + WAIT_SECONDS
            while time.monotonic() < deadline:
                time.sleep(1)
                with sqlite3.connect(ledger) as db:
                    (left,) = db.execute(
                        "SELECT count(*) FROM tasks WHERE status IN ('queued', 'running')"
                    ).fetchone()
                if not left:
                    break
            stop.set()
            prober.join()
            watcher.join()
        sampler.join()
        side.rss_mb = peak[0]
        side.cpu_seconds = max(cpu[0], _cpu_seconds(_tree(pid))) - cpu_at_start
        with sqlite3.connect(ledger) as db:
            rows = list(
                db.execute("SELECT created_at, finished_at, status, stop_reason FROM tasks")
            )
    started = min(_when(r[0]) for r in rows)
    side.finished = [_when(r[1]) - started for r in rows if r[1]]
    side.failures = sorted({str(r[3]) for r in rows if r[2] != "succeeded"})
    return side


def _when(value: str) -> float:
    return datetime.fromisoformat(str(value)).timestamp()


def run(quick: bool, *, levels: tuple[int, ...] | None = None) -> Section:
    from tests.openai_server import serve_script

    chosen = levels or (QUICK_LEVELS if quick else LEVELS)
    section = Section("9. Tasks in flight: serve against bare LangGraph on one event loop")
    script: dict[str, list[dict[str, Any]]] = {}
    for level in chosen:
        for job in _jobs("bare", level):
            script.update(_bare_turns(job))
        for job in _jobs("rg", level):
            script.update(_turns(job))
    rows: list[tuple[Side, Side]] = []
    with (
        tempfile.TemporaryDirectory(prefix="relaygraph-inflight-") as tmp,
        serve_script(script, delay_seconds=DELAY_SECONDS, key_from=_job_of) as fake,
    ):
        for level in chosen:
            log(f"  {level} in flight: bare")
            home = Path(tmp) / f"bare-{level}"
            home.mkdir()
            bare = _bare(level, fake.base_url, home)
            log(f"  {level} in flight: relaygraph serve")
            ours = _relaygraph(level, Path(tmp), fake.base_url)
            rows.append((bare, ours))
            for who, side in (("bare", bare), ("serve", ours)):
                log(
                    f"    {who}: {side.tasks_per_second:.1f} tasks/s ({side.of_bound:.0%}), "
                    f"RSS {side.rss_mb:.0f} MB, CPU {side.cpu_ms_per_task:.0f} ms a task, "
                    f"p99 {side.p99_ms}, failures {len(side.failures)}"
                )
            log(
                f"    serve API p99: POST {_ms(_p99(ours.post_ms))} ({len(ours.post_ms)}), "
                f"GET {_ms(_p99(ours.get_ms))} ({len(ours.get_ms)}); task loop lag "
                f"max {max(ours.lag_s, default=0) * 1000:.0f} ms, median "
                f"{statistics.median(ours.lag_s or [0]) * 1000:.0f} ms; sync steps waiting "
                f"max {max(ours.sync_waiting, default=0)}"
            )
    _report(section, rows, quick)
    return section


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f} ms"


def _report(section: Section, rows: list[tuple[Side, Side]], quick: bool) -> None:
    section.add(
        f"A model double answering each call after {DELAY_SECONDS:g} s, {CALLS_PER_TASK} calls "
        f"a task; each side handed {WAVES} × N tasks at once"
        + (" (`--quick`: 50 and 200 only)." if quick else "."),
        "",
    )

    def p99(side: Side) -> str:
        return _ms(side.p99_ms)

    section.body += table(
        [
            "in flight",
            "bare tasks/s (% of bound)",
            "serve tasks/s (% of bound)",
            "serve ÷ bare",
            "bare RSS",
            "serve RSS (MB per task in flight)",
            "serve API p99 (POST / GET)",
            "CPU per task (bare / serve)",
            "failures (bare / serve)",
        ],
        [
            [
                str(b.level),
                f"{b.tasks_per_second:.1f} ({b.of_bound:.0%})",
                f"{s.tasks_per_second:.1f} ({s.of_bound:.0%})",
                f"{s.tasks_per_second / b.tasks_per_second:.2f}" if b.tasks_per_second else "—",
                f"{b.rss_mb:.0f} MB",
                f"{s.rss_mb:.0f} MB ({s.mb_per_task:.2f})",
                f"{p99(s)} ({_ms(_p99(s.post_ms))} / {_ms(_p99(s.get_ms))})",
                f"{b.cpu_ms_per_task:.0f} / {s.cpu_ms_per_task:.0f} ms",
                f"{len(b.failures)} / {len(s.failures)}",
            ]
            for b, s in rows
        ],
    )
    section.add("")
    for b, s in rows:
        for who, side in (("bare", b), ("serve", s)):
            if side.failures:
                section.add(f"- {who} at {side.level}: {'; '.join(side.failures[:3])}")
        ratio = s.tasks_per_second / b.tasks_per_second if b.tasks_per_second else 0.0
        section.verdicts.append(
            Verdict(
                f"in flight {s.level}",
                "≥ 0.9× bare's tasks/s",
                f"{ratio:.2f}×",
                ratio >= 0.9,
                issue=ISSUE,
            )
        )
        section.verdicts.append(
            Verdict(
                f"in flight {s.level}",
                "RSS ≤ 2× bare's",
                f"{s.rss_mb / b.rss_mb:.2f}×" if b.rss_mb else "—",
                bool(b.rss_mb) and s.rss_mb <= 2 * b.rss_mb,
                issue=ISSUE,
            )
        )
        if s.level == 1000:
            section.verdicts.append(
                Verdict(
                    "in flight 1000",
                    "API p99 ≤ 200 ms",
                    p99(s),
                    (s.p99_ms or 0) <= 200,
                    issue=ISSUE,
                )
            )
    section.add("")


WORKER_MODE_LEVEL = 200
"""The tasks in flight at which the worker mode is set against serve (issue 44: within 0.8×)."""
WORKER_MODE_PROCESSES = 2
"""Workers sharing them: one per core of this 2-core machine, as docs/deploy.md sizes the
worker mode (``serve`` runs every task on its one event loop, in one interpreter)."""


def _worker_mode(level: int, root: Path, base_url: str, processes: int = 1) -> Side:
    """``processes`` workers with ``N ÷ processes`` tasks in flight each
    (``relaygraph worker --tasks-in-flight``) behind one ``relaygraph serve`` in the worker
    mode (RabbitMQ, the ledger and checkpoints on a fresh PostgreSQL database), handed
    ``3 × N`` tasks at once over HTTP; RSS summed over all the processes."""
    from tests.worker_cluster import Cluster, broker_url, fresh_database, postgres_server

    from relaygraph.client import Client

    server_url, problem = postgres_server()
    if server_url is None:
        raise RuntimeError(problem)
    side = Side(level)
    jobs = _jobs("wk", level)
    each = str(level // processes)
    env = {**_service_env(base_url, jobs), "RELAYGRAPH_TASKS_IN_FLIGHT": each}
    with (
        fresh_database(server_url, prefix="relaygraph_bench") as url,
        Cluster(root / f"worker-{level}", database_url=url, broker=broker_url(), env=env) as c,
    ):
        server = c.serve("api", model=MODEL)
        workers = [c.worker(f"w{n + 1}", traced=False) for n in range(processes)]
        key = c.create_project("bench")
        pids = [server.pid, *(worker.pid for worker in workers)]
        side.idle_rss_mb = _rss_mb([p for pid in pids for p in _tree(pid)])
        peak = [side.idle_rss_mb]
        with Client(server.url, key, timeout=60) as client, ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda job: client.submit(_task_text(job)), jobs))
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            time.sleep(0.5)
            peak[0] = max(peak[0], _rss_mb([p for pid in pids for p in _tree(pid)]))
            [row] = c.sql("SELECT count(*) AS n FROM tasks WHERE status IN ('queued', 'running')")
            if not row["n"]:
                break
        side.rss_mb = peak[0]
        rows = c.sql("SELECT created_at, finished_at, status, stop_reason FROM tasks")
    started = min(_when(str(row["created_at"])) for row in rows)
    side.finished = [_when(str(r["finished_at"])) - started for r in rows if r["finished_at"]]
    side.failures = sorted({str(r["stop_reason"]) for r in rows if r["status"] != "succeeded"})
    return side


def run_worker_mode(
    level: int = WORKER_MODE_LEVEL, processes: int = WORKER_MODE_PROCESSES
) -> Section:
    """The worker mode (``processes`` workers sharing ``level`` tasks in flight) against serve
    in process at the same level, in the same run."""
    from tests.openai_server import serve_script
    from tests.worker_cluster import broker_problem, broker_url, postgres_server

    section = Section(f"9b. Tasks in flight: the worker mode against serve at {level}")
    server_url, why = postgres_server()
    problem = broker_problem(broker_url()) or (why if server_url is None else None)
    if problem is not None:
        log(f"  worker mode not measured: {problem}")
        section.add(f"Not measured: {problem}")
        return section
    script: dict[str, list[dict[str, Any]]] = {}
    for job in [*_jobs("rg", level), *_jobs("wk", level)]:
        script.update(_turns(job))
    with (
        tempfile.TemporaryDirectory(prefix="relaygraph-inflight-worker-") as tmp,
        serve_script(script, delay_seconds=DELAY_SECONDS, key_from=_job_of) as fake,
    ):
        log(f"  {level} in flight: relaygraph serve")
        serve = _relaygraph(level, Path(tmp), fake.base_url)
        each = level // processes
        log(f"  {level} in flight: {processes} × relaygraph worker --tasks-in-flight {each}")
        worker = _worker_mode(level, Path(tmp), fake.base_url, processes)
    ratio = worker.tasks_per_second / serve.tasks_per_second if serve.tasks_per_second else 0.0
    section.body += table(
        [
            "in flight",
            "serve tasks/s (% of bound)",
            "worker tasks/s (% of bound)",
            "worker ÷ serve",
            "serve RSS",
            "worker + its server RSS",
            "failures (serve / worker)",
        ],
        [
            [
                str(level),
                f"{serve.tasks_per_second:.1f} ({serve.of_bound:.0%})",
                f"{worker.tasks_per_second:.1f} ({worker.of_bound:.0%})",
                f"{ratio:.2f}",
                f"{serve.rss_mb:.0f} MB",
                f"{worker.rss_mb:.0f} MB",
                f"{len(serve.failures)} / {len(worker.failures)}",
            ]
        ],
    )
    for who, side in (("serve", serve), ("worker", worker)):
        if side.failures:
            section.add(f"- {who}: {'; '.join(side.failures[:3])}")
    section.verdicts.append(
        Verdict(
            f"worker mode {level}",
            "≥ 0.8× serve's tasks/s",
            f"{ratio:.2f}×",
            ratio >= 0.8,
            issue=ISSUE,
        )
    )
    section.add("")
    return section


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--levels", type=int, nargs="+")
    parser.add_argument("--worker-mode", action="store_true", help="the worker mode at 200 only")
    parser.add_argument(
        "--worker-processes",
        type=int,
        default=WORKER_MODE_PROCESSES,
        help="the workers sharing the worker mode's tasks in flight",
    )
    args = parser.parse_args(argv)
    if args.worker_mode:
        section = run_worker_mode(processes=args.worker_processes)
    else:
        section = run(args.quick, levels=tuple(args.levels) if args.levels else None)
    print("\n".join(section.body))
    for verdict in section.verdicts:
        log(f"  {verdict.benchmark}: {verdict.target}: {verdict.measured} ({verdict.met})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
