"""Request and response bodies of the API (pydantic: the HTTP boundary)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from relaygraph.events import EVENT_TYPES
from relaygraph.runner import POLICY_SOURCE_KEY
from relaygraph.store import Approval, HandoffEntry, Task, unstorable

_Model = TypeVar("_Model", bound=BaseModel)

MAX_BODY_DEPTH = 32
"""How deeply a request body may nest (``metadata``, ``policy``, an edit's ``args``)."""


def shown(text: str) -> str:
    """``text`` as an error message may quote it: a lone surrogate becomes its escape."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _read_record(model: type[_Model], record: object, **overrides: Any) -> _Model:
    """The ledger's ``record`` as the API answers it: each field of ``model`` read from the
    record's attribute of the same name, but those the API shows otherwise (``overrides``).

    The ledger's records (``relaygraph.store``) are frozen dataclasses the API may not
    expose as they are: the response models are the HTTP contract, and they name, leave
    out or reshape some fields.
    """
    values = {
        field.alias or name: overrides[name] if name in overrides else getattr(record, name)
        for name, field in model.model_fields.items()
    }
    return model.model_validate(values)


def _refuse(field: str, problem: str) -> PydanticCustomError:
    # The field travels in the context: the error handler names it (a model validator's
    # own location is the whole body).
    return PydanticCustomError("invalid_text", "{problem}", {"field": field, "problem": problem})


def check_json_text(value: Any, field: str = "", depth: int = 0) -> None:
    """Refuse what JSON can carry but the ledger cannot store, naming the field: a NUL or
    a lone surrogate in any string or key, a non-finite number, or nesting deeper than
    :data:`MAX_BODY_DEPTH`.

    Raises:
        PydanticCustomError: ``invalid_text``, with the field (``metadata.ticket``) in its
            context; a bad key is named by the object that holds it.
    """
    where = field or "body"
    if isinstance(value, str):
        if (problem := unstorable(value)) is not None:
            raise _refuse(where, f"{where} {shown(repr(value))[:120]} {problem}")
    elif isinstance(value, float) and not math.isfinite(value):
        raise _refuse(where, f"{where} is {value!r}, not a finite number")
    elif isinstance(value, dict | list) and depth >= MAX_BODY_DEPTH:
        raise _refuse(where, f"{where} nests deeper than {MAX_BODY_DEPTH} levels")
    elif isinstance(value, dict):
        for key, item in value.items():
            if (problem := unstorable(key)) is not None:
                raise _refuse(
                    where, f"{where} has the key {shown(repr(key))[:120]}, which {problem}"
                )
            check_json_text(item, f"{field}.{key}" if field else key, depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_json_text(item, f"{where}[{index}]", depth + 1)


class _RequestBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        check_json_text(data)
        return data


SSE_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "One Server-Sent Event, as an EventSource client reads it.",
    "required": ["id", "event", "data"],
    "properties": {
        "id": {
            "type": "string",
            "pattern": "^[1-9][0-9]*$",
            "description": "The event's sequence number in its task: 1, 2, 3, ... with no gaps.",
        },
        "event": {
            "type": "string",
            "description": "The event's type: " + ", ".join(EVENT_TYPES) + ".",
        },
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": {
                "type": "object",
                "required": ["type"],
                "properties": {"type": {"type": "string"}},
            },
            "description": "The event as JSON; its `type` is the event's type.",
        },
    },
}
"""What each event of ``GET /v1/tasks/{id}/events`` looks like (the OpenAPI schema of one
``text/event-stream`` item)."""


class ErrorDetail(BaseModel):
    code: str = Field(description="Stable, machine-readable: `task_not_found`, `thread_busy`, ...")
    message: str = Field(description="What went wrong, naming the field and the value.")
    field: str | None = Field(
        default=None,
        description="The request field at fault, when there is one: a body path "
        "(`metadata.ticket`), a query parameter (`since`) or a header (`Idempotency-Key`).",
    )


class ErrorBody(BaseModel):
    """What every error response of the API looks like."""

    error: ErrorDetail


class TaskCreate(_RequestBody):
    """``POST /v1/tasks``."""

    input: str = Field(min_length=1, max_length=100_000, description="What the team should do.")
    team: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="The team to run: one the project registered (`PUT /v1/teams/{name}`), one "
        "the server loads (`serve --team`), or `default`, the built-in researcher, coder and "
        "writer (also when none is named).",
    )
    version: int | None = Field(
        default=None,
        ge=1,
        le=2**31 - 1,
        description="The registered team's version; its latest when none is named.",
    )
    thread_id: str | None = Field(
        default=None, min_length=1, max_length=200, description="Continue this conversation."
    )
    policy: dict[str, Any] | None = Field(
        default=None,
        description="Policy-file-shaped overrides; may only tighten the chosen team's policy.",
    )
    model: str | None = Field(default=None, description="Model spec for every role.")
    agent_models: dict[str, str] | None = Field(default=None, description="Spec per role.")
    metadata: dict[str, Any] | None = None
    topology: Literal["structured", "swarm", "supervisor-tools"] | None = Field(
        default=None,
        description="How the agents are arranged (default: the team's own, structured for the "
        "built-in team); a thread keeps the topology it started with.",
    )
    start_agent: str | None = Field(
        default=None, description="swarm only: the agent a new thread starts with."
    )
    output_mode: Literal["last_message", "full_history"] | None = Field(
        default=None,
        description="supervisor-tools only: what an agent's visit adds to the supervisor's "
        "messages (default last_message).",
    )
    multitask: Literal["reject", "enqueue"] = Field(
        default="reject",
        description="When the thread is busy: refuse with 409, or queue behind its task.",
    )


class DecisionIn(_RequestBody):
    """``POST /v1/tasks/{id}/approvals/{approval_id}``."""

    decision: Literal["approve", "reject", "edit"]
    args: dict[str, Any] | None = None
    reason: str | None = Field(default=None, max_length=2000)


class TeamRecord(BaseModel):
    """Which team definition a task ran: enough for an audit to find its definition."""

    name: str = Field(description="`default` for the built-in team.")
    version: int | None = Field(
        description="The registered team's version; null for the built-in team and the "
        "server's own teams (`serve --team`)."
    )
    digest: str | None = Field(
        description="The team's digest (agents, prompts, tools, policy, topology); null for a "
        "task recorded before teams were."
    )

    @classmethod
    def of(cls, record: Mapping[str, Any] | None) -> TeamRecord:
        """A task's team record as the API shows it (never the server's path of a file)."""
        record = record or {}
        return cls(
            name=record.get("name") or "default",
            version=record.get("version"),
            digest=record.get("digest"),
        )


class TeamIn(_RequestBody):
    """``PUT /v1/teams/{name}``: a team file, as its TOML text or as the same content in JSON."""

    toml: str | None = Field(
        default=None,
        min_length=1,
        description="The team file's text (TOML), as `relaygraph teams push` sends it.",
    )
    definition: dict[str, Any] | None = Field(
        default=None, description="The team file's content as a JSON object, instead of `toml`."
    )

    @model_validator(mode="after")
    def _one_form(self) -> TeamIn:
        if (self.toml is None) == (self.definition is None):
            raise _refuse("body", "send exactly one of 'toml' (the file's text) or 'definition'")
        return self


TeamOrigin = Literal["builtin", "server", "project"]


class TeamVersionOut(BaseModel):
    """A team as tasks name it: one version of a registered team, or a server's own team."""

    name: str
    version: int | None = Field(description="Null for the built-in team and the server's own.")
    digest: str
    origin: TeamOrigin = Field(
        description="`project`: registered by this project; `server`: loaded by the operator "
        "(`serve --team`), for every project; `builtin`: the default team."
    )
    description: str
    agents: list[str]
    created_at: datetime | None = Field(description="When this version was registered.")
    created: bool | None = Field(
        default=None,
        description="In the answer of a push: whether it made this version (false: the team "
        "was unchanged, its latest version is returned).",
    )
    definition: dict[str, Any] | None = Field(
        default=None,
        description="The team file's content as registered (a registered version only).",
    )


