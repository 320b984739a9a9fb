"""Rows derived from a task's events: handoffs, tool calls, approvals and usage.

The rows are made from the records the events carry, as :mod:`relaygraph.events` defines
them: a handoff row from the event's :class:`~relaygraph.events.Handoff`
(:func:`~relaygraph.events.moved_work`), an agent's usage from the visit's
:class:`~relaygraph.events.Usage` record; nothing is computed again here.

Each function runs inside the transaction that appends the event, after the task row was
locked, so the derived rows of one task are written one event at a time, in order.

A resumed or recovered run re-emits some events (the agent that paused starts again and
repeats its ``tool_call``; a node re-run after a crash repeats its ``agent_finished``); the
derivations recognise those by their ids and do not count them twice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.orm import Session

from relaygraph._names import SUPERVISOR
from relaygraph.events import Handoff, moved_work
from relaygraph.store import _usage
from relaygraph.store._models import ApprovalRow, HandoffRow, ToolCallRow

__all__ = ["DERIVERS", "NAME_CHARS", "derive", "event_agent"]

NAME_CHARS = 64

Deriver = Callable[[Session, str, int, Mapping[str, Any], datetime], None]


def event_agent(event: Mapping[str, Any]) -> str | None:
    """The role an event is about: the router for routes, the sender for handoffs."""
    if event["type"] == "route":
        return SUPERVISOR
    for key in ("agent", "source", "role"):
        value = event.get(key)
        if isinstance(value, str) and value:
            return value[:NAME_CHARS]
    return None


def derive(
    session: Session, task_id: str, seq: int, event: Mapping[str, Any], now: datetime
) -> None:
    """Write the rows event number ``seq`` implies, if any."""
    deriver = DERIVERS.get(event["type"])
    if deriver is not None:
        deriver(session, task_id, seq, event, now)


def _text(event: Mapping[str, Any], key: str) -> str:
    value = event.get(key)
    return "" if value is None else str(value)


def _name(event: Mapping[str, Any], key: str) -> str:
    return _text(event, key)[:NAME_CHARS]


def _optional_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _object(value: object) -> dict[str, Any] | None:
    if value is None or isinstance(value, dict):
        return value
    return {"value": value}


def _transfer(
    session: Session, task_id: str, seq: int, event: Mapping[str, Any], now: datetime
) -> None:
    handoff = moved_work(event)
    if handoff is None:
        return  # Finishing, or a transfer a limit or a ping-pong stopped: no work moved.
    tokens = _optional_int(event.get("tokens_so_far"))
    _add_handoff(session, task_id, seq, handoff, tokens, now)


# The handoff and tool-call rows are read and written in SQLAlchemy Core, on the session's
# connection, with statements built once (ids and values, no ORM objects, no statement built
# per event): most of a run's events are a route, a tool call or its result, and this runs on
# the thread that shares the interpreter with the graph. Only these functions write those
# two tables, so nothing the session holds unflushed is missed by their reads.

_LATEST_HANDOFF = (
    select(
        HandoffRow.seq,
        HandoffRow.checkpoint_ns,
        HandoffRow.kind,
        HandoffRow.source,
        HandoffRow.target,
        HandoffRow.task,
    )
    .where(HandoffRow.task_id == bindparam("task_id"))
    .order_by(HandoffRow.seq.desc())
    .limit(1)
)
_ADD_HANDOFF = insert(HandoffRow)
_OPEN_CALL_BY_ID = (
    select(ToolCallRow.id)
    .where(
        ToolCallRow.task_id == bindparam("task_id"),
        ToolCallRow.finished_at.is_(None),
        ToolCallRow.tool_call_id == bindparam("call_id"),
    )
    .order_by(ToolCallRow.id.desc())
    .limit(1)
)
_OPEN_CALL_BY_TOOL = (
    select(ToolCallRow.id)
    .where(
        ToolCallRow.task_id == bindparam("task_id"),
        ToolCallRow.finished_at.is_(None),
        ToolCallRow.agent == bindparam("agent"),
        ToolCallRow.tool == bindparam("tool"),
    )
    .order_by(ToolCallRow.id.desc())
    .limit(1)
)
_FINISHED_CALL = (
    select(ToolCallRow.id)
    .where(
        ToolCallRow.task_id == bindparam("task_id"),
        ToolCallRow.finished_at.is_not(None),
        ToolCallRow.tool_call_id == bindparam("call_id"),
        ToolCallRow.agent == bindparam("agent"),
        ToolCallRow.tool == bindparam("tool"),
    )
    .limit(1)
)
_ADD_CALL = insert(ToolCallRow)
_FINISH_CALL = update(ToolCallRow).where(ToolCallRow.id == bindparam("row_id"))


def _add_handoff(
    session: Session,
    task_id: str,
    event_seq: int,
    handoff: Handoff,
    tokens_so_far: int | None,
    now: datetime,
) -> None:
    ns = handoff["id"] or None
    source, target = handoff["source"][:NAME_CHARS], handoff["target"][:NAME_CHARS]
    connection = session.connection()
    latest = connection.execute(_LATEST_HANDOFF, {"task_id": task_id}).first()
    if (
        latest is not None
        and ns is not None
        and tuple(latest[1:]) == (ns, handoff["kind"], source, target, handoff["task"])
    ):
        # The same transfer from the same node run, reported again: the step re-ran after
        # a person's decision (a ping-pong the human approved). One transfer, one row.
        return
    last = latest.seq if latest is not None else 0
    if tokens_so_far is None:
        tokens_so_far = _usage.tokens_so_far(session, task_id)
    connection.execute(
        _ADD_HANDOFF,
        {
            "task_id": task_id,
            "seq": (last or 0) + 1,
            "event_seq": event_seq,
            "kind": handoff["kind"],
            "source": source,
            "target": target,
            "task": handoff["task"],
            "reason": handoff["reason"],
            "step": handoff["step"],
            "checkpoint_ns": ns,
            "tokens_so_far": tokens_so_far,
            "created_at": now,
        },
    )


def _open_call(session: Session, task_id: str, event: Mapping[str, Any]) -> int | None:
    """The id of the latest call this ``tool_result`` (or a repeated ``tool_call``) belongs
    to."""
    call_id = event.get("tool_call_id")
    if isinstance(call_id, str) and call_id:
        query, params = _OPEN_CALL_BY_ID, {"task_id": task_id, "call_id": call_id}
    else:
        query = _OPEN_CALL_BY_TOOL
        params = {"task_id": task_id, "agent": _name(event, "agent"), "tool": _text(event, "tool")}
    return session.connection().execute(query, params).scalar()


def _new_call(task_id: str, seq: int, event: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    call_id = event.get("tool_call_id")
    return {
        "task_id": task_id,
        "event_seq": seq,
        "agent": _name(event, "agent"),
        "tool": _text(event, "tool")[:128],
        "tool_call_id": call_id if isinstance(call_id, str) and call_id else None,
        "args": _object(event.get("args")),
        "status": "pending",
        "result_preview": None,
        "created_at": now,
        "finished_at": None,
    }


def _tool_call(
    session: Session, task_id: str, seq: int, event: Mapping[str, Any], now: datetime
) -> None:
    has_id = isinstance(event.get("tool_call_id"), str) and event["tool_call_id"]
    if has_id and _open_call(session, task_id, event) is not None:
        return  # The same call announced again by an agent resumed after an approval.
    if has_id and _finished_call(session, task_id, event) is not None:
        return  # A call the tool journal replays after a crash: it ran once, one row.
    session.connection().execute(_ADD_CALL, _new_call(task_id, seq, event, now))


def _finished_call(session: Session, task_id: str, event: Mapping[str, Any]) -> int | None:
    """The id of the finished row of the same call (id, agent and tool), if any."""
    params = {
        "task_id": task_id,
        "call_id": event.get("tool_call_id"),
        "agent": _name(event, "agent"),
        "tool": _text(event, "tool")[:128],
    }
    return session.connection().execute(_FINISHED_CALL, params).scalar()


def _tool_result(
    session: Session, task_id: str, seq: int, event: Mapping[str, Any], now: datetime
) -> None:
    row_id = _open_call(session, task_id, event)
    if row_id is None and event.get("tool_call_id") and _finished_call(session, task_id, event):
        return  # The journal's replay of a result already recorded.
    preview = event.get("preview")
    outcome = {
        "status": _text(event, "status")[:16] or "success",
        "result_preview": None if preview is None else str(preview),
        "finished_at": now,
    }
    connection = session.connection()
    if row_id is None:  # The call's own event was not recorded; keep the result all the same.
        connection.execute(
            _ADD_CALL, {**_new_call(task_id, seq, event, now), "args": None, **outcome}
        )
        return
    connection.execute(_FINISH_CALL, {"row_id": row_id, **outcome})


def _interrupted(
    session: Session, task_id: str, seq: int, event: Mapping[str, Any], now: datetime
) -> None:
    interrupt_id = event.get("id")
    interrupt_id = str(interrupt_id) if interrupt_id is not None else None
    if interrupt_id is not None:
        known = session.scalar(
            select(ApprovalRow.id).where(
                ApprovalRow.task_id == task_id, ApprovalRow.interrupt_id == interrupt_id
            )
        )
        if known is not None:
            return  # Interrupted again on the same request (a restarted run).
    call_id = event.get("tool_call_id")
    session.add(
        ApprovalRow(
            task_id=task_id,
            interrupt_id=interrupt_id,
            kind=_text(event, "waits_for")[:32] or "approval",
            agent=_name(event, "agent") or None,
            tool=_text(event, "tool")[:128] or None,
            tool_call_id=str(call_id) if call_id is not None else None,
            args=_object(event.get("args")),
            request={k: v for k, v in event.items() if k not in ("type", "id", "waits_for")},
            requested_at=now,
        )
    )


def _approval(
    session: Session, task_id: str, seq: int, event: Mapping[str, Any], now: datetime
) -> None:
    """The resumed run acted on a decision: mark the request it answered as applied."""
    agent, tool = _name(event, "agent") or None, _text(event, "tool")[:128] or None
    row = session.scalars(
        select(ApprovalRow)
        .where(
            ApprovalRow.task_id == task_id,
            ApprovalRow.kind == "approval",
            ApprovalRow.agent == agent,
            ApprovalRow.tool == tool,
            ApprovalRow.applied_at.is_(None),
        )
        .order_by(ApprovalRow.id.desc())
        .limit(1)
    ).first()
    if row is None:  # No recorded request (the interrupt's event was not appended).
        row = ApprovalRow(
            task_id=task_id,
            kind="approval",
            agent=agent,
            tool=tool,
            request={k: v for k, v in event.items() if k != "type"},
            requested_at=now,
        )
        session.add(row)
    if row.decision is None:  # Decided outside the ledger (e.g. `relaygraph resume`).
        decision = event.get("decision")
        row.decision = None if decision is None else str(decision)[:16]
        reason = event.get("reason")
        row.reason = None if reason is None else str(reason)
        row.decided_at = now
    row.applied_at = now


def _agent_finished(
    session: Session, task_id: str, seq: int, event: Mapping[str, Any], now: datetime
) -> None:
    usage = event.get("usage")
    if isinstance(usage, Mapping):
        agent = _name(event, "agent") or _name(usage, "agent")
        _usage.add_record(session, task_id, usage, now, agent=agent, where="agent_finished usage")


def _usage_record(
    session: Session, task_id: str, seq: int, event: Mapping[str, Any], now: datetime
) -> None:
    usage = event.get("usage")
    if isinstance(usage, Mapping):
        _usage.add_record(session, task_id, usage, now, where="usage event")


DERIVERS: dict[str, Deriver] = {
    "route": _transfer,
    "handoff": _transfer,
    "tool_call": _tool_call,
    "tool_result": _tool_result,
    "interrupted": _interrupted,
    "approval": _approval,
    "agent_finished": _agent_finished,
    "usage": _usage_record,
}
