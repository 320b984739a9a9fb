"""Every event a task's run produces, and the records they carry: one definition per fact.

The team graph (``relaygraph.supervisor``), the agents' middleware and the runner emit
events to the run's sink (:func:`event_sink`: the runner's writer) or, where no runner set
one (LangGraph's dev server), on LangGraph's custom stream; the runner stores each in the
ledger exactly as it was emitted (``Event.data``), the API serves it, the CLI prints it,
and the ledger derives its handoff, tool-call, approval and usage rows from it. Each event
is a JSON object tagged by ``type``; each shape is defined here once, as a ``TypedDict``
with a ``Literal`` tag, and the producers build them with the constructors below (so key
order is one too).

The wire shape is the contract: stored events are read back years later, so a field is
added (``NotRequired``), never renamed.

Stdlib only (it imports nothing of relaygraph but :mod:`relaygraph._names`): every layer,
the ledger and the tracers included, may import it.
"""

# No ``from __future__ import annotations`` here: on Python 3.11 a TypedDict sees
# ``NotRequired`` only in an evaluated annotation.
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Literal, NotRequired, TypedDict, TypeVar, cast, get_args, get_type_hints

from relaygraph._names import FINISH, SUPERVISOR

__all__ = [
    "EVENT_SHAPES",
    "EVENT_TYPES",
    "INTERRUPT_TYPES",
    "PREVIEW_CHARS",
    "USAGE_AMOUNTS",
    "USAGE_COUNTS",
    "VIOLATION_KINDS",
    "AgentFinishedEvent",
    "AgentStartedEvent",
    "ApprovalEvent",
    "ApprovalRequest",
    "Assignment",
    "CancelRequestedEvent",
    "Event",
    "FinalEvent",
    "Handoff",
    "HandoffEvent",
    "HandoffKind",
    "InterruptedEvent",
    "ModelCallEvent",
    "ModelCallMessage",
    "ModelErrorEvent",
    "ModelRetryEvent",
    "PingPongRequest",
    "RouteEvent",
    "RunFinishedEvent",
    "RunStartedEvent",
    "RunSuspendedEvent",
    "StructuredMethodEvent",
    "TokenEvent",
    "ToolCallEvent",
    "ToolResultEvent",
    "TraceLinks",
    "Usage",
    "UsageEvent",
    "UsageFigures",
    "ViolationEvent",
    "ViolationKind",
    "VisitEnded",
    "agent_finished_event",
    "agent_started_event",
    "approval_event",
    "approval_request",
    "cancel_requested_event",
    "event_sink",
    "events_to",
    "final_event",
    "handoff_attributes",
    "handoff_event",
    "handoff_result",
    "interrupted_event",
    "is_carried_out",
    "model_call_event",
    "moved_work",
    "ping_pong_request",
    "record_handoff",
    "route_event",
    "run_finished_event",
    "run_started_event",
    "run_suspended_event",
    "token_event",
    "tool_call_event",
    "tool_result_event",
    "transfer_of",
    "usage_event",
    "violation_event",
]

# -- the records events carry ----------------------------------------------------------

HandoffKind = Literal["route", "direct"]
"""A supervisor's ``route``, or an agent's own (``direct``) handoff to a peer."""


class Assignment(TypedDict):
    """The work a transfer gives the next agent: who, what, why, and who asked.

    The team graph's state holds the one waiting (``TeamState.assignment``) and the steps a
    supervisor planned (``TeamState.plan``). When the work moves, the transfer is recorded as
    the :class:`Handoff` that :func:`record_handoff` makes from the assignment, so that the
    two never disagree.
    """

    agent: str
    """The agent that is to do the work (the handoff's ``target``)."""
    task: str
    reason: str
    source: str
    """``supervisor`` for routes, else the agent that handed off."""
    kind: HandoffKind


