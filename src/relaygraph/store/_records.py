"""What the ledger hands back: frozen snapshots of rows, never live ORM objects."""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Literal, TypeVar

from relaygraph.events import HandoffKind

R = TypeVar("R")

TaskStatus = Literal[
    "queued", "running", "interrupted", "succeeded", "degraded", "failed", "cancelled"
]
TASK_STATUSES: tuple[TaskStatus, ...] = (
    "queued",
    "running",
    "interrupted",
    "succeeded",
    "degraded",
    "failed",
    "cancelled",
)
FINISHED_STATUSES: frozenset[str] = frozenset({"succeeded", "degraded", "failed", "cancelled"})
ACTIVE_STATUSES: tuple[TaskStatus, ...] = ("queued", "running", "interrupted")
"""A task not yet finished: its thread's later tasks wait for it."""
"""Statuses a task does not leave: it has an answer or a reason it has none."""


UNLIMITED = None
"""A quota of no limit (``Quotas``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Quotas:
    """What one project may use of the service at once and per day; None: no limit."""

    max_running: int | None = None
    """Its tasks running at once; more stay queued while other projects' tasks run."""
    max_queued: int | None = 1000
    """Its tasks waiting (``queued``); a submission past it is refused."""
    daily_cost_usd: float | None = None
    """Its spend per UTC day in USD: past it submissions are refused and runs stop."""

    def overridden(self, overrides: QuotaOverrides) -> Quotas:
        """These quotas (the server's), with the operator's values for one project over them."""
        return Quotas(
            max_running=_first(overrides.max_running, self.max_running),
            max_queued=_first(overrides.max_queued, self.max_queued),
            daily_cost_usd=_first(overrides.daily_cost_usd, self.daily_cost_usd),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class QuotaOverrides:
    """The operator's quotas for one project (``relaygraph projects quota``); None: the
    server's setting applies (a different meaning from None in :class:`Quotas`)."""

    max_running: int | None = None
    max_queued: int | None = None
    daily_cost_usd: float | None = None


def _first(value: Any, default: Any) -> Any:
    return default if value is None else value


@dataclass(frozen=True, kw_only=True, slots=True)
class ProjectLoad:
    """What one project uses of the service now."""

    running: int
    """Its tasks ``running`` (a worker runs them, or is about to)."""
    queued: int
    """Its tasks ``queued``."""
    cost_today_usd: float
    """What its tasks' runs spent since 00:00 UTC today."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Project:
    """A tenant of the task service: every task and API key belongs to one."""

    id: str
    name: str
    created_at: datetime


@dataclass(frozen=True, kw_only=True, slots=True)
class ApiKey:
    """An API key as stored: its display prefix, never the key itself."""

    id: str
    project_id: str
    prefix: str
    """The key's first characters (``rg_`` and a few more), to tell keys apart in a list."""
    created_at: datetime
    revoked_at: datetime | None


@dataclass(frozen=True, kw_only=True, slots=True)
class Task:
    """One task: what was asked, how it ran, and how it ended."""

    id: str
    project_id: str
    input: str
    status: TaskStatus
    answer: str | None
    stop_reason: str | None
    policy: dict[str, Any] | None
    """The team policy the task ran under, as ``policies.policy_to_mapping`` writes it."""
    models: dict[str, Any]
    """The model spec each role runs on."""
    topology: dict[str, Any] | None
    """How the agents were arranged (``relaygraph.topology.Topology.to_mapping``); None
    for a task recorded before topologies existed, which ran the structured team."""
    team: dict[str, Any] | None
    """Which team definition ran it: ``name``, ``version``, ``digest`` and ``source`` (its
    file); None for a task recorded before teams were recorded (the built-in team)."""
    thread_id: str
    """The conversation, in the owning project's own namespace of thread ids."""
    checkpoint_thread: str
    """The LangGraph thread id its checkpoints live under (unique across projects)."""
    idempotency_key: str | None
    metadata: dict[str, Any]
    last_event_seq: int
    """Sequence number of the task's latest event; 0 before the first."""
    attempts: int
    """How many times a runner started running it (a restart after a crash counts). In the
    worker mode it is the fencing number of the latest attempt, and never goes back."""
    dispatch: int
    """How many times it was handed to the worker mode's queue (0: never)."""
    cancel_requested_at: datetime | None
    """When a cancel was asked for that its runner has not acted on yet."""
    replay_of: str | None = None
    """The task this one replays (``relaygraph replay``), of the same project; None for a
    task that is no replay."""
    from_step: int | None = None
    """The step of ``replay_of``'s trajectory the replay went on from: 0 from its request,
    N after its first N steps, whose tool calls did not run again."""
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime

    @property
    def finished(self) -> bool:
        return self.status in FINISHED_STATUSES


@dataclass(frozen=True, kw_only=True, slots=True)
class Attempt:
    """A worker's attempt at a task, as it began (``Ledger.start_attempt``)."""

    number: int
    """The attempt's number: the fencing number of every write of its run."""
    task: Task
    """The task as the attempt left it (``running``, held by the worker)."""
    fresh: bool
    """The task never ran before this attempt: it has no checkpoint of its own, so the run
    starts from its request without reading the thread's checkpoints to find out."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TeamVersion:
    """One version of a team a project registered: its definition and its digest."""

    project_id: str
    name: str
    version: int
    """From 1, per project and name; a push that changes the team makes the next."""
    definition: dict[str, Any]
    """The team file's content, as JSON."""
    digest: str
    """The team's digest (``relaygraph.team.Team.digest``)."""
    created_at: datetime


@dataclass(frozen=True, kw_only=True, slots=True)
class Event:
    """One thing that happened in a task, in order: ``seq`` counts from 1 per task."""

    task_id: str
    seq: int
    type: str
    """One of :data:`relaygraph.events.EVENT_TYPES` (older ledgers may hold others)."""
    agent: str | None
    data: dict[str, Any]
    """The event as the run emitted it, ``type`` included: one of the shapes of
    :mod:`relaygraph.events`."""
    created_at: datetime


@dataclass(frozen=True, kw_only=True, slots=True)
class HandoffEntry:
    """A handoff's ledger entry: the :class:`relaygraph.events.Handoff` (the one definition
    of a transfer) that a ``route`` or ``handoff`` event reported (``kind``, ``source``,
    ``target``, ``task``, ``reason``, ``step``; made into the row by ``store._derive``), where
    it was recorded, and the tokens spent when the work moved."""

    task_id: str
    seq: int
    """Order among the task's handoffs, from 1."""
    event_seq: int
    """The event that recorded it."""
    kind: HandoffKind
    source: str
    target: str
    task: str
    reason: str
    step: int | None
    """LangGraph super-step, when the event carried it."""
    checkpoint_ns: str | None
    """Checkpoint namespace of the node that handed off, when the event carried it."""
    tokens_so_far: int
    """Input plus output tokens the task's agents had used when the work moved."""
    created_at: datetime


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolCall:
    """One tool call by an agent, and its result once it came back."""

    id: int
    task_id: str
    agent: str
    tool: str
    tool_call_id: str | None
    args: dict[str, Any] | None
    status: str
    """``pending`` until the result arrives, then the tool message's ``success`` or ``error``."""
    result_preview: str | None
    created_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True, kw_only=True, slots=True)
