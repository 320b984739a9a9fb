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
- ``ledger.attempts``: the worker mode's attempts and the dispatch numbers that start them
  (``_attempts.AttemptRepository``);
- ``ledger.worker_slots``: the worker mode's pool processes and their free slots
  (``_worker_slots.WorkerSlotRepository``).

Each public method of a repository is a :class:`forward` line here that names the method,
``append_events = forward("events", EventRepository.append_events)``: ``ledger.append_events``
is ``ledger.events.append_events``, so grep or "go to definition" lead from the one to the
other, and a type checker checks every call against the repository method's own signature.
The repositories never call each other; what two of them share is a function in
``_task_rows``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar, overload

from relaygraph.store._approvals import ApprovalRepository
from relaygraph.store._attempts import AttemptRepository
from relaygraph.store._core import LedgerCore
from relaygraph.store._eval_runs import EvalRunRepository
from relaygraph.store._events import EventRepository
from relaygraph.store._journal import LedgerToolJournal, ToolJournalRepository
from relaygraph.store._leases import LeaseRepository
from relaygraph.store._quotas import QuotaRepository
from relaygraph.store._task_queries import TaskQueryRepository
from relaygraph.store._tasks import TaskRepository
from relaygraph.store._teams import TeamRepository
from relaygraph.store._tenants import TenantRepository, hash_key
from relaygraph.store._usage_records import UsageRepository
from relaygraph.store._worker_slots import WorkerSlotRepository

__all__ = ["Ledger", "hash_key"]

P = ParamSpec("P")
R = TypeVar("R")


