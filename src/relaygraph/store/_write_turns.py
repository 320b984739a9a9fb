"""Whose turn it is to write to a SQLite ledger: a request someone waits on before the runs.

SQLite has one writer at a time, and a process hands its one write connection to one
thread at a time. With hundreds of tasks in flight, the runs' event batches keep a queue of
threads waiting for it; a submission that joined the back of that queue would wait for all
of them. Writes made under :func:`background_writes` (the runs' event batches) therefore
wait behind the others, which are a person's (a submission, a cancel, a decision) or hold a
run's lease (a take, a renewal: a lease that lapses while its take or renewal waits lets the
task start twice) and go first; and so that a stream of requests cannot hold the events up
for good, one background write takes its turn after at most :data:`URGENT_TURNS_IN_A_ROW`
urgent ones while it waits.
"""

from __future__ import annotations

import collections
import contextvars
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.exc import TimeoutError as PoolTimeout

__all__ = ["URGENT_TURNS_IN_A_ROW", "WriteTurns", "background_writes"]

URGENT_TURNS_IN_A_ROW = 4
"""Urgent writes that may go before a waiting background write, one after another: the
background write goes next, then the urgent ones again."""

_BACKGROUND: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "relaygraph_background_writes", default=False
)


@contextmanager
def background_writes() -> Iterator[None]:
    """The ledger writes made in this block wait behind those that a request waits on.

    The mark is a context variable: it holds for this thread's writes, and for the threads
    and asyncio tasks started in the block with its context (``asyncio.to_thread``), not
    for other threads of a pool.
    """
    token = _BACKGROUND.set(True)
    try:
        yield
    finally:
        _BACKGROUND.reset(token)


class WriteTurns:
    """One writer at a time: the urgent writers in the order they came, then the background
    ones (those in :func:`background_writes`) in theirs, one background writer going after
    at most ``urgent_in_a_row`` urgent ones while it waits.

    Args:
        timeout: How long a writer waits for its turn before
            ``sqlalchemy.exc.TimeoutError``, as it waited for the connection pool.
        urgent_in_a_row: See :data:`URGENT_TURNS_IN_A_ROW`.
    """

    def __init__(self, *, timeout: float, urgent_in_a_row: int = URGENT_TURNS_IN_A_ROW) -> None:
        self._timeout = timeout
        self._urgent_in_a_row = urgent_in_a_row
        self._lock = threading.Lock()
        self._busy = False
        self._urgent: collections.deque[_Waiter] = collections.deque()
        self._background: collections.deque[_Waiter] = collections.deque()
        self._urgent_run = 0
        """Urgent turns given since the last background one."""

    @property
    def waiting(self) -> tuple[int, int]:
        """Writers waiting for their turn now: (urgent, background)."""
        with self._lock:
            return len(self._urgent), len(self._background)

    @contextmanager
    def turn(self) -> Iterator[None]:
        """Wait for this thread's turn to write (see the class), and hold it in the block."""
        self._acquire(background=_BACKGROUND.get())
        try:
            yield
        finally:
            self._release()

    def _acquire(self, *, background: bool) -> None:
        with self._lock:
            if not self._busy:
                self._busy = True
                return
            waiter = _Waiter()
            queue = self._background if background else self._urgent
            queue.append(waiter)
        if waiter.wait(self._timeout):
            return
        with self._lock:
            if waiter.given:  # Handed over as the wait ran out: the turn is ours.
                return
            queue.remove(waiter)
        raise PoolTimeout(
            f"no turn to write to the ledger within {self._timeout:g} s: another writer of "
            "this process held the ledger's write connection throughout"
        )

    def _release(self) -> None:
        with self._lock:
            waiter = self._next()
            if waiter is None:
                self._busy = False
                return
            waiter.give()  # The turn passes straight on: no writer can slip in between.

    def _next(self) -> _Waiter | None:
        """The writer whose turn is next (under ``_lock``), or None if none waits."""
        if self._background and (not self._urgent or self._urgent_run >= self._urgent_in_a_row):
            self._urgent_run = 0
            return self._background.popleft()
        if self._urgent:
            self._urgent_run += 1
            return self._urgent.popleft()
        return None


class _Waiter:
    """A writer waiting for its turn: a lock held until the turn is given to it."""

    __slots__ = ("_handed", "given")

    def __init__(self) -> None:
        self._handed = threading.Lock()
        self._handed.acquire()
        self.given = False

    def give(self) -> None:
        self.given = True
        self._handed.release()

    def wait(self, timeout: float) -> bool:
        return self._handed.acquire(timeout=timeout)
