"""The ledger's tables as SQLAlchemy declarative models.

The migrations in ``migrations/versions`` create exactly these tables; a test compares the
two on SQLite and PostgreSQL, so a change here needs a new migration.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

LOCAL_PROJECT_ID = "local"
"""The built-in project that owns tasks started from the CLI (``relaygraph run``)."""

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# JSONB on PostgreSQL (indexable, validated), JSON text on SQLite. A Python None is stored
# as SQL NULL rather than JSON null, so "no policy" reads the same on both.
JSONValue = JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")
# JSON text on every backend (``json`` on PostgreSQL keeps the text as written), for a
# document whose key order means something: jsonb orders an object's keys by length, then
# bytes, so a team's agents would read back in another order (and make another team).
OrderedJSON = JSON(none_as_null=True)
# Row ids that PostgreSQL may count past 2**31; SQLite only auto-increments INTEGER keys.
RowId = BigInteger().with_variant(Integer(), "sqlite")

RowKey = Annotated[int, mapped_column(RowId, primary_key=True, autoincrement=True)]
"""A row's own ``id``, which the database counts up."""
ProjectRef = Annotated[str, mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))]
"""The project a row belongs to: the row goes when the project goes."""
TaskRef = Annotated[str, mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"))]
"""The task a row belongs to: the row goes when the task goes."""


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that is always timezone-aware UTC in Python, on every backend.

    SQLite has no time zones: values are stored as naive UTC text and read back as UTC.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"timestamp {value.isoformat()!r} has no time zone")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: UTCDateTime(),
        dict[str, Any]: JSONValue,
    }


class ProjectRow(Base):
    __tablename__ = "projects"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime]
    # The operator's quotas for this project (``relaygraph projects quota``); NULL: the
    # server's setting (``RELAYGRAPH_PROJECT_MAX_RUNNING`` and the like) applies.
    max_running: Mapped[int | None] = mapped_column(Integer)
    max_queued: Mapped[int | None] = mapped_column(Integer)
    daily_cost_usd: Mapped[float | None] = mapped_column(Float)


class ApiKeyRow(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    project_id: Mapped[ProjectRef] = mapped_column(index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]


class TaskRow(Base):
    __tablename__ = "tasks"
    __table_args__ = (
        UniqueConstraint("project_id", "idempotency_key"),
        Index(None, "project_id", "created_at", "id"),
        Index(None, "project_id", "status", "created_at", "id"),
        Index(None, "status", "created_at"),
        Index(None, "project_id", "thread_id"),
        Index(None, "project_id", "started_at"),
        Index(None, "replay_of"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    project_id: Mapped[ProjectRef]
    input: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    answer: Mapped[str | None] = mapped_column(Text)
    stop_reason: Mapped[str | None] = mapped_column(Text)
    policy: Mapped[dict[str, Any] | None]
    models: Mapped[dict[str, Any]]
    topology: Mapped[dict[str, Any] | None]
    # Which team definition ran it: name, version, digest (and its file); NULL: built-in.
    team: Mapped[dict[str, Any] | None]
    # A thread id is the tenant's own: two tenants may use the same one. The checkpoints
    # of the thread live under ``checkpoint_thread``, which is unique across tenants.
    thread_id: Mapped[str] = mapped_column(String(255))
    checkpoint_thread: Mapped[str] = mapped_column(String(300))
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    # A digest of the whole request: an Idempotency-Key reused for another request is
    # refused. NULL on tasks recorded before it existed (their input decides).
    request_digest: Mapped[str | None] = mapped_column(String(64))
    # ``metadata`` is taken on declarative classes, so the attribute has another name.
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSONValue)
    last_event_seq: Mapped[int] = mapped_column(Integer, default=0)
    # Who runs the task, until when: a runner (a server's workers, a CLI process) holds the
    # lease while it runs the task and renews it; another may take the task over only once
    # the lease has lapsed, so a task never runs in two places at once.
    runner_id: Mapped[str | None] = mapped_column(String(64))
    lease_until: Mapped[datetime | None]
    # How many times a runner started running the task (a new lease, not a renewal): a
    # task that kills its runner each time is failed after a bounded number.
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # A cancel asked for while a runner held the task; the holder sees it when it renews.
    cancel_requested_at: Mapped[datetime | None]
    # The worker mode: how many times the task was handed to the workers (its submission,
    # then each decision that continues it). A message names the dispatch it was published
    # for; one of an earlier dispatch is stale.
    dispatch: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Workers' starts of the current dispatch (``attempts`` never goes back in the worker
    # mode: it is the fencing number), for the attempt limit.
    dispatch_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # A replay (``relaygraph replay``): the task it replays, of the same project, and the
    # step of that task's trajectory it went on from (0: its request).
    replay_of: Mapped[str | None] = mapped_column(String(36))
    from_step: Mapped[int | None]
    created_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    updated_at: Mapped[datetime]


class WorkerSlotRow(Base):
    """A worker-mode pool process that takes tasks: it reports itself while it lives, and
    the publishers keep about as many tasks waiting in the broker as these have free."""

    __tablename__ = "worker_slots"

    worker_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    # Tasks it runs at once (a prefork child runs one).
    slots: Mapped[int] = mapped_column(Integer)
    # Its last report: one older than a few report intervals is of a process that is gone.
    seen_at: Mapped[datetime] = mapped_column(index=True)


class TeamVersionRow(Base):
    """One version of a team a project registered (``PUT /v1/teams/{name}``)."""

    __tablename__ = "team_versions"
    __table_args__ = (UniqueConstraint("project_id", "name", "version"),)

    id: Mapped[RowKey]
    project_id: Mapped[ProjectRef]
    name: Mapped[str] = mapped_column(String(64))
    version: Mapped[int] = mapped_column(Integer)
    # The team file's content as pushed (JSON), which builds the team again for any task:
    # in its own key order, which is the agents' order.
    definition: Mapped[dict[str, Any]] = mapped_column(OrderedJSON)
    # Team.digest: equal digests, equal teams; a push with the latest's digest is no change.
    digest: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[datetime]


class EventRow(Base):
    __tablename__ = "events"

    task_id: Mapped[TaskRef] = mapped_column(primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    type: Mapped[str] = mapped_column(String(32))
    agent: Mapped[str | None] = mapped_column(String(64))
    data: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]


class HandoffRow(Base):
    __tablename__ = "handoffs"
    __table_args__ = (CheckConstraint("kind IN ('route', 'direct')", name="kind"),)

    task_id: Mapped[TaskRef] = mapped_column(primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    event_seq: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(8))
    source: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(64))
    task: Mapped[str] = mapped_column(Text)
    reason: Mapped[str] = mapped_column(Text)
    step: Mapped[int | None] = mapped_column(Integer)
    checkpoint_ns: Mapped[str | None] = mapped_column(String(255))
    tokens_so_far: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime]


