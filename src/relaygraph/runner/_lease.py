"""A runner's hold on the task it runs: a lease taken at the start and renewed while it runs
(in process), or a worker's attempt watched from the ledger (the worker mode)."""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["DEFAULT_LEASE_SECONDS", "AttemptWatch", "LeaseKeeper"]

DEFAULT_LEASE_SECONDS = 30.0
"""How long a lease lasts unrenewed: how long a crashed runner's task waits for another."""

log = logging.getLogger(__name__)


class LeaseKeeper:
    """Renews ``runner_id``'s lease on a task every third of its length.

    A runner that dies stops renewing, and after ``seconds`` another may take the task
    over (``Ledger.take_lease``). Should this runner find its lease gone (it could not
    renew in time, and another took the task), ``lost`` is set: the run must stop. Should
    a cancel wait on the task (asked for on another server, ``Ledger.request_cancel``),
    ``cancel`` is set: the run stops at its next step boundary, ``cancelled``.

    Every keeper of the process is renewed from one thread (:class:`_Renewals`), not one
    thread each: a thread per run cost each run a thread's start and end on its own path.
    """

    def __init__(
        self,
        ledger: Any,
        task_id: str,
        runner_id: str,
        *,
        seconds: float,
        cancel: threading.Event | None = None,
    ) -> None:
        self.lost = threading.Event()
        self._cancel = cancel
        self._ledger = ledger
        self._task_id = task_id
        self._runner_id = runner_id
        self._seconds = seconds
        self._done = threading.Event()
        self._on_lost: list[Callable[[], None]] = []
        self._on_cancel: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        _RENEWALS.add(self, seconds / 3)

    def _renew(self) -> bool:
        """Renew the lease once, and look for a cancel; False: renew no more."""
        if self._done.is_set():
            return False
        try:
            held = self._ledger.renew_lease(self._task_id, self._runner_id, seconds=self._seconds)
        except Exception:  # A database hiccup: the next renewal may work.
            log.warning("could not renew the lease on task %s", self._task_id, exc_info=True)
            return True
        if not held:
            log.warning("task %s: another runner took it over; stopping", self._task_id)
            with self._lock:
                self.lost.set()
                callbacks = list(self._on_lost)
            _call_each(callbacks, "lease lost")
            return False
        if self._cancel is not None and not self._cancel.is_set():
            try:
                if self._ledger.cancel_requested(self._task_id):
                    self._cancelled()
            except Exception:  # As for the renewal: the next round may work.
                log.warning("could not read task %s's cancel", self._task_id, exc_info=True)
        return not self._done.is_set()

    def _cancelled(self) -> None:
        with self._lock:
            if self._cancel is None or self._cancel.is_set():
                return
            self._cancel.set()
            callbacks = list(self._on_cancel)
        _call_each(callbacks, "cancel")

    def when_cancelled(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when this keeper finds a cancel waiting on the task (at once,
        if ``cancel`` is set already)."""
        with self._lock:
            if self._cancel is None or not self._cancel.is_set():
                self._on_cancel.append(callback)
                return
        callback()

    def when_lost(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the lease is lost (at once, if it already was)."""
        with self._lock:
            if not self.lost.is_set():
                self._on_lost.append(callback)
                return
        callback()

    def close(self) -> None:
        """Stop renewing (the caller releases the lease). A renewal under way may still
        finish; none starts after this returns."""
        self._done.set()
        _RENEWALS.remove(self)


class _Renewals:
    """The process's lease keepers, each renewed every ``every`` seconds by one thread,
    which ends while there is none (and is started again with the next)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._due: list[tuple[float, int, LeaseKeeper, float]] = []
        """A heap: (when, order, keeper, every)."""
        self._order = itertools.count()
        self._renewing: LeaseKeeper | None = None
        self._thread: threading.Thread | None = None

    def forget(self) -> None:
        """In a forked child: none of the parent's leases or its thread are here, and its
        lock may have been copied held."""
        self._changed = threading.Condition()
        self._due, self._renewing, self._thread = [], None, None

    def add(self, keeper: LeaseKeeper, every: float) -> None:
        with self._changed:
            self._push(keeper, every)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="relaygraph-leases", daemon=True
                )
                self._thread.start()
            self._changed.notify()

    def remove(self, keeper: LeaseKeeper) -> None:
        with self._changed:
            self._due = [entry for entry in self._due if entry[2] is not keeper]
            heapq.heapify(self._due)
            # A renewal of this keeper under way finishes before close returns (unless
            # close is called from that renewal: a callback on the renewing thread).
            while self._renewing is keeper and threading.current_thread() is not self._thread:
                self._changed.wait()
            self._changed.notify()

    def _push(self, keeper: LeaseKeeper, every: float) -> None:
        heapq.heappush(self._due, (time.monotonic() + every, next(self._order), keeper, every))

    def _loop(self) -> None:
        while True:
            with self._changed:
                while True:
                    if not self._due:
                        self._thread = None
                        return
                    when, _, keeper, every = self._due[0]
                    wait = when - time.monotonic()
                    if wait <= 0:
                        heapq.heappop(self._due)
                        self._renewing = keeper
                        break
                    self._changed.wait(wait)
            again = False
            try:
                again = keeper._renew()
            except Exception:  # One keeper's failure must not stop every lease's renewals.
                log.exception("renewing the lease on task %s failed", keeper._task_id)
                again = not keeper._done.is_set()
            finally:
                with self._changed:
                    self._renewing = None
                    if again and not keeper._done.is_set():
                        self._push(keeper, every)
                    self._changed.notify_all()


_RENEWALS = _Renewals()
os.register_at_fork(after_in_child=_RENEWALS.forget)


def _call_each(callbacks: list[Callable[[], None]], what: str) -> None:
    """Call every callback; one that raises is logged and the others still run (they run
    on the thread that renews every lease of the process, which must go on)."""
    for callback in callbacks:
        try:
            callback()
        except Exception:
            log.exception("a %s callback failed", what)


class AttemptWatch:
    """Watches a worker's attempt at a task from the ledger, on a thread: the worker mode's
    counterpart of :class:`LeaseKeeper` (nothing to renew: the broker says when a worker is
    gone).

    It reads the task's attempt and cancel flag at each step boundary of the run
    (:meth:`check`, which the runner calls before each checkpoint is written) and, for a step
    that takes long, every ``poll_seconds`` on a thread. Once the task is on another attempt
    (the broker gave it to another worker while this one was frozen, or a write of this
    attempt was refused), ``lost`` is set and the run must stop at once: its writes are
    refused anyway (the fencing number). Once a cancel waits on the task, ``cancel`` is set
    and the ``when_cancelled`` callbacks run: the run stops at that step boundary,
    ``cancelled``.
    """

    def __init__(
        self,
        ledger: Any,
        task_id: str,
        attempt: int,
        *,
        poll_seconds: float = 0.5,
        cancel: threading.Event | None = None,
    ) -> None:
        self.lost = threading.Event()
        self.attempt = attempt
        self.current: int | None = attempt
        """The task's attempt when ``lost`` was set (None: the task is gone)."""
        self._cancel = cancel
        self._ledger = ledger
        self.task_id = task_id
        self._poll = poll_seconds
        self._done = threading.Event()
        self._on_lost: list[Callable[[], None]] = []
        self._on_cancel: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._watch, name=f"relaygraph-attempt-{task_id[:8]}", daemon=True
        )
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(self._poll):
            try:
                if not self.check():
                    return
            except Exception:  # A database hiccup: the next round may work.
                log.warning("could not read task %s's attempt", self.task_id, exc_info=True)

    def check(self) -> bool:
        """Read the task's attempt and cancel flag now; False when the attempt is superseded
        (``lost`` is then set)."""
        state = self._ledger.attempt_state(self.task_id)
        if state is None or state[0] != self.attempt:
            self.supersede(None if state is None else state[0])
            return False
        if state[1]:
            self.cancelled()
        return True

    def cancelled(self) -> None:
        """The ledger asks for the run to be cancelled (read here, or by the run's fenced
        checkpointer at a write): ``cancel`` is set and the ``when_cancelled`` callbacks run,
        once."""
        with self._lock:
            if self._cancel is None or self._cancel.is_set():
                return
            self._cancel.set()
            callbacks = list(self._on_cancel)
        _call_each(callbacks, "cancel")

    def when_cancelled(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the ledger asks for the run to be cancelled (at once, if it
        already did)."""
        with self._lock:
            if self._cancel is None or not self._cancel.is_set():
                self._on_cancel.append(callback)
                return
        callback()

    def supersede(self, current: int | None) -> None:
        """Mark the attempt superseded by ``current`` (a refused write says so first)."""
        with self._lock:
            if self.lost.is_set():
                return
            self.current = current
            self.lost.set()
            callbacks = list(self._on_lost)
        log.warning(
            "task %s: attempt %s is superseded (now %s); stopping",
            self.task_id,
            self.attempt,
            current,
        )
        for callback in callbacks:
            callback()

    def when_lost(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the attempt is superseded (at once, if it already was)."""
        with self._lock:
            if not self.lost.is_set():
                self._on_lost.append(callback)
                return
        callback()

    def close(self) -> None:
        """Stop watching."""
        self._done.set()
        self._thread.join()
