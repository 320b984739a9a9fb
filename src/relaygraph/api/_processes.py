"""``serve --processes N``: the server's workers spread over N processes sharing the ledger.

Every graph of an in-process server runs on threads of one Python interpreter, which runs
one thread at a time: past some tasks per second the interpreter, not the model, sets the
pace (benchmarks/RESULTS.md, section 6). With ``--processes N`` the server process keeps
its share of the workers and starts N - 1 task processes (``python -m
relaygraph.api._task_process``), each with its share, on the same ledger. No broker and no
new service: the ledger is the queue. A queued task waits in it until a process with a
free worker takes it under that process's lease (:meth:`InProcessDispatch.pull`), so a
task never runs twice and starts at once wherever a worker frees up.

The server tells its task processes over their stdin (a line each): ``wake`` when a task
was queued (they would otherwise find it within :data:`~relaygraph.api._in_process.
PULL_IDLE_SECONDS`), ``cancel <id>`` when one was cancelled (its lease keeper would
otherwise see it only at its next renewal). A task process that reads the end of its stdin
(the server stopped, or died) stops as the server does: running tasks stop at their next
step boundary and stay ``running``, for the next start to continue. multiprocessing is not
used: a fork of a process with threads running may copy held locks, and a spawned child
would need the server's objects pickled; a plain subprocess reads its settings from stdin.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from relaygraph.api._in_process import InProcessDispatch
from relaygraph.api._settings import ServiceSettings
from relaygraph.runner import Answers, settle_long_lived
from relaygraph.store import Ledger, Task

__all__ = ["TaskProcesses", "serve_tasks", "shares"]

log = logging.getLogger("relaygraph.api")

STOP_SECONDS = 60.0
"""How long the server waits for a task process to stop after its stdin closes."""
QUICK_END_SECONDS = 10.0
"""A task process that ends sooner than this after it started is started again only after
a pause, which doubles while they keep ending so soon."""
RESTART_PAUSE_MAX = 30.0


def shares(workers: int, processes: int) -> list[int]:
    """The workers of each process, the server's first: as even as they divide."""
    base, extra = divmod(workers, processes)
    return [base + (1 if i < extra else 0) for i in range(processes)]


class _Child:
    """One task process, and what the server says to it.

    Lines go through a queue to a writer thread of its own, so the request that queues a
    task or cancels one never waits on a pipe a stuck process has stopped reading (its
    lines wait in the queue instead; ``wake`` lines are merged, so they never pile up).
    """

    def __init__(self, setup: dict[str, Any]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "relaygraph.api._task_process"],
            stdin=subprocess.PIPE,
            text=True,
            # Its own session: a Ctrl-C meant for the server reaches the server, which
            # then stops its task processes in order (stdin closed).
            start_new_session=True,
        )
        self._lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._woken = threading.Event()
        """A ``wake`` is queued and not yet written: another adds nothing."""
        self._lines.put(json.dumps(setup))
        self._writer = threading.Thread(
            target=self._write, name=f"relaygraph-tell-{self.process.pid}", daemon=True
        )
        self._writer.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def tell(self, line: str) -> None:
        if line == "wake":
            if self._woken.is_set():
                return
            self._woken.set()
        self._lines.put(line)

    def close(self) -> None:
        """Close its stdin once what is queued is written: the process then stops."""
        self._lines.put(None)

    def _write(self) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        try:
            while (line := self._lines.get()) is not None:
                if line == "wake":
                    self._woken.clear()
                stdin.write(line + "\n")
                stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # Gone: the watcher logs it and starts another.
        finally:
            with contextlib.suppress(OSError):
                stdin.close()


