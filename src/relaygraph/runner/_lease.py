"""A runner's hold on the task it runs: a lease taken at the start and renewed while it runs
(in process), or a worker's attempt watched from the ledger (the worker mode)."""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["DEFAULT_LEASE_SECONDS", "AttemptWatch", "LeaseKeeper", "RunHold"]

DEFAULT_LEASE_SECONDS = 30.0
"""How long a lease lasts unrenewed: how long a crashed runner's task waits for another."""
CONFIRMED_SHARE = 5 / 6
"""A keeper gives its lease up (sets ``lost``) once this share of the lease's length has
passed since its last renewal that worked began: with renewals every third of the length,
one failed renewal is forgiven, a second is not, and the run has the last sixth (5 s of
the default 30) to reach a step boundary before the lease can lapse."""
RENEWAL_THREADS = 4
"""Threads that renew leases at once: one renewal that hangs leaves the others theirs."""
POOL_IDLE_SECONDS = 60.0
"""A renewal thread with nothing to do for this long ends (the next lease starts one)."""

log = logging.getLogger(__name__)


class RunHold(Protocol):
    """A runner's hold on the task it runs: :class:`LeaseKeeper` in process,
    :class:`AttemptWatch` on a worker. Either is looked after by the process's one
    scheduling thread (:class:`_Renewals`), not a thread per run."""

    lost: threading.Event
    """Set when the hold is gone (the lease lost, the attempt superseded): the run stops."""

    def when_lost(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the hold is lost (at once, if it already was)."""

    def when_cancelled(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when a cancel waits on the task (at once, if one did)."""

    def close(self) -> None:
        """Stop looking after the hold: the run is over."""


class LeaseKeeper:
    """Renews ``runner_id``'s lease on a task every third of its length.

    A runner that dies stops renewing, and after ``seconds`` another may take the task
    over (``Ledger.take_lease``). Should this runner find its lease gone (it could not
    renew in time, and another took the task), ``lost`` is set: the run must stop. Should
    a cancel wait on the task (asked for on another server, ``Ledger.request_cancel``),
    ``cancel`` is set: the run stops at its next step boundary, ``cancelled``.

    Every keeper of the process is scheduled from one thread (:class:`_Renewals`), not one
    thread each: a thread per run cost each run a thread's start and end on its own path.
    The renewals themselves run on a few threads of a pool, so one that hangs (a row
    lock, a connection that stopped answering) holds up no other lease.

    A keeper whose lease has not been renewed for :data:`CONFIRMED_SHARE` of its length
    (counted from the start of the last renewal that worked, or from the keeper's start)
    sets ``lost`` itself: its lease may lapse before any renewal comes back, and another
    runner could then take the task while this one still runs it. The run stops at its
    next step boundary, ahead of the lapse, and the task continues on the next runner.
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
        self.confirmed_until = time.monotonic() + seconds * CONFIRMED_SHARE
        """When, on this process's monotonic clock, the lease stops being sure (see the
        class): moved on by each renewal that works. The lease was taken just before the
        keeper was made, so the first is counted from now."""
        _RENEWALS.add(self, seconds / 3)

    def _renew(self) -> bool:
        """Renew the lease once, and look for a cancel; False: renew no more."""
        if self._done.is_set():
            return False
        began = time.monotonic()
        try:
            held = self._ledger.renew_lease(self._task_id, self._runner_id, seconds=self._seconds)
        except Exception:  # A database hiccup: the next renewal may work.
            log.warning("could not renew the lease on task %s", self._task_id, exc_info=True)
            return True
        if held:
            # Counted from when the renewal began: the ledger's new end is at least that
            # late (its clock is read in the renewal).
            with self._lock:
                self.confirmed_until = max(
                    self.confirmed_until, began + self._seconds * CONFIRMED_SHARE
                )
        if not held:
            log.warning("task %s: another runner took it over; stopping", self._task_id)
            self._lose()
            return False
        if self._cancel is not None and not self._cancel.is_set():
            try:
                if self._ledger.cancel_requested(self._task_id):
                    self._cancelled()
            except Exception:  # As for the renewal: the next round may work.
                log.warning("could not read task %s's cancel", self._task_id, exc_info=True)
        return not self._done.is_set()

    def _lose(self) -> None:
        """Set ``lost`` and call the ``when_lost`` callbacks, once."""
        with self._lock:
            if self.lost.is_set():
                return
            self.lost.set()
            callbacks = list(self._on_lost)
        _call_each(callbacks, "lease lost")

    def _lapsing(self, now: float) -> bool:
        """Whether the lease went unconfirmed for too long (see the class); the run is then
        told its lease is lost. Called by the scheduling thread."""
        with self._lock:
            late = not self._done.is_set() and not self.lost.is_set()
            late = late and now >= self.confirmed_until
        if late:
            log.warning(
                "task %s: its lease was not renewed in time (%.3g s); stopping its run before "
                "the lease can lapse",
                self._task_id,
                self._seconds * CONFIRMED_SHARE,
            )
            self._lose()
        return late

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
    """The process's lease keepers, each renewed every ``every`` seconds.

    One thread schedules them and ends while there is none (it is started again with the
    next); the renewals run on a pool of :data:`RENEWAL_THREADS`, so one that hangs holds up
    no other keeper. The scheduling thread never waits on the ledger: it also tells each
    keeper whose lease went unconfirmed too long (:meth:`LeaseKeeper._lapsing`), even while
    that keeper's renewal hangs. A keeper whose renewal is still under way when it is due
    again is not renewed twice at once; it is due again one period later.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._due: list[tuple[float, int, Any, float]] = []
        """A heap: (when, order, keeper, every)."""
        self._order = itertools.count()
        self._keepers: set[Any] = set()
        """Every keeper not closed: the ones whose lease the scheduler watches."""
        self._renewing: set[Any] = set()
        self._thread: threading.Thread | None = None
        self._pool: _DaemonPool | None = None

    def forget(self) -> None:
        """In a forked child: none of the parent's leases or threads are here, and its
        lock may have been copied held."""
        self._changed = threading.Condition()
        self._due, self._keepers, self._renewing = [], set(), set()
        self._thread, self._pool = None, None

    def add(self, keeper: LeaseKeeper | AttemptWatch, every: float) -> None:
        with self._changed:
            self._keepers.add(keeper)
            self._push(keeper, every)
            if self._pool is None:
                self._pool = _DaemonPool(RENEWAL_THREADS, "relaygraph-renewal")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="relaygraph-leases", daemon=True
                )
                self._thread.start()
            self._changed.notify()

    def remove(self, keeper: LeaseKeeper | AttemptWatch) -> None:
        with self._changed:
            self._keepers.discard(keeper)
            self._due = [entry for entry in self._due if entry[2] is not keeper]
            heapq.heapify(self._due)
            # A renewal of this keeper under way finishes before close returns, unless close
            # is called on a thread of the renewals (a callback: a lost lease's, a
            # cancel's): waiting there could wait for itself, or hold up every other lease;
            # or unless the lease is lost (its renewal may be the one that hangs): a
            # renewal that ends later changes nothing once the run's end has given the
            # lease up, as it matches only this runner's hold.
            while keeper in self._renewing and not keeper.lost.is_set() and not _on_lease_thread():
                self._changed.wait()
            self._changed.notify()

    def _push(
        self, keeper: LeaseKeeper | AttemptWatch, every: float, *, after: float | None = None
    ) -> None:
        """Make ``keeper`` due ``every`` seconds after ``after`` (now by default), or now if
        that has passed."""
        when = max(time.monotonic(), (time.monotonic() if after is None else after) + every)
        heapq.heappush(self._due, (when, next(self._order), keeper, every))

    def _loop(self) -> None:
        while True:
            with self._changed:
                while True:
                    if not self._due and not self._renewing:
                        self._thread = None
                        return
                    now = time.monotonic()
                    watched = [
                        k for k in self._keepers if not (k.lost.is_set() or k._done.is_set())
                    ]
                    lapsing = [k for k in watched if now >= k.confirmed_until]
                    if lapsing or (self._due and self._due[0][0] <= now):
                        break
                    wake = [k.confirmed_until for k in watched if k.confirmed_until < math.inf]
                    if self._due:
                        wake.append(self._due[0][0])
                    self._changed.wait(max(0.0, min(wake) - now) if wake else None)
                due: list[tuple[LeaseKeeper | AttemptWatch, float]] = []
                while self._due and self._due[0][0] <= now:
                    # A keeper is either due (once) or being renewed, never both.
                    _, _, keeper, every = heapq.heappop(self._due)
                    self._renewing.add(keeper)
                    due.append((keeper, every))
                pool = self._pool
            assert pool is not None
            for keeper, every in due:
                pool.submit(self._renew, keeper, every)
            # On this thread, not the pool's: every renewal thread may be hung, which is
            # when a lapse must still be told. The callbacks only ask a run to stop.
            for keeper in lapsing:
                keeper._lapsing(now)

    def _renew(self, keeper: LeaseKeeper | AttemptWatch, every: float) -> None:
        began = time.monotonic()
        again = False
        try:
            again = keeper._renew()
        except Exception:  # One keeper's failure must not stop every lease's renewals.
            log.exception("renewing the lease on task %s failed", keeper._task_id)
            again = not keeper._done.is_set()
        finally:
            with self._changed:
                self._renewing.discard(keeper)
                if again and not keeper._done.is_set() and keeper in self._keepers:
                    # Counted from when this renewal began, not when it came back: a slow
                    # failed renewal (a connect timeout) must not use up the next one's time.
                    self._push(keeper, every, after=began)
                self._changed.notify_all()


