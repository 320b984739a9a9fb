"""``begin``: the node every request of every topology goes through first."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig

from relaygraph.supervisor._node_config import step_of
from relaygraph.supervisor._state import TeamState


def begin_turn(state: TeamState, config: RunnableConfig) -> dict[str, Any]:
    """Start a new turn of the thread: the request as its message, and fresh per-request
    fields (a thread keeps its state from one request to the next)."""
    return {
        "turn": state.get("turn", 0) + 1,
        # LangGraph numbers a thread's steps on from request to request, while its
        # recursion limit holds per request: the step guard counts from here.
        "turn_step": step_of(config) or 0,
        "messages": [HumanMessage(content=state.get("request", ""))],
        "assignment": None,
        "plan": [],
        "barred": [],
        "answer": None,
        "status": None,
        "stop_reason": None,
    }