class Approval:
    """A pause for a person: a tool waiting for approval, or a ping-pong decision."""

    id: int
    task_id: str
    interrupt_id: str | None
    """LangGraph's interrupt id: the id to resume with (the API's approval id)."""
    kind: str
    """``approval`` for a tool call, ``ping_pong`` for a loop the policy sends to a person."""
    agent: str | None
    tool: str | None
    tool_call_id: str | None
    args: dict[str, Any] | None
    """The arguments the agent asked to run the tool with."""
    request: dict[str, Any]
    """Everything the interrupt asked, as emitted."""
    requested_at: datetime
    decision: str | None
    """``approve``, ``reject`` or ``edit``; None while it waits."""
    decided_by: str | None
    decided_at: datetime | None
    reason: str | None
    edited_args: dict[str, Any] | None
    applied_at: datetime | None
    """When the resumed run acted on the decision."""

    @property
    def pending(self) -> bool:
        return self.decision is None


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentUsage:
    """What one role used over a whole task."""

    task_id: str
    agent: str
    model_calls: int
    tool_calls: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    seconds: float
    estimated: bool
    """True when some token counts were estimated because the provider reported none."""


@dataclass(frozen=True, kw_only=True, slots=True)
class EvalCaseRecord:
    """One run of one golden case in an eval run, as the ledger keeps it."""

    id: int
    eval_run_id: str
    case_id: str
    trial: int
    """Which run of the case, from 1 (``--repeat``)."""
    passed: bool
    checks: list[dict[str, Any]]
    """Every check: ``name``, ``passed``, ``expected``, ``actual`` (and ``message``)."""
    first_failure: dict[str, Any] | None
    """The first check that failed; None when the run passed."""
    usage: dict[str, Any]
    latency_seconds: float
    error: str | None
    """Why the case could not run at all."""
    task_id: str | None
    """The task the run was (``tasks.id``); None when the case failed before it had one."""
    created_at: datetime


@dataclass(frozen=True, kw_only=True, slots=True)
class EvalRunRecord:
    """One ``relaygraph eval`` run: the golden set, how it ran, its metrics and its cases."""

    id: str
    golden: str
    """The golden file's path."""
    models: dict[str, Any]
    """``{"model": spec or None, "agent_models": {role: spec}}``."""
    options: dict[str, Any]
    """How it ran: ``repeat``, ``concurrency``, ``tags``, ``baseline``."""
    case_count: int
    """Cases selected to run."""
    run_count: int
    """Case runs planned: cases times ``repeat``."""
    passed_case_count: int | None
    """Cases all of whose runs passed, among the recorded ones; None until finished."""
    passed_run_count: int | None
    pass_rate: float | None
    metrics: dict[str, Any] | None
    """The report's metrics; None until finished."""
    started_at: datetime
    finished_at: datetime | None
    """None while it runs, or if it was stopped before the end."""
    cases: tuple[EvalCaseRecord, ...] = ()
    """Each recorded run of each case, by case id then trial."""

    @property
    def finished(self) -> bool:
        return self.finished_at is not None


def snapshot(record: type[R], row: object, **overrides: Any) -> R:
    """A ``record`` holding ``row``'s values (each field read from the row's attribute)."""
    names = [f.name for f in fields(record)]  # type: ignore[arg-type]
    values = {name: getattr(row, name) for name in names if name not in overrides}
    return record(**values, **overrides)
