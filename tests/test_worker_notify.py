"""Event notices on PostgreSQL LISTEN/NOTIFY: "task X has events up to seq N" reaches every
subscriber of every listener (one per API server), only once its transaction commits, and a
listener whose connection drops tells its subscribers to read the ledger.

The cases on a real server use the ``postgres_server`` fixture (skipped where PostgreSQL is
not reachable, a failure with ``RELAYGRAPH_REQUIRE_POSTGRES=1``) and a channel of their own.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import psycopg
import pytest

from relaygraph.worker import EventListener, EventNotice, libpq_url, notify


def test_a_notice_is_a_task_id_and_a_sequence_number() -> None:
    notice = EventNotice(task_id="0b6f-task", seq=42)
    assert notice.payload() == "0b6f-task 42"
    assert EventNotice.from_payload(notice.payload()) == notice
    for foreign in ["", "0b6f-task", "0b6f-task x", "0b6f-task -1", " 3"]:
        assert EventNotice.from_payload(foreign) is None
    with pytest.raises(ValueError):
        EventNotice(task_id="t", seq=None).payload()


def test_libpq_url_keeps_the_options() -> None:
    url = "postgresql+psycopg://root:pw@127.0.0.1:5432/test?options=-csearch_path%3Drg_x"
    assert libpq_url(url) == "postgresql://root:pw@127.0.0.1:5432/test?options=-csearch_path%3Drg_x"
    with pytest.raises(ValueError, match="PostgreSQL"):
        libpq_url("sqlite:///ledger.sqlite")


@pytest.fixture
def conninfo(postgres_server: str) -> str:
    return libpq_url(postgres_server)


@pytest.fixture
def channel() -> str:
    return f"rg_test_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def listener(conninfo: str, channel: str) -> Iterator[EventListener]:
    with EventListener(conninfo, channel=channel) as listener:
        yield listener


def send(conninfo: str, channel: str, task_id: str, seq: int) -> None:
    with psycopg.connect(conninfo, autocommit=True) as connection:
        notify(connection, EventNotice(task_id=task_id, seq=seq), channel=channel)


class Received:
    """A callback subscriber that remembers what it got."""

    def __init__(self) -> None:
        self.notices: list[EventNotice] = []
        self._arrived = threading.Condition()

    def __call__(self, notice: EventNotice) -> None:
        with self._arrived:
            self.notices.append(notice)
            self._arrived.notify_all()

    def wait_for(self, count: int, timeout: float = 30.0) -> list[EventNotice]:
        """The notices once there are ``count``, or after ``timeout`` seconds: a generous
        bound, which a notice that arrives in time never waits out."""
        with self._arrived:
            self._arrived.wait_for(lambda: len(self.notices) >= count, timeout)
            return list(self.notices)


async def test_a_notice_reaches_every_subscriber_of_every_listener(
    conninfo: str, channel: str, listener: EventListener
) -> None:
    mine, others = Received(), Received()
    listener.subscribe("task-a", mine)
    listener.subscribe("task-b", others)
    # A second API server's listener, with an event stream watching the same task.
    with EventListener(conninfo, channel=channel) as second:
        async with listener.watch("task-a") as here, second.watch("task-a") as there:
            started = time.monotonic()
            await asyncio.to_thread(send, conninfo, channel, "task-a", 5)
            assert await here.wait(after=4, timeout=5)
            assert await there.wait(after=4, timeout=5)
            assert time.monotonic() - started < 5
    assert mine.wait_for(1) == [EventNotice(task_id="task-a", seq=5)]
    assert others.notices == []


def test_a_notice_leaves_when_its_transaction_commits_and_never_on_rollback(
    conninfo: str, channel: str, listener: EventListener
) -> None:
    received = Received()
    listener.subscribe("task-a", received)
    with psycopg.connect(conninfo) as writer:
        notify(writer, EventNotice(task_id="task-a", seq=1), channel=channel)
        writer.rollback()
        notify(writer, EventNotice(task_id="task-a", seq=2), channel=channel)
        assert received.wait_for(1, timeout=0.5) == []
        writer.commit()
    assert received.wait_for(1) == [EventNotice(task_id="task-a", seq=2)]
    time.sleep(0.3)
    assert received.notices == [EventNotice(task_id="task-a", seq=2)]


def test_an_unsubscribed_callback_gets_nothing_and_a_failing_one_spoils_nothing(
    conninfo: str, channel: str, listener: EventListener
) -> None:
    def broken(notice: EventNotice) -> None:
        raise RuntimeError("a subscriber's bug")

    gone, kept = Received(), Received()
    listener.subscribe("task-a", broken)
    unsubscribe = listener.subscribe("task-a", gone)
    listener.subscribe("task-a", kept)
    unsubscribe()
    send(conninfo, channel, "task-a", 1)
    assert kept.wait_for(1) == [EventNotice(task_id="task-a", seq=1)]
    assert gone.notices == []


async def test_a_watch_keeps_what_arrived_while_its_reader_was_busy(
    conninfo: str, channel: str, listener: EventListener
) -> None:
    async with listener.watch("task-a") as watch:
        # Subscribed after the watch: the listener calls its subscribers in order, so a
        # notice `arrived` has is on the watch's loop already, however late it came.
        arrived = Received()
        listener.subscribe("task-a", arrived)
        await asyncio.to_thread(send, conninfo, channel, "task-a", 3)
        # The reader is writing out events; the notice waits.
        assert len(await asyncio.to_thread(arrived.wait_for, 1)) == 1
        assert await watch.wait(after=2, timeout=0.01)
        # Events up to 3 read: nothing new, the wait times out.
        assert not await watch.wait(after=3, timeout=0.2)
        await asyncio.to_thread(send, conninfo, channel, "task-a", 4)
        await asyncio.to_thread(send, conninfo, channel, "task-a", 6)
        assert len(await asyncio.to_thread(arrived.wait_for, 3)) == 3
        # Coalesced: one notice for the highest sequence number.
        assert await asyncio.wait_for(anext(watch), 30) == EventNotice(task_id="task-a", seq=6)
        waiting = asyncio.ensure_future(anext(watch))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await asyncio.to_thread(send, conninfo, channel, "task-a", 7)
        assert await asyncio.wait_for(waiting, 30) == EventNotice(task_id="task-a", seq=7)


async def test_a_dropped_connection_tells_subscribers_to_read_the_ledger(
    conninfo: str, channel: str
) -> None:
    name = f"rg_listener_{uuid.uuid4().hex[:8]}"
    separator = "&" if "?" in conninfo else "?"
    tagged = f"{conninfo}{separator}application_name={quote(name)}"
    received = Received()
    with EventListener(tagged, channel=channel, retry_seconds=0.1) as listener:
        listener.subscribe("task-a", received)
        async with listener.watch("task-a") as watch:
            with psycopg.connect(conninfo, autocommit=True) as admin:
                ended = admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = %s",
                    (name,),
                ).fetchall()
            assert ended == [(True,)]
            # What was sent while it was away is lost: the subscribers are told so.
            assert received.wait_for(1) == [EventNotice(task_id="task-a", seq=None)]
            assert await asyncio.wait_for(anext(watch), 30) == EventNotice(
                task_id="task-a", seq=None
            )
            assert listener.listening
            await asyncio.to_thread(send, conninfo, channel, "task-a", 9)
            assert await watch.wait(after=8, timeout=5)
    assert received.wait_for(2)[1] == EventNotice(task_id="task-a", seq=9)
    assert not listener.listening


def test_a_listener_that_cannot_connect_says_why() -> None:
    listener = EventListener("postgresql://nobody@127.0.0.1:9/none", retry_seconds=0.05)
    try:
        with pytest.raises(ConnectionError, match="could not LISTEN on 'relaygraph_events'"):
            listener.start(timeout=0.5)
    finally:
        listener.close()
