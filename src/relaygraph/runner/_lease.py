"""A runner's hold on the task it runs: a lease taken at the start and renewed while it runs
(in process), or a worker's attempt watched from the ledger (the worker mode)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["DEFAULT_LEASE_SECONDS", "AttemptWatch", "LeaseKeeper"]

DEFAULT_LEASE_SECONDS = 30.0
"""How long a lease lasts unrenewed: how long a crashed runner's task waits for another."""

log = logging.getLogger(__name__)


class LeaseKeeper:
    """Renews ``runner_id``'s lease on a task every third of its length, on a thread.

    A runner that dies stops renewing, and after ``seconds`` another may take the task
    over (``Ledger.take_lease``). Should this runner find its lease gone (it could not
    renew in time, and another took the task), ``lost`` is set: the run must stop. Should
    a cancel wait on the task (asked for on another server, ``Ledger.request_cancel``),
    ``cancel`` is set: the run stops at its next step boundary, ``cancelled``.
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
        self._thread = threading.Thread(
            target=self._renew, name=f"relaygraph-lease-{task_id[:8]}", daemon=True
        )
        self._thread.start()

    def _renew(self) -> None:
        while not self._done.wait(self._seconds / 3):
            try:
                held = self._ledger.renew_lease(
                    self._task_id, self._runner_id, seconds=self._seconds
                )
            except Exception:  # A database hiccup: the next renewal may work.
                log.warning("could not renew the lease on task %s", self._task_id, exc_info=True)
                continue
            if not held:
                log.warning("task %s: another runner took it over; stopping", self._task_id)
                with self._lock:
                    self.lost.set()
                    callbacks = list(self._on_lost)
                for callback in callbacks:
                    callback()
                return
            if self._cancel is not None and not self._cancel.is_set():
                try:
                    if self._ledger.cancel_requested(self._task_id):
                        self._cancelled()
                except Exception:  # As for the renewal: the next round may work.
                    log.warning("could not read task %s's cancel", self._task_id, exc_info=True)

    def _cancelled(self) -> None:
        with self._lock:
            if self._cancel is None or self._cancel.is_set():
                return
            self._cancel.set()
            callbacks = list(self._on_cancel)
        for callback in callbacks:
            callback()

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
        """Stop renewing (the caller releases the lease)."""
        self._done.set()
        self._thread.join()


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
        for callback in callbacks:
            callback()

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