class Handoff(TypedDict):
    """One transfer of work: a supervisor's route to an agent, or an agent's handoff.

    The one definition of a handoff. The team graph's state holds it as it is
    (``TeamState.handoffs``, checkpointed); everything else is made from it here:
    :func:`handoff_event` and :func:`route_event` (the stream and the ledger's events),
    :func:`transfer_of` (reads it back from an event: the ledger's ``handoffs`` row and the
    timeline's node are made from that), :func:`handoff_result` (``RunResult.handoffs``)
    and :func:`handoff_attributes` (a trace span's attributes).

    It lives here rather than in ``relaygraph.handoffs`` because its readers sit in layers
    that may not import LangGraph: the ledger and the tracers may import only this base
    layer, while ``handoffs`` is the transfer tools themselves.
    """

    id: str
    """Stable across re-runs of a step: the tool call's id, or the routing node's namespace."""
    kind: HandoffKind
    source: str
    """``supervisor`` for routes, else the agent that handed off."""
    target: str
    task: str
    reason: str
    step: int | None
    """The team graph's super-step in which the transfer happened (set by the team graph)."""
    turn: int | None
    """Which request of the thread it belongs to (set by the team graph)."""


class UsageFigures(TypedDict):
    """What was spent: the figures a :class:`Usage` record carries.

    ``relaygraph.policies.budget.UsageTotals`` sums them and gives its sum back as one
    (``UsageTotals.figures``), so a record is made from a sum without naming each figure.
    """

    model_calls: int
    tool_calls: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    seconds: float
    """Wall-clock seconds spent running (waiting for a person's approval is not counted)."""


class Usage(UsageFigures):
    """Model and tool usage of one node execution (an agent visit, a routing decision).

    Computed once, where the team graph records it (``relaygraph.supervisor``); the run's
    result, the ledger's usage rows, the ``agent_finished`` event and the trace spans all
    read this record. Its keys come in the order ``id``, ``agent``, ``turn``, the figures,
    ``estimated``: the order its makers write them in.
    """

    id: str
    """The LangGraph task namespace that spent it: a re-run writes the same record again."""
    agent: str
    turn: int
    estimated: bool
    """True when some tokens were estimated because the provider reported none."""


USAGE_COUNTS: tuple[str, ...] = tuple(
    name for name, kind in get_type_hints(UsageFigures).items() if kind is int
)
"""The whole-number fields of a :class:`Usage` record."""
USAGE_AMOUNTS: tuple[str, ...] = tuple(
    name for name, kind in get_type_hints(UsageFigures).items() if kind is float
)
"""The fractional fields of a :class:`Usage` record (USD, wall-clock seconds)."""

ViolationKind = Literal[
    "tool_not_allowed",
    "handoff_not_allowed",
    "invalid_arguments",
    "ping_pong",
    "repeated_tool_call",
    "budget",
    "tool_unavailable",
]
"""What a violation was: the one list of kinds (golden sets and the dashboard use it too)."""
VIOLATION_KINDS: tuple[ViolationKind, ...] = get_args(ViolationKind)
"""The kinds of :data:`ViolationKind`, in order."""

VisitEnded = Literal["finished", "handed_off", "budget", "refused", "model_error"]
"""How an agent visit ended."""


class TraceLinks(TypedDict, total=False):
    """Where a run's trace is, when tracing is on: for links from the dashboard."""

    otel_trace_id: str
    """The OpenTelemetry trace id, 32 hex digits."""
    langsmith_run_id: str
    langsmith_url: str


# -- the events ------------------------------------------------------------------------


class RunStartedEvent(TypedDict):
    """A run of the task began (a resumed task has one per run)."""

    type: Literal["run_started"]
    task_id: str
    thread_id: str
    models: dict[str, str]
    """The model spec each role runs on."""
    topology: dict[str, Any]
    """How the agents are arranged (``Topology.to_mapping``)."""
    trace: NotRequired[TraceLinks]
    """Where the run's trace is; absent when tracing is off."""