class ToolCallRow(Base):
    __tablename__ = "tool_calls"
    __table_args__ = (Index(None, "task_id", "tool_call_id"),)

    id: Mapped[RowKey]
    task_id: Mapped[TaskRef]
    event_seq: Mapped[int] = mapped_column(Integer)
    agent: Mapped[str] = mapped_column(String(64))
    tool: Mapped[str] = mapped_column(String(128))
    tool_call_id: Mapped[str | None] = mapped_column(String(255))
    args: Mapped[dict[str, Any] | None]
    status: Mapped[str] = mapped_column(String(16))
    result_preview: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]


class ToolJournalRow(Base):
    """A tool call that completed, with the result the graph received (the tool journal).

    Written before the result returns into the graph, so a step re-run after a crash finds
    it and answers the call from here instead of running the tool again.
    """

    __tablename__ = "tool_journal"

    task_id: Mapped[TaskRef] = mapped_column(primary_key=True)
    call_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    # The journal's own JSON record (``relaygraph.agents._journal``): the ledger keeps it as
    # given and reads nothing in it.
    record: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]


class ApprovalRow(Base):
    __tablename__ = "approvals"
    __table_args__ = (UniqueConstraint("task_id", "interrupt_id"),)

    id: Mapped[RowKey]
    task_id: Mapped[TaskRef]
    interrupt_id: Mapped[str | None] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(32))
    agent: Mapped[str | None] = mapped_column(String(64))
    tool: Mapped[str | None] = mapped_column(String(128))
    tool_call_id: Mapped[str | None] = mapped_column(String(255))
    args: Mapped[dict[str, Any] | None]
    request: Mapped[dict[str, Any]]
    requested_at: Mapped[datetime]
    decision: Mapped[str | None] = mapped_column(String(16))
    decided_by: Mapped[str | None] = mapped_column(String(255))
    decided_at: Mapped[datetime | None]
    reason: Mapped[str | None] = mapped_column(Text)
    edited_args: Mapped[dict[str, Any] | None]
    applied_at: Mapped[datetime | None]


class UsageRow(Base):
    __tablename__ = "usage"

    task_id: Mapped[TaskRef] = mapped_column(primary_key=True)
    agent: Mapped[str] = mapped_column(String(64), primary_key=True)
    model_calls: Mapped[int] = mapped_column(Integer)
    tool_calls: Mapped[int] = mapped_column(Integer)
    input_tokens: Mapped[int] = mapped_column(Integer)
    output_tokens: Mapped[int] = mapped_column(Integer)
    cost_usd: Mapped[float] = mapped_column(Float)
    seconds: Mapped[float] = mapped_column(Float)
    estimated: Mapped[bool]
    records: Mapped[dict[str, Any]] = mapped_column(JSONValue)
    """The usage records the row adds up, by id (:class:`relaygraph.events.Usage` figures):
    a record sent again replaces the one of its id, so the totals are always their sum."""
    updated_at: Mapped[datetime]


class EvalRunRow(Base):
    __tablename__ = "eval_runs"
    __table_args__ = (Index(None, "started_at", "id"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    golden: Mapped[str] = mapped_column(Text)
    models: Mapped[dict[str, Any]]
    options: Mapped[dict[str, Any]]
    case_count: Mapped[int] = mapped_column(Integer)
    run_count: Mapped[int] = mapped_column(Integer)
    passed_case_count: Mapped[int | None] = mapped_column(Integer)
    passed_run_count: Mapped[int | None] = mapped_column(Integer)
    pass_rate: Mapped[float | None] = mapped_column(Float)
    metrics: Mapped[dict[str, Any] | None]
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]


class EvalCaseRow(Base):
    __tablename__ = "eval_case_results"
    __table_args__ = (UniqueConstraint("eval_run_id", "case_id", "trial"),)

    id: Mapped[RowKey]
    eval_run_id: Mapped[str] = mapped_column(ForeignKey("eval_runs.id", ondelete="CASCADE"))
    case_id: Mapped[str] = mapped_column(String(255))
    trial: Mapped[int] = mapped_column(Integer)
    passed: Mapped[bool]
    checks: Mapped[list[dict[str, Any]]] = mapped_column(JSONValue)
    first_failure: Mapped[dict[str, Any] | None]
    usage: Mapped[dict[str, Any]]
    latency_seconds: Mapped[float] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    # A case that could not run has no task; deleting a task keeps the eval's result.
    task_id: Mapped[str | None] = mapped_column(
        ForeignKey("tasks.id", ondelete="SET NULL"), index=True
    )
    created_at: Mapped[datetime]