class forward(Generic[P, R]):
    """A :class:`Ledger` attribute that is one of its repositories' methods.

    ``name = forward("events", EventRepository.name)`` in the class makes ``ledger.name``
    the bound ``ledger.events.name``, typed as that method (its parameters, without
    ``self``, and its return); ``Ledger.name(ledger, ...)`` calls it too, as a method's
    function would be called on the class.

    Args:
        repository: The :class:`Ledger` attribute that holds the repository.
        method: The repository class's method, of the same name as the attribute.
    """

    def __init__(self, repository: str, method: Callable[Concatenate[Any, P], R]) -> None:
        self.repository = repository
        self.method = method
        self.name: str = method.__name__
        # What help() and inspect.signature() show for ``Ledger.name``: the method's own.
        self.__doc__ = method.__doc__
        self.__wrapped__ = method

    def __set_name__(self, owner: type, name: str) -> None:
        if name != self.name:
            raise TypeError(
                f"{owner.__name__}.{name} forwards to {self.method.__qualname__}: "
                "a forwarded method keeps its name"
            )

    @overload
    def __get__(self, ledger: None, owner: type | None = None) -> Self: ...

    @overload
    def __get__(self, ledger: object, owner: type | None = None) -> Callable[P, R]: ...

    def __get__(self, ledger: object | None, owner: type | None = None) -> Self | Callable[P, R]:
        if ledger is None:
            return self
        bound: Callable[P, R] = getattr(getattr(ledger, self.repository), self.name)
        return bound

    def __call__(self, ledger: object, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.__get__(ledger)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"forward({self.repository!r}, {self.method.__qualname__})"


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
        self.attempts = AttemptRepository(self.core)
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

    close = forward("core", LedgerCore.close)
    upgrade = forward("core", LedgerCore.upgrade)
    is_current = forward("core", LedgerCore.is_current)

    # TenantRepository (_tenants.py)
    create_project = forward("tenants", TenantRepository.create_project)
    create_api_key = forward("tenants", TenantRepository.create_api_key)
    revoke_api_key = forward("tenants", TenantRepository.revoke_api_key)
    api_keys = forward("tenants", TenantRepository.api_keys)
    authenticate = forward("tenants", TenantRepository.authenticate)
    get_project = forward("tenants", TenantRepository.get_project)
    project_by_id = forward("tenants", TenantRepository.project_by_id)

    # TeamRepository (_teams.py)
    register_team = forward("team_registry", TeamRepository.register_team)
    team_version = forward("team_registry", TeamRepository.team_version)
    team_versions = forward("team_registry", TeamRepository.team_versions)
    teams = forward("team_registry", TeamRepository.teams)
    projects_with_teams = forward("team_registry", TeamRepository.projects_with_teams)

    # TaskRepository (_tasks.py)
    create_task = forward("tasks", TaskRepository.create_task)
    get_task = forward("tasks", TaskRepository.get_task)
    list_tasks = forward("tasks", TaskRepository.list_tasks)
    tasks_ended_before = forward("tasks", TaskRepository.tasks_ended_before)
    unfinished_tasks = forward("tasks", TaskRepository.unfinished_tasks)
    task_owner = forward("tasks", TaskRepository.task_owner)
    task_by_idempotency_key = forward("tasks", TaskRepository.task_by_idempotency_key)
    thread_exists = forward("tasks", TaskRepository.thread_exists)
    thread_topology = forward("tasks", TaskRepository.thread_topology)
    active_task_on_thread = forward("tasks", TaskRepository.active_task_on_thread)
    set_status = forward("tasks", TaskRepository.set_status)
    count_tasks_by_status = forward("tasks", TaskRepository.count_tasks_by_status)
    oldest_queued_at = forward("tasks", TaskRepository.oldest_queued_at)

    # TaskQueryRepository (_task_queries.py)
    select_tasks = forward("task_queries", TaskQueryRepository.select_tasks)
    replays_of = forward("task_queries", TaskQueryRepository.replays_of)

    # QuotaRepository (_quotas.py)
    set_project_quotas = forward("quotas", QuotaRepository.set_project_quotas)
    project_quotas = forward("quotas", QuotaRepository.project_quotas)
    project_load = forward("quotas", QuotaRepository.project_load)
    spent_today = forward("quotas", QuotaRepository.spent_today)
    queued_tasks = forward("quotas", QuotaRepository.queued_tasks)
    tasks_to_publish = forward("quotas", QuotaRepository.tasks_to_publish)

    # LeaseRepository (_leases.py)
    claim = forward("leases", LeaseRepository.claim)
    take_lease = forward("leases", LeaseRepository.take_lease)
    renew_lease = forward("leases", LeaseRepository.renew_lease)
    renew_leases = forward("leases", LeaseRepository.renew_leases)
    release_lease = forward("leases", LeaseRepository.release_lease)
    cancel_requested = forward("leases", LeaseRepository.cancel_requested)
    request_cancel = forward("leases", LeaseRepository.request_cancel)
    settle_abandoned = forward("leases", LeaseRepository.settle_abandoned)
    abandoned_tasks = forward("leases", LeaseRepository.abandoned_tasks)
    lease_of = forward("leases", LeaseRepository.lease_of)

    # EventRepository (_events.py)
    append_event = forward("events", EventRepository.append_event)
    append_events = forward("events", EventRepository.append_events)
    events_after = forward("events", EventRepository.events_after)
    handoffs = forward("events", EventRepository.handoffs)
    tool_calls = forward("events", EventRepository.tool_calls)
    approvals = forward("events", EventRepository.approvals)

    # UsageRepository (_usage_records.py)
    usage = forward("usage_records", UsageRepository.usage)
    record_usage = forward("usage_records", UsageRepository.record_usage)
    end_run = forward("usage_records", UsageRepository.end_run)
    usage_for_project = forward("usage_records", UsageRepository.usage_for_project)

    # ApprovalRepository (_approvals.py)
    get_approval = forward("approval_decisions", ApprovalRepository.get_approval)
    record_decision = forward("approval_decisions", ApprovalRepository.record_decision)

    # EvalRunRepository (_eval_runs.py)
    record_eval_run = forward("eval_records", EvalRunRepository.record_eval_run)
    record_eval_case = forward("eval_records", EvalRunRepository.record_eval_case)
    finish_eval_run = forward("eval_records", EvalRunRepository.finish_eval_run)
    eval_runs = forward("eval_records", EvalRunRepository.eval_runs)
    eval_run = forward("eval_records", EvalRunRepository.eval_run)

    # ToolJournalRepository (_journal.py)
    journaled_call = forward("journal_records", ToolJournalRepository.journaled_call)
    check_attempt = forward("journal_records", ToolJournalRepository.check_attempt)
    journal_call = forward("journal_records", ToolJournalRepository.journal_call)
    attempt_journal = forward("journal_records", ToolJournalRepository.attempt_journal)

    @property
    def tool_journal(self) -> LedgerToolJournal:
        return self.journal_records.tool_journal

    # AttemptRepository (_attempts.py)
    queue_for_workers = forward("attempts", AttemptRepository.queue_for_workers)
    claim_for_workers = forward("attempts", AttemptRepository.claim_for_workers)
    begin_attempt = forward("attempts", AttemptRepository.begin_attempt)
    start_attempt = forward("attempts", AttemptRepository.start_attempt)
    attempt_state = forward("attempts", AttemptRepository.attempt_state)
    attempt_states = forward("attempts", AttemptRepository.attempt_states)

    # WorkerSlotRepository (_worker_slots.py)
    report_worker_slots = forward("worker_slots", WorkerSlotRepository.report_worker_slots)
    forget_worker_slots = forward("worker_slots", WorkerSlotRepository.forget_worker_slots)
