"""The tool journal: a tool call that completed is answered again, never run again.

A tool's side effects (code run, a file written, an artifact saved) happen at once; its
result reaches the checkpoint only with the tool step's writes, which LangGraph saves after
the call returns (in the background under the default ``async`` durability). A worker killed
in between leaves a checkpoint without the result, and the re-run step calls the tool again.
:class:`ToolJournalMiddleware` closes that gap: it writes each completed call's result to the
task's :class:`~relaygraph.agents.context.ToolJournal` before the result returns into the
graph, and answers a call it finds there from the record without running the tool.

It is the innermost middleware of an agent, right around the tool itself, so it records only
calls that ran: a call the policy refuses, or one a person rejects, never reaches it, and an
approval pauses before it. A call in progress when the worker died has no record and runs
again (nothing can say how far it got); a call that completed is never repeated.

Being innermost, it is also where the tool's body leaves the run's event sink
(:func:`relaygraph.events.events_to`): a graph the tool streams itself (a team compiled as a
plain LangGraph graph) has its events on its own stream, not in the task's ledger.
"""

from __future__ import annotations

import base64
import hashlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from relaygraph._calls import Call, Steps
from relaygraph.agents.context import TaskContext, ToolJournal
from relaygraph.errors import RelaygraphError
from relaygraph.events import events_to
from relaygraph.handoffs import handoff_target
from relaygraph.policies.middleware import ToolStepsMiddleware
from relaygraph.policies.pingpong import normalize_call

__all__ = ["JOURNAL_KEY", "ToolJournalMiddleware", "call_key", "journal_record", "replay"]

log = logging.getLogger(__name__)

JOURNAL_KEY = "relaygraph_journal"
"""``response_metadata`` key on a ToolMessage answered from the journal: ``"replayed"``."""

# The checkpointer's own serializer: a recorded result reads back exactly as the checkpoint
# would have held it (messages, artifacts, commands and what they carry).
_SERDE = JsonPlusSerializer()

Result = ToolMessage | Command[Any]


def call_key(call: Mapping[str, Any]) -> str:
    """A digest of the call's tool and arguments: a record answers only the call it was made
    for, even if a model gave two calls of a task the same id."""
    return hashlib.sha256(normalize_call(call["name"], call["args"]).encode()).hexdigest()


def journal_record(call: Mapping[str, Any], result: Result) -> dict[str, Any]:
    """The journal's record of a completed call: the tool, which call, how it went, and
    the result itself (serialized, base64) — a JSON object for the ledger.

    Args:
        call: The call as it ran (with a person's edited arguments, if any).
        result: What the tool returned into the graph.
    """
    kind, data = _SERDE.dumps_typed(result)
    outcome = result.status if isinstance(result, ToolMessage) else "command"
    return {
        "tool": call["name"],
        "call": call_key(call),
        "outcome": outcome,
        "result": {"serde": kind, "data": base64.b64encode(data).decode("ascii")},
    }


def replay(record: Mapping[str, Any]) -> Result:
    """The result a record holds, as the call returned it the first time; a ToolMessage is
    marked with :data:`JOURNAL_KEY` so the transcript shows it was not run again."""
    stored = record["result"]
    result = _SERDE.loads_typed((stored["serde"], base64.b64decode(stored["data"])))
    if isinstance(result, ToolMessage):
        result.response_metadata[JOURNAL_KEY] = "replayed"
    elif not isinstance(result, Command):
        raise TypeError(f"a journal record holds {type(result).__name__}, not a tool result")
    return result


class ToolJournalMiddleware(ToolStepsMiddleware):
    """Answers a call that completed before from the task's tool journal, and records each
    call that completes, before its result returns into the graph.

    Handoffs (``transfer_to_<peer>``) are left out: they change nothing outside the graph,
    and a re-run step makes the same command again from the checkpointed message. So is a
    call without an id, and every call of a task whose context has no journal.
    """

    label = "ToolJournal"

    def _tool_call(self, request: ToolCallRequest, handler: Callable[..., Any]) -> Steps[Result]:
        call = request.tool_call
        context = request.runtime.context
        journal: ToolJournal | None = (
            context.tool_journal if isinstance(context, TaskContext) else None
        )
        call_id = call["id"]
        if handoff_target(call["name"]) is not None:
            return (yield Call.handler(handler, request))
        if journal is None or not call_id:
            return (yield from _own_events(handler, request))
        assert isinstance(context, TaskContext)
        key = call_key(call)
        found = yield Call.blocking(journal.get, context.task_id, call_id)
        if found is not None:
            if found.get("call") == key:
                return replay(found)
            log.warning(
                "%s: task %s has a record of another call with id %r (%s); running %s "
                "without the journal",
                self.agent,
                context.task_id,
                call_id,
                found.get("tool"),
                call["name"],
            )
            return (yield from _own_events(handler, request))
        result = yield from _own_events(handler, request)
        record = journal_record(call, result)
        kept = yield Call.blocking(journal.put, context.task_id, call_id, record)
        if kept.get("result") != record["result"] and kept.get("call") == key:
            # Another attempt of the task (one that was only frozen) completed the call
            # first: answer as it did, so the task holds one result of the call.
            return replay(kept)
        return result


def _own_events(handler: Callable[..., Any], request: ToolCallRequest) -> Steps[Result]:
    """``handler`` run outside the run's event sink: the events of the run itself come from
    its nodes and middleware, never from a tool's body, so whatever graph the tool runs
    reports on that graph's own stream (LangGraph's writer) instead of into the task.

    What the tool's body raises is answered as a tool error naming the tool, a sync tool's
    and a coroutine's alike (as LangChain's ``ToolException`` is), and recorded like any
    completed call: the model reads it and may try otherwise. relaygraph's own errors (bad
    input the outer middleware answers, a quota, a superseded attempt) and LangGraph's
    control flow (an interrupt, a handoff's command) go on up.
    """
    with events_to(None):
        try:
            return (yield Call.handler(handler, request))
        except (RelaygraphError, GraphBubbleUp):
            raise
        except Exception as exc:
            return _tool_error(request, exc)


def _tool_error(request: ToolCallRequest, exc: Exception) -> ToolMessage:
    call = request.tool_call
    log.warning("tool %s failed", call["name"], exc_info=True)
    return ToolMessage(
        content=f"Error: tool {call['name']!r} failed: {type(exc).__name__}: {exc}",
        name=call["name"],
        tool_call_id=call["id"] or "",
        status="error",
    )