class RouteEvent(TypedDict):
    """The supervisor's decision: an agent and its task, or ``FINISH``."""

    type: Literal["route"]
    step: int | None
    checkpoint_ns: str
    next: str
    """The agent that works next, or ``FINISH``."""
    task: str
    reason: str
    repaired: bool
    """The model's first reply was invalid and the repair prompt's was not."""
    fallback: bool
    """Both replies were invalid: the run finishes degraded."""
    error: str | None
    tokens_so_far: int
    """Input plus output tokens the agents had used when the route was decided."""
    carried_out: bool
    """False when a limit or a ping-pong stopped it: no work moved (see :func:`moved_work`)."""


class HandoffEvent(TypedDict):
    """An agent handed its work straight to a peer."""

    type: Literal["handoff"]
    step: int | None
    checkpoint_ns: str
    source: str
    target: str
    task: str
    reason: str
    tokens_so_far: int
    carried_out: bool
    """False when a ping-pong stopped it: no work moved (see :func:`moved_work`)."""


class AgentStartedEvent(TypedDict):
    type: Literal["agent_started"]
    agent: str
    task: str
    source: str
    """Who gave the task: ``supervisor``, ``user`` (a swarm's first agent) or a peer."""


class AgentFinishedEvent(TypedDict):
    type: Literal["agent_finished"]
    agent: str
    ended: VisitEnded
    output: str
    usage: Usage
    """The visit's usage record, as the team graph recorded it."""


class UsageEvent(TypedDict):
    """A usage record of a role that is no agent (a supervisor's decision, finalize's
    answer), as the team graph recorded it; an agent's comes in its ``agent_finished``.

    The ledger stores each record by its id: a record sent again (its node ran again, or a
    tool-calling supervisor's record grew by a call) replaces the one it had."""

    type: Literal["usage"]
    usage: Usage


class ToolCallEvent(TypedDict):
    type: Literal["tool_call"]
    agent: str
    tool: str
    args: dict[str, Any]
    tool_call_id: str | None


PREVIEW_CHARS = 300
"""How much of a tool's result a ``tool_result`` event keeps: a preview this long was cut
(the timeline says so), and the rest of the result is in no record."""


class ToolResultEvent(TypedDict):
    type: Literal["tool_result"]
    agent: str
    tool: str
    tool_call_id: str | None
    status: str
    """The tool message's ``success`` or ``error``."""
    ran: bool
    """False for a call refused or rejected before it ran."""
    preview: str
    """The result's first :data:`PREVIEW_CHARS` characters; the rest is in no record."""


class ViolationEvent(TypedDict):
    """Something the policy refused or stopped, as it happened."""

    type: Literal["violation"]
    agent: str | None
    kind: ViolationKind
    detail: str
    budget: NotRequired[dict[str, Any]]
    """The limit a tool call was refused at (``BudgetHit.to_json()``), for a budget."""


class ApprovalEvent(TypedDict):
    """A resumed run acted on a person's decision about a tool call."""

    type: Literal["approval"]
    agent: str
    tool: str
    decision: str | None
    """``approve``, ``reject`` or ``edit``."""
    reason: str | None
    tool_call_id: NotRequired[str | None]
    """The call decided on (events recorded before it was carried have none)."""
    args: NotRequired[dict[str, Any]]
    """For an ``edit``: the arguments the call ran with, a person's rather than the model's
    (the call's ``tool_call`` event and the approval request hold the model's)."""


class InterruptedEvent(TypedDict):
    """The run paused for a person: an :class:`ApprovalRequest` or a
    :class:`PingPongRequest`, with LangGraph's interrupt id (the id to resume with)."""

    type: Literal["interrupted"]
    id: str
    waits_for: str | None
    """The request's own ``type``: ``approval`` or ``ping_pong``."""
    agent: NotRequired[str]
    tool: NotRequired[str]
    args: NotRequired[dict[str, Any]]
    tool_call_id: NotRequired[str | None]
    step: NotRequired[int | None]
    detail: NotRequired[str]
    agents: NotRequired[list[str]]
    next: NotRequired[str]
    source: NotRequired[str]
    value: NotRequired[Any]
    """An interrupt whose value was not an object."""