class TaskProcesses:
    """The server's hand-off (:class:`~relaygraph.api._dispatch.TaskDispatch`) when its
    workers are spread over processes: its own pulling workers, and its task processes.

    A task process that dies (killed, out of memory) is logged and started again at once;
    its running tasks continue once their leases lapse (the sweeper), as a dead server's do.

    Args:
        workers: This process's workers (pulling).
        settings: The server's settings, given to every task process.
        url: The ledger's URL, the same for every process.
        home: The data directory.
    """

    def __init__(
        self, workers: InProcessDispatch, *, settings: ServiceSettings, url: str, home: Path
    ) -> None:
        self.workers = workers
        self.ledger = workers.ledger
        self._settings, self._url, self._home = settings, url, home
        self._children: list[_Child] = []
        self._lock = threading.Lock()
        self._stopping = False
        self._stop = threading.Event()
        self._watchers: list[threading.Thread] = []

    @property
    def pids(self) -> list[int]:
        """The task processes' process ids, as they are now."""
        with self._lock:
            return [child.pid for child in self._children]

    def start(self) -> None:
        """Start the task processes (each with its share of the workers)."""
        for slot, count in enumerate(shares(self._settings.workers, self._settings.processes)[1:]):
            self._children.append(self._spawn(count))
            watcher = threading.Thread(
                target=self._watch, args=(slot, count), name="relaygraph-processes", daemon=True
            )
            watcher.start()
            self._watchers.append(watcher)

    def _spawn(self, workers: int) -> _Child:
        setup = {
            "settings": self._settings.model_dump(mode="json"),
            "url": self._url,
            "home": str(self._home),
            "workers": workers,
        }
        return _Child(setup)

    def _watch(self, slot: int, workers: int) -> None:
        """Wait on the task process of ``slot``; should it end while the server runs, log
        how and start another in its place: at once after a process that ran a while,
        after a growing pause (1 s, 2 s, ... up to :data:`RESTART_PAUSE_MAX`) after one
        that ended soon after it started (the ledger unreachable, say), so a process that
        cannot start does not make the server start processes in a tight loop."""
        pause = 0.0
        while True:
            with self._lock:
                child = self._children[slot]
            started = time.monotonic()
            code = child.process.wait()
            quick = time.monotonic() - started < QUICK_END_SECONDS
            pause = min(RESTART_PAUSE_MAX, max(1.0, 2 * pause)) if quick else 0.0
            log.warning(
                "task process %d ended (exit code %s); starting another%s",
                child.pid,
                code,
                f" in {pause:g} s" if pause else "",
            )
            child.close()
            if self._stop.wait(pause):
                return
            with self._lock:
                if self._stopping:
                    return
                self._children[slot] = self._spawn(workers)

    def _tell(self, line: str) -> None:
        with self._lock:
            for child in self._children:
                child.tell(line)

    def enqueue(self, task: Task) -> None:
        """Wake every process: the first with a worker free takes the task."""
        self.workers.wake()
        self._tell("wake")

    def resume(self, task_id: str, answers: Answers) -> bool:
        """Continue a decided task in this process (see :meth:`InProcessDispatch.resume`)."""
        return self.workers.resume(task_id, answers)

    def cancel(self, task_id: str, *, by: str | None = None, via: str = "api") -> Task:
        """Cancel in the ledger (recording who asked), and stop the task at once wherever
        it runs."""
        task = self.workers.cancel(task_id, by=by, via=via)
        if task.status != "cancelled":
            self._tell(f"cancel {task_id}")
        return task

    def shutdown(self, *, wait: bool = True) -> None:
        """Stop this process's workers and the task processes (stdin closed)."""
        with self._lock:
            self._stopping = True
            self._stop.set()
            children = list(self._children)
        for child in children:
            child.close()
        self.workers.shutdown(wait=wait)
        for child in children:
            try:
                child.process.wait(timeout=STOP_SECONDS if wait else 0.1)
            except subprocess.TimeoutExpired:
                log.warning("task process %d did not stop in time; killing it", child.pid)
                child.process.kill()
                child.process.wait()
        for watcher in self._watchers:
            watcher.join()


def serve_tasks(stdin: IO[str]) -> None:
    """A task process: run queued tasks until stdin ends, or ``SystemExit`` (its SIGTERM
    handler, :mod:`relaygraph.api._task_process`), see the module docstring."""
    from relaygraph.runner import ServiceTeams

    setup: dict[str, Any] = json.loads(stdin.readline())
    settings = ServiceSettings.model_validate(setup["settings"])
    home = Path(setup["home"])
    ledger = Ledger(setup["url"])
    teams = ServiceTeams(ledger=ledger, settings=settings, home=home)
    workers = InProcessDispatch(
        ledger,
        home=home,
        workers=int(setup["workers"]),
        lease_seconds=settings.lease_seconds,
        max_attempts=settings.max_attempts,
        sandbox_isolation_required=not settings.unsafe_sandbox,
        teams=teams.resolve,
        policies=teams.policy_for,
        pull=True,
        workspace_quota=settings.workspace_quota(),
        quotas=settings.quotas,
        model_calls=settings.model_call_recording(),
    )
    settle_long_lived()  # as the server does before its first task
    workers.start_pulling()
    workers.wake()
    try:
        for line in stdin:
            command, _, argument = line.strip().partition(" ")
            if command == "wake":
                workers.wake()
            elif command == "cancel":
                workers.cancel_here(argument)
    finally:
        workers.shutdown(wait=True)
        ledger.close()
