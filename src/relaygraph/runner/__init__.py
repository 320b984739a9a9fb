"""The runner: one task from request to ledger.

:func:`run_task` and :func:`resume_task` run a task (or continue a paused one) in this
process; :class:`TaskRunner` is the long-lived form the task service keeps (team cache,
checkpointer, ledger). Around them: the checkpointer (``_checkpoint``), the ledger writes
behind the graph (``_event_writer``), the runner's hold on its task (``_lease``), the
compiled teams per process (``_team_cache``) and the honest summary of a run (``_summary``).
"""

from relaygraph.runner._checkpoint import sqlite_checkpointer
from relaygraph.runner._run import (
    CONTINUE,
    LEASE_LOST,
    SUSPENDED,
    Decision,
    RunResult,
    TaskRunner,
    ledger_for,
    policy_digest,
    resolve_model_specs,
    resume_task,
    run_task,
    team_of_record,
)

__all__ = [
    "CONTINUE",
    "LEASE_LOST",
    "SUSPENDED",
    "Decision",
    "RunResult",
    "TaskRunner",
    "ledger_for",
    "policy_digest",
    "resolve_model_specs",
    "resume_task",
    "run_task",
    "sqlite_checkpointer",
    "team_of_record",
]