class FinalEvent(TypedDict):
    """The team's answer (None when ``on_exhausted = "fail"`` stopped it)."""

    type: Literal["final"]
    status: str
    answer: str | None
    stop_reason: str | None


class TokenEvent(TypedDict):
    """A piece of a model's streamed text (``stream_tokens``)."""

    type: Literal["token"]
    role: str | None
    text: str


class RunSuspendedEvent(TypedDict):
    """The run stopped at a step boundary to be continued elsewhere (shutdown, lost lease)."""

    type: Literal["run_suspended"]
    reason: str | None


class CancelRequestedEvent(TypedDict):
    """Someone asked to cancel the task: recorded by the ledger as it takes the request,
    before the run stops (at once when no runner holds the task)."""

    type: Literal["cancel_requested"]
    by: str
    """Who asked: the project whose key or dashboard session sent the cancel."""
    via: str
    """Where the cancel came from: ``api``, ``dashboard`` or ``cli``."""


class RunFinishedEvent(TypedDict):
    type: Literal["run_finished"]
    status: str
    stop_reason: str | None


class ModelCallMessage(TypedDict):
    """One message of a model call, as the ``model_call`` event keeps it."""

    role: str
    """``system``, ``human``, ``ai`` or ``tool`` (LangChain's message type)."""
    content: str
    """The message's text, cut to the recording's limit (see ``ModelCallEvent.truncated``)."""
    tool_calls: NotRequired[list[dict[str, Any]]]
    """An AI message's tool calls: ``name`` and ``args``."""


class ModelCallEvent(TypedDict):
    """One model call: what the model saw, what it answered, and what the call spent.

    ``usage`` is the call's own :class:`Usage` record (one model call), computed by the one
    function that computes every usage figure; its ``id`` is the visit's record id plus
    ``#`` and the call's run id. The ledger stores it beside the visit's records so that a
    visit in progress shows its spend, and drops it when the visit's own record (the id
    before ``#``) lands: nothing is counted twice.
    """

    type: Literal["model_call"]
    role: str
    """The role that made the call: an agent, ``supervisor`` or ``finalize``."""
    visit: str
    """The usage record id of the node run that made it (``agent:<task id>``)."""
    model: str
    """The model's name as the provider reported it (empty when it said none)."""
    messages: list[ModelCallMessage]
    """The messages the model saw; empty when the recording keeps no messages."""
    reply: ModelCallMessage | None
    """What it answered; None when the recording keeps no messages."""
    usage: Usage
    truncated: bool
    """Some message's text was cut to the recording's limit, or messages were left out."""
    redacted: bool
    """The recording keeps no messages (``RELAYGRAPH_MODEL_CALL_MESSAGES=false``)."""


class ModelErrorEvent(TypedDict):
    """A model call failed after the client's retries."""

    type: Literal["model_error"]
    role: str
    model: str
    status: int | None
    """The HTTP status, when the server answered."""
    error: str
    attempts: int


class ModelRetryEvent(TypedDict):
    """A model call is retried."""

    type: Literal["model_retry"]
    role: str
    model: str
    attempt: int
    status: int | None
    error: str
    wait_seconds: float
    retry_after: float | None


class StructuredMethodEvent(TypedDict):
    """A server refused some structured-output methods; this one is used from now on."""

    type: Literal["structured_method"]
    role: str
    model: str
    base_url: str
    method: str
    rejected: dict[str, str]
    """Each refused method and why."""


Event = (
    RunStartedEvent
    | RouteEvent
    | HandoffEvent
    | AgentStartedEvent
    | AgentFinishedEvent
    | UsageEvent
    | ToolCallEvent
    | ToolResultEvent
    | ViolationEvent
    | ApprovalEvent
    | InterruptedEvent
    | FinalEvent
    | TokenEvent
    | RunSuspendedEvent
    | CancelRequestedEvent
    | RunFinishedEvent
    | ModelCallEvent
    | ModelErrorEvent
    | ModelRetryEvent
    | StructuredMethodEvent
)
"""Any event of a task's run."""

