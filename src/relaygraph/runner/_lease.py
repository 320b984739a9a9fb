"""A runner's hold on the task it runs: a lease taken at the start and renewed while it runs
(in process), or a worker's attempt watched from the ledger (the worker mode)."""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Protocol

from relaygraph.runner._daemon import DueScheduler

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
EARLY_SHARE = 1 / 4
"""A hold due within this share of its period after the first one due is looked after in the
same round, so that the holds of a process fall into a few rounds a period, each one
statement for all of its holds (``Ledger.renew_leases``, ``Ledger.attempt_states``)."""

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


class _WatchedHold(ABC):
    """What :class:`LeaseKeeper` and :class:`AttemptWatch` share: the ``lost`` event, the
    caller's ``cancel`` and the callbacks of both, and a place in the process's scheduler
    (:class:`_Renewals`), which looks after the hold every ``every`` seconds
    (:meth:`_renew_all`, with the other holds of the same :meth:`_round_key` due about then)
    and calls :meth:`_lapsing` when ``confirmed_until`` has passed.

    Args:
        ledger: The ledger the hold is read from.
        task_id: The task held.
        every: Seconds between two of the scheduler's rounds for this hold.
        cancel: Set when the ledger asks for the run to be cancelled; None: not watched.
    """

    confirmed_until: float
    """When, on this process's monotonic clock, the hold stops being sure (a lease that was
    not renewed in time); ``math.inf`` for a hold that does not lapse."""

    def __init__(
        self, ledger: Any, task_id: str, *, every: float, cancel: threading.Event | None
    ) -> None:
        self.lost = threading.Event()
        self.task_id = task_id
        self._ledger = ledger
        self._cancel = cancel
        self._done = threading.Event()
        self._gone = False
        """The ledger said the hold is no more (the lease another's, the attempt superseded):
        no more rounds. A lease that only went unconfirmed is still renewed."""
        self._on_lost: list[Callable[[], None]] = []
        self._on_cancel: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        _RENEWALS.add(self, every)

    @abstractmethod
    def _round_key(self) -> tuple[Any, ...]:
        """Holds with the same key are looked after in one round: one statement for all."""

    @classmethod
    @abstractmethod
    def _renew_all(cls, holds: list[Any], *, alone: bool) -> list[Any]:
        """The scheduler's round for ``holds`` (of this class and one :meth:`_round_key`,
        none closed when the round began); ``alone``: one hold, passed over in a round
        before. Each is looked after again a period later, unless it is closed or gone by
        then. Returns the holds the round passed over (a row locked elsewhere), each to be
        looked after at once in a round of its own, which may wait. An error is logged and
        the holds wait for their next round."""

    def _lapsing(self, now: float) -> bool:
        """Whether the hold went unconfirmed for too long, which loses it. Called by the
        scheduling thread once ``now`` is past ``confirmed_until``."""
        return False

    def _lose(self) -> bool:
        """Set ``lost`` and call the ``when_lost`` callbacks, once; False if it was lost
        already."""
        with self._lock:
            if self.lost.is_set():
                return False
            self.lost.set()
            callbacks = list(self._on_lost)
        _call_each(callbacks, "hold lost")
        return True

    def cancelled(self) -> None:
        """The ledger asks for the run to be cancelled: ``cancel`` is set and the
        ``when_cancelled`` callbacks run, once."""
        with self._lock:
            if self._cancel is None or self._cancel.is_set():
                return
            self._cancel.set()
            callbacks = list(self._on_cancel)
        _call_each(callbacks, "cancel")

    def when_cancelled(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the ledger asks for the run to be cancelled (at once, if
        ``cancel`` is set already)."""
        with self._lock:
            if self._cancel is None or not self._cancel.is_set():
                self._on_cancel.append(callback)
                return
        callback()

    def when_lost(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the hold is lost (at once, if it already was)."""
        with self._lock:
            if not self.lost.is_set():
                self._on_lost.append(callback)
                return
        callback()

    def close(self) -> None:
        """Stop looking after the hold. A round under way may still finish; none starts
        after this returns."""
        self._done.set()
        _RENEWALS.remove(self)


class LeaseKeeper(_WatchedHold):
    """Renews ``runner_id``'s lease on a task every third of its length.

    A runner that dies stops renewing, and after ``seconds`` another may take the task
    over (``Ledger.take_lease``). Should this runner find its lease gone (it could not
    renew in time, and another took the task), ``lost`` is set: the run must stop. Should
    a cancel wait on the task (asked for on another server, ``Ledger.request_cancel``),
    ``cancel`` is set: the run stops at its next step boundary, ``cancelled``.

    Every keeper of the process is scheduled from one thread (:class:`_Renewals`), not one
    thread each: a thread per run cost each run a thread's start and end on its own path.
    The keepers due about the same time are renewed in one statement (a round, see
    :data:`EARLY_SHARE`), and the rounds run on a few threads of a pool, so one that hangs
    (a row lock, a connection that stopped answering) holds up no other round.

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
        self._runner_id = runner_id
        self._seconds = seconds
        self.confirmed_until = time.monotonic() + seconds * CONFIRMED_SHARE
        """When, on this process's monotonic clock, the lease stops being sure (see the
        class): moved on by each renewal that works. The lease was taken just before the
        keeper was made, so the first is counted from now."""
        super().__init__(ledger, task_id, every=seconds / 3, cancel=cancel)

    def _round_key(self) -> tuple[Any, ...]:
        return (LeaseKeeper, id(self._ledger), self._runner_id, self._seconds)

    @classmethod
    def _renew_all(cls, holds: list[Any], *, alone: bool) -> list[Any]:
        """Renew the leases in one statement, which also reads whether a cancel waits on
        each task; a lease whose row is locked elsewhere is passed over, and renewed alone
        (waiting for the lock)."""
        first: LeaseKeeper = holds[0]
        began = time.monotonic()
        try:
            held = first._ledger.renew_leases(
                [keeper.task_id for keeper in holds],
                first._runner_id,
                seconds=first._seconds,
                wait=alone,
            )
        except Exception:  # A database hiccup: the next round may work.
            log.warning("could not renew the leases of %d task(s)", len(holds), exc_info=True)
            return []
        passed = []
        for keeper in holds:
            if keeper.task_id in held and held[keeper.task_id] is None:
                passed.append(keeper)
            else:
                keeper._renewed(began, held.get(keeper.task_id))
        return passed

    def _renewed(self, began: float, cancel: bool | None) -> None:
        """A renewal that began at ``began`` came back: ``cancel`` says whether a cancel
        waits on the task; None: the lease is no longer this runner's."""
        if cancel is None:
            log.warning("task %s: another runner took it over; stopping", self.task_id)
            self._gone = True
            self._lose()
            return
        # Counted from when the renewal began: the ledger's new end is at least that late
        # (its clock is read in the renewal).
        with self._lock:
            self.confirmed_until = max(
                self.confirmed_until, began + self._seconds * CONFIRMED_SHARE
            )
        if cancel:
            self.cancelled()

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
                self.task_id,
                self._seconds * CONFIRMED_SHARE,
            )
            self._lose()
        return late


