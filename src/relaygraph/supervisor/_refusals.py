"""What the team refuses, as its state records it: violations, the agents barred from
the next route, and the results of earlier tool calls (a repeat of one is refused)."""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langgraph.config import get_stream_writer

from relaygraph.events import ViolationKind, event_sink, violation_event
from relaygraph.policies.middleware import VIOLATION_KEY
from relaygraph.policies.pingpong import normalize_call
from relaygraph.supervisor._state import Bar, TeamState, Violation

__all__ = [
    "add_bar",
    "announce_violation",
    "bars_now",
    "earlier_results",
    "transcript_violations",
    "violation",
]


def violation(
    id: str, turn: int, agent: str, kind: ViolationKind, detail: str, *, announce: bool = True
) -> Violation:
    """A violation record, and its live event unless it was announced already (a tool call
    refused at the same limit sent it when it happened)."""
    record = Violation(id=id, turn=turn, agent=agent, kind=kind, detail=detail)
    if announce:
        announce_violation(record)
    return record


def announce_violation(record: Violation) -> None:
    """Send a violation's live event."""
    (event_sink() or get_stream_writer())(
        violation_event(record["agent"], record["kind"], record["detail"])
    )


def transcript_violations(
    transcript: Sequence[BaseMessage], agent: str, turn: int
) -> list[Violation]:
    """Violations the agent's middleware recorded on messages (events were sent then)."""
    found = []
    for message in transcript:
        record = message.additional_kwargs.get(VIOLATION_KEY)
        if record:
            key = getattr(message, "tool_call_id", None) or message.id or ""
            found.append(
                Violation(
                    id=f"{key}:{record['kind']}",
                    turn=turn,
                    agent=agent,
                    kind=record["kind"],
                    detail=record["detail"],
                )
            )
    return found


def bars_now(state: TeamState, last_agent: str | None) -> dict[str, str]:
    """Agents the supervisor may not route to now, with the reason."""
    barred: dict[str, str] = {}
    for bar in state.get("barred", []):
        if bar["after"] is None or bar["after"] == last_agent:
            barred.setdefault(bar["agent"], bar["reason"])
    return barred


def add_bar(state: TeamState, agent: str, reason: str, after: str | None = None) -> list[Bar]:
    return [*state.get("barred", []), Bar(agent=agent, after=after, reason=reason)]


def earlier_results(state: TeamState, agent: str) -> dict[str, str]:
    """Results of ``agent``'s executed tool calls in earlier visits for this request."""
    turn = state.get("turn", 0)
    results: dict[str, str] = {}
    for visit in state.get("visits", []):
        if visit["agent"] != agent or visit["turn"] != turn:
            continue
        answers = {
            m.tool_call_id: m
            for m in visit["messages"]
            if isinstance(m, ToolMessage) and VIOLATION_KEY not in m.additional_kwargs
        }
        for message in visit["messages"]:
            if isinstance(message, AIMessage):
                for call in message.tool_calls:
                    if call["id"] in answers:
                        key = normalize_call(call["name"], call["args"])
                        results.setdefault(key, str(answers[call["id"]].content))
    return results