EVENT_SHAPES: Mapping[str, type] = {
    get_args(get_type_hints(shape)["type"])[0]: shape for shape in get_args(Event)
}
"""Each event's ``type`` and its ``TypedDict``."""
EVENT_TYPES: tuple[str, ...] = tuple(EVENT_SHAPES)
"""Every event type, in the order a run meets them."""


# -- what an interrupt asks a person ---------------------------------------------------


class ApprovalRequest(TypedDict):
    """The interrupt an approval tool pauses on."""

    type: Literal["approval"]
    agent: str
    tool: str
    args: dict[str, Any]
    tool_call_id: str | None
    step: int | None
    """The team graph's super-step of the visit."""


class PingPongRequest(TypedDict):
    """The interrupt a ping-pong pauses on when the policy sends it to a person."""

    type: Literal["ping_pong"]
    detail: str
    agents: list[str]
    next: str
    """The agent the stopped transfer would have gone to."""
    source: str


INTERRUPT_TYPES = ("approval", "ping_pong")
"""What an ``interrupted`` event may wait for."""


# -- building an event -----------------------------------------------------------------

_Shape = TypeVar("_Shape")


def _layout(shape: type) -> tuple[str, tuple[str, ...]]:
    """A shape's ``type`` tag and its other fields, in the order it declares them."""
    hints = get_type_hints(shape)
    return get_args(hints["type"])[0], tuple(key for key in hints if key != "type")


_LAYOUTS: Mapping[type, tuple[str, tuple[str, ...]]] = {
    shape: _layout(shape) for shape in (*get_args(Event), ApprovalRequest, PingPongRequest)
}
"""Each shape a constructor builds: its tag and its fields (worked out once, not per event)."""


def _event(
    shape: type[_Shape], fields: Mapping[str, Any], *, omit_none: Collection[str] = ()
) -> _Shape:
    """The event (or interrupt request) of ``shape`` that holds ``fields``: its ``type`` tag
    first, then each field the shape declares that ``fields`` has, in the order the shape
    declares them, so that every event's keys come in one order.

    A constructor passes its arguments (``locals()``), which are named as the shape's
    fields: the shape alone says which keys an event has and in what order, and a
    constructor says only how an argument differs from its field.

    Args:
        shape: The event's ``TypedDict``.
        fields: Its values, by field name; names the shape does not declare are not read.
        omit_none: Optional (``NotRequired``) fields that the event leaves out, rather than
            holding None, when ``fields`` has None for them.
    """
    tag, keys = _LAYOUTS[shape]
    event: dict[str, Any] = {"type": tag}
    for key in keys:
        if key in fields and not (key in omit_none and fields[key] is None):
            event[key] = fields[key]
    return cast(_Shape, event)


# -- handoffs --------------------------------------------------------------------------


def is_carried_out(event: Mapping[str, Any]) -> bool:
    """Whether a ``route`` or ``handoff`` event was carried out: a route or handoff that a
    limit or a ping-pong stopped says ``carried_out: false``; events stored before the
    field existed were all carried out."""
    return event.get("carried_out") is not False


def transfer_of(event: Mapping[str, Any]) -> Handoff | None:
    """The transfer of work a ``route`` or ``handoff`` event reports, carried out or not;
    None for a route to ``FINISH`` (finishing moves no work) and for other events.

    ``id`` is the node run's namespace and ``turn`` is unknown (events do not say).
    """
    kind = event.get("type")
    target: object
    source: object
    if kind == "route":
        target, source = event.get("next"), SUPERVISOR
        if target is None or target == FINISH:
            return None
    elif kind == "handoff":
        target, source = event.get("target"), event.get("source")
    else:
        return None
    step, ns = event.get("step"), event.get("checkpoint_ns")
    return Handoff(
        id=ns if isinstance(ns, str) else "",
        kind="route" if kind == "route" else "direct",
        source=_text(source),
        target=_text(target),
        task=_text(event.get("task")),
        reason=_text(event.get("reason")),
        step=step if isinstance(step, int) and not isinstance(step, bool) else None,
        turn=None,
    )


