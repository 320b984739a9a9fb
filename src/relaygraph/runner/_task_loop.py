"""The event loop a process runs its tasks on (a server's, or a worker's with tasks in
flight), on a thread of its own: one per process (:meth:`TaskLoop.shared`), for as long as
the process lives.

Agent tasks spend nearly all their time waiting for a model. A run on the loop
(``TaskRunner.arun``) holds no thread while it waits, so one process holds as many tasks
in flight as its CPU and memory allow, not one thread (or process) each. Sync steps (tools,
the ledger's reads and writes, sync nodes) run on the loop's default executor, a bounded
pool of ``sync_threads``.

One loop per process, never closed: what the runs leave bound to it (each model's async
HTTP client and its kept connections, the async checkpointers) is shared by every run of
the process, and would be unusable from another loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import os
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from relaygraph.errors import ConfigError

__all__ = [
    "DEFAULT_SYNC_THREADS",
    "EVENT_LOOP_ENV",
    "LoopLoad",
    "TaskLoop",
    "event_loop_kind",
    "new_event_loop",
]

T = TypeVar("T")

DEFAULT_SYNC_THREADS = 32
"""Threads for the sync steps of every task on the loop (tools, ledger writes): the most
of them that run at once; the others wait for a thread, not for a task to end."""
LAG_PROBE_SECONDS = 0.25
"""How often the loop's lag is measured: how late a timer of this length fires."""


EVENT_LOOP_ENV = "RELAYGRAPH_EVENT_LOOP"
EVENT_LOOPS = ("auto", "uvloop", "asyncio")


def event_loop_kind() -> str:
    """Which event loop the process's task loop and HTTP server run on:
    ``$RELAYGRAPH_EVENT_LOOP`` (``auto``, the default: uvloop where it is installed, else
    asyncio's own; ``uvloop``; ``asyncio``), as uvicorn's ``loop`` setting names them.

    Raises:
        ConfigError: Another value, or ``uvloop`` where it is not installed.
    """
    kind = os.environ.get(EVENT_LOOP_ENV, "").strip() or "auto"
    if kind not in EVENT_LOOPS:
        raise ConfigError(f"{EVENT_LOOP_ENV}={kind!r}: give one of {', '.join(EVENT_LOOPS)}")
    if kind == "uvloop" and importlib.util.find_spec("uvloop") is None:
        raise ConfigError(f"{EVENT_LOOP_ENV}=uvloop, but uvloop is not installed (pip install it)")
    return kind


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new loop of :func:`event_loop_kind`'s kind. uvloop (libuv) runs the loop's own work
    (callbacks, timers, sockets) in C: a loop holding hundreds of tasks spends a fifth of
    its time there on asyncio's.

    Raises:
        ConfigError: The setting is bad (see :func:`event_loop_kind`).
    """
    if event_loop_kind() == "asyncio" or importlib.util.find_spec("uvloop") is None:
        return asyncio.new_event_loop()
    import uvloop

    return uvloop.new_event_loop()


@dataclass(frozen=True, kw_only=True, slots=True)
class LoopLoad:
    """The loop's lag, as ``/metrics`` shows it."""

    lag_seconds: float
    """How late the loop's last probe timer fired: how long a ready task waits for the
    loop (a loop kept busy by CPU work shows it first)."""
    sync_queue: int
    """Sync steps waiting for a thread of the loop's executor."""


class TaskLoop:
    """An event loop on a daemon thread, with a bounded executor for sync steps."""

    def __init__(self, *, sync_threads: int = DEFAULT_SYNC_THREADS, name: str = "tasks") -> None:
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=sync_threads, thread_name_prefix=f"relaygraph-{name}-sync"
        )
        self.loop = new_event_loop()
        self.loop.set_default_executor(self._executor)
        self._lag = 0.0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"relaygraph-{name}", daemon=True)
        self._thread.start()
        self._ready.wait()

    @classmethod
    def shared(cls, *, sync_threads: int = DEFAULT_SYNC_THREADS) -> TaskLoop:
        """The process's task loop, started by the first caller (whose ``sync_threads``
        it keeps)."""
        global _SHARED
        with _SHARED_LOCK:
            if _SHARED is None:
                _SHARED = cls(sync_threads=sync_threads)
            return _SHARED

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        probe = self.loop.create_task(self._probe_lag())
        try:
            self.loop.run_forever()
        finally:
            probe.cancel()
            self.loop.run_until_complete(asyncio.gather(probe, return_exceptions=True))
            self.loop.close()

    async def _probe_lag(self) -> None:
        while True:
            began = self.loop.time()
            await asyncio.sleep(LAG_PROBE_SECONDS)
            self._lag = max(0.0, self.loop.time() - began - LAG_PROBE_SECONDS)

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coroutine`` on the loop; its future is this thread's to wait on."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def load(self) -> LoopLoad:
        return LoopLoad(lag_seconds=self._lag, sync_queue=self._executor._work_queue.qsize())


_SHARED: TaskLoop | None = None
_SHARED_LOCK = threading.Lock()


def _forget() -> None:
    """In a forked child: the parent's loop thread is not there."""
    global _SHARED, _SHARED_LOCK
    _SHARED, _SHARED_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget)
