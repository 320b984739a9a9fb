"""The team graph's state: what the supervisor, the agents and finalize share."""

from __future__ import annotations

from typing import Annotated, Literal, TypedDict

from langchain_core.messages import AnyMessage
from langgraph.channels import DeltaChannel
from langgraph.graph.message import add_messages
from langgraph.managed import RemainingSteps

from relaygraph.events import Handoff, Usage, ViolationKind, VisitEnded
from relaygraph.handoffs import Assignment, merge_batch_by_id

__all__ = [
    "Bar",
    "Status",
    "SwarmTeamState",
    "TeamState",
    "ToolsTeamState",
    "Usage",
    "Violation",
    "ViolationKind",
    "Visit",
    "ending_status",
]

Status = Literal["succeeded", "degraded", "failed", "interrupted"]


class Visit(TypedDict):
    """One run of an agent on one task."""

    id: str
    agent: str
    turn: int
    task: str
    source: str
    """Who gave the task: ``supervisor`` or the agent that handed off."""
    output: str
    ended: VisitEnded
    tools: list[str]
    messages: list[AnyMessage]
    """The visit's transcript, every tool call answered; kept for audit, never re-sent."""


class Violation(TypedDict):
    """Something the policy refused or stopped: a disallowed tool, a transfer with invalid
    arguments, a budget, a ping-pong."""

    id: str
    turn: int
    agent: str
    kind: ViolationKind
    detail: str


class Bar(TypedDict):
    """The supervisor may not send work to ``agent`` (after ``after``, when set) this turn."""

    agent: str
    after: str | None
    reason: str


class TeamState(TypedDict, total=False):
    """State of the team graph. Every list two nodes or a re-run may write merges by id."""

    messages: Annotated[list[AnyMessage], add_messages]
    """The conversation of the thread: the user's requests and the team's answers."""
    request: str
    """The current user request."""
    turn: int
    """How many requests this thread has received; scopes visits and limits to a request."""
    turn_step: int
    """The team graph's step at which the current request began (``begin``)."""
    assignment: Assignment | None
    """The work waiting for the next agent."""
    plan: list[Assignment]
    """The steps the supervisor planned after the current one (its route's ``then``), run
    in order without a supervisor call while each visit finishes with a result."""
    visits: Annotated[list[Visit], DeltaChannel(merge_batch_by_id)]
    handoffs: Annotated[list[Handoff], DeltaChannel(merge_batch_by_id)]
    """Every transfer of work, carried out (a stopped one moved no work)."""
    usage: Annotated[list[Usage], DeltaChannel(merge_batch_by_id)]
    """One record per node run that spent: the only place usage is computed."""
    violations: Annotated[list[Violation], DeltaChannel(merge_batch_by_id)]
    barred: list[Bar]
    """Routes the supervisor may not take in this turn, with the reason, told to it."""
    answer: str | None
    status: Status | None
    """Set only by what degrades or ends a run early (a stop, a budget, a failure); a run
    that reaches its end without one succeeded (:func:`ending_status`)."""
    stop_reason: str | None


def ending_status(state: TeamState) -> Status:
    """The status a run ends with: what degraded or stopped it set one; else it succeeded
    (whether it did real work is the runner's check, ``honest_status``)."""
    return state.get("status") or "succeeded"


class SwarmTeamState(TeamState, total=False):
    """The swarm's state: the team's, plus the agent a new request goes to."""

    active_agent: str | None
    """The agent that was active last; langgraph-swarm's router sends the next request to it."""


class ToolsTeamState(TeamState, total=False):
    """The tool-calling supervisor's state: the team's, plus what its prebuilt agent needs."""

    remaining_steps: RemainingSteps
    """Steps left before the recursion limit (required by LangGraph's prebuilt agent)."""
    call_started: float
    """When the supervisor's current model call started (wall clock), for its usage."""
    supervisor_step: int
    """The team graph's step the supervisor runs in next (its own graph has its own steps)."""
