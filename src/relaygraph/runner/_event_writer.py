"""A running task's events, written to the ledger behind the graph, in order, in batches.

The writers of every run of the process share a few threads (:class:`_Writes`), not one
thread each: a server holding hundreds of tasks in flight would otherwise hold as many
threads, each asleep between its run's events.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import heapq
import itertools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from relaygraph.events import Event
from relaygraph.runner._daemon import DueScheduler
from relaygraph.store import background_writes

__all__ = ["EventWriter"]

WRITE_THREADS = 8
"""Threads that write runs' batches at once, for every run of the process: one write that
hangs (a row lock) holds up no other run's."""


class _Marker:
    """Queued behind the events a caller waits for: set once they are written and handed
    on (a flush, the run's end with ``end``, or the writer's close)."""

    def __init__(
        self, end: Any = None, *, stop: bool = False, also: Callable[[Any], None] | None = None
    ) -> None:
        self.end = end
        self.stop = stop
        self.also = also
        """More of the transaction that writes the events before it (see
        :meth:`EventWriter.asave_with`)."""
        self._done = threading.Event()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._lock = threading.Lock()

    def set(self) -> None:
        with self._lock:
            self._done.set()
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            loop.call_soon_threadsafe(_resolve, future)

    def wait(self) -> None:
        self._done.wait()

    async def wait_async(self) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._done.is_set():
                return
            self._waiters.append((loop, future))
        await future


