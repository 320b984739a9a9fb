"""The ledger: every project, task and thing that happened, in SQL.

:class:`Ledger` holds one repository per job, each a class in a module of its own, all
given one :class:`~relaygraph.store._core.LedgerCore` (the engines and their sessions):

- ``ledger.tenants``: projects and their API keys (``_tenants.TenantRepository``);
- ``ledger.team_registry``: registered teams, versioned (``_teams.TeamRepository``);
- ``ledger.tasks``: tasks and threads, and their status (``_tasks.TaskRepository``);
- ``ledger.task_queries``: the selections of recorded tasks that replay evals and golden
  sets take (``_task_queries.TaskQueryRepository``);
- ``ledger.quotas``: quotas, a project's load, the fair order of queued tasks
  (``_quotas.QuotaRepository``);
- ``ledger.leases``: leases, cancel, abandoned tasks (``_leases.LeaseRepository``);
- ``ledger.events``: events and the rows they imply (``_events.EventRepository``);
- ``ledger.usage_records``: usage and the end of a run (``_usage_records.UsageRepository``);
- ``ledger.approval_decisions``: decisions on paused tool calls
  (``_approvals.ApprovalRepository``);
- ``ledger.eval_records``: eval runs and their cases (``_eval_runs.EvalRunRepository``);
- ``ledger.journal_records``: the tool journal (``_journal.ToolJournalRepository``);
- ``ledger.worker_dispatch``: the worker mode's dispatches and attempts
  (``_dispatch.WorkerDispatchRepository``);
- ``ledger.worker_slots``: the worker mode's pool processes and their free slots
  (``_worker_slots.WorkerSlotRepository``).

Each public method of a repository has a one-line method of the same name and signature
here that says which repository does the work, so ``ledger.append_events(...)`` leads (by
grep or "go to definition") to ``EventRepository.append_events``. The repositories never
call each other; what two of them share is a function in ``_base``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Self

from relaygraph.store._approvals import ApprovalRepository
from relaygraph.store._base import hash_key
from relaygraph.store._core import LedgerCore
from relaygraph.store._dispatch import WorkerDispatchRepository
from relaygraph.store._eval_runs import EvalRunRepository
from relaygraph.store._events import EventRepository
from relaygraph.store._journal import LedgerToolJournal, ToolJournalRepository
from relaygraph.store._leases import LeaseRepository
from relaygraph.store._quotas import QuotaRepository
from relaygraph.store._records import (
    ACTIVE_STATUSES,
    AgentUsage,
    ApiKey,
    Approval,
    Attempt,
    EvalCaseRecord,
    EvalRunRecord,
    Event,
    HandoffEntry,
    Project,
    ProjectLoad,
    QuotaOverrides,
    Quotas,
    Task,
    TeamVersion,
    ToolCall,
)
from relaygraph.store._task_queries import TaskQueryRepository, TaskSelection
from relaygraph.store._tasks import TaskRepository
from relaygraph.store._teams import TeamRepository
from relaygraph.store._tenants import TenantRepository
from relaygraph.store._usage_records import RunEnd, UsageRepository
from relaygraph.store._worker_slots import WorkerSlotRepository

__all__ = ["Ledger", "hash_key"]


class Ledger:
    """The SQL record of projects, API keys, tasks and everything that happened in each task.

    Safe to share between threads: every call runs in its own short transaction. On SQLite
    writers queue for the database lock; on PostgreSQL writes to one task queue on that
    task's row, so a task's events get gap-free sequence numbers in commit order.

    Args:
        url: A SQLAlchemy URL; ``$RELAYGRAPH_DATABASE_URL`` when None, else the SQLite file
            ``ledger.sqlite`` in the data directory.
        notify_channel: On PostgreSQL, the ``NOTIFY`` channel on which every write of a
            task's events is announced ("task X has events up to seq N",
            :class:`~relaygraph.store.EventNotice`), in the transaction that writes them;
            None (the default): no notices.

    Raises:
        ConfigError: The URL is not one the ledger can use.
    """

    def __init__(self, url: str | None = None, *, notify_channel: str | None = None) -> None:
        self.core = LedgerCore(url, notify_channel=notify_channel)
        """The engine and sessions that every repository below shares."""
        self.tenants = TenantRepository(self.core)
        self.team_registry = TeamRepository(self.core)
        self.tasks = TaskRepository(self.core)
        self.task_queries = TaskQueryRepository(self.core)
        self.quotas = QuotaRepository(self.core)
        self.leases = LeaseRepository(self.core)
        self.events = EventRepository(self.core)
        self.usage_records = UsageRepository(self.core)
        self.approval_decisions = ApprovalRepository(self.core)
        self.eval_records = EvalRunRepository(self.core)
        self.journal_records = ToolJournalRepository(self.core)
        self.worker_dispatch = WorkerDispatchRepository(self.core)
        self.worker_slots = WorkerSlotRepository(self.core)

    def __repr__(self) -> str:
        return f"Ledger({self.core.url!r})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # LedgerCore (_core.py)
    @property
    def url(self) -> str:
        """The database URL, password hidden."""
        return self.core.url

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.core.dialect

    @property
    def notify_channel(self) -> str | None:
        """The PostgreSQL ``NOTIFY`` channel of event notices; None: none is sent."""
        return self.core.notify_channel

    @property
    def database_file(self) -> Path | None:
        """The SQLite database's file; None on PostgreSQL or for an in-memory database."""
        return self.core.database_file

    def close(self) -> None:
        """Close the connection pool; the ledger opens new connections if used again."""
        self.core.close()

    def upgrade(self, revision: str = "head") -> None:
        """Apply the shipped migrations up to ``revision``; does nothing when current."""
        self.core.upgrade(revision)

    def is_current(self) -> bool:
        """Whether the database has every shipped migration (a readiness check)."""
        return self.core.is_current()

    # TenantRepository (_tenants.py)
    def create_project(self, name: str) -> tuple[Project, str]:
        return self.tenants.create_project(name)

    def create_api_key(self, project_id: str) -> tuple[ApiKey, str]:
        return self.tenants.create_api_key(project_id)

    def revoke_api_key(self, key_id: str) -> ApiKey:
        return self.tenants.revoke_api_key(key_id)

    def api_keys(self, project_id: str) -> list[ApiKey]:
        return self.tenants.api_keys(project_id)

    def authenticate(self, key: str) -> Project | None:
        return self.tenants.authenticate(key)

    def get_project(self, name: str) -> Project | None:
        return self.tenants.get_project(name)

    def project_by_id(self, project_id: str) -> Project | None:
        return self.tenants.project_by_id(project_id)

    # TeamRepository (_teams.py)
    def register_team(
        self, project_id: str, name: str, *, definition: Mapping[str, Any], digest: str
    ) -> tuple[TeamVersion, bool]:
        return self.team_registry.register_team(
            project_id, name, definition=definition, digest=digest
        )

    def team_version(
        self, project_id: str, name: str, version: int | None = None
    ) -> TeamVersion | None:
        return self.team_registry.team_version(project_id, name, version)

    def team_versions(self, project_id: str, name: str) -> list[TeamVersion]:
        return self.team_registry.team_versions(project_id, name)

    def teams(self, project_id: str) -> list[TeamVersion]:
        return self.team_registry.teams(project_id)

    def projects_with_teams(self, names: Collection[str]) -> list[tuple[str, str, str]]:
        return self.team_registry.projects_with_teams(names)

    # TaskRepository (_tasks.py)
    def create_task(
        self,
        *,
        project_id: str,
        input: str,
        thread_id: str | None = None,
        policy: Mapping[str, Any] | None = None,
        models: Mapping[str, str] | None = None,
        topology: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        team: Mapping[str, Any] | None = None,
        runner_id: str | None = None,
        lease_seconds: float | None = None,
        quotas: Quotas | None = None,
        replay_of: str | None = None,
        from_step: int | None = None,
        task_id: str | None = None,
    ) -> tuple[Task, bool]:
        return self.tasks.create_task(
            project_id=project_id,
            input=input,
            thread_id=thread_id,
            policy=policy,
            models=models,
            topology=topology,
            metadata=metadata,
            idempotency_key=idempotency_key,
            team=team,
            runner_id=runner_id,
            lease_seconds=lease_seconds,
            quotas=quotas,
            replay_of=replay_of,
            from_step=from_step,
            task_id=task_id,
        )

    def get_task(self, task_id: str, *, project_id: str) -> Task | None:
        return self.tasks.get_task(task_id, project_id=project_id)

    def list_tasks(
        self,
        *,
        project_id: str,
        status: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> tuple[list[Task], str | None]:
        return self.tasks.list_tasks(
            project_id=project_id, status=status, limit=limit, cursor=cursor
        )

    def tasks_ended_before(self, cutoff: datetime) -> list[str]:
        return self.tasks.tasks_ended_before(cutoff)

    def unfinished_tasks(self, *, exclude_project: str | None = None) -> list[Task]:
        return self.tasks.unfinished_tasks(exclude_project=exclude_project)

    def task_owner(self, task_id: str) -> str | None:
        return self.tasks.task_owner(task_id)

    def task_by_idempotency_key(self, project_id: str, key: str) -> Task | None:
        return self.tasks.task_by_idempotency_key(project_id, key)

    def thread_exists(self, thread_id: str, *, project_id: str) -> bool:
        return self.tasks.thread_exists(thread_id, project_id=project_id)

    def thread_topology(self, thread_id: str, *, project_id: str) -> dict[str, Any] | None:
        return self.tasks.thread_topology(thread_id, project_id=project_id)

    def active_task_on_thread(self, thread_id: str, *, project_id: str) -> Task | None:
        return self.tasks.active_task_on_thread(thread_id, project_id=project_id)

    def set_status(
        self, task_id: str, status: str, *, attempt: int | None = None, **fields: str | None
    ) -> Task:
        return self.tasks.set_status(task_id, status, attempt=attempt, **fields)

    def count_tasks_by_status(self) -> dict[str, int]:
        return self.tasks.count_tasks_by_status()

    def oldest_queued_at(self) -> datetime | None:
        return self.tasks.oldest_queued_at()

    # TaskQueryRepository (_task_queries.py)
    def select_tasks(self, selection: TaskSelection) -> list[Task]:
        return self.task_queries.select_tasks(selection)

    def replays_of(self, task_id: str, *, project_id: str) -> list[Task]:
        return self.task_queries.replays_of(task_id, project_id=project_id)

    # QuotaRepository (_quotas.py)
    def set_project_quotas(self, name: str, overrides: QuotaOverrides) -> QuotaOverrides:
        return self.quotas.set_project_quotas(name, overrides)

    def project_quotas(self, project_id: str) -> QuotaOverrides:
        return self.quotas.project_quotas(project_id)

    def project_load(self, project_id: str, *, now: datetime | None = None) -> ProjectLoad:
        return self.quotas.project_load(project_id, now=now)

    def spent_today(
        self, project_id: str, *, excluding: str | None = None, now: datetime | None = None
    ) -> float:
        return self.quotas.spent_today(project_id, excluding=excluding, now=now)

    def queued_tasks(
        self,
        *,
        limit: int,
        exclude_project: str | None = None,
        max_running: int | None = None,
    ) -> list[str]:
        return self.quotas.queued_tasks(
            limit=limit, exclude_project=exclude_project, max_running=max_running
        )

    def tasks_to_publish(
        self,
        *,
        budget: int | None = None,
        exclude_project: str | None = None,
        max_running: int | None = None,
    ) -> list[str]:
        return self.quotas.tasks_to_publish(
            budget=budget, exclude_project=exclude_project, max_running=max_running
        )

    # LeaseRepository (_leases.py)
    def claim(
        self, task_id: str, status: str = "running", *, only_from: Iterable[str] = ("queued",)
    ) -> Task | None:
        return self.leases.claim(task_id, status, only_from=only_from)

    def take_lease(
        self,
        task_id: str,
        runner_id: str,
        *,
        seconds: float,
        only_from: Iterable[str] = ACTIVE_STATUSES,
    ) -> Task | None:
        return self.leases.take_lease(task_id, runner_id, seconds=seconds, only_from=only_from)

    def renew_lease(self, task_id: str, runner_id: str, *, seconds: float) -> bool:
        return self.leases.renew_lease(task_id, runner_id, seconds=seconds)

    def release_lease(self, task_id: str, runner_id: str) -> None:
        return self.leases.release_lease(task_id, runner_id)

    def cancel_requested(self, task_id: str) -> bool:
        return self.leases.cancel_requested(task_id)

    def request_cancel(
        self,
        task_id: str,
        *,
        reason: str = "cancelled by request",
        by: str | None = None,
        via: str = "api",
    ) -> Task:
        return self.leases.request_cancel(task_id, reason=reason, by=by, via=via)

    def settle_abandoned(self, task_id: str, *, max_attempts: int) -> Task | None:
        return self.leases.settle_abandoned(task_id, max_attempts=max_attempts)

    def abandoned_tasks(self, *, exclude_project: str | None = None) -> list[Task]:
        return self.leases.abandoned_tasks(exclude_project=exclude_project)

    def lease_of(self, task_id: str) -> tuple[str | None, datetime | None]:
        return self.leases.lease_of(task_id)

    # EventRepository (_events.py)
    def append_event(
        self, task_id: str, event: Mapping[str, Any], *, attempt: int | None = None
    ) -> int:
        return self.events.append_event(task_id, event, attempt=attempt)

    def append_events(
        self,
        task_id: str,
        events: Sequence[Mapping[str, Any]],
        *,
        attempt: int | None = None,
        end: RunEnd | None = None,
    ) -> list[int]:
        return self.events.append_events(task_id, events, attempt=attempt, end=end)

    def events_after(
        self, task_id: str, after_seq: int = 0, *, limit: int | None = None
    ) -> list[Event]:
        return self.events.events_after(task_id, after_seq, limit=limit)

    def handoffs(self, task_id: str) -> list[HandoffEntry]:
        return self.events.handoffs(task_id)

    def tool_calls(self, task_id: str) -> list[ToolCall]:
        return self.events.tool_calls(task_id)

    def approvals(self, task_id: str) -> list[Approval]:
        return self.events.approvals(task_id)

    # UsageRepository (_usage_records.py)
    def usage(self, task_id: str) -> list[AgentUsage]:
        return self.usage_records.usage(task_id)

    def record_usage(
        self,
        task_id: str,
        records: Iterable[Mapping[str, Any]],
        *,
        attempt: int | None = None,
    ) -> None:
        return self.usage_records.record_usage(task_id, records, attempt=attempt)

    def end_run(
        self,
        task_id: str,
        *,
        usage: Iterable[Mapping[str, Any]] = (),
        runner_id: str | None = None,
        status: str | None = None,
        attempt: int | None = None,
        **fields: str | None,
    ) -> None:
        return self.usage_records.end_run(
            task_id, usage=usage, runner_id=runner_id, status=status, attempt=attempt, **fields
        )

    def usage_for_project(
        self, project_id: str, since: datetime | None = None, until: datetime | None = None
    ) -> dict[str, Any]:
        return self.usage_records.usage_for_project(project_id, since, until)

    # ApprovalRepository (_approvals.py)
    def get_approval(self, task_id: str, approval_id: str) -> Approval | None:
        return self.approval_decisions.get_approval(task_id, approval_id)

    def record_decision(
        self,
        task_id: str,
        approval_id: str,
        *,
        decision: str,
        decided_by: str,
        reason: str | None = None,
        args: Mapping[str, Any] | None = None,
    ) -> Approval:
        return self.approval_decisions.record_decision(
            task_id, approval_id, decision=decision, decided_by=decided_by, reason=reason, args=args
        )

    # EvalRunRepository (_eval_runs.py)
    def record_eval_run(
        self,
        *,
        golden: str,
        models: Mapping[str, Any],
        options: Mapping[str, Any],
        case_count: int,
        run_count: int,
        started_at: datetime | None = None,
    ) -> str:
        return self.eval_records.record_eval_run(
            golden=golden,
            models=models,
            options=options,
            case_count=case_count,
            run_count=run_count,
            started_at=started_at,
        )

    def record_eval_case(
        self,
        eval_run_id: str,
        *,
        case_id: str,
        trial: int,
        passed: bool,
        checks: Sequence[Mapping[str, Any]],
        task_id: str | None = None,
        usage: Mapping[str, Any] | None = None,
        latency_seconds: float = 0.0,
        error: str | None = None,
    ) -> EvalCaseRecord:
        return self.eval_records.record_eval_case(
            eval_run_id,
            case_id=case_id,
            trial=trial,
            passed=passed,
            checks=checks,
            task_id=task_id,
            usage=usage,
            latency_seconds=latency_seconds,
            error=error,
        )

    def finish_eval_run(
        self,
        eval_run_id: str,
        *,
        metrics: Mapping[str, Any],
        finished_at: datetime | None = None,
    ) -> EvalRunRecord:
        return self.eval_records.finish_eval_run(
            eval_run_id, metrics=metrics, finished_at=finished_at
        )

    def eval_runs(self, limit: int = 20) -> list[EvalRunRecord]:
        return self.eval_records.eval_runs(limit)

    def eval_run(self, eval_run_id: str) -> EvalRunRecord:
        return self.eval_records.eval_run(eval_run_id)

    # ToolJournalRepository (_journal.py)
    def journaled_call(self, task_id: str, call_id: str) -> dict[str, Any] | None:
        return self.journal_records.journaled_call(task_id, call_id)

    def check_attempt(self, task_id: str, attempt: int) -> None:
        return self.journal_records.check_attempt(task_id, attempt)

    def journal_call(
        self,
        task_id: str,
        call_id: str,
        record: Mapping[str, Any],
        *,
        attempt: int | None = None,
    ) -> dict[str, Any]:
        return self.journal_records.journal_call(task_id, call_id, record, attempt=attempt)

    @property
    def tool_journal(self) -> LedgerToolJournal:
        return self.journal_records.tool_journal

    def attempt_journal(self, attempt: int) -> LedgerToolJournal:
        return self.journal_records.attempt_journal(attempt)

    # WorkerDispatchRepository (_dispatch.py)
    def queue_for_workers(self, task_id: str) -> int:
        return self.worker_dispatch.queue_for_workers(task_id)

    def claim_for_workers(self, task_id: str) -> int | None:
        return self.worker_dispatch.claim_for_workers(task_id)

    def begin_attempt(
        self, task_id: str, *, dispatch: int, worker_id: str, max_attempts: int
    ) -> int | None:
        return self.worker_dispatch.begin_attempt(
            task_id, dispatch=dispatch, worker_id=worker_id, max_attempts=max_attempts
        )

    def start_attempt(
        self, task_id: str, *, dispatch: int, worker_id: str, max_attempts: int
    ) -> Attempt | None:
        return self.worker_dispatch.start_attempt(
            task_id, dispatch=dispatch, worker_id=worker_id, max_attempts=max_attempts
        )

    def attempt_state(self, task_id: str) -> tuple[int, bool] | None:
        return self.worker_dispatch.attempt_state(task_id)

    def report_worker_slots(
        self, worker_id: str, *, slots: int, now: datetime | None = None
    ) -> None:
        return self.worker_slots.report_worker_slots(worker_id, slots=slots, now=now)

    def forget_worker_slots(self, worker_id: str) -> None:
        return self.worker_slots.forget_worker_slots(worker_id)
