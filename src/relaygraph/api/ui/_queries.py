"""What the dashboard reads: the functions behind its ``/v1`` endpoints and its pages.

Each ``/v1`` endpoint of :mod:`relaygraph.api._dashboard_api` and each page of ``/ui`` that
shows the same thing calls the same function here, so a page never shows what the API
would not answer.
"""

import json
import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any

from fastapi.responses import Response
from pydantic import BaseModel, Field

from relaygraph._home import TASKS_FOLDER
from relaygraph._names import FINALIZE, SUPERVISOR
from relaygraph.api._errors import ErrorAnswer
from relaygraph.api._schemas import ProjectMe, ProjectUsageOut, QuotasOut
from relaygraph.api._streams import StreamGate
from relaygraph.api.ui._audit import audit_of
from relaygraph.runner import POLICY_SOURCE_KEY
from relaygraph.store import (
    EvalRunRecord,
    Event,
    Ledger,
    Quotas,
    RecordNotFound,
    Task,
    day_start,
)

MAX_SCAN = 1000
"""Most tasks one filtered page looks at before it answers (with the cursor to go on)."""
MAX_DAYS = 366
"""The most days one usage range covers (the usage page's and ``GET /v1/usage/daily``'s)."""
DEFAULT_USAGE_DAYS = 14
"""The days a usage range covers, up to now, when it names no start."""
INPUT_CHARS = 280


# -- bodies --------------------------------------------------------------------------------


class TaskSummary(BaseModel):
    """A task as the task list shows it."""

    id: str
    status: str
    input: str = Field(description=f"The request, cut at {INPUT_CHARS} characters.")
    team: dict[str, Any] | None = Field(description="`name` and `version` of the team that ran it.")
    topology: str
    agents: list[str] = Field(description="The agents that ran, in the order they first ran.")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    duration_s: float | None
    tokens: int = Field(description="Input plus output tokens of every role.")
    cost_usd: float
    handoffs: int = Field(
        description="Transfers of work carried out: the supervisor's routes and the agents' "
        "direct handoffs, as the task page counts them."
    )
    direct_handoffs: int = Field(description="Of those, the agents' direct handoffs.")
    violations: int = Field(
        description="What the policy refused (each once); budget hits are counted apart."
    )
    violation_kinds: list[str]
    budget_hits: int = Field(description="Budget limits the task reached.")
    rejected: int = Field(description="Tool calls a person rejected.")
    approvals: int = Field(description="Tool calls that waited for a person's decision.")
    waited_s: float = Field(
        description="Seconds the task waited for a person; no budget counts them."
    )
    metadata: dict[str, Any] = Field(description="What the caller sent as `metadata`.")
    stop_reason: str | None


class TaskSummaryPage(BaseModel):
    tasks: list[TaskSummary]
    next_cursor: str | None = Field(description="Where the next page starts; null at the end.")
    scanned: int = Field(description="Tasks looked at for this page (filters skip some).")


class ArtifactOut(BaseModel):
    name: str
    size_bytes: int


class ArtifactList(BaseModel):
    artifacts: list[ArtifactOut]


class EvalCaseOut(BaseModel):
    case_id: str
    trial: int
    passed: bool
    checks: list[dict[str, Any]] = Field(
        description="Each check: `name`, `passed`, `expected`, `actual` (and `message`)."
    )
    first_failure: dict[str, Any] | None
    usage: dict[str, Any]
    latency_seconds: float
    error: str | None
    task_id: str | None


class EvalRunOut(BaseModel):
    id: str
    golden: str
    models: dict[str, Any]
    options: dict[str, Any]
    case_count: int
    run_count: int
    passed_case_count: int | None
    passed_run_count: int | None
    pass_rate: float | None
    metrics: dict[str, Any] | None
    started_at: datetime
    finished_at: datetime | None
    cases: list[EvalCaseOut] | None = Field(description="Only in `GET /v1/evals/{run_id}`.")

    @classmethod
    def of(cls, run: EvalRunRecord, *, cases: bool) -> "EvalRunOut":
        """The ledger's record as the API answers it: the same fields, read from the record
        (a case's ledger keys left out), the cases only when asked for."""
        if cases:
            return cls.model_validate(run, from_attributes=True)
        body = cls.model_validate(replace(run, cases=()), from_attributes=True)
        return body.model_copy(update={"cases": None})


class EvalRunList(BaseModel):
    eval_runs: list[EvalRunOut]


