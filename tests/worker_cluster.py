"""Real processes of the worker mode on loopback: API servers, Celery workers, a database.

For tests/test_worker_cluster.py and benchmarks/bench_service.py. A :class:`Cluster` is one
deployment as docs/deploy.md describes it, on this machine's RabbitMQ and PostgreSQL: every
process shares a data directory (``RELAYGRAPH_HOME``), a fresh database of its own
(:func:`fresh_database`) and a queue and control exchange of its own, so that two clusters
(two tests, a test and a benchmark, two engineers) never see each other's tasks or
messages. Each process starts in a session of its own, so that a signal to its process
group reaches its pool children too, and :meth:`Cluster.close` kills every group it started.

:func:`gated_coder` is a scripted team whose tool runs until the test lets it go, so that a
worker is killed, frozen or cancelled mid-tool.

A worker started with ``traced=True`` runs ``tests.worker_trace`` (the ``relaygraph``
command with a trace of which process ran which task: :class:`WorkerTrace`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from kombu import Connection
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from ._scripts import one_visit, say
from ._service import free_port
from .conftest import POSTGRES_URL_ENV, POSTGRES_URLS, unsafe_sandbox_env

REPO = Path(__file__).resolve().parents[1]
BROKER_URL_ENV = "RELAYGRAPH_TEST_BROKER_URL"
DEFAULT_BROKER_URL = "amqp://guest:guest@127.0.0.1:5672//"

_PROXIES = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy")


# A tool that runs until the test lets it go


GATED_CODE = (
    "import os, time\n"
    "token = os.urandom(6).hex()\n"
    "with open('starts.txt', 'a') as f:\n"
    "    f.write(token + '\\n')\n"
    "deadline = time.monotonic() + 600\n"
    "while not os.path.exists('go-' + token) and time.monotonic() < deadline:\n"
    "    time.sleep(0.05)\n"
    "with open('effects.txt', 'a') as f:\n"
    "    f.write(token + '\\n')\n"
    "print('went ' + token)"
)
"""A slow tool whose every start is visible: it appends a token of its own to
``starts.txt``, runs until the test creates ``go-<token>`` in the workspace, then appends the
token to ``effects.txt`` (its side effect) and prints it (its result)."""

FIRST_CODE = "with open('effects.txt', 'a') as f:\n    f.write('first\\n')\nprint('first done')"
"""A quick tool with a side effect."""


def gated_coder(*, first: bool = False) -> dict[str, Any]:
    """supervisor → coder (a quick program first, if ``first``; then the gated one) → FINISH."""
    calls = []
    if first:
        calls.append(
            {"tool_calls": [{"name": "run_python", "args": {"code": FIRST_CODE}, "id": "first"}]}
        )
    calls.append(
        {"tool_calls": [{"name": "run_python", "args": {"code": GATED_CODE}, "id": "gated"}]}
    )
    return one_visit(
        "coder", "compute slowly", "code to run", *calls, say("It ran."), final="It ran."
    )


def broker_url() -> str:
    """The RabbitMQ to use (``$RELAYGRAPH_TEST_BROKER_URL``, else the local one)."""
    return os.environ.get(BROKER_URL_ENV, DEFAULT_BROKER_URL)


def broker_problem(url: str) -> str | None:
    """Why RabbitMQ at ``url`` cannot be used; None when it answers."""
    try:
        with Connection(url, connect_timeout=3) as connection:
            connection.ensure_connection(max_retries=1)
    except Exception as exc:
        return f"RabbitMQ is not reachable at {url}: {exc}"
    return None


def postgres_server() -> tuple[str | None, str]:
    """A URL of the PostgreSQL server that answers, or None and why none does."""
    override = os.environ.get(POSTGRES_URL_ENV)
    problems = []
    for url in [override] if override else POSTGRES_URLS:
        engine = create_engine(url, connect_args={"connect_timeout": 3})
        try:
            with engine.connect() as connection:
                connection.execute(text("SELECT 1"))
            return url, ""
        except SQLAlchemyError as exc:
            reason = getattr(exc, "orig", None) or exc  # DBAPIError carries the driver's own
            problems.append(f"{url}: {str(reason).strip().splitlines()[0]}")
        finally:
            engine.dispose()
    return None, "PostgreSQL is not reachable: " + "; ".join(problems)


@contextlib.contextmanager
def fresh_database(server_url: str, prefix: str = "relaygraph_cluster") -> Iterator[str]:
    """A new, empty database ``<prefix>_<random>`` on ``server_url``'s server, dropped
    afterwards (its connections closed); yields its SQLAlchemy URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
        try:
            yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as connection:
                connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        admin.dispose()


