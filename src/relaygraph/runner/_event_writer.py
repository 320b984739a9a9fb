"""A running task's events, written to the ledger behind the graph, in order, in batches."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from relaygraph.events import Event

__all__ = ["EventWriter"]

_STOP = object()


class _Finish(threading.Event):
    """Queued by :meth:`EventWriter.finish`: the run's end goes with the batch it ends."""

    def __init__(self, end: Any) -> None:
        super().__init__()
        self.end = end


class EventWriter:
    """Writes one task's events to the ledger on a thread of its own.

    The graph's thread only queues an event; the writer takes it and whatever queues up
    behind it within ``linger_seconds`` (50 ms: a quarter of the API's event-stream poll)
    and writes them in one transaction (``Ledger.append_events``), then hands each event
    to ``on_written``, in order. Written inline, one transaction per event, the ledger cost
    a run about 1.1 ms per event on the thread that drives the graph; in batches, about
    0.4 ms (benchmarks/RESULTS.md).

    While it lingers the writer sleeps: the events that queue up meanwhile do not wake it
    (only :meth:`flush` and :meth:`close` do), so a batch costs the graph's threads two
    hand-overs of the interpreter's lock, not one per event. Woken per event, the writer
    took about 6 ms of CPU per relay-3 task (17 events) on 2 cores.

    Events that the ledger does not keep (``token``) pass through the same queue, so
    ``on_written`` receives every event in the order the run emitted it.

    A failure to write is raised from every later :meth:`put`, :meth:`flush` and
    :meth:`close`; the events after it are not written and not handed on, and ``on_error``
    hears of it at once (a worker's run that finds its attempt superseded stops then).

    With ``attempt`` (a worker's run), every write carries it: the ledger refuses the
    writes of an attempt that is no longer the task's latest.
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
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._hurry = threading.Event()
        """Set by :meth:`flush` and :meth:`close`: the writer stops lingering."""
        self._error: BaseException | None = None
        self._queued = 0
        """Events queued so far (``put``)."""
        self._counting = threading.Lock()
        self._handed = 0
        """Events written and handed on so far (the writer's thread alone counts them)."""
        self._thread = threading.Thread(
            target=self._loop, name=f"relaygraph-events-{task_id[:8]}", daemon=True
        )
        self._thread.start()

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
        with self._counting:  # Nodes that run at once (parallel tools) queue at once.
            self._queue.put(event)
            self._queued += 1

    def when_failed(self, callback: Callable[[BaseException], None]) -> None:
        """Call ``callback`` with the error when a write fails (at once if one has): a run
        whose nodes only :meth:`queue` stops then, instead of going on to call models and
        tools whose events can no longer be stored."""
        self._failed.append(callback)
        if self._error is not None:
            callback(self._error)

    def flush(self) -> None:
        """Wait until every event queued so far is written and handed on.

        At once when they are: a worker's run flushes before each checkpoint, and a step
        that emitted no event would otherwise wait for the writer's thread to wake and
        answer (two hand-overs of the processor on a loaded machine)."""
        self._raise_error()
        if self._handed == self._queued:
            return
        done = threading.Event()
        self._queue.put(done)
        self._hurry.set()
        done.wait()
        self._raise_error()

    def finish(self, end: Any) -> None:
        """Write what is queued and the run's end (``store.RunEnd``) in the same
        transaction (``Ledger.append_events(end=...)``), then wait until it is written
        and every event handed on. Written apart, a run's last batch and its end were two
        transactions one after the other while the run waited."""
        marker = _Finish(end)
        self._queue.put(marker)
        self._hurry.set()
        marker.wait()
        self._raise_error()

    def close(self) -> None:
        """Write what is queued, then stop the writer's thread."""
        self._queue.put(_STOP)
        self._hurry.set()
        self._thread.join()
        self._raise_error()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _take_queued(self) -> list[Any]:
        """Everything queued now. The hurry is cleared only where the queue is then seen
        empty: a flush queues its marker before it hurries the writer, so no marker is
        ever left in the queue with the hurry cleared (to wait out a whole linger). At
        worst a hurry outlives its marker and the next batch lingers less."""
        taken: list[Any] = []
        while True:
            self._hurry.clear()
            before = len(taken)
            while True:
                try:
                    taken.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if len(taken) == before:
                return taken

    def _loop(self) -> None:
        failed = False
        while True:
            batch = [self._queue.get()]
            if not (batch[0] is _STOP or isinstance(batch[0], threading.Event)):
                # Linger a moment for the events right behind the first: a batch of many
                # costs the ledger little more than one. A flush or a close ends the wait
                # at once.
                self._hurry.wait(self._linger)
            batch += self._take_queued()
            events = [item for item in batch if isinstance(item, dict)]
            finish = next((item for item in batch if isinstance(item, _Finish)), None)
            if (events or finish is not None) and not failed:
                try:
                    stored = [e for e in events if e.get("type") not in self._unstored]
                    given = self._fence if finish is None else {**self._fence, "end": finish.end}
                    if stored or finish is not None:
                        self._ledger.append_events(self._task_id, stored, **given)
                    for event in events:
                        self._on_written(event)
                    self._handed += len(events)
                except BaseException as exc:  # Raised on the run's thread, not lost here.
                    self._error = exc
                    failed = True
                    for heard in self._failed:
                        heard(exc)
            for item in batch:
                if isinstance(item, threading.Event):
                    item.set()
            if any(item is _STOP for item in batch):
                return