class _Renewals(DueScheduler):
    """The process's lease keepers, each renewed every ``every`` seconds.

    One thread schedules them and ends while there is none (it is started again with the
    next). The keepers due within :data:`EARLY_SHARE` of their period of the first one due
    are looked after in one round, a statement for each :meth:`_WatchedHold._round_key`
    (a process with hundreds of tasks in flight makes a few statements a period, not one or
    two per task); the rounds run on a pool of :data:`RENEWAL_THREADS`, so one that hangs
    holds up no other round. The scheduling thread never waits on the ledger: it also tells each
    keeper whose lease went unconfirmed too long (:meth:`LeaseKeeper._lapsing`), even while
    that keeper's renewal hangs. A keeper whose renewal is still under way when it is due
    again is not renewed twice at once; it is due again one period later.

    Both the renewals due and the leases' confirmed ends are heaps, so that each round
    costs the scheduler the keepers it acts on, not every keeper of the process: a server
    holding hundreds of tasks in flight has a renewal due many times a second. A closed
    keeper's entries are left in the heaps and dropped when they come up.
    """

    def __init__(self) -> None:
        super().__init__(
            pool_size=RENEWAL_THREADS,
            pool_name="relaygraph-renewal",
            thread_name="relaygraph-leases",
        )
        self._due: list[tuple[float, int, Any, float]] = []
        """A heap: (when, order, keeper, every)."""
        self._scheduled: set[Any] = set()
        """The keepers with an entry in ``_due`` (one each at most)."""
        self._confirmed: list[tuple[float, int, Any]] = []
        """A heap: (a keeper's ``confirmed_until`` when pushed, order, keeper); an entry
        that comes up after its keeper was renewed is pushed again at the new end."""
        self._order = itertools.count()
        self._keepers: set[Any] = set()
        """Every keeper not closed: the ones whose lease the scheduler watches."""
        self._renewing: set[Any] = set()

    def forget(self) -> None:
        super().forget()
        self._due, self._confirmed = [], []
        self._scheduled, self._keepers, self._renewing = set(), set(), set()

    def add(self, keeper: _WatchedHold, every: float) -> None:
        with self._changed:
            self._keepers.add(keeper)
            self._push(keeper, every)
            self._watch_confirmed(keeper)
            self._start()

    def remove(self, keeper: _WatchedHold) -> None:
        with self._changed:
            self._keepers.discard(keeper)
            self._scheduled.discard(keeper)
            # A renewal of this keeper under way finishes before close returns, unless close
            # is called on a thread of the renewals (a callback: a lost lease's, a
            # cancel's): waiting there could wait for itself, or hold up every other lease;
            # or unless the lease is lost (its renewal may be the one that hangs): a
            # renewal that ends later changes nothing once the run's end has given the
            # lease up, as it matches only this runner's hold.
            while keeper in self._renewing and not keeper.lost.is_set() and not _on_lease_thread():
                self._changed.wait()
            self._changed.notify()

    def _push(self, keeper: _WatchedHold, every: float, *, after: float | None = None) -> None:
        """Make ``keeper`` due ``every`` seconds after ``after`` (now by default), or now if
        that has passed."""
        when = max(time.monotonic(), (time.monotonic() if after is None else after) + every)
        heapq.heappush(self._due, (when, next(self._order), keeper, every))
        self._scheduled.add(keeper)

    def _watch_confirmed(self, keeper: _WatchedHold) -> None:
        """Watch for ``keeper``'s lease going unconfirmed too long, if it still may."""
        watched = keeper in self._keepers and not (keeper.lost.is_set() or keeper._done.is_set())
        if watched and keeper.confirmed_until < math.inf:
            entry = (keeper.confirmed_until, next(self._order), keeper)
            heapq.heappush(self._confirmed, entry)

    def _lapsing(self, now: float) -> list[_WatchedHold]:
        """The watched keepers whose lease went unconfirmed until ``now``; the others whose
        entries came up are watched again at their new confirmed ends."""
        lapsing: list[_WatchedHold] = []
        renewed: list[_WatchedHold] = []
        while self._confirmed and self._confirmed[0][0] <= now:
            _, _, keeper = heapq.heappop(self._confirmed)
            (lapsing if now >= keeper.confirmed_until else renewed).append(keeper)
        for keeper in renewed:
            self._watch_confirmed(keeper)
        return [
            k for k in lapsing if k in self._keepers and not (k.lost.is_set() or k._done.is_set())
        ]

    def _next_due(self) -> float | None:
        """When the first renewal still scheduled is due (None: none is), dropping the
        entries of closed keepers that come first."""
        while self._due and self._due[0][2] not in self._scheduled:
            heapq.heappop(self._due)
        return self._due[0][0] if self._due else None

    def _loop(self) -> None:
        while True:
            with self._changed:
                while True:
                    if not self._scheduled and not self._renewing:
                        self._thread = None
                        self._due, self._confirmed = [], []
                        return
                    now = time.monotonic()
                    lapsing = self._lapsing(now)
                    next_due = self._next_due()
                    if lapsing or (next_due is not None and next_due <= now):
                        break
                    wake = [] if next_due is None else [next_due]
                    if self._confirmed:
                        wake.append(self._confirmed[0][0])
                    self._changed.wait(max(0.0, min(wake) - now) if wake else None)
                rounds: dict[tuple[Any, ...], list[tuple[_WatchedHold, float]]] = {}
                # The first due and those due soon after it (EARLY_SHARE), by round key.
                while self._due and self._due[0][0] <= now + self._due[0][3] * EARLY_SHARE:
                    # A keeper is either due (once) or being renewed, never both.
                    _, _, keeper, every = heapq.heappop(self._due)
                    if keeper not in self._scheduled:
                        continue  # Closed.
                    self._scheduled.discard(keeper)
                    self._renewing.add(keeper)
                    rounds.setdefault(keeper._round_key(), []).append((keeper, every))
                pool = self._pool
            assert pool is not None
            for due in rounds.values():
                pool.submit(self._renew, due)
            # On this thread, not the pool's: every renewal thread may be hung, which is
            # when a lapse must still be told. The callbacks only ask a run to stop.
            for keeper in lapsing:
                keeper._lapsing(now)
            if lapsing:
                with self._changed:
                    for keeper in lapsing:  # Renewed meanwhile: watched at its new end.
                        self._watch_confirmed(keeper)

    def _renew(self, due: list[tuple[_WatchedHold, float]], alone: bool = False) -> None:
        began = time.monotonic()
        holds = [keeper for keeper, _ in due if not keeper._done.is_set()]
        passed: list[_WatchedHold] = []
        try:
            if holds:
                passed = type(holds[0])._renew_all(holds, alone=alone)
        except Exception:  # One round's failure must not stop every lease's renewals.
            log.exception("renewing the leases of %d task(s) failed", len(holds))
        finally:
            with self._changed:
                for keeper, every in due:
                    if keeper in passed:
                        continue  # Still being renewed: in a round of its own, next.
                    self._renewing.discard(keeper)
                    again = not (keeper._done.is_set() or keeper._gone)
                    if again and keeper in self._keepers:
                        # Counted from when this round began, not when it came back: a slow
                        # failed renewal (a connect timeout) must not use up the next one's
                        # time.
                        self._push(keeper, every, after=began)
                self._changed.notify_all()
                pool = self._pool
            assert pool is not None
            for keeper, every in due:
                if keeper in passed:
                    pool.submit(self._renew, [(keeper, every)], True)


