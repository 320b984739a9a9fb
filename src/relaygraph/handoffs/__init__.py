"""Direct handoffs between agents: ``transfer_to_<agent>`` tools and the records they leave.

A handoff tool returns ``Command(goto=target, graph=Command.PARENT, update=...)``: LangGraph
raises it out of the agent's subgraph to the team graph, which runs the target next. The
update answers the tool call with a ToolMessage (so no tool call is ever left dangling), gives
the target its task, and appends a :class:`~relaygraph.events.Handoff` (defined with the events
made from it, in :mod:`relaygraph.events`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolCall, ToolMessage
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.prebuilt import ToolRuntime
from langgraph.types import Command
from pydantic import BaseModel, Field, ValidationError, field_validator
from pydantic_core import ErrorDetails, PydanticCustomError

from relaygraph._names import HANDOFF_PREFIX
from relaygraph.events import Assignment, Handoff, record_handoff

__all__ = [
    "HANDOFF_PREFIX",
    "Assignment",
    "Handoff",
    "HandoffArgs",
    "answer_unanswered_calls",
    "arguments_problem",
    "calling_message",
    "create_handoff_tool",
    "handoff_args_problem",
    "handoff_call_problem",
    "handoff_target",
    "merge_by_id",
]


def merge_by_id(left: Sequence[Any] | None, right: Any) -> list[Any]:
    """Reducer for lists of records with an ``id``: a record written again replaces itself.

    A super-step that LangGraph re-runs (after an interrupt, or a resumed thread) writes the
    same records again; keyed merging keeps them once instead of appending duplicates.
    """
    merged = list(left or [])
    if right is None:
        return merged
    incoming = right if isinstance(right, list | tuple) else [right]
    positions = {rec["id"]: i for i, rec in enumerate(merged)}
    for rec in incoming:
        if rec["id"] in positions:
            merged[positions[rec["id"]]] = rec
        else:
            positions[rec["id"]] = len(merged)
            merged.append(rec)
    return merged


def merge_batch_by_id(left: Sequence[Any] | None, batch: Sequence[Any]) -> list[Any]:
    """``merge_by_id`` over a batch of writes, for a LangGraph ``DeltaChannel``."""
    merged = list(left or [])
    for right in batch:
        merged = merge_by_id(merged, right)
    return merged


def answer_unanswered_calls(
    messages: Sequence[BaseMessage], *, carried_out: str
) -> list[ToolMessage]:
    """ToolMessages for calls of the last AI message that have no answer after a handoff.

    When a handoff is carried out, LangGraph leaves the agent's subgraph at once, so the
    refusals written for the other handoff calls of the same message are lost with the rest
    of that step. relaygraph's policy middleware puts its refusals of those calls on the
    handoff itself, recorded as violations; this completes the transcript of an agent
    without it, so that no tool call is ever left dangling.
    """
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    last_ai = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
    if last_ai is None:
        return []
    return [
        ToolMessage(
            content="Handoff not carried out: only one handoff per message is carried out, "
            f"and {carried_out!r} came first in this message.",
            name=call["name"],
            tool_call_id=call["id"] or "",
            status="error",
        )
        for call in last_ai.tool_calls
        if call["id"] not in answered
    ]


def handoff_target(tool_name: str) -> str | None:
    """The agent a handoff tool name points at, or ``None`` for other tools."""
    return tool_name.removeprefix(HANDOFF_PREFIX) if tool_name.startswith(HANDOFF_PREFIX) else None


class HandoffArgs(BaseModel):
    """The arguments of every transfer tool: what to do, and why.

    Neither the fields nor the schema carry a description (the tools take their schema
    from :class:`_HandoffCall`, which has no docstring to send): the schema goes with every
    model call of every agent that may hand off, once per peer, and the agent's prompt
    already says that a task must be self-contained (the target sees only it and the
    results so far).
    """

    task: str
    reason: str = Field(default_factory=str)
    """May be left out. Made by a factory rather than given as a default, so that the JSON
    schema sent to the model carries no ``"default": ""``: ``required`` already says so."""

    @field_validator("task")
    @classmethod
    def _task_says_something(cls, task: str) -> str:
        # A blank task would hand over work nobody described; the agent could only guess.
        if not task.strip():
            raise PydanticCustomError("blank_task", "is empty; say what the agent must do")
        return task


class _HandoffCall(HandoffArgs):
    # No docstring: LangChain describes a tool whose description is empty by its argument
    # schema's docstring, and the transfer tools' definitions carry no description.
    pass


def handoff_args_problem(args: Any) -> str | None:
    """What is wrong with a transfer call's arguments, in words a model can act on, or
    ``None`` when they fit :class:`HandoffArgs`.

    A transfer whose arguments do not fit (no ``task``, a task that is not a string or is
    blank) is refused before it runs, and the refusal says which argument to fix.
    """
    return arguments_problem(HandoffArgs, args)


def arguments_problem(schema: type[BaseModel], args: Any) -> str | None:
    """What is wrong with a tool call's arguments for the tool's ``schema``, in words a model
    can act on (``'code' is missing``), or ``None`` when they fit."""
    try:
        schema.model_validate(args)
    except ValidationError as exc:
        return "; ".join(_problem(error) for error in exc.errors())
    return None


def _problem(error: ErrorDetails) -> str:
    field = ".".join(str(part) for part in error["loc"])
    if not field:
        return f"the arguments are invalid: {error['msg']}"
    if error["type"] == "missing":
        return f"{field!r} is missing"
    if error["type"] == "blank_task":
        return f"{field!r} {error['msg']}"
    return f"{field!r} is invalid: {error['msg']}"


def handoff_call_problem(calls: Sequence[ToolCall | Mapping[str, Any]], call_id: str) -> str | None:
    """Why the transfer call ``call_id`` cannot be carried out because of the other calls of
    its message (``calls``), or ``None`` when it may be.

    Only the first transfer of a message may be carried out: parallel transfers silently
    lose an agent upstream (langgraph-supervisor #230, langgraph #7129). A transfer beside
    ordinary tool calls is refused too: their results would be lost upstream
    (langgraph-swarm #26); the agent sees them first and may hand off in its next message.
    """
    handoffs = [c for c in calls if handoff_target(c["name"]) is not None]
    if handoffs and handoffs[0]["id"] != call_id:
        return (
            f"only one handoff per message is carried out, and {handoffs[0]['name']!r} "
            "came first in this message."
        )
    if len(handoffs) != len(calls):
        others = ", ".join(repr(c["name"]) for c in calls if c not in handoffs)
        return (
            f"this message also calls {others}; hand off in a message of its own once you "
            "have those results."
        )
    return None


def calling_message(runtime: ToolRuntime[Any, Any]) -> AIMessage | None:
    """The AI message whose tool call is running now."""
    for message in reversed(runtime.state.get("messages", [])):
        if isinstance(message, AIMessage) and any(
            call["id"] == runtime.tool_call_id for call in message.tool_calls
        ):
            return message
    return None


def _refusal(runtime: ToolRuntime[Any, Any], name: str, why: str) -> ToolMessage:
    return ToolMessage(
        content=f"Handoff not carried out: {why}",
        name=name,
        tool_call_id=runtime.tool_call_id or "",
        status="error",
    )


def create_handoff_tool(target: str, *, source: str, description: str = "") -> BaseTool:
    """Create the ``transfer_to_<target>`` tool for agent ``source``.

    Only the first handoff call of a message is carried out, and only when the message
    calls nothing else (:func:`handoff_call_problem` says why); every other call is
    answered with a ToolMessage saying it was not carried out and why. In a relaygraph
    agent the policy middleware refuses those calls before they reach the tool and records
    each as a violation, as it does a call whose arguments do not fit :class:`HandoffArgs`
    (:func:`handoff_args_problem`).

    Args:
        target: The agent that receives the work.
        source: The agent that owns the tool.
        description: Shown to the model; empty by default: the tool's name says what it
            does, and its definition is sent with every model call of ``source``.
    """
    name = f"{HANDOFF_PREFIX}{target}"

    def handoff(
        task: str, runtime: ToolRuntime[Any, Any], reason: str = ""
    ) -> Command[Any] | ToolMessage:
        message = calling_message(runtime)
        calls = message.tool_calls if message is not None else []
        if (why := handoff_call_problem(calls, runtime.tool_call_id or "")) is not None:
            return _refusal(runtime, name, why)
        tool_message = ToolMessage(
            content=f"Transferred to {target}: {task}",
            name=name,
            tool_call_id=runtime.tool_call_id or "",
        )
        assignment = Assignment(
            agent=target, task=task, reason=reason, source=source, kind="direct"
        )
        record = record_handoff(assignment, id=runtime.tool_call_id or f"{source}->{target}")
        return Command(
            goto=target,
            graph=Command.PARENT,
            update={"messages": [tool_message], "handoffs": [record], "assignment": assignment},
        )

    tool = StructuredTool.from_function(
        func=handoff, name=name, description=description or name, args_schema=_HandoffCall
    )
    # Set afterwards: given as empty, from_function would take the function's docstring.
    tool.description = description
    return tool
