"""Event notices between processes: "task X has events up to seq N", on PostgreSQL LISTEN/NOTIFY.

In the worker mode a task's events are written by a worker and streamed (SSE) by whichever
API server a client asked. A notice only wakes the streams of that task; they read the
events from the ledger, which stays the source of truth: a notice that is lost (a listener
reconnecting) costs a stream some latency, never an event, and a reconnect with
``Last-Event-ID`` replays from the ledger as before.

PostgreSQL rather than Redis pub/sub: the worker mode needs PostgreSQL already (Redis would
be one more service to run); a ``NOTIFY`` sent in the transaction that writes the events is
delivered when it commits and never if it rolls back, so a woken stream always finds the
rows; and a listener whose connection drops gets an error it can act on (it tells its
subscribers to read the ledger), where redis-py reconnects silently and the notices
published meanwhile are gone without a sign.

One :class:`EventListener` per process holds one connection (``LISTEN``) and hands each
notice to the subscribers of its task: callbacks (:meth:`EventListener.subscribe`) or
async watches (:meth:`EventListener.watch`) for event streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

from relaygraph.store import DEFAULT_CHANNEL, EventNotice

__all__ = [
    "DEFAULT_CHANNEL",
    "EventListener",
    "EventNotice",
    "TaskWatch",
    "libpq_url",
    "notify",
]

log = logging.getLogger(__name__)


def notify(
    connection: psycopg.Connection[Any], notice: EventNotice, *, channel: str = DEFAULT_CHANNEL
) -> None:
    """Send ``notice`` to every listener on ``channel``.

    Inside a transaction the notice leaves when it commits, and never if it rolls back: send
    it in the transaction that writes the events it announces.
    """
    connection.execute("SELECT pg_notify(%s, %s)", (channel, notice.payload()))


def libpq_url(database_url: str) -> str:
    """The libpq form of a SQLAlchemy PostgreSQL URL (``postgresql+psycopg://`` ->
    ``postgresql://``), query options kept, for a connection of psycopg's own."""
    url = make_url(database_url)
    if url.get_backend_name() != "postgresql":
        raise ValueError(f"event notices need PostgreSQL, not {url.get_backend_name()}")
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


Callback = Callable[[EventNotice], None]


class EventListener:
    """One ``LISTEN`` connection for a process, fanning notices out to its subscribers.

    A thread holds the connection. When the connection drops it reconnects (waiting
    ``retry_seconds``, doubled up to ``max_retry_seconds`` while it fails) and then gives
    every subscriber a notice with ``seq=None``: what was sent meanwhile is lost.

    Args:
        conninfo: A libpq connection string or URL (:func:`libpq_url` makes one from the
            ledger's URL).
        channel: The channel to listen on.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        channel: str = DEFAULT_CHANNEL,
        retry_seconds: float = 0.2,
        max_retry_seconds: float = 5.0,
    ) -> None:
        self.channel = channel
        self._conninfo = conninfo
        self._retry = (retry_seconds, max_retry_seconds)
        self._subscribers: dict[str, list[Callback]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listening = threading.Event()
        self._last_error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._listen, name=f"relaygraph-listen-{channel}", daemon=True
        )

    def start(self, *, timeout: float = 10.0) -> EventListener:
        """Start listening; returns once notices sent from now on will arrive.

        Raises:
            ConnectionError: No ``LISTEN`` within ``timeout`` seconds (the listener keeps
                trying until :meth:`close`).
        """
        self._thread.start()
        if not self._listening.wait(timeout):
            raise ConnectionError(
                f"could not LISTEN on {self.channel!r} within {timeout} s: {self._last_error}"
            )
        return self

    @property
    def listening(self) -> bool:
        """Whether the connection is up (notices sent now arrive)."""
        return self._listening.is_set()

    def close(self) -> None:
        """Stop listening and close the connection (within half a second)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def __enter__(self) -> EventListener:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def subscribe(self, task_id: str, callback: Callback) -> Callable[[], None]:
        """Call ``callback`` with each notice of ``task_id``, on the listener's thread (it
        must return quickly). Returns the function that ends the subscription."""
        with self._lock:
            self._subscribers.setdefault(task_id, []).append(callback)

        def unsubscribe() -> None:
            with self._lock:
                callbacks = self._subscribers.get(task_id, [])
                if callback in callbacks:
                    callbacks.remove(callback)
                if not callbacks:
                    self._subscribers.pop(task_id, None)

        return unsubscribe

    def watch(self, task_id: str) -> TaskWatch:
        """The notices of ``task_id`` for one async reader, from the moment it is entered:
        ``async with listener.watch(task_id) as watch: ...``."""
        return TaskWatch(self, task_id)

    def _listen(self) -> None:
        delay, max_delay = self._retry
        connected_before = False
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True) as connection:
                    connection.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    self._listening.set()
                    if connected_before:
                        self._deliver_to_all_lost()
                    connected_before, delay = True, self._retry[0]
                    while not self._stop.is_set():
                        for message in connection.notifies(timeout=0.5):
                            notice = EventNotice.from_payload(message.payload)
                            if notice is not None:
                                self._deliver(notice)
            except psycopg.Error as exc:
                self._listening.clear()
                self._last_error = exc
                log.warning(
                    "event notices on %r: connection lost (%s); reconnecting in %.1f s",
                    self.channel,
                    str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
                    delay,
                )
                self._stop.wait(delay)
                delay = min(delay * 2, max_delay)
        self._listening.clear()

    def _deliver(self, notice: EventNotice) -> None:
        with self._lock:
            callbacks = list(self._subscribers.get(notice.task_id, ()))
        for callback in callbacks:
            _call(callback, notice)

    def _deliver_to_all_lost(self) -> None:
        with self._lock:
            everyone = [(task_id, list(each)) for task_id, each in self._subscribers.items()]
        for task_id, callbacks in everyone:
            for callback in callbacks:
                _call(callback, EventNotice(task_id=task_id, seq=None))


