"""The answer a team gives from its last agent's reply, without a model call.

Both the supervisor (a FINISH answered in its own step) and finalize (``finalize.answer =
"last_reply"``) answer this way: one definition for the two.
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage
from langgraph.config import get_stream_writer

from relaygraph._names import ANSWER_NAME
from relaygraph.events import event_sink, final_event
from relaygraph.policies import TeamPolicy
from relaygraph.supervisor import _prompts
from relaygraph.supervisor._state import TeamState
from relaygraph.supervisor._verdict import closing_verdict, source_message

__all__ = ["last_reply_answer", "reply_answered", "writes_final_answer"]


def writes_final_answer(model: BaseChatModel) -> bool:
    """Whether ``model``, as finalize's, writes every answer itself (the embedded model
    cites its sources there), so that no answer is taken from an agent's reply."""
    return bool(getattr(model, "writes_final_answer", False))


def reply_answered(state: TeamState, answer: str) -> dict[str, Any]:
    """The run's end with the last agent's reply as its answer (a writer's deliverable),
    without a model call: the ``final`` event, and the update that records it."""
    visits = _prompts.turn_visits(state)
    source = source_message(visits[-1] if visits else None)
    status, stop_reason = closing_verdict(state, answer, source)
    (event_sink() or get_stream_writer())(final_event(status, answer, stop_reason))
    return {
        "answer": answer,
        "status": status,
        "stop_reason": stop_reason,
        "messages": [AIMessage(content=answer, name=ANSWER_NAME)],
    }


def last_reply_answer(state: TeamState, policy: TeamPolicy) -> str | None:
    """The answer finalize gives without a model call, or None when its model must write it.

    Under ``finalize.answer = "last_reply"``, a request the team finished normally (FINISH
    routed, no stop, no degraded status) is answered with its last agent's reply when that
    agent ended its visit with text. A task that stopped early, or whose last visit handed
    off, ran out of budget or failed, still gets an answer written from what exists.
    """
    if policy.finalize.answer != "last_reply":
        return None
    if state.get("status") or state.get("stop_reason"):
        return None
    visits = _prompts.turn_visits(state)
    if not visits or visits[-1]["ended"] != "finished":
        return None
    output = visits[-1]["output"].strip()
    return output or None
