"""Reading the task's record in state: usage so far, earlier results, bars, violations; and
making the usage records, the one place a node run's usage is computed."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_stream_writer

from relaygraph._names import PRIOR_CALLS_KEY, REPLAYS_BY_POSITION, SUPERVISOR
from relaygraph.events import Usage, ViolationKind, event_sink, usage_event, violation_event
from relaygraph.policies import TeamPolicy
from relaygraph.policies.budget import UsageTotals
from relaygraph.policies.middleware import (
    VIOLATION_KEY,
    model_outputs,
    transcript_usage,
    usage_estimated,
)
from relaygraph.policies.pingpong import normalize_call
from relaygraph.supervisor._state import Bar, TeamState, Violation


def task_ns(config: RunnableConfig) -> str:
    """The running task's checkpoint namespace (``node:<task id>``): stable across re-runs."""
    return str(config.get("configurable", {}).get("checkpoint_ns") or "")


def step_of(config: RunnableConfig) -> int | None:
    step = config.get("metadata", {}).get("langgraph_step")
    return int(step) if step is not None else None


def replays_by_position(model: object) -> bool:
    """Whether ``model`` picks its replies by their position in its role's history
    (:data:`~relaygraph._names.REPLAYS_BY_POSITION`); decided when the graph is built."""
    return getattr(model, REPLAYS_BY_POSITION, False) is True


def call_config(
    config: RunnableConfig,
    state: TeamState,
    role: str,
    *,
    replays: bool,
    **configurable: Any,
) -> RunnableConfig:
    """The node's config for a model call of ``role``, plus ``configurable``. For a model
    that replays by position (``replays``), also how many model calls the role made earlier
    in the thread (:data:`~relaygraph._names.PRIOR_CALLS_KEY`, from its usage records);
    any other model is told nothing of it."""
    extra: dict[str, Any] = dict(configurable)
    metadata = config.get("metadata", {})
    if replays:
        prior = sum(u["model_calls"] for u in state.get("usage", []) if u["agent"] == role)
        extra[PRIOR_CALLS_KEY] = prior
        metadata = {**metadata, PRIOR_CALLS_KEY: prior}
    if not extra:
        return config
    return {
        **config,
        "configurable": {**config.get("configurable", {}), **extra},
        "metadata": metadata,
    }


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
        model_calls=totals.model_calls,
        tool_calls=totals.tool_calls,
        input_tokens=totals.input_tokens,
        output_tokens=totals.output_tokens,
        cost_usd=totals.cost_usd,
        seconds=totals.seconds,
        estimated=usage_estimated(replies),
    )


def announce_usage(record: Usage) -> Usage:
    """Send the usage record of a role that is no agent (an agent's goes in its
    ``agent_finished``) to the task's stream, where the ledger stores it; returns it."""
    (event_sink() or get_stream_writer())(usage_event(record))
    return record


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


def transcript_violations(transcript: list[BaseMessage], agent: str, turn: int) -> list[Violation]:
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
