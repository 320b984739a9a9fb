"""The usage records in the team's state: the one place a node run's usage is computed
(:func:`usage_record`), sent (:func:`announce_usage`) and summed for the budgets."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from langchain_core.messages import BaseMessage
from langgraph.config import get_stream_writer

from relaygraph._names import SUPERVISOR
from relaygraph.events import Usage, event_sink, usage_event
from relaygraph.policies import TeamPolicy
from relaygraph.policies.budget import UsageTotals
from relaygraph.policies.middleware import model_outputs, transcript_usage, usage_estimated
from relaygraph.supervisor._refusals import transcript_violations
from relaygraph.supervisor._state import TeamState

__all__ = ["agent_tokens", "announce_usage", "in_flight_records", "turn_usage", "usage_record"]


def turn_usage(state: TeamState, role: str | None = None) -> UsageTotals:
    turn = state.get("turn", 0)
    return UsageTotals.of(
        u
        for u in state.get("usage", [])
        if u["turn"] == turn and (role is None or u["agent"] == role)
    )


def agent_tokens(state: TeamState, agents: Iterable[str]) -> int:
    """Input plus output tokens the agents spent on the current request, as recorded in
    state: a handoff's ``tokens_so_far``, exact however the ledger's rows stand."""
    names = set(agents)
    turn = state.get("turn", 0)
    return sum(
        u["input_tokens"] + u["output_tokens"]
        for u in state.get("usage", [])
        if u["turn"] == turn and u["agent"] in names
    )


def usage_record(
    id: str, role: str, turn: int, totals: UsageTotals, replies: list[BaseMessage]
) -> Usage:
    """The usage record of one node run: ``totals`` (from
    :func:`~relaygraph.policies.middleware.replies_usage`) for ``role``, estimated when some
    reply's tokens were."""
    return Usage(
        id=id,
        agent=role,
        turn=turn,
        **totals.figures(),
        estimated=usage_estimated(replies),
    )


def announce_usage(record: Usage) -> Usage:
    """Send the usage record of a role that is no agent (an agent's goes in its
    ``agent_finished``) to the task's stream, where the ledger stores it; returns it."""
    (event_sink() or get_stream_writer())(usage_event(record))
    return record


def in_flight_records(
    snapshot: Any, policy: TeamPolicy
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """What the nodes still in progress spent and refused so far, as (usage, violations).

    A task paused for a person, cancelled, suspended or failed mid-visit has made model and
    tool calls that no visit record holds yet; so has a tool-calling supervisor whose run
    has not left its own graph. Each is read from the pending task's own state (``snapshot``
    is the team's, taken with ``subgraphs=True``; the task's namespace is the node's name
    and task id, in every topology); the finished node's records replace these on a later
    run, so nothing is counted twice. A visit's usage so far is the record the agent node
    will make of it (:func:`usage_record`), computed the
    same way from the transcript so far.
    """
    usage: list[dict[str, Any]] = []
    violations: list[dict[str, Any]] = []
    for pending in snapshot.tasks:
        if pending.name not in (*policy.agents, SUPERVISOR):
            continue
        ns = f"{pending.name}:{pending.id}"
        # Read through the graph, not from the raw checkpoint: the records are delta
        # channels, which a checkpoint does not hold.
        values = getattr(pending.state, "values", None)
        if not values:  # Not a graph of its own (the structured supervisor), or no step yet.
            continue
        if pending.name == SUPERVISOR:  # The tool supervisor: its records of this run.
            usage += [u for u in values.get("usage") or [] if str(u["id"]).startswith(ns)]
            violations += [v for v in values.get("violations") or [] if str(v["id"]).startswith(ns)]
            continue
        messages = list(values.get("messages") or [])
        totals = transcript_usage(messages, policy)
        record = usage_record(ns, pending.name, 0, totals, model_outputs(messages))
        usage.append(dict(record))
        violations += [dict(v) for v in transcript_violations(messages, pending.name, 0)]
    return usage, violations