def _each(calls: list[Callable[[Any], None]], connection: Any) -> None:
    for call in calls:
        call(connection)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class EventWriter:
    """Writes one task's events to the ledger behind its run.

    The run only queues an event; the writer takes it and whatever queues up behind it
    within ``linger_seconds`` (a quarter of the API's event-stream poll) and writes them in
    one transaction (``Ledger.append_events``), then hands each event to ``on_written``, in
    order: a batch of many costs the ledger little more than one (benchmarks/RESULTS.md).
    A flush or a close ends the linger at once. The batches are written on the process's
    shared write threads (:class:`_Writes`), one batch of a writer at a time.

    Events that the ledger does not keep (``token``) pass through the same queue, so
    ``on_written`` receives every event in the order the run emitted it.

    A failure to write is raised from every later :meth:`put`, :meth:`flush` and
    :meth:`close`; the events after it are not written and not handed on, and ``on_error``
    hears of it at once (a worker's run that finds its attempt superseded stops then).

    With ``attempt`` (a worker's run), every write carries it: the ledger refuses the
    writes of an attempt that is no longer the task's latest.

    A run on an event loop waits with :meth:`aflush`, :meth:`afinish` and :meth:`aclose`,
    which hold no thread while the batch is written.
    """

    def __init__(
        self,
        ledger: Any,
        task_id: str,
        on_written: Callable[[dict[str, Any]], None],
        *,
        unstored: frozenset[str] = frozenset({"token"}),
        linger_seconds: float = 0.05,
        attempt: int | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._ledger = ledger
        self._task_id = task_id
        self._fence: dict[str, Any] = {} if attempt is None else {"attempt": attempt}
        self._failed: list[Callable[[BaseException], None]] = [on_error] if on_error else []
        """Who hears of a failed write at once: ``on_error`` and :meth:`when_failed`'s."""
        self._on_written = on_written
        self._unstored = unstored
        self._linger = linger_seconds
        self._lock = threading.Lock()
        self._queue: collections.deque[Any] = collections.deque()
        self._running = False
        """A batch of this writer is being written (on a write thread)."""
        self._due: float | None = None
        """When this writer's next batch is due (on the monotonic clock); None: none is."""
        self._hurry = False
        """Set by :meth:`flush` and :meth:`close`: the next batch does not linger."""
        self._error: BaseException | None = None
        self._queued = 0
        """Events queued so far (``put``)."""
        self._handed = 0
        """Events written and handed on so far (one batch at a time counts them)."""

    def put(self, event: Event) -> None:
        """Queue ``event`` to be written."""
        self._raise_error()
        self.queue(event)

    def queue(self, event: Event) -> None:
        """Queue ``event`` to be written, never raising: the sink a graph's nodes send to
        (``events.events_to``), where an error of the writer would look like the node's
        own (a model call's, to its fallback). A failed write is raised from the run's
        next :meth:`put`, :meth:`flush`, :meth:`finish` or :meth:`close`, and ``on_error``
        hears of it at once."""
        with self._lock:  # Nodes that run at once (parallel tools) queue at once.
            self._queue.append(event)
            self._queued += 1
            self._schedule(hurry=False)

    def when_failed(self, callback: Callable[[BaseException], None]) -> None:
        """Call ``callback`` with the error when a write fails (at once if one has): a run
        whose nodes only :meth:`queue` stops then, instead of going on to call models and
        tools whose events can no longer be stored."""
        self._failed.append(callback)
        if self._error is not None:
            callback(self._error)

    def flush(self) -> None:
        """Wait until every event queued so far is written and handed on (at once when
        they are)."""
        self._raise_error()
        if self._handed == self._queued:
            return
        self._mark(_Marker()).wait()
        self._raise_error()

    async def aflush(self) -> None:
        """:meth:`flush`, awaited."""
        self._raise_error()
        if self._handed == self._queued:
            return
        await self._mark(_Marker()).wait_async()
        self._raise_error()

    async def asave_with(self, also: Callable[[Any], None]) -> None:
        """Write every event queued so far, and ``also`` in the same transaction
        (``Ledger.append_events(also=...)``: called with the transaction's DBAPI connection,
        with no events too), then wait until it is committed and the events handed on. What
        ``also`` raises fails the writer, as a failed write does: the events with it were
        not written (``also`` keeps what should not fail the writer to itself)."""
        self._raise_error()
        await self._mark(_Marker(also=also)).wait_async()
        self._raise_error()

    def finish(self, end: Any) -> None:
        """Write what is queued and the run's end (``store.RunEnd``) in the same
        transaction (``Ledger.append_events(end=...)``), then wait until it is written
        and every event handed on."""
        self._mark(_Marker(end)).wait()
        self._raise_error()

    async def afinish(self, end: Any) -> None:
        """:meth:`finish`, awaited."""
        await self._mark(_Marker(end)).wait_async()
        self._raise_error()

    def close(self) -> None:
        """Write what is queued; the writer takes no more."""
        self._mark(_Marker(stop=True)).wait()
        self._raise_error()

    async def aclose(self) -> None:
        """:meth:`close`, awaited."""
        await self._mark(_Marker(stop=True)).wait_async()
        self._raise_error()

    def _mark(self, marker: _Marker) -> _Marker:
        with self._lock:
            self._queue.append(marker)
            self._schedule(hurry=True)
        return marker

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _schedule(self, *, hurry: bool) -> None:
        """Make the next batch due (under ``_lock``): now when hurried, else after the
        linger; a batch being written makes its successor due when it ends."""
        self._hurry = self._hurry or hurry
        if self._running:
            return
        when = time.monotonic() + (0.0 if self._hurry else self._linger)
        if self._due is not None and self._due <= when:
            return
        self._due = when
        _WRITES.due(self, when)

    def _fire(self, now: float) -> bool:
        """Whether the batch due at ``now`` is still to be written (the scheduler asks;
        a batch made due sooner since, or already written, is not)."""
        with self._lock:
            return not self._running and self._due is not None and self._due <= now

    def _write_batch(self) -> None:
        """Write what is queued (on a write thread), then make the next batch due."""
        with self._lock:
            if self._running or self._due is None:
                return
            self._running, self._due, self._hurry = True, None, False
            batch = list(self._queue)
            self._queue.clear()
        try:
            self._write(batch)
        finally:
            with self._lock:
                self._running = False
                if self._queue:
                    first = self._queue[0]
                    self._schedule(hurry=isinstance(first, _Marker))

    def _write(self, batch: list[Any]) -> None:
        events = [item for item in batch if isinstance(item, dict)]
        finish = next((i for i in batch if isinstance(i, _Marker) and i.end is not None), None)
        alsos = [i.also for i in batch if isinstance(i, _Marker) and i.also is not None]
        if (events or finish is not None or alsos) and self._error is None:
            try:
                stored = [e for e in events if e.get("type") not in self._unstored]
                given = self._fence if finish is None else {**self._fence, "end": finish.end}
                if alsos:
                    given = {**given, "also": functools.partial(_each, alsos)}
                if stored or finish is not None or alsos:
                    # Behind the writes a request waits on (a submission): a run's events
                    # wait for their turn in batches, which grow while they wait.
                    with background_writes():
                        self._ledger.append_events(self._task_id, stored, **given)
                for event in events:
                    self._on_written(event)
                self._handed += len(events)
            except BaseException as exc:  # Raised on the run's side, not lost here.
                self._error = exc
                for heard in self._failed:
                    heard(exc)
        for item in batch:
            if isinstance(item, _Marker):
                item.set()


class _Writes(DueScheduler):
    """The process's writers' due batches: one thread waits for the next one due and hands
    it to a pool of :data:`WRITE_THREADS`, and ends while none is due (it is started again
    with the next)."""

    def __init__(self) -> None:
        super().__init__(
            pool_size=WRITE_THREADS, pool_name="relaygraph-writes", thread_name="relaygraph-events"
        )
        self._due: list[tuple[float, int, EventWriter]] = []
        self._order = itertools.count()

    def forget(self) -> None:
        super().forget()
        self._due = []

    def due(self, writer: EventWriter, when: float) -> None:
        with self._changed:
            heapq.heappush(self._due, (when, next(self._order), writer))
            self._start()

    def _loop(self) -> None:
        while True:
            with self._changed:
                while True:
                    if not self._due:
                        self._thread = None
                        return
                    now = time.monotonic()
                    if self._due[0][0] <= now:
                        break
                    self._changed.wait(self._due[0][0] - now)
                ready: list[EventWriter] = []
                while self._due and self._due[0][0] <= now:
                    ready.append(heapq.heappop(self._due)[2])
                pool = self._pool
            assert pool is not None
            for writer in dict.fromkeys(ready):
                if writer._fire(now):
                    pool.submit(writer._write_batch)


_WRITES = _Writes()
os.register_at_fork(after_in_child=_WRITES.forget)
