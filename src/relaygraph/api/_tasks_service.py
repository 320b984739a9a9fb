"""What the API's task routes and the dashboard's task page both do: decide an approval and
follow a task's events. Each is written once here, so a page acts exactly as the ``/v1``
endpoint it stands for."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from anyio import to_thread
from fastapi import Request

from relaygraph.api._errors import ErrorAnswer
from relaygraph.api._schemas import DecisionIn
from relaygraph.errors import ConfigError
from relaygraph.runner import Decision, RequestRefused, decide_task
from relaygraph.store import FINISHED_STATUSES, Ledger, Task

if TYPE_CHECKING:
    from relaygraph.api._dispatch import TaskDispatch
    from relaygraph.team import Team
    from relaygraph.worker import EventListener, TaskWatch

__all__ = ["decide", "follow_events"]


def decide(
    *,
    ledger: Ledger,
    dispatch: TaskDispatch,
    task_team: Callable[[Task], Team],
    task: Task,
    approval_id: str,
    body: DecisionIn,
    decided_by: str,
) -> None:
    """Decide a pending approval of ``task`` and resume the task through ``dispatch``
    (:func:`~relaygraph.runner.decide_task`, the one decision path).

    An edit's arguments are checked against the tool in the task's team (the built-in tools
    when that team no longer builds); the task is taken with this server's lease before it
    resumes (in the worker mode: queued for the workers), so no other server starts it
    meanwhile.

    Args:
        ledger: The server's ledger.
        dispatch: Where the server hands its tasks on (its task loop, or the broker).
        task_team: The team a task records.
        task: The task, already checked to be the caller's project's.
        approval_id: The approval to decide.
        body: The decision.
        decided_by: Who decided, as the approval records it (the project's name).

    Raises:
        ErrorAnswer: 404 ``approval_not_found``; 409 ``not_waiting`` when the approval is decided
            or the task no longer waits; 422 ``invalid_request`` on ``args``; 503
            ``broker_unavailable`` (the worker mode: the decision is recorded, the task
            ``queued``, its message not sent).
    """

    def tools() -> Mapping[str, Any]:
        from relaygraph.agents.tools import BUILTIN_TOOLS

        try:
            return task_team(task).tools
        except ConfigError:  # Its team no longer builds: check against what is known.
            return BUILTIN_TOOLS

    try:
        decide_task(
            task,
            Decision(decision=body.decision, args=body.args, reason=body.reason),
            ledger=ledger,
            tools=tools,
            decided_by=decided_by,
            approval_id=approval_id,
            resume=dispatch.resume,
        )
    except RequestRefused as exc:
        raise ErrorAnswer.refused(exc) from None


async def follow_events(
    ledger: Callable[[], Ledger],
    task: Task,
    *,
    after: int,
    request: Request,
    poll_seconds: float,
    still_wanted: Callable[[], bool] = lambda: True,
    notices: EventListener | None = None,
    notice_timeout_seconds: float = 15.0,
) -> AsyncIterator[dict[str, Any]]:
    """The task's events after sequence number ``after``, as Server-Sent Events, while
    they are written.

    The ledger is read whenever the task may have new events: every ``poll_seconds``, or,
    with ``notices`` (the worker mode, where other processes write the events), when a
    notice says so. The notices only wake the stream; what it sends is always read from
    the ledger, so a lost notice costs latency, never an event, and ``Last-Event-ID``
    replays exactly what a client missed.

    It ends after a finished task's last event, when the client went away, or when
    ``still_wanted`` says no (it is asked whenever no events are new).

    Args:
        ledger: Returns the server's ledger.
        task: The task, already checked to be the caller's project's.
        after: The last sequence number the client has.
        request: The streaming request (to see the client go away).
        poll_seconds: How long to wait between reads without notices (none given, or the
            listener's connection is down).
        still_wanted: Asked when no events are new; False ends the stream.
        notices: The server's event listener (PostgreSQL ``NOTIFY``), in the worker mode.
        notice_timeout_seconds: The longest the stream waits for a notice before it reads
            the ledger anyway (a safety net, not the pace).
    """
    if notices is None:
        async for frame in _follow(
            ledger, task, after, request, still_wanted, _sleep(poll_seconds)
        ):
            yield frame
        return
    # Entered before the first read: a notice sent while the stream reads is not missed.
    async with notices.watch(task.id) as watch:
        wait = _notice(watch, notices, poll_seconds, notice_timeout_seconds)
        async for frame in _follow(ledger, task, after, request, still_wanted, wait):
            yield frame


Wait = Callable[[int, bool], Awaitable[None]]
"""Waits until the task may have events after the given sequence number; the flag says
that the last event sent was a finished run's ``run_finished`` (its status comes next)."""


async def _follow(
    ledger: Callable[[], Ledger],
    task: Task,
    after: int,
    request: Request,
    still_wanted: Callable[[], bool],
    wait: Wait,
) -> AsyncIterator[dict[str, Any]]:
    """:func:`follow_events`' loop: read, send, and ``wait`` when nothing is new."""
    seq, finished, ending = after, False, False
    while True:
        batch = await to_thread.run_sync(ledger().events_after, task.id, seq)
        for event in batch:
            seq = event.seq
            ending = event.type == "run_finished" and event.data.get("status") in FINISHED_STATUSES
            yield {
                "id": str(event.seq),
                "event": event.type,
                "data": json.dumps(event.data, ensure_ascii=False),
            }
        if batch:
            continue
        if finished:
            return
        now = await to_thread.run_sync(
            lambda: ledger().get_task(task.id, project_id=task.project_id)
        )
        if now is None or now.status in FINISHED_STATUSES:
            # Events written between the read above and the status read are read once more
            # before the stream closes: a finished task's last events are never lost.
            finished = True
            continue
        if await request.is_disconnected() or not still_wanted():
            return
        await wait(seq, ending)


def _sleep(seconds: float) -> Wait:
    async def wait(seq: int, ending: bool) -> None:
        await asyncio.sleep(seconds)

    return wait


LISTENER_CHECK_SECONDS = 1.0
"""How often a stream waiting for a notice looks whether the listener is still connected."""
ENDING_POLL_SECONDS = 0.1
"""Between reads of a task's status once its ``run_finished`` was sent: the runner records
the status in the transaction after that event's, and that one announces no new event."""


def _notice(watch: TaskWatch, listener: EventListener, poll: float, timeout: float) -> Wait:
    """Wait for a notice of events after ``seq`` (at most ``timeout``); while the listener's
    connection is down, wait ``poll`` instead, as a stream without notices does."""

    async def wait(seq: int, ending: bool) -> None:
        if ending:
            await asyncio.sleep(ENDING_POLL_SECONDS)
            return
        if not listener.listening:
            await asyncio.sleep(poll)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while listener.listening:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            if await watch.wait(after=seq, timeout=min(remaining, LISTENER_CHECK_SECONDS)):
                return

    return wait