def moved_work(event: Mapping[str, Any]) -> Handoff | None:
    """The transfer an event reports if it moved work: a route to an agent or a handoff,
    carried out. A route to ``FINISH`` moves none, nor does one a limit or a ping-pong
    stopped (it is not among the task's handoffs)."""
    return transfer_of(event) if is_carried_out(event) else None


def handoff_event(
    handoff: Handoff, *, checkpoint_ns: str, tokens_so_far: int, carried_out: bool
) -> HandoffEvent:
    """The ``handoff`` event of an agent's own handoff: the handoff's fields and these."""
    return _event(HandoffEvent, {**handoff, **locals()})


def route_event(
    *,
    next: str,
    task: str,
    reason: str,
    step: int | None,
    checkpoint_ns: str,
    tokens_so_far: int,
    carried_out: bool,
    repaired: bool = False,
    fallback: bool = False,
    error: str | None = None,
) -> RouteEvent:
    """The ``route`` event of a supervisor's decision (to an agent, or ``FINISH``)."""
    return _event(RouteEvent, locals())


def record_handoff(
    assignment: Assignment, *, id: str, step: int | None = None, turn: int | None = None
) -> Handoff:
    """The record of the transfer that gives ``assignment``: where it happened (``id``, the
    team graph's ``step`` and ``turn``) added to the assignment's fields."""
    return Handoff(
        id=id,
        kind=assignment["kind"],
        source=assignment["source"],
        target=assignment["agent"],
        task=assignment["task"],
        reason=assignment["reason"],
        step=step,
        turn=turn,
    )


def handoff_result(handoff: Handoff) -> dict[str, str]:
    """A ``RunResult.handoffs`` entry: ``kind``, ``from``, ``to``, ``task``, ``reason``."""
    return {
        "kind": handoff["kind"],
        "from": handoff["source"],
        "to": handoff["target"],
        "task": handoff["task"],
        "reason": handoff["reason"],
    }


def handoff_attributes(handoff: Mapping[str, Any], prefix: str) -> dict[str, str]:
    """A trace span's attributes for a handoff: ``<prefix>.from``, ``.to``, ``.task``,
    ``.reason``."""
    return {
        f"{prefix}.from": _text(handoff.get("source")),
        f"{prefix}.to": _text(handoff.get("target")),
        f"{prefix}.task": _text(handoff.get("task")),
        f"{prefix}.reason": _text(handoff.get("reason")),
    }


def _text(value: object) -> str:
    return "" if value is None else str(value)


# -- the other constructors --------------------------------------------------------------


def run_started_event(
    *,
    task_id: str,
    thread_id: str,
    models: dict[str, str],
    topology: dict[str, Any],
    trace: TraceLinks | None = None,
) -> RunStartedEvent:
    """The ``run_started`` event; ``trace`` only when some tracer traces the run (an empty
    one says nothing)."""
    trace = trace or None
    return _event(RunStartedEvent, locals(), omit_none=("trace",))


def agent_started_event(agent: str, *, task: str, source: str) -> AgentStartedEvent:
    return _event(AgentStartedEvent, locals())


def agent_finished_event(
    agent: str, *, ended: VisitEnded, output: str, usage: Usage
) -> AgentFinishedEvent:
    return _event(AgentFinishedEvent, locals())


def usage_event(usage: Usage) -> UsageEvent:
    return _event(UsageEvent, locals())


def tool_call_event(
    agent: str, *, tool: str, args: dict[str, Any], tool_call_id: str | None
) -> ToolCallEvent:
    return _event(ToolCallEvent, locals())


