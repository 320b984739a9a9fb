"""The ledger: every project, task and thing that happened, in SQL.

A facade over one class per job, each in its own module: projects and keys (``_tenants``),
their quotas and the fair order of queued tasks (``_quotas``), registered teams
(``_teams``), tasks and threads (``_tasks``), leases (``_leases``), events and what they
imply (``_events``), usage and the end of a run (``_usage_records``), approvals
(``_approvals``), eval runs (``_eval_runs``), the tool journal (``_journal``) and the worker
mode's dispatches and attempts (``_dispatch``) and its pool processes' slots
(``_worker_slots``); the engine and sessions are ``_base``.
"""

from __future__ import annotations

from relaygraph.store._approvals import ApprovalsLedger
from relaygraph.store._base import hash_key
from relaygraph.store._dispatch import WorkerDispatchLedger
from relaygraph.store._eval_runs import EvalRunsLedger
from relaygraph.store._events import EventsLedger
from relaygraph.store._journal import ToolJournalLedger
from relaygraph.store._leases import LeasesLedger
from relaygraph.store._quotas import QuotasLedger
from relaygraph.store._tasks import TasksLedger
from relaygraph.store._teams import TeamsLedger
from relaygraph.store._tenants import TenantsLedger
from relaygraph.store._usage_records import UsageLedger
from relaygraph.store._worker_slots import WorkerSlotsLedger

__all__ = ["Ledger", "hash_key"]


class Ledger(
    TenantsLedger,
    TeamsLedger,
    TasksLedger,
    QuotasLedger,
    LeasesLedger,
    EventsLedger,
    UsageLedger,
    ApprovalsLedger,
    EvalRunsLedger,
    ToolJournalLedger,
    WorkerDispatchLedger,
    WorkerSlotsLedger,
):
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
