"""The process-wide daemon threads of the runner's background work: a scheduling thread
that waits for what is due next (:class:`DueScheduler`), and the pool it hands that work to
(:class:`DaemonPool`). The event writers' batches and the leases' renewals each have one."""

from __future__ import annotations

import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

__all__ = ["POOL_IDLE_SECONDS", "DaemonPool", "DueScheduler"]

POOL_IDLE_SECONDS = 60.0
"""A pool thread with nothing to do for this long ends (the next call starts one)."""


class DaemonPool:
    """Up to ``size`` daemon threads that run the calls submitted, started as they are needed.

    Not ``concurrent.futures.ThreadPoolExecutor``: its threads are joined when the
    interpreter exits, so one renewal that hangs (a dead connection) would keep a finished
    ``relaygraph run`` or a stopped server from exiting. A call must handle its own errors.
    """

    def __init__(self, size: int, name: str) -> None:
        self._size, self._name = size, name
        self._work: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]]]
        self._work = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = self._idle = self._pending = 0

    def submit(self, call: Callable[..., None], *args: Any) -> None:
        with self._lock:
            self._pending += 1
            self._work.put((call, args))
            if self._pending > self._idle and self._threads < self._size:
                self._threads += 1
                name = f"{self._name}_{self._threads}"
                threading.Thread(target=self._loop, name=name, daemon=True).start()

    def _loop(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            try:
                call, args = self._work.get(timeout=POOL_IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    self._idle -= 1
                    if self._pending <= self._idle:  # No call waits without a thread.
                        self._threads -= 1
                        return
                continue
            with self._lock:
                self._idle -= 1
                self._pending -= 1
            call(*args)


class DueScheduler(ABC):
    """A scheduling thread (:meth:`_loop`) that hands what comes due to a
    :class:`DaemonPool`, both started when work is first added (:meth:`_start`, called
    holding :attr:`_changed`); the thread may end while nothing is due, and is started
    again with the next work.

    Args:
        pool_size: The pool's threads at most.
        pool_name: The prefix of the pool's thread names.
        thread_name: The scheduling thread's name.
    """

    def __init__(self, *, pool_size: int, pool_name: str, thread_name: str) -> None:
        self._pool_size, self._pool_name, self._thread_name = pool_size, pool_name, thread_name
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._pool: DaemonPool | None = None

    def forget(self) -> None:
        """In a forked child: none of the parent's work or threads are here, and its lock may
        have been copied held."""
        self._changed = threading.Condition()
        self._thread, self._pool = None, None

    def _start(self) -> None:
        """Start the pool and the scheduling thread where they are not running, and wake the
        thread: work was added. The caller holds :attr:`_changed`."""
        if self._pool is None:
            self._pool = DaemonPool(self._pool_size, self._pool_name)
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self._thread_name, daemon=True)
            self._thread.start()
        self._changed.notify()

    @abstractmethod
    def _loop(self) -> None:
        """The scheduling thread: hands the work due to :attr:`_pool`; sets :attr:`_thread`
        to None (holding :attr:`_changed`) before it returns."""