class TeamList(BaseModel):
    teams: list[TeamVersionOut]
    """Every team the project may run: the built-in one, the server's, and the latest
    version of each of its own."""


class TeamHistory(BaseModel):
    """A team with every version (a server's or the built-in team has none)."""

    name: str
    origin: TeamOrigin
    latest: TeamVersionOut
    versions: list[TeamVersionOut]


_PATH = re.compile(r"[^\s'\"]*[/\\][^\s'\"]*")
"""A word with a path separator in it: a path, of which only the last part is shown."""


def without_paths(text: str | None) -> str | None:
    """``text`` with each file path cut to its last part: the server records a policy file
    by its path (``'/etc/relaygraph/tight.toml' + request``), and a project is shown only
    the file's name (``'tight.toml' + request``), never where the server keeps it."""
    if text is None:
        return None
    return _PATH.sub(lambda found: re.split(r"[/\\]", found.group(0))[-1], text)


class TaskOut(BaseModel):
    id: str
    status: str
    input: str
    answer: str | None
    stop_reason: str | None
    thread_id: str
    models: dict[str, Any]
    topology: dict[str, Any]
    team: TeamRecord
    """Which team definition ran it."""
    metadata: dict[str, Any]
    """What the caller sent as ``metadata``, unchanged."""
    policy_source: str | None
    """Where the task's policy came from (``default``, the server's policy file by its
    name, never its path; ``+ request`` when the request tightened it)."""
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    last_event_seq: int
    cancel_requested_at: datetime | None
    """When a cancel was asked of the runner that holds the running task; it stops at its
    next step boundary."""
    replay_of: str | None = None
    """The task this one replays (``POST /v1/tasks/{id}/replay``)."""
    from_step: int | None = None
    """The step of ``replay_of`` the replay went on from (0: its request)."""

    @classmethod
    def of(cls, task: Task) -> TaskOut:
        return _read_record(
            cls,
            task,
            topology=task.topology or {"kind": "structured"},
            team=TeamRecord.of(task.team),
            metadata={k: v for k, v in task.metadata.items() if k != POLICY_SOURCE_KEY},
            policy_source=without_paths(task.metadata.get(POLICY_SOURCE_KEY)),
        )