class TraceLink(BaseModel):
    """Where one run of a task was traced outside relaygraph (its ``run_started`` event's
    ``trace``)."""

    seq: int = Field(description="The run's `run_started` event.")
    started_at: datetime
    otel_trace_id: str | None = Field(
        description="The OpenTelemetry trace id (32 hex digits) of the run's root span, as an "
        "OTLP collector shows it."
    )
    langsmith_run_id: str | None = Field(description="The run's root run in LangSmith.")
    langsmith_url: str | None = Field(
        description="That run's page in LangSmith, when the server knew the project's "
        "(`RELAYGRAPH_LANGSMITH_PROJECT_URL`)."
    )


class TraceLinks(BaseModel):
    runs: list[TraceLink] = Field(
        description="The task's traced runs, latest first: a task resumed after a decision or "
        "a restart has one per run. Empty when no tracer was on."
    )


class DayUsage(BaseModel):
    date: date
    tasks: int
    total: dict[str, Any]
    agents: dict[str, dict[str, Any]]


class DailyUsage(BaseModel):
    project_id: str
    since: datetime
    until: datetime
    days: list[DayUsage]


# -- what the endpoints and the pages both call ---------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskFilters:
    """Which of a project's tasks a list shows; None lets every task through."""

    status: str | None = None
    agent: str | None = None
    """Only tasks in which this agent ran."""
    violation: str | None = None
    """Only tasks with a violation of this kind (``tool_not_allowed``, ...), with any
    violation (``any``), or that hit a budget (``budget``)."""
    since: datetime | None = None
    """Created at or after (UTC)."""
    until: datetime | None = None
    """Created before (UTC)."""
    team: str | None = None
    """Only tasks of the team of this name (``built-in`` for the server's own team)."""
    approvals: str | None = None
    """``any``: only tasks that asked a person; ``rejected``: only those with a rejection."""
    text: str | None = None
    """Found, ignoring case, in the request, the answer, the stop reason, the task id or
    the caller's metadata."""


ANY_VIOLATION = "any"
"""The violation filter that keeps every task with a violation of any kind."""
APPROVAL_FILTERS = ("any", "rejected")
BUILT_IN_TEAM = "built-in"
"""The team filter's name for the server's own team (a task that records no team name)."""


def task_metadata(task: Task) -> dict[str, Any]:
    """What the caller sent as ``metadata`` (the server's own note of the policy's source
    left out), as ``GET /v1/tasks/{id}`` answers it."""
    return {k: v for k, v in task.metadata.items() if k != POLICY_SOURCE_KEY}


def summarize(ledger: Ledger, task: Task, events: Sequence[Event] | None = None) -> TaskSummary:
    """The task list's line for ``task``: who ran, tokens, cost, handoffs, violations.

    Args:
        ledger: The ledger.
        task: The task.
        events: The task's events, when the caller has read them already (the task page).
    """
    agents: list[str] = []
    events = ledger.events_after(task.id) if events is None else events
    for event in events:
        if event.type == "agent_started":
            agent = str(event.data.get("agent") or "")
            if agent and agent not in agents:
                agents.append(agent)
    audit = audit_of(events)
    handoffs = ledger.handoffs(task.id)
    usage = ledger.usage(task.id)
    start = task.started_at or task.created_at
    team = task.team or {}
    return TaskSummary(
        id=task.id,
        status=task.status,
        input=task.input if len(task.input) <= INPUT_CHARS else task.input[:INPUT_CHARS] + "…",
        team={"name": team.get("name"), "version": team.get("version")} if team else None,
        topology=str((task.topology or {}).get("kind", "structured")),
        agents=agents,
        created_at=task.created_at,
        started_at=task.started_at,
        finished_at=task.finished_at,
        duration_s=round((task.finished_at - start).total_seconds(), 3)
        if task.finished_at
        else None,
        tokens=sum(u.input_tokens + u.output_tokens for u in usage),
        cost_usd=round(sum(u.cost_usd for u in usage), 6),
        handoffs=len(handoffs),
        direct_handoffs=sum(1 for h in handoffs if h.kind == "direct"),
        violations=len(audit.violations),
        violation_kinds=audit.kinds,
        budget_hits=len(audit.budget_hits),
        rejected=audit.rejected,
        approvals=len(ledger.approvals(task.id)),
        waited_s=audit.waited_s(task.finished_at or datetime.now(UTC)),
        metadata=task_metadata(task),
        stop_reason=task.stop_reason,
    )