def wait_until(
    condition: Callable[[], Any], timeout: float, what: str, *, every: float = 0.05
) -> Any:
    """Poll ``condition`` until it returns something true, and return that.

    Raises:
        TimeoutError: Still false after ``timeout`` seconds; the message says ``what``.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:g} s")
        time.sleep(every)


class Process:
    """One process of the cluster, in a session (and process group) of its own."""

    def __init__(self, name: str, argv: list[str], env: Mapping[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        with log.open("ab") as out:
            self.popen = subprocess.Popen(
                argv,
                cwd=REPO,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self, last: int = 6000) -> str:
        """The end of what the process printed."""
        try:
            return self.log.read_text(errors="replace")[-last:]
        except OSError:
            return ""

    def running(self) -> bool:
        return self.popen.poll() is None

    def signal_group(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the process and everything in its group (its pool children)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL the whole group (a stopped one too) and reap the process."""
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(15)

    def check_alive(self) -> None:
        if not self.running():
            raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n{self.output()}")


class ApiServer(Process):
    """A ``relaygraph serve`` process."""

    def __init__(self, name: str, argv: list[str], env: Mapping[str, str], log: Path, port: int):
        super().__init__(name, argv, env, log)
        self.url = f"http://127.0.0.1:{port}"

    def wait_ready(self, timeout: float = 90) -> None:
        """Wait until ``/readyz`` answers 200 (its database is reachable and migrated)."""

        def ready() -> bool:
            self.check_alive()
            try:
                return httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        try:
            wait_until(ready, timeout, f"{self.name} ready", every=0.1)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.output()}") from None


class Worker(Process):
    """A ``relaygraph worker`` process (the Celery worker and its prefork pool)."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: Mapping[str, str],
        log: Path,
        trace: WorkerTrace | None,
    ) -> None:
        super().__init__(name, argv, env, log)
        self.trace = trace

    def wait_ready(self, cluster: Cluster, consumers: int, timeout: float = 90) -> None:
        """Wait until RabbitMQ counts ``consumers`` consumers on the cluster's queue (this
        worker's among them), and for a traced worker, until it said it is ready."""

        def ready() -> bool:
            self.check_alive()
            if self.trace is not None and not self.trace.find(kind="ready", pid=self.pid):
                return False
            return cluster.queue_counts()[1] >= consumers

        try:
            wait_until(ready, timeout, f"{self.name} consuming", every=0.1)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.output()}") from None

    def pool_children(self) -> set[int]:
        """The pids of this worker's pool processes now (its children, from /proc)."""
        return {pid for pid, parent in _parents().items() if parent == self.pid}


@dataclass(frozen=True)
class Run:
    """One ``relaygraph.run_task`` a traced worker's pool process took (task_prerun)."""

    task_id: str
    dispatch: int
    pid: int
    """The pool process that runs it."""
    ppid: int
    """Its worker's main process."""
    t: float


