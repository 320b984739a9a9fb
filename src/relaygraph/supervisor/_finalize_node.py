"""The structured team's finalize node: the request's answer, written by finalize's model
from the team's work, or taken from the last agent's reply, or none when nothing is left
to answer from.

A class, not one closure, so that each part can be called alone: the status the run
reaches finalize with (:meth:`FinalizeNode.status_before`), finalize's model call
(:meth:`FinalizeNode.ask`) and the verdict on its reply (:meth:`FinalizeNode.close`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_stream_writer

from relaygraph._calls import Call, Steps
from relaygraph._deadline import due_within
from relaygraph._names import ANSWER_NAME, FINALIZE
from relaygraph.events import event_sink, final_event
from relaygraph.models import ModelCallError
from relaygraph.policies import TeamPolicy
from relaygraph.policies.budget import seconds_left
from relaygraph.policies.middleware import replies_usage
from relaygraph.supervisor import _prompts
from relaygraph.supervisor._last_reply import last_reply_answer, reply_answered, writes_final_answer
from relaygraph.supervisor._node import steps_node
from relaygraph.supervisor._node_config import call_config, replays_by_position, task_ns
from relaygraph.supervisor._refusals import violation
from relaygraph.supervisor._state import Status, TeamState, Violation, ending_status
from relaygraph.supervisor._usage import announce_usage, turn_usage, usage_record
from relaygraph.supervisor._verdict import closing_verdict, failed_calls_only

__all__ = ["Asked", "FinalizeNode"]


@dataclass(frozen=True, slots=True)
class Asked:
    """Finalize's model call: its reply, and what failed it."""

    reply: AIMessage
    """The model's reply; empty when the call failed."""
    failed: ModelCallError | None
    seconds: float
    """How long the call took, in seconds."""


class FinalizeNode:
    """Finalize's node, written once as steps (:mod:`relaygraph._calls`).

    Args:
        model: Finalize's model.
        policy: The team's policy.
    """

    def __init__(self, model: BaseChatModel, policy: TeamPolicy) -> None:
        self.model = model
        self.policy = policy
        self.replays = replays_by_position(model)
        # A model that writes the answer itself (the embedded model cites its sources
        # there) is always asked; any other is asked only when the policy says so.
        self.always_asked = writes_final_answer(model)

    def runnable(self) -> Any:
        """The node as LangGraph runs it (see :func:`steps_node`)."""
        return steps_node(self.steps, FINALIZE)

    def status_before(self, state: TeamState) -> Status:
        """The status the run reaches finalize with: ``failed`` as well when every agent
        that was given work failed its model call, as there is nothing to answer from,
        and an answer written anyway would only say so."""
        status = ending_status(state)
        if status != "failed" and failed_calls_only(_prompts.turn_visits(state)):
            return "failed"
        return status

    def ask(self, state: TeamState, config: RunnableConfig) -> Steps[Asked]:
        """Finalize's model call, within what the team's time limit leaves.

        A failed call is no error: as a route's, the task ends without an answer, saying
        why (the time limit the stop already spent, a server that failed).
        """
        messages: list[BaseMessage] = [
            SystemMessage(content=_prompts.FINALIZE_PROMPT),
            HumanMessage(content=_prompts.finalize_input(state)),
        ]
        started = time.monotonic()
        try:
            with due_within(seconds_left((self.policy.team.max_seconds, turn_usage(state)))):
                reply = yield Call.invoke(
                    self.model, messages, call_config(config, state, FINALIZE, replays=self.replays)
                )
        except ModelCallError as exc:
            return Asked(AIMessage(content=""), exc, time.monotonic() - started)
        return Asked(reply, None, time.monotonic() - started)

    def close(
        self, state: TeamState, config: RunnableConfig, status: Status, asked: Asked
    ) -> dict[str, Any]:
        """The run's end with the answer finalize's model wrote: its verdict, usage and
        ``final`` event."""
        reply, failed = asked.reply, asked.failed
        stop_reason = state.get("stop_reason")
        violations = finalize_calls_refused(reply, state, config)
        # An empty answer is no answer: the run did not deliver what it was asked for.
        answer = reply.text if reply.text.strip() else None
        if answer is None and status == "succeeded":
            status = "degraded"
            stop_reason = (
                f"model_error: {FINALIZE}: {failed.reason}"
                if failed is not None
                else "no answer: finalize wrote no text"
                + (" (it called a tool, which it may not)" if violations else "")
            )
        status, stop_reason = closing_verdict(
            {**state, "status": status, "stop_reason": stop_reason}, answer, reply
        )
        if status == "failed":
            answer = None
        # A failed call answered nothing: like a route's, it counts no model call.
        replies: list[BaseMessage] = [] if failed is not None else [reply]
        totals = replies_usage(replies, self.policy, seconds=asked.seconds)
        usage = announce_usage(
            usage_record(task_ns(config), FINALIZE, state.get("turn", 0), totals, replies)
        )
        (event_sink() or get_stream_writer())(final_event(status, answer, stop_reason))
        update: dict[str, Any] = {
            "answer": answer,
            "status": status,
            "stop_reason": stop_reason,
            "violations": violations,
            "usage": [usage],
        }
        if answer is not None:
            update["messages"] = [AIMessage(content=answer, name=ANSWER_NAME)]
        return update

    def steps(self, state: TeamState, config: RunnableConfig) -> Steps[dict[str, Any]]:
        """Finalize's one run: no answer, the last reply's, or its model's."""
        status = self.status_before(state)
        if status == "failed":  # Nothing to answer from (on_exhausted = "fail", or no work).
            stop_reason = state.get("stop_reason")
            (event_sink() or get_stream_writer())(final_event(status, None, stop_reason))
            return {"answer": None, "status": status, "stop_reason": stop_reason}
        reply_answer = None if self.always_asked else last_reply_answer(state, self.policy)
        if reply_answer is not None:
            return reply_answered(state, reply_answer)
        asked = yield from self.ask(state, config)
        return self.close(state, config, status, asked)


def finalize_calls_refused(
    reply: AIMessage, state: TeamState, config: RunnableConfig
) -> list[Violation]:
    """Violations for the tool calls of finalize's reply: none is run.

    Finalize is bound to no tools, yet a model may answer with a call all the same (a
    scripted or embedded model, a server that ignores the tool list); the call is dropped,
    its text (if any) is the answer, and the attempt is recorded. There is no conversation
    to answer it in: finalize makes one model call.
    """
    return [
        violation(
            f"{task_ns(config)}:{call['id'] or index}:tool_not_allowed",
            state.get("turn", 0),
            FINALIZE,
            "tool_not_allowed",
            f"{FINALIZE!r} called {call['name']!r}, which it may not: finalize has no tools, "
            "so the call was not run",
        )
        for index, call in enumerate(reply.tool_calls)
    ]
