"""How the team graph's runs look to a LangChain callback handler, for both tracers.

LangGraph reports every node run to callbacks with ``langgraph_node`` and
``langgraph_checkpoint_ns`` metadata. Under the graph's root run (the task) the team's
nodes run as its direct children: ``begin``, ``supervisor``, one run per agent visit, and
``finalize``. An agent visit runs the agent's own graph inside the node, so the model and
tool runs nest below it (``researcher:<id>|model:<id>`` in the namespace).

The team nodes return ``Command`` updates that carry the visit's records: its usage, the
violations and budget hits it recorded, and the handoff or route it made. Both tracers
read them from the node's output, so neither needs the runner's event stream.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast
from uuid import UUID

from langgraph.errors import GraphBubbleUp, GraphInterrupt, ParentCommand
from langgraph.types import Command

from relaygraph._names import BEGIN, FINALIZE, SUPERVISOR
from relaygraph.events import Handoff, Usage, handoff_attributes

__all__ = [
    "Handoff",
    "NodeRecords",
    "RunTree",
    "control_flow_kind",
    "handoff_attributes",
    "handoff_of",
    "interrupt_values",
    "is_control_flow",
    "node_records",
    "node_role",
    "response_model",
    "token_usage",
]

Role = Literal["supervisor", "agent", "finalize"]


def node_role(name: str) -> Role | None:
    """What a direct child of the task's run is: None for ``begin`` (no span of its own)."""
    if name == BEGIN:
        return None
    if name == SUPERVISOR:
        return "supervisor"
    if name == FINALIZE:
        return "finalize"
    return "agent"


def is_control_flow(error: BaseException) -> bool:
    """True for LangGraph's signals that travel as exceptions but are not failures.

    ``ParentCommand`` carries a handoff out of an agent's graph; ``GraphInterrupt`` pauses
    the task for a person; ``GraphDrained`` stops a run that was asked to stop (cancel,
    shutdown). Each passes through every run between where it was raised and where it is
    caught (langgraph-supervisor #40, langsmith-sdk #1127).
    """
    return isinstance(error, GraphBubbleUp)


def control_flow_kind(error: BaseException) -> str:
    """``handoff``, ``interrupt`` or ``drain`` (a run asked to stop at a step boundary)."""
    if isinstance(error, ParentCommand):
        return "handoff"
    if isinstance(error, GraphInterrupt):
        return "interrupt"
    return "drain" if type(error).__name__ == "GraphDrained" else type(error).__name__


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeRecords:
    """What one team node's output says happened in it."""

    goto: str | None = None
    handoffs: tuple[Handoff, ...] = ()
    """The transfers of work the node made: the records the team graph keeps (a span's
    attributes are made from one by :func:`handoff_attributes`)."""
    violations: tuple[Mapping[str, Any], ...] = ()
    usage: Usage | None = None
    """The node's usage record (one per node run), as the team graph computed it."""
    ended: str | None = None
    """How an agent visit ended: ``finished``, ``handed_off``, ``budget``."""
    status: str | None = None
    stop_reason: str | None = None


def _handoffs(update: Mapping[str, Any]) -> tuple[Handoff, ...]:
    """The handoff records a node's update carries (the team graph's own)."""
    return tuple(cast(Handoff, h) for h in update.get("handoffs") or [] if isinstance(h, Mapping))


def node_records(output: Any) -> NodeRecords:
    """Read a team node's output: a ``Command`` (supervisor, agents) or a dict (finalize)."""
    goto: str | None = None
    update: Any = output
    if isinstance(output, Command):
        goto = output.goto if isinstance(output.goto, str) else None
        update = output.update
    if not isinstance(update, Mapping):
        return NodeRecords(goto=goto)
    usage = [u for u in update.get("usage") or [] if isinstance(u, Mapping)]
    visits = [v for v in update.get("visits") or [] if isinstance(v, Mapping)]
    return NodeRecords(
        goto=goto,
        handoffs=_handoffs(update),
        violations=tuple(v for v in update.get("violations") or [] if isinstance(v, Mapping)),
        usage=cast(Usage, usage[-1]) if usage else None,
        ended=str(visits[-1].get("ended")) if visits else None,
        status=update.get("status"),
        stop_reason=update.get("stop_reason"),
    )


def handoff_of(value: Any) -> Handoff | None:
    """The handoff a ``transfer_to_<peer>`` tool returned, or a ``ParentCommand`` carries."""
    if isinstance(value, ParentCommand):
        value = value.args[0] if value.args else None
    if not isinstance(value, Command) or not isinstance(value.update, Mapping):
        return None
    records = _handoffs(value.update)
    return records[0] if records else None


def interrupt_values(error: BaseException) -> list[Any]:
    """What a ``GraphInterrupt`` waits for (approval requests, ping-pong decisions)."""
    if not isinstance(error, GraphInterrupt) or not error.args:
        return []
    return [getattr(i, "value", i) for i in error.args[0] or []]


def token_usage(response: Any) -> tuple[int, int] | None:
    """Input and output tokens of a model call's ``LLMResult``, if the model reported them."""
    input_tokens = output_tokens = 0
    found = False
    for generations in getattr(response, "generations", None) or []:
        for generation in generations:
            meta = getattr(getattr(generation, "message", None), "usage_metadata", None)
            if meta:
                input_tokens += int(meta.get("input_tokens", 0))
                output_tokens += int(meta.get("output_tokens", 0))
                found = True
    if not found:
        usage = (getattr(response, "llm_output", None) or {}).get("token_usage") or {}
        if usage:
            input_tokens = int(usage.get("prompt_tokens", 0))
            output_tokens = int(usage.get("completion_tokens", 0))
            found = True
    return (input_tokens, output_tokens) if found else None


def response_model(response: Any) -> str | None:
    """The model name the provider answered with, if it said."""
    for generations in getattr(response, "generations", None) or []:
        for generation in generations:
            meta = getattr(getattr(generation, "message", None), "response_metadata", None)
            if meta and meta.get("model_name"):
                return str(meta["model_name"])
    return None


@dataclass(kw_only=True, slots=True)
class RunTree:
    """The runs a handler has seen: who is whose parent, which run is the task, which the
    team's nodes. One handler serves one task run, so its first chain run is the task."""

    root: UUID | None = None
    parents: dict[UUID, UUID | None] = field(default_factory=dict)
    nodes: dict[UUID, str] = field(default_factory=dict)
    """The task's direct children (team nodes), by run id: their node name."""

    def start(self, run_id: UUID, parent_run_id: UUID | None, name: str | None) -> bool:
        """Note a chain run; True when it is the task's run or a team node's run."""
        self.parents[run_id] = parent_run_id
        if self.root is None:
            self.root = run_id
            return True
        if parent_run_id is not None and parent_run_id == self.root and name:
            self.nodes[run_id] = name
            return True
        return False

    def note(self, run_id: UUID, parent_run_id: UUID | None) -> None:
        """Note a model, tool or other run under the task."""
        self.parents[run_id] = parent_run_id

    def node_of(self, run_id: UUID | None) -> str | None:
        """The team node a run belongs to (the run itself or its nearest such ancestor)."""
        seen = 0
        while run_id is not None and seen < 1000:
            if run_id in self.nodes:
                return self.nodes[run_id]
            run_id = self.parents.get(run_id)
            seen += 1
        return None

    def forget(self, run_id: UUID) -> None:
        self.nodes.pop(run_id, None)
        if run_id != self.root:
            self.parents.pop(run_id, None)