def agent_names(ledger: Ledger, project_id: str) -> list[str]:
    """The agents that ran in the project's tasks, for the task list's agent filter to
    suggest: the roles its tasks used, but the supervisor and the finalizer, which are no
    agents (a task's ``agents`` never names them)."""
    roles = ledger.usage_for_project(project_id)["agents"]
    return sorted(set(roles) - {SUPERVISOR, FINALIZE})


def _matches(task: Task, summary: TaskSummary | None, filters: TaskFilters) -> bool:
    if filters.since is not None and task.created_at < filters.since:
        return False
    if filters.until is not None and task.created_at >= filters.until:
        return False
    if filters.text:
        needle = filters.text.casefold()
        haystack = "\n".join(
            part or "" for part in (task.id, task.input, task.answer, task.stop_reason)
        )
        # The caller's metadata (a ticket id) is searched as the API answers it.
        haystack += "\n" + json.dumps(task_metadata(task), ensure_ascii=False, sort_keys=True)
        if needle not in haystack.casefold():
            return False
    if summary is None:
        return True
    if filters.agent and filters.agent not in summary.agents:
        return False
    if filters.team and filters.team != ((summary.team or {}).get("name") or BUILT_IN_TEAM):
        return False
    if filters.approvals == "any" and not summary.approvals:
        return False
    if filters.approvals == "rejected" and not summary.rejected:
        return False
    if filters.violation == ANY_VIOLATION:
        return summary.violations > 0
    if filters.violation == "budget":
        return summary.budget_hits > 0
    return not filters.violation or filters.violation in summary.violation_kinds


def find_tasks(
    ledger: Ledger,
    project_id: str,
    filters: TaskFilters,
    *,
    limit: int = 50,
    cursor: str | None = None,
) -> TaskSummaryPage:
    """A page of the project's tasks that pass ``filters``, newest first.

    Walks the ledger's pages (its cursors, so a page is a position, not an offset) until
    ``limit`` tasks matched, the tasks ran out, or :data:`MAX_SCAN` were looked at; the
    page may then hold fewer than ``limit`` tasks and still a ``next_cursor``.

    Raises:
        ConfigError: A cursor the ledger did not hand out, an unknown status or a bad limit.
    """
    found: list[TaskSummary] = []
    scanned = 0
    while True:
        tasks, cursor = ledger.list_tasks(
            project_id=project_id, status=filters.status, limit=limit, cursor=cursor
        )
        scanned += len(tasks)
        for task in tasks:
            if _matches(task, None, filters):
                summary = summarize(ledger, task)
                if _matches(task, summary, filters):
                    found.append(summary)
        older = filters.since is not None and tasks and tasks[-1].created_at < filters.since
        if older:
            cursor = None  # Newest first: every task after this one is older still.
        if cursor is None or len(found) >= limit or scanned >= MAX_SCAN:
            return TaskSummaryPage(tasks=found, next_cursor=cursor, scanned=scanned)


_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_RUN_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def trace_links(events: Iterable[Event]) -> TraceLinks:
    """Where the task's runs were traced, latest first, from the ``trace`` of their
    ``run_started`` events.

    Only values of the expected shape are kept (a trace id, a run id, an ``http(s)``
    address), so a page that links them never links anything else.
    """
    runs: list[TraceLink] = []
    for event in events:
        trace = event.data.get("trace") if event.type == "run_started" else None
        if not isinstance(trace, dict):
            continue
        otel = _matching(trace.get("otel_trace_id"), _TRACE_ID)
        run = _matching(trace.get("langsmith_run_id"), _RUN_ID)
        url = trace.get("langsmith_url")
        if not (run and isinstance(url, str) and url.startswith(("https://", "http://"))):
            url = None
        if otel or run:
            runs.append(
                TraceLink(
                    seq=event.seq,
                    started_at=event.created_at,
                    otel_trace_id=otel,
                    langsmith_run_id=run,
                    langsmith_url=url,
                )
            )
    return TraceLinks(runs=runs[::-1])


def _matching(value: Any, pattern: re.Pattern[str]) -> str | None:
    return value if isinstance(value, str) and pattern.fullmatch(value) else None


def artifacts_folder(home: Path, task_id: str) -> Path:
    return home / TASKS_FOLDER / task_id / "artifacts"


def task_artifacts(home: Path, task_id: str) -> list[ArtifactOut]:
    """The task's deliverables (regular files only: a symlink is never listed)."""
    from relaygraph.backends.workspace import ArtifactStore

    folder = artifacts_folder(home, task_id)
    if not folder.is_dir():
        return []
    return [ArtifactOut(name=a.name, size_bytes=a.size_bytes) for a in ArtifactStore(folder).list()]


