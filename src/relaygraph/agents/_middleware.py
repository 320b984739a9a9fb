"""Agent middleware: tool events for the team's event stream, tool input errors as results."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from relaygraph._calls import Call, Steps
from relaygraph.backends.sandbox import SandboxUnavailableError
from relaygraph.errors import ToolInputError
from relaygraph.events import event_sink, tool_call_event, tool_result_event
from relaygraph.handoffs import handoff_target
from relaygraph.policies.middleware import ToolStepsMiddleware, refuse_call, was_run


class ToolEventsMiddleware(ToolStepsMiddleware):
    """Reports each tool call and its result on the custom stream, and answers refused input.

    A :class:`ToolInputError` (a path outside the workspace, an unknown doc id) is a normal
    outcome the model can correct, so it becomes an error ToolMessage instead of failing the
    task. A :class:`SandboxUnavailableError` is a refusal before anything ran (this server
    allows no unisolated code): its answer records a ``tool_unavailable`` violation (the policy
    middleware refuses such a call before it runs, and before any approval; this is the
    backstop). What
    else a tool's body raises is answered as a tool error by the tool journal middleware
    (``_journal._own_events``); any other exception still propagates: it is a real failure.
    """

    label = "ToolEvents"

    def _tool_call(
        self, request: ToolCallRequest, handler: Callable[..., Any]
    ) -> Steps[ToolMessage | Command[Any]]:
        call = request.tool_call
        emit = event_sink() or request.runtime.stream_writer
        is_handoff = handoff_target(call["name"]) is not None
        if not is_handoff:
            emit(
                tool_call_event(
                    self.agent, tool=call["name"], args=call["args"], tool_call_id=call["id"]
                )
            )
        try:
            result = yield Call.handler(handler, request)
        except SandboxUnavailableError as exc:
            result = refuse_call(
                call,
                agent=self.agent,
                kind="tool_unavailable",
                detail=f"{self.agent!r} called {call['name']!r}, which this server cannot "
                "run: it has no filesystem isolation (bubblewrap) for code",
                content=f"Not run: {exc}",
                emit=emit,
            )
        except ToolInputError as exc:
            result = ToolMessage(
                content=f"Error: {exc}",
                name=call["name"],
                tool_call_id=call["id"] or "",
                status="error",
            )
        if isinstance(result, ToolMessage) and not (is_handoff and result.status != "error"):
            emit(
                tool_result_event(
                    self.agent,
                    tool=call["name"],
                    tool_call_id=call["id"],
                    status=result.status,
                    ran=was_run(result),
                    result=str(result.content),
                )
            )
        return result