def _on_lease_thread() -> bool:
    """Whether this thread is the scheduler's or a renewal's."""
    return threading.current_thread().name.startswith(("relaygraph-leases", "relaygraph-renewal"))


class _DaemonPool:
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
    """Watches a worker's attempt at a task from the ledger: the worker mode's counterpart
    of :class:`LeaseKeeper` (nothing to renew: the broker says when a worker is gone),
    looked after by the same scheduling thread.

    It reads the task's attempt and cancel flag at each step boundary of the run
    (:meth:`check`, which the runner calls before each checkpoint is written) and, for a step
    that takes long, every ``poll_seconds`` on the process's renewal threads. Once the task
    is on another attempt (the broker gave it to another worker while this one was frozen,
    or a write of this attempt was refused), ``lost`` is set and the run must stop at once:
    its writes are refused anyway (the fencing number). Once a cancel waits on the task,
    ``cancel`` is set and the ``when_cancelled`` callbacks run: the run stops at that step boundary,
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
        self._task_id = task_id
        self.confirmed_until = math.inf
        """Nothing lapses: the broker, not a lease, says when a worker is gone."""
        _RENEWALS.add(self, poll_seconds)

    def _renew(self) -> bool:
        """Read the attempt once (the scheduler's round); False: watch no more."""
        if self._done.is_set():
            return False
        try:
            if not self.check():
                return False
        except Exception:  # A database hiccup: the next round may work.
            log.warning("could not read task %s's attempt", self.task_id, exc_info=True)
        return not self._done.is_set()

    def _lapsing(self, now: float) -> bool:
        return False

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
        _RENEWALS.remove(self)