class TaskPage(BaseModel):
    tasks: list[TaskOut]
    next_cursor: str | None


class ApprovalOut(BaseModel):
    id: str | None
    kind: str
    agent: str | None
    tool: str | None
    args: dict[str, Any] | None
    requested_at: datetime
    decision: str | None
    decided_by: str | None
    decided_at: datetime | None
    reason: str | None
    edited_args: dict[str, Any] | None
    """The arguments a person put in place of ``args`` (an ``edit``)."""
    applied_at: datetime | None
    """When the resumed run acted on the decision."""

    @classmethod
    def of(cls, approval: Approval) -> ApprovalOut:
        # The API's approval id is LangGraph's interrupt id (the id to resume with).
        return _read_record(cls, approval, id=approval.interrupt_id)


class ApprovalList(BaseModel):
    approvals: list[ApprovalOut]

    @classmethod
    def of(cls, approvals: list[Approval]) -> ApprovalList:
        return cls(approvals=[ApprovalOut.of(a) for a in approvals])


class HandoffOut(BaseModel):
    """A transfer of work: a supervisor's ``route`` or an agent's own ``direct`` handoff."""

    kind: Literal["route", "direct"]
    source: str = Field(alias="from")
    target: str = Field(alias="to")
    task: str
    reason: str
    step: int | None
    checkpoint_ns: str | None
    tokens_so_far: int
    """Input plus output tokens the task's agents had used when the work moved."""
    at: datetime


class HandoffList(BaseModel):
    handoffs: list[HandoffOut]

    @classmethod
    def of(cls, handoffs: list[HandoffEntry]) -> HandoffList:
        return cls(handoffs=[_read_record(HandoffOut, h, at=h.created_at) for h in handoffs])


class Status(BaseModel):
    """``/healthz`` and ``/readyz``."""

    status: str


class QuotasOut(BaseModel):
    """A project's quotas as they apply to it now (the operator's for it, else the
    server's); null: no limit."""

    max_running: int | None = Field(description="Its tasks running at once.")
    max_queued: int | None = Field(description="Its tasks queued; one more gets 429.")
    daily_cost_usd: float | None = Field(description="Its spend per UTC day, in USD.")
    max_streams: int | None = Field(
        default=None, description="Its open event streams; null: none (or not known here)."
    )


class ProjectUsageOut(BaseModel):
    """What the project uses now."""

    running: int = Field(description="Its tasks running.")
    queued: int = Field(description="Its tasks queued.")
    cost_today_usd: float = Field(description="What its tasks spent since 00:00 UTC today.")
    streams: int | None = Field(
        default=None, description="Its open event streams; null when this server cannot say."
    )


class ProjectMe(BaseModel):
    """``GET /v1/projects/me``: the calling project, its quotas and what it uses."""

    id: str
    name: str
    quotas: QuotasOut
    usage: ProjectUsageOut
    day_started_at: datetime = Field(description="00:00 UTC today: when the day's spend began.")