def _on_lease_thread() -> bool:
    """Whether this thread is the scheduler's or a renewal's."""
    return threading.current_thread().name.startswith(("relaygraph-leases", "relaygraph-renewal"))


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


class AttemptWatch(_WatchedHold):
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
        self.attempt = attempt
        self.current: int | None = attempt
        """The task's attempt when ``lost`` was set (None: the task is gone)."""
        self.confirmed_until = math.inf
        """Nothing lapses: the broker, not a lease, says when a worker is gone."""
        super().__init__(ledger, task_id, every=poll_seconds, cancel=cancel)

    def _round_key(self) -> tuple[Any, ...]:
        return (AttemptWatch, id(self._ledger))

    @classmethod
    def _renew_all(cls, holds: list[Any], *, alone: bool) -> list[Any]:
        """Read the attempts of the watched tasks in one statement (a read: no row lock
        holds it up)."""
        first: AttemptWatch = holds[0]
        try:
            states = first._ledger.attempt_states([watch.task_id for watch in holds])
        except Exception:  # A database hiccup: the next round may work.
            log.warning("could not read the attempts of %d task(s)", len(holds), exc_info=True)
            return []
        for watch in holds:
            watch._seen(states.get(watch.task_id))
        return []

    def check(self) -> bool:
        """Read the task's attempt and cancel flag now; False when the attempt is superseded
        (``lost`` is then set)."""
        return self._seen(self._ledger.attempt_state(self.task_id))

    def _seen(self, state: tuple[int, bool] | None) -> bool:
        """The task's attempt and cancel flag as read (None: the task is gone); False when
        the attempt is superseded (``lost`` is then set)."""
        if state is None or state[0] != self.attempt:
            self._gone = True
            self.supersede(None if state is None else state[0])
            return False
        if state[1]:
            self.cancelled()
        return True

    def supersede(self, current: int | None) -> None:
        """Mark the attempt superseded by ``current`` (a refused write says so first)."""
        with self._lock:
            if self.lost.is_set():
                return
            self.current = current
        if self._lose():
            log.warning(
                "task %s: attempt %s is superseded (now %s); stopping",
                self.task_id,
                self.attempt,
                current,
            )