class WorkerTrace:
    """What traced workers recorded (``tests.worker_trace``): one JSON line per event."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def records(self) -> list[dict[str, Any]]:
        try:
            lines = self.path.read_text().splitlines()
        except OSError:
            return []
        return [json.loads(line) for line in lines if line.endswith("}")]

    def find(self, **fields: Any) -> list[dict[str, Any]]:
        return [r for r in self.records() if all(r.get(k) == v for k, v in fields.items())]

    def runs(self, task_id: str | None = None) -> list[Run]:
        """The runs that started, in order (of ``task_id`` only, when given)."""
        return [
            Run(r["task_id"], r["dispatch"], r["pid"], r["ppid"], r["t"])
            for r in self.records()
            if r["kind"] == "prerun" and (task_id is None or r["task_id"] == task_id)
        ]

    def returned(self, run: Run) -> bool:
        """Whether the pool process of ``run`` returned from it (task_postrun)."""
        return any(
            r["kind"] == "postrun" and r["pid"] == run.pid and r["t"] >= run.t
            for r in self.records()
        )

    def busy(self) -> list[Run]:
        """Runs that started and have not returned."""
        return [run for run in self.runs() if not self.returned(run)]


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of ``pid`` so far (0 when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    # Fields 14 and 15 of stat (utime, stime), counted from the state field (3rd).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_stats() -> Iterator[tuple[int, str, list[str]]]:
    """Every process's id, command name and the fields of its /proc stat that follow the
    name, from the state (the stat's 3rd field) on; a process gone while read is left out."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        # The command name is in parentheses and may contain anything; fields follow it.
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        yield int(entry.name), name, stat[stat.rindex(")") + 2 :].split()


def _parents() -> dict[int, int]:
    """Every process's parent, from /proc."""
    return {pid: int(fields[1]) for pid, _, fields in process_stats()}


def process_gone(pid: int) -> bool:
    """Whether ``pid`` is gone (or a zombie: it ran its last instruction)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


class Cluster:
    """API servers and workers sharing one data directory, database and queue.

    Args:
        root: A folder for the data directory, the logs and the trace.
        database_url: The ledger (a fresh database); None: SQLite in the data directory
            (the single-machine mode, for the benchmark).
        broker: The RabbitMQ URL; None: no worker mode (``serve`` runs tasks in process).
        scripts: The folder of scripts that requests may name (``serve --scripts``).
        env: More environment for every process.
    """

    def __init__(
        self,
        root: Path,
        *,
        database_url: str | None,
        broker: str | None,
        scripts: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.root = root
        self.home = root / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.logs = root / "logs"
        self.logs.mkdir(exist_ok=True)
        self.scripts = scripts
        self.broker = broker
        self.database_url = database_url
        self.queue = f"rg-cluster-{uuid.uuid4().hex[:10]}"
        self.control = f"{self.queue}-ctl"
        self.trace = WorkerTrace(root / "worker-trace.jsonl")
        self.servers: list[ApiServer] = []
        self.workers: list[Worker] = []
        self.env = {**os.environ}
        for name in _PROXIES:
            self.env.pop(name, None)
        self.env.update(
            {
                "RELAYGRAPH_HOME": str(self.home),
                "RELAYGRAPH_QUEUES": json.dumps([self.queue]),
                "RELAYGRAPH_CONTROL_EXCHANGE": self.control,
                "LANGSMITH_TRACING": "false",
                "NO_PROXY": "127.0.0.1,localhost",
                "PYTHONUNBUFFERED": "1",
                "WORKER_TRACE": str(self.trace.path),
            }
        )
        for name, value in (
            ("RELAYGRAPH_DATABASE_URL", database_url),
            ("RELAYGRAPH_BROKER_URL", broker),
        ):
            if value is None:
                self.env.pop(name, None)
            else:
                self.env[name] = value
        # The cluster's tests follow tasks through servers and workers, not the sandbox's
        # isolation: where bubblewrap is missing, the programs run unisolated.
        self.env.update(unsafe_sandbox_env())
        self.env.update(env or {})
        self._engine = create_engine(database_url) if database_url else None

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Processes

    def serve(
        self,
        name: str,
        *,
        model: str,
        workers: int | None = None,
        processes: int | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 90,
    ) -> ApiServer:
        """Start ``relaygraph serve`` and wait until it is ready."""
        port = free_port()
        argv = [sys.executable, "-m", "relaygraph.cli", "serve", "--port", str(port)]
        argv += ["--model", model]
        if self.scripts is not None:
            argv += ["--scripts", str(self.scripts)]
        if workers is not None:
            argv += ["--workers", str(workers)]
        if processes is not None:
            argv += ["--processes", str(processes)]
        server = ApiServer(name, argv, {**self.env, **(env or {})}, self.logs / f"{name}.log", port)
        self.servers.append(server)
        server.wait_ready(timeout)
        return server

    def worker(
        self,
        name: str,
        *,
        concurrency: int = 1,
        traced: bool = True,
        env: Mapping[str, str] | None = None,
        wait: bool = True,
        timeout: float = 90,
        hostname: str | None = None,
    ) -> Worker:
        """Start ``relaygraph worker`` on the cluster's queue and (``wait``) until it consumes.

        Without ``hostname`` it runs as docs/deploy.md starts workers, with no ``--hostname``:
        every worker of the host takes its default node name, ``relaygraph-<pid>@<host>``.
        """
        module = "tests.worker_trace" if traced else "relaygraph.cli"
        argv = [sys.executable, "-m", module, "worker"]
        argv += ["--concurrency", str(concurrency), "--queues", self.queue]
        if hostname is not None:
            argv += ["--hostname", hostname]
        worker = Worker(
            name,
            argv,
            {**self.env, **(env or {})},
            self.logs / f"{name}.log",
            self.trace if traced else None,
        )
        self.workers.append(worker)
        if wait:
            worker.wait_ready(self, sum(w.running() for w in self.workers), timeout)
        return worker

    def worker_of(self, run: Run) -> Worker:
        """The worker whose pool process took ``run``."""
        return next(w for w in self.workers if w.pid == run.ppid)

    def create_project(self, name: str) -> str:
        """``relaygraph projects create NAME --json`` on the cluster's ledger; its key."""
        done = subprocess.run(
            [sys.executable, "-m", "relaygraph.cli", "projects", "create", name, "--json"],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"projects create {name} failed:\n{done.stdout}\n{done.stderr}")
        key: str = json.loads(done.stdout)["key"]
        return key

    def outputs(self) -> str:
        """Every process's last lines, for a failure message."""
        return "\n".join(
            f"--- {p.name} (pid {p.pid}) ---\n{p.output(3000)}"
            for p in [*self.servers, *self.workers]
        )

    def close(self) -> None:
        """Kill every process group started, then delete the queue and exchanges."""
        for process in [*self.workers, *self.servers]:
            process.kill()
        if self._engine is not None:
            self._engine.dispose()
        if self.broker is not None:
            with contextlib.suppress(Exception), Connection(self.broker) as connection:
                channel = connection.default_channel
                channel.queue_delete(self.queue)
                channel.exchange_delete(self.queue)
                channel.exchange_delete(f"{self.control}.pidbox")
                channel.exchange_delete(f"reply.{self.control}.pidbox")

    # The broker and the ledger, read directly

    def queue_counts(self) -> tuple[int, int]:
        """``(messages ready, consumers)`` of the cluster's queue; (0, 0) before anyone
        declared it."""
        assert self.broker is not None
        try:
            with Connection(self.broker, connect_timeout=5) as connection:
                _, ready, consumers = connection.default_channel.queue_declare(
                    self.queue, passive=True
                )
                return int(ready), int(consumers)
        except Exception as exc:  # NOT_FOUND closes the channel: not declared yet.
            if "NOT_FOUND" in str(exc) or "404" in str(exc):
                return 0, 0
            raise

    def sql(self, statement: str, **params: Any) -> list[dict[str, Any]]:
        """Rows of a read-only SQL statement on the cluster's ledger."""
        assert self._engine is not None, "the cluster has no PostgreSQL ledger"
        with self._engine.connect() as connection:
            return [dict(row._mapping) for row in connection.execute(text(statement), params)]

    def cpu_seconds(self) -> float:
        """CPU time used so far by the cluster's live processes and all their descendants
        (pool processes, sandboxes): how much of the machine the service itself takes."""
        return sum(self.cpu_seconds_by_role().values())

    def cpu_seconds_by_role(self) -> dict[str, float]:
        """:meth:`cpu_seconds` apart for the API servers and the workers (each with its
        descendants: a worker's pool processes count as the worker's)."""
        parents = _parents()

        def with_descendants(processes: Sequence[Process]) -> float:
            found = {p.pid for p in processes if p.running()}
            frontier = set(found)
            while frontier:
                frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
                found |= frontier
            return sum(_cpu_seconds(pid) for pid in found)

        return {
            "API servers": with_descendants(self.servers),
            "workers": with_descendants(self.workers),
        }

    def task_dir(self, task_id: str) -> Path:
        return self.home / "tasks" / task_id