def _call(callback: Callback, notice: EventNotice) -> None:
    # A subscriber's bug must not stop the notices of every other subscriber.
    try:
        callback(notice)
    except Exception:
        log.exception("event notice subscriber failed on %s", notice)


class TaskWatch:
    """One task's notices for one async reader (an event stream), coalesced.

    It remembers the highest sequence number announced since it was entered, so a notice
    that arrives while the reader is busy reading the ledger is not missed::

        async with listener.watch(task_id) as watch:
            while True:
                ...  # read the ledger's events after seq, send them
                await watch.wait(after=seq, timeout=15.0)

    Iterating (``async for notice in watch``) gives a notice each time the task's events
    go beyond what was last given, or notices may have been lost (``seq=None``).
    """

    def __init__(self, listener: EventListener, task_id: str) -> None:
        self.task_id = task_id
        self._listener = listener
        self._latest = -1
        self._given = -1
        self._lost = False
        self._changed: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._unsubscribe: Callable[[], None] | None = None

    async def __aenter__(self) -> TaskWatch:
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        self._unsubscribe = self._listener.subscribe(self.task_id, self._from_thread)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()

    def _from_thread(self, notice: EventNotice) -> None:
        assert self._loop is not None
        # RuntimeError: the reader's loop has closed; it no longer wants notices.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._note, notice)

    def _note(self, notice: EventNotice) -> None:
        assert self._changed is not None
        if notice.seq is None:
            self._lost = True
        else:
            self._latest = max(self._latest, notice.seq)
        self._changed.set()

    async def wait(self, *, after: int, timeout: float) -> bool:
        """Wait until a notice says the task has events beyond ``after``, or that notices
        may have been lost; False after ``timeout`` seconds without either.

        Read the ledger whatever it returns: the timeout is the reader's safety net.
        """
        assert self._changed is not None, "enter the watch first: async with ... as watch"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if self._lost or self._latest > after:
                self._lost = False
                return True
            self._changed.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                return False

    def __aiter__(self) -> AsyncIterator[EventNotice]:
        return self

    async def __anext__(self) -> EventNotice:
        assert self._changed is not None, "enter the watch first: async with ... as watch"
        while True:
            if self._lost:
                self._lost = False
                return EventNotice(task_id=self.task_id, seq=None)
            if self._latest > self._given:
                self._given = self._latest
                return EventNotice(task_id=self.task_id, seq=self._latest)
            self._changed.clear()
            await self._changed.wait()