def read_artifact(home: Path, task_id: str, name: str) -> bytes:
    """One deliverable's bytes.

    Raises:
        ErrorAnswer: 404 ``artifact_not_found`` for a name the task has no artifact under.
    """
    listed = {a.name: a for a in task_artifacts(home, task_id)}
    if name not in listed:
        raise ErrorAnswer(404, "artifact_not_found", f"no artifact {name[:120]!r}", "name")
    path = artifacts_folder(home, task_id) / name
    # Opened without following a symlink swapped in since the listing, and read only if
    # it is still a regular file.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        raise ErrorAnswer(404, "artifact_not_found", f"no artifact {name!r}", "name") from None
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise ErrorAnswer(404, "artifact_not_found", f"no artifact {name!r}", "name")
        return file.read()


def daily_usage(ledger: Ledger, project_id: str, since: datetime, until: datetime) -> DailyUsage:
    """The project's usage per UTC day in ``[since, until)``, by the days tasks were created.

    Raises:
        ErrorAnswer: 422 for a range over :data:`MAX_DAYS` days or one that runs backwards.
    """
    if since > until:
        raise ErrorAnswer(422, "invalid_request", "since is after until", "since")
    first = since.astimezone(UTC).date()
    days: list[DayUsage] = []
    day = first
    while datetime.combine(day, time(), UTC) < until:
        if len(days) >= MAX_DAYS:
            raise ErrorAnswer(
                422, "invalid_request", f"the range is over {MAX_DAYS} days; ask for less", "until"
            )
        start = max(since, datetime.combine(day, time(), UTC))
        end = min(until, datetime.combine(day + timedelta(days=1), time(), UTC))
        usage = ledger.usage_for_project(project_id, start, end)
        days.append(
            DayUsage(date=day, tasks=usage["tasks"], total=usage["total"], agents=usage["agents"])
        )
        day += timedelta(days=1)
    return DailyUsage(project_id=project_id, since=since, until=until, days=days)


def eval_run(ledger: Ledger, run_id: str) -> EvalRunRecord:
    """One eval run with its cases.

    Raises:
        ErrorAnswer: 404 ``eval_run_not_found``.
    """
    try:
        return ledger.eval_run(run_id)
    except RecordNotFound:
        raise ErrorAnswer(404, "eval_run_not_found", f"no eval run {run_id!r}", "run_id") from None


def utc_time(text: str | None, field: str) -> datetime | None:
    """A query's ISO 8601 time with a time zone, in UTC (as ``GET /v1/usage`` takes it)."""
    from relaygraph.api._params import in_utc

    return in_utc(text, field)


def artifact_response(data: bytes, name: str, *, download: bool) -> Response:
    """An artifact as a response that no browser runs: plain text to view, or a download.

    Artifacts are written by models; served from the dashboard's origin as HTML they could
    run script there, so they are never served as anything a browser renders.
    """
    headers = {
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "sandbox; default-src 'none'",
        "Cache-Control": "no-store",
    }
    if download:
        headers["Content-Disposition"] = f'attachment; filename="{name}"'
        return Response(data, media_type="application/octet-stream", headers=headers)
    return Response(data, media_type="text/plain; charset=utf-8", headers=headers)


def project_me(
    ledger: Ledger,
    server: Quotas,
    *,
    project_id: str,
    name: str,
    streams: StreamGate | None = None,
) -> ProjectMe:
    """The project's quotas (the operator's for it over the server's, ``server``) and what
    it uses of them now: what ``GET /v1/projects/me`` answers and the usage page shows.
    ``streams``: this server's event streams (their quota, and the project's open ones)."""
    now = datetime.now(UTC)
    quotas = server.overridden(ledger.project_quotas(project_id))
    load = ledger.project_load(project_id, now=now)
    return ProjectMe(
        id=project_id,
        name=name,
        quotas=QuotasOut(
            max_running=quotas.max_running,
            max_queued=quotas.max_queued,
            daily_cost_usd=quotas.daily_cost_usd,
            max_streams=None if streams is None else streams.max_per_project,
        ),
        usage=ProjectUsageOut(
            running=load.running,
            queued=load.queued,
            cost_today_usd=load.cost_today_usd,
            streams=None if streams is None else streams.open_streams(project_id),
        ),
        day_started_at=day_start(now),
    )
