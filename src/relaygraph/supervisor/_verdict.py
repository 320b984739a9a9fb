"""What a team's answer is worth: the one definition of a non-answer, and the status a run
ends with given its answer, for every topology and model.

A non-answer is no answer, a blank one, the placeholder a topology writes when no agent
gave a result (:data:`~relaygraph._names.NO_RESULT`), the embedded model's answer when no
agent cited a document it read (:data:`~relaygraph._names.NO_CITED_ANSWER`), a reply that
was a tool call whose arguments are not JSON, or an answer cut at the token limit
(``finish_reason: "length"``).
A run that ends with one is not ``succeeded``: it is ``degraded`` with the reason, or
``failed`` when an agent's model call failed and no agent's work is left to answer from.
Each topology's closing step (``finalize``, the tool supervisor's last reply, the swarm's
closing) and the runner's last check (``honest_status``) ask :func:`non_answer`.
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.messages import AIMessage, BaseMessage

from relaygraph._names import NO_CITED_ANSWER, NO_RESULT
from relaygraph.supervisor._state import Status, TeamState, Visit, ending_status

__all__ = ["closing_verdict", "failed_calls_only", "non_answer", "source_message"]

CUT_FINISH_REASONS = frozenset({"length", "max_tokens"})
"""``finish_reason`` values of an answer the server cut at its token limit (OpenAI's
``length``; ``max_tokens`` as some gateways translate Anthropic's stop reason)."""


def non_answer(answer: str | None, message: BaseMessage | None = None) -> str | None:
    """Why ``answer`` answers nothing, or None when it is an answer.

    Args:
        answer: The team's final answer.
        message: The model reply the answer was taken from, when there is one: its
            ``finish_reason`` and its tool calls tell a cut or broken reply apart.

    Returns:
        A stop reason (``no answer: ...`` or ``truncated: ...``), or None.
    """
    who = f"{message.name}'s" if message is not None and message.name else "the"
    if isinstance(message, AIMessage) and message.invalid_tool_calls and not message.tool_calls:
        names = ", ".join(repr(c.get("name") or "?") for c in message.invalid_tool_calls)
        return f"no answer: {who} last reply was a call of {names} whose arguments are not JSON"
    text = (answer or "").strip()
    if not text:
        return "no answer: the team's final answer is empty"
    if text.startswith(NO_RESULT):
        return "no answer: no agent gave a result"
    if text.startswith(NO_CITED_ANSWER):
        return (
            "no answer: no agent cited a document it read, and the embedded model answers "
            "only from the documents"
        )
    finish = message.response_metadata.get("finish_reason") if message is not None else None
    if finish in CUT_FINISH_REASONS:
        return (
            f"truncated: {who} answer was cut at the model's token limit "
            f"(finish_reason {finish!r}); raise max_tokens in the model spec"
        )
    return None


def failed_calls_only(visits: Sequence[Visit]) -> bool:
    """Whether the request's visits are there, and every one ended in a failed model call:
    no agent's work is left to answer from."""
    return bool(visits) and all(v["ended"] == "model_error" for v in visits)


def source_message(visit: Visit | None) -> BaseMessage | None:
    """The model reply a visit's result was taken from: its transcript's last message."""
    if visit is None or not visit["messages"]:
        return None
    return visit["messages"][-1]


def closing_verdict(
    state: TeamState, answer: str | None, message: BaseMessage | None = None
) -> tuple[Status, str | None]:
    """The status and stop reason a request ends with, given its answer.

    What stopped or degraded the run earlier keeps its status and reason (it says more
    than the answer's shortfall); a run that would succeed with a non-answer is
    ``degraded`` with :func:`non_answer`'s reason. A run degraded by an agent's failed
    model call is ``failed`` when no answer stands or every visit failed its call.
    """
    status, stop_reason = ending_status(state), state.get("stop_reason")
    if status == "failed":
        return status, stop_reason
    turn = state.get("turn", 0)
    visits = [v for v in state.get("visits", []) if v["turn"] == turn]
    why = non_answer(answer, message)
    failed_call = any(v["ended"] == "model_error" for v in visits)
    if failed_call and (why is not None or failed_calls_only(visits)):
        return "failed", stop_reason or why
    if why is not None and status == "succeeded":
        return "degraded", why
    return status, stop_reason