def tool_result_event(
    agent: str, *, tool: str, tool_call_id: str | None, status: str, ran: bool, result: str
) -> ToolResultEvent:
    """The event of a tool's result, its text cut to :data:`PREVIEW_CHARS`."""
    return _event(ToolResultEvent, {**locals(), "preview": result[:PREVIEW_CHARS]})


def violation_event(
    agent: str | None,
    kind: ViolationKind,
    detail: str,
    *,
    budget: dict[str, Any] | None = None,
) -> ViolationEvent:
    """The ``violation`` event; ``budget`` only for a refusal at a limit."""
    return _event(ViolationEvent, locals(), omit_none=("budget",))


def approval_request(
    agent: str, *, tool: str, args: dict[str, Any], tool_call_id: str | None, step: int | None
) -> ApprovalRequest:
    return _event(ApprovalRequest, locals())


def ping_pong_request(*, detail: str, agents: list[str], next: str, source: str) -> PingPongRequest:
    return _event(PingPongRequest, locals())


def approval_event(
    agent: str,
    *,
    tool: str,
    decision: str | None,
    reason: str | None,
    tool_call_id: str | None = None,
    args: dict[str, Any] | None = None,
) -> ApprovalEvent:
    """The ``approval`` event; ``args`` only for an edit (the arguments the call ran with)."""
    return _event(ApprovalEvent, locals(), omit_none=("args",))


def interrupted_event(pending: Mapping[str, Any]) -> InterruptedEvent:
    """The ``interrupted`` event of one pending interrupt: ``{"id": ..., **its value}``."""
    event: Any = {**pending, "type": "interrupted", "waits_for": pending.get("type")}
    return event


def model_call_event(
    role: str,
    *,
    visit: str,
    model: str,
    messages: list[ModelCallMessage],
    reply: ModelCallMessage | None,
    usage: Usage,
    truncated: bool,
    redacted: bool,
) -> ModelCallEvent:
    return _event(ModelCallEvent, locals())


def final_event(status: str, answer: str | None, stop_reason: str | None) -> FinalEvent:
    return _event(FinalEvent, locals())


def token_event(role: str | None, text: str) -> TokenEvent:
    return _event(TokenEvent, locals())


def run_suspended_event(reason: str | None) -> RunSuspendedEvent:
    return _event(RunSuspendedEvent, locals())


def cancel_requested_event(*, by: str, via: str) -> CancelRequestedEvent:
    return _event(CancelRequestedEvent, locals())


def run_finished_event(status: str, stop_reason: str | None) -> RunFinishedEvent:
    return _event(RunFinishedEvent, locals())


_SINK: ContextVar[Callable[[Any], None] | None] = ContextVar("relaygraph_event_sink", default=None)


def event_sink() -> Callable[[Any], None] | None:
    """Where the run in progress on this thread takes its events, when its runner said
    (:func:`events_to`); None: they go on LangGraph's custom stream, as anywhere else.

    Every producer sends through ``event_sink() or <LangGraph's stream writer>``. The
    runner's own runs give a sink because a graph streamed with ``custom`` (or
    ``subgraphs``) runs every node on a thread of LangGraph's pool, with a second one
    waiting for the stream, and hands each event across threads to the loop that yields
    it: three hand-overs of the interpreter per event and per step, each a wait behind
    the other runs of a busy server. With a sink, the graph runs each step on the run's
    own thread (LangGraph's single-task path) and an event is a queue put
    (benchmarks/RESULTS.md, the task service).
    """
    return _SINK.get()


@contextmanager
def events_to(sink: Callable[[Any], None] | None) -> Iterator[None]:
    """While in the block, the events of the graph run on this thread (and of the threads
    it starts: LangGraph copies the context to them) go to ``sink``, in the order they
    are produced; None: on LangGraph's stream (a run inside another run's tool)."""
    token = _SINK.set(sink)
    try:
        yield
    finally:
        _SINK.reset(token)
