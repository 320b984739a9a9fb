"""Rows derived from a task's events: handoffs, tool calls, approvals and usage.

The rows are made from the records the events carry, as :mod:`relaygraph.events` defines
them: a handoff row from the event's :class:`~relaygraph.events.Handoff`
(:func:`~relaygraph.events.moved_work`), an agent's usage from the visit's
:class:`~relaygraph.events.Usage` record; nothing is computed again here.

Each function runs inside the transaction that appends the event, after the task row was
locked, so the derived rows of one task are written one event at a time, in order. They
write in SQLAlchemy Core, on that transaction's connection, with statements built once (ids
and values, no ORM objects, no statement built per event): every batch of a run's events
comes through here, on the thread that shares the interpreter with the graph, so each
batch reads its usage rows once (:class:`BatchRows`) and builds no ORM object
(``tests/test_ledger_statements.py`` counts the statements).

A resumed or recovered run re-emits some events (the agent that paused starts again and
repeats its ``tool_call``; a node re-run after a crash repeats its ``agent_finished``); the
derivations recognise those by their ids and do not count them twice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, case, insert, select, update

from relaygraph._names import SUPERVISOR
from relaygraph.events import Handoff, moved_work
from relaygraph.store import _usage
from relaygraph.store._models import ApprovalRow, HandoffRow, ToolCallRow

__all__ = ["DERIVERS", "NAME_CHARS", "BatchRows", "derive", "event_agent"]

NAME_CHARS = 64


class BatchRows:
    """What the derivations of one batch of a task's events share: the transaction's
    connection, the task's usage rows as the batch leaves them (read at the first record,
    written when the batch ends: :meth:`flush`), and the tool-call rows of each call id
    the batch has seen (a call and its result often come in one batch: the result's row is
    then known without reading it back)."""

    def __init__(self, connection: Connection, task_id: str, now: datetime) -> None:
        self.connection = connection
        self.task_id = task_id
        self.now = now
        self.usage = _usage.UsageRows(connection, task_id)
        self.calls: dict[str, list[list[Any]]] = {}
        """Per call id, its rows as ``[id, finished, agent, tool]``, newest first."""

    def flush(self) -> None:
        """Write the usage rows the batch changed."""
        self.usage.write(self.now)


Deriver = Callable[[BatchRows, int, Mapping[str, Any]], None]


def event_agent(event: Mapping[str, Any]) -> str | None:
    """The role an event is about: the router for routes, the sender for handoffs."""
    if event["type"] == "route":
        return SUPERVISOR
    for key in ("agent", "source", "role"):
        value = event.get(key)
        if isinstance(value, str) and value:
            return value[:NAME_CHARS]
    return None


def derive(rows: BatchRows, seq: int, event: Mapping[str, Any]) -> None:
    """Write the rows event number ``seq`` implies, if any (the usage rows when the batch
    ends: :meth:`BatchRows.flush`)."""
    deriver = DERIVERS.get(event["type"])
    if deriver is not None:
        deriver(rows, seq, event)


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


def _transfer(rows: BatchRows, seq: int, event: Mapping[str, Any]) -> None:
    handoff = moved_work(event)
    if handoff is None:
        return  # Finishing, or a transfer a limit or a ping-pong stopped: no work moved.
    tokens = _optional_int(event.get("tokens_so_far"))
    _add_handoff(rows, seq, handoff, tokens)


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
_CALLS_BY_ID = (
    # A tool call's rows by the model's call id, newest first: the open one a result or a
    # repeated announcement belongs to, and the finished ones a replay matches (one read
    # for both questions; a call id has one row, rarely a few).
    select(ToolCallRow.id, ToolCallRow.finished_at, ToolCallRow.agent, ToolCallRow.tool)
    .where(
        ToolCallRow.task_id == bindparam("task_id"),
        ToolCallRow.tool_call_id == bindparam("call_id"),
    )
    .order_by(ToolCallRow.id.desc())
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
_ADD_CALL = insert(ToolCallRow)
_ADD_CALL_RETURNING_ID = insert(ToolCallRow).returning(ToolCallRow.id)
_FINISH_CALL = (
    update(ToolCallRow)
    .where(ToolCallRow.id == bindparam("row_id"))
    .values(
        status=bindparam("status"),
        result_preview=bindparam("result_preview"),
        finished_at=bindparam("finished_at"),
    )
)
_EDIT_CALL = (
    update(ToolCallRow).where(ToolCallRow.id == bindparam("row_id")).values(args=bindparam("args"))
)
_APPROVAL_BY_INTERRUPT = select(ApprovalRow.id).where(
    ApprovalRow.task_id == bindparam("task_id"),
    ApprovalRow.interrupt_id == bindparam("interrupt_id"),
)
_ADD_APPROVAL = insert(ApprovalRow)
_UNAPPLIED_APPROVAL = (
    select(ApprovalRow.id)
    .where(
        ApprovalRow.task_id == bindparam("task_id"),
        ApprovalRow.kind == "approval",
        # IS NOT DISTINCT FROM: an approval event may name no agent or no tool.
        ApprovalRow.agent.is_not_distinct_from(bindparam("agent")),
        ApprovalRow.tool.is_not_distinct_from(bindparam("tool")),
        ApprovalRow.applied_at.is_(None),
    )
    .order_by(ApprovalRow.id.desc())
    .limit(1)
)
_UNDECIDED = ApprovalRow.decision.is_(None)
_APPLY_APPROVAL = (
    update(ApprovalRow)
    .where(ApprovalRow.id == bindparam("row_id"))
    .values(
        # A request decided outside the ledger (e.g. `relaygraph resume`) takes the
        # decision the event reports; the SET expressions read the row as it was.
        decision=case((_UNDECIDED, bindparam("decision")), else_=ApprovalRow.decision),
        reason=case((_UNDECIDED, bindparam("reason")), else_=ApprovalRow.reason),
        decided_at=case((_UNDECIDED, bindparam("applied_at")), else_=ApprovalRow.decided_at),
        applied_at=bindparam("applied_at"),
    )
)


def _add_handoff(
    rows: BatchRows, event_seq: int, handoff: Handoff, tokens_so_far: int | None
) -> None:
    ns = handoff["id"] or None
    source, target = handoff["source"][:NAME_CHARS], handoff["target"][:NAME_CHARS]
    connection, task_id = rows.connection, rows.task_id
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
        tokens_so_far = rows.usage.tokens_so_far()
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
            "created_at": rows.now,
        },
    )


def _call_id(event: Mapping[str, Any]) -> str | None:
    call_id = event.get("tool_call_id")
    return call_id if isinstance(call_id, str) and call_id else None


def _calls(rows: BatchRows, event: Mapping[str, Any]) -> tuple[int | None, bool]:
    """The id of the latest open call this ``tool_result`` (or a repeated ``tool_call``)
    belongs to, and whether the same call (id, agent and tool) has a finished row."""
    call_id = _call_id(event)
    agent, tool = _name(event, "agent"), _text(event, "tool")
    if call_id is None:
        params = {"task_id": rows.task_id, "agent": agent, "tool": tool}
        return rows.connection.execute(_OPEN_CALL_BY_TOOL, params).scalar(), False
    open_id: int | None = None
    finished = False
    for row_id, row_finished, row_agent, row_tool in _call_rows(rows, call_id):
        if not row_finished:
            open_id = row_id if open_id is None else open_id
        elif (row_agent, row_tool) == (agent, tool[:128]):
            finished = True
    return open_id, finished


def _call_rows(rows: BatchRows, call_id: str) -> list[list[Any]]:
    """The rows of the call ``call_id``: read the first time, then as the batch changes
    them."""
    known = rows.calls.get(call_id)
    if known is None:
        found = rows.connection.execute(_CALLS_BY_ID, {"task_id": rows.task_id, "call_id": call_id})
        known = rows.calls[call_id] = [
            [row_id, finished_at is not None, agent, tool]
            for row_id, finished_at, agent, tool in found
        ]
    return known


def _add_call(rows: BatchRows, values: dict[str, Any]) -> None:
    """Insert a tool-call row, and remember it under its call id."""
    call_id = values["tool_call_id"]
    if call_id is None:
        rows.connection.execute(_ADD_CALL, values)
        return
    known = _call_rows(rows, call_id)
    row_id = rows.connection.execute(_ADD_CALL_RETURNING_ID, values).scalar_one()
    finished = values["finished_at"] is not None
    known.insert(0, [row_id, finished, values["agent"], values["tool"]])


def _new_call(rows: BatchRows, seq: int, event: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "task_id": rows.task_id,
        "event_seq": seq,
        "agent": _name(event, "agent"),
        "tool": _text(event, "tool")[:128],
        "tool_call_id": _call_id(event),
        "args": _object(event.get("args")),
        "status": "pending",
        "result_preview": None,
        "created_at": rows.now,
        "finished_at": None,
    }


def _tool_call(rows: BatchRows, seq: int, event: Mapping[str, Any]) -> None:
    if _call_id(event) is not None:
        open_id, finished = _calls(rows, event)
        if open_id is not None:
            return  # The same call announced again by an agent resumed after an approval.
        if finished:
            return  # A call the tool journal replays after a crash: it ran once, one row.
    _add_call(rows, _new_call(rows, seq, event))


def _tool_result(rows: BatchRows, seq: int, event: Mapping[str, Any]) -> None:
    row_id, finished = _calls(rows, event)
    if row_id is None and finished:
        return  # The journal's replay of a result already recorded.
    preview = event.get("preview")
    outcome = {
        "status": _text(event, "status")[:16] or "success",
        "result_preview": None if preview is None else str(preview),
        "finished_at": rows.now,
    }
    if row_id is None:  # The call's own event was not recorded; keep the result all the same.
        _add_call(rows, {**_new_call(rows, seq, event), "args": None, **outcome})
        return
    rows.connection.execute(_FINISH_CALL, {"row_id": row_id, **outcome})
    call_id = _call_id(event)
    for known in rows.calls.get(call_id, []) if call_id is not None else []:
        if known[0] == row_id:
            known[1] = True


def _interrupted(rows: BatchRows, seq: int, event: Mapping[str, Any]) -> None:
    interrupt_id = event.get("id")
    interrupt_id = str(interrupt_id) if interrupt_id is not None else None
    if interrupt_id is not None:
        known = rows.connection.execute(
            _APPROVAL_BY_INTERRUPT, {"task_id": rows.task_id, "interrupt_id": interrupt_id}
        ).scalar()
        if known is not None:
            return  # Interrupted again on the same request (a restarted run).
    call_id = event.get("tool_call_id")
    rows.connection.execute(
        _ADD_APPROVAL,
        {
            "task_id": rows.task_id,
            "interrupt_id": interrupt_id,
            "kind": _text(event, "waits_for")[:32] or "approval",
            "agent": _name(event, "agent") or None,
            "tool": _text(event, "tool")[:128] or None,
            "tool_call_id": str(call_id) if call_id is not None else None,
            "args": _object(event.get("args")),
            "request": {k: v for k, v in event.items() if k not in ("type", "id", "waits_for")},
            "requested_at": rows.now,
        },
    )


def _approval(rows: BatchRows, seq: int, event: Mapping[str, Any]) -> None:
    """The resumed run acted on a decision: mark the request it answered as applied."""
    agent, tool = _name(event, "agent") or None, _text(event, "tool")[:128] or None
    connection, now = rows.connection, rows.now
    found = connection.execute(
        _UNAPPLIED_APPROVAL, {"task_id": rows.task_id, "agent": agent, "tool": tool}
    ).first()
    if found is None:  # No recorded request (the interrupt's event was not appended).
        row_id = connection.execute(
            _ADD_APPROVAL.returning(ApprovalRow.id),
            {
                "task_id": rows.task_id,
                "interrupt_id": None,
                "kind": "approval",
                "agent": agent,
                "tool": tool,
                "tool_call_id": None,
                "args": None,
                "request": {k: v for k, v in event.items() if k != "type"},
                "requested_at": now,
            },
        ).scalar_one()
    else:
        row_id = found.id
    decision, reason = event.get("decision"), event.get("reason")
    edited = event.get("args")
    if isinstance(edited, Mapping) and _call_id(event) is not None:
        # The call ran with a person's arguments: its row says what ran (the approval's
        # row keeps the model's, in its request, beside the edited ones).
        call_row, _ = _calls(rows, event)
        if call_row is not None:
            connection.execute(_EDIT_CALL, {"row_id": call_row, "args": _object(edited)})
    connection.execute(
        _APPLY_APPROVAL,
        {
            "row_id": row_id,
            "applied_at": now,
            "decision": None if decision is None else str(decision)[:16],
            "reason": None if reason is None else str(reason),
        },
    )


def _agent_finished(rows: BatchRows, seq: int, event: Mapping[str, Any]) -> None:
    usage = event.get("usage")
    if isinstance(usage, Mapping):
        agent = _name(event, "agent") or _name(usage, "agent")
        rows.usage.add_record(usage, agent=agent, where="agent_finished usage")


def _usage_record(rows: BatchRows, seq: int, event: Mapping[str, Any]) -> None:
    usage = event.get("usage")
    if isinstance(usage, Mapping):
        rows.usage.add_record(usage, where="usage event")


def _model_call(rows: BatchRows, seq: int, event: Mapping[str, Any]) -> None:
    # The call's record stands beside its visit's until the visit's own lands (a live
    # figure of a visit in progress); add_record drops it then.
    usage = event.get("usage")
    if isinstance(usage, Mapping):
        rows.usage.add_record(usage, where="model_call usage")


DERIVERS: dict[str, Deriver] = {
    "route": _transfer,
    "handoff": _transfer,
    "tool_call": _tool_call,
    "tool_result": _tool_result,
    "interrupted": _interrupted,
    "approval": _approval,
    "agent_finished": _agent_finished,
    "usage": _usage_record,
    "model_call": _model_call,
}
