"""The ledger: projects, API keys, tasks and everything that happened in them, in SQL.

SQLite in the data directory by default (``ledger.sqlite``, WAL mode); PostgreSQL when
``RELAYGRAPH_DATABASE_URL`` says so. The schema comes from migrations shipped in this
package: run ``relaygraph db upgrade`` (:func:`upgrade`) or :meth:`Ledger.upgrade`.

    ledger = Ledger()
    ledger.upgrade()
    project, key = ledger.create_project("research")
    task, created = ledger.create_task(project_id=project.id, input="...")
    ledger.append_event(task.id, {"type": "route", "next": "researcher", ...})
"""

from relaygraph.store._engine import (
    DATABASE_POOL_ENV,
    DATABASE_URL_ENV,
    database_pool_size,
    database_url,
    is_quiet,
)
from relaygraph.store._errors import (
    DATABASE_RETRY_SECONDS,
    AttemptSuperseded,
    RecordConflict,
    RecordNotFound,
    is_database_unavailable,
    is_disk_full,
)
from relaygraph.store._journal import LedgerToolJournal
from relaygraph.store._ledger import Ledger, hash_key
from relaygraph.store._models import LOCAL_PROJECT_ID
from relaygraph.store._notices import DEFAULT_CHANNEL, EventNotice
from relaygraph.store._quotas import day_start
from relaygraph.store._records import (
    FINISHED_STATUSES,
    TASK_STATUSES,
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
    TaskStatus,
    TeamVersion,
    ToolCall,
)
from relaygraph.store._task_queries import TaskSelection
from relaygraph.store._tasks import new_checkpoint_thread
from relaygraph.store._usage_records import RunEnd
from relaygraph.store._validate import unstorable
from relaygraph.store._worker_slots import WORKER_GONE_SECONDS, WORKER_REPORT_SECONDS
from relaygraph.store._write_turns import background_writes

__all__ = [
    "DATABASE_POOL_ENV",
    "DATABASE_RETRY_SECONDS",
    "DATABASE_URL_ENV",
    "DEFAULT_CHANNEL",
    "FINISHED_STATUSES",
    "LOCAL_PROJECT_ID",
    "TASK_STATUSES",
    "WORKER_GONE_SECONDS",
    "WORKER_REPORT_SECONDS",
    "AgentUsage",
    "ApiKey",
    "Approval",
    "Attempt",
    "AttemptSuperseded",
    "EvalCaseRecord",
    "EvalRunRecord",
    "Event",
    "EventNotice",
    "HandoffEntry",
    "Ledger",
    "LedgerToolJournal",
    "Project",
    "ProjectLoad",
    "QuotaOverrides",
    "Quotas",
    "RecordConflict",
    "RecordNotFound",
    "RunEnd",
    "Task",
    "TaskSelection",
    "TaskStatus",
    "TeamVersion",
    "ToolCall",
    "background_writes",
    "database_pool_size",
    "database_url",
    "day_start",
    "hash_key",
    "is_database_unavailable",
    "is_disk_full",
    "is_quiet",
    "new_checkpoint_thread",
    "unstorable",
    "upgrade",
]


def upgrade(url: str | None = None) -> str:
    """Migrate the ledger at ``url`` (default: see :func:`database_url`) to the latest schema.

    Returns:
        The database URL, password hidden, for the caller to report.
    """
    with Ledger(url) as ledger:
        ledger.upgrade()
        return ledger.url
