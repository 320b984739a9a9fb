"""The runner: one task from request to ledger.

A task comes in one way, whoever asks (the CLI, :func:`run_task`, the HTTP API):
:func:`submit_task` checks a :class:`TaskRequest`, records it and starts it as its
:class:`Intake` says (``_submit``); a paused task is answered one way too,
:func:`decide_task` (``_decide``). Refusals name the field at fault (:class:`RequestRefused`).

:func:`run_task` and :func:`resume_task` run a task (or continue a paused one) in this
process (``_run``); :class:`TaskRunner` is the long-lived form the task service keeps
(``_task_runner``): it prepares each run and takes it through the named steps of one
:class:`~relaygraph.runner._task_run.TaskRun` (input, ``run_started``, stream, result, end).
Around them: the result and a person's decision (``_result``), each role's model
(``_models``), the team a task runs (``_teams``), the ledger of a data directory
(``_ledger``), the event loop a process runs its tasks in flight on (``_task_loop``), the
run's keywords and the steps ``run`` and ``arun`` share (``_run_steps``), the checkpointer
(``_checkpoint``; a worker's, fenced by its attempt, in
``_fenced_saver``), the ledger writes behind the graph (``_event_writer``), the runner's hold
on its task (``_lease``: a lease in process, a worker's attempt in the worker mode), the
compiled teams per process (``_team_cache``), the honest summary of a run (``_summary``), the
settings every process that runs the service's tasks reads (``_settings``) and the teams
those tasks run (``_service_teams``).
"""

from relaygraph.runner._checkpoint import sqlite_checkpointer
from relaygraph.runner._decide import (
    Answers,
    Resume,
    decide_task,
    resume_input,
    waiting_approvals,
)
from relaygraph.runner._errors import RefusalKind, RequestRefused
from relaygraph.runner._fence import CheckpointFence
from relaygraph.runner._lease import DEFAULT_LEASE_SECONDS
from relaygraph.runner._ledger import ledger_for
from relaygraph.runner._long_lived import settle_long_lived
from relaygraph.runner._model_calls import ModelCallRecorder, ModelCallRecording
from relaygraph.runner._models import (
    ModelGate,
    ModelRules,
    RoleModels,
    check_model_spec,
    resolve_model_specs,
)
from relaygraph.runner._replay import (
    ReplayChanges,
    check_from_step,
    replay_task,
    submit_replay,
)
from relaygraph.runner._result import Decision, RunResult
from relaygraph.runner._retention import RETENTION_SWEEP_SECONDS, Freed, collect_garbage
from relaygraph.runner._run import arun_task, resume_task, run_task
from relaygraph.runner._service_teams import ServiceTeams
from relaygraph.runner._settings import RunnerSettings, load_runner_settings, read_settings
from relaygraph.runner._submit import (
    POLICY_SOURCE_KEY,
    Enqueue,
    Intake,
    Submission,
    SubmittedTask,
    TaskRequest,
    check_request,
    record_submission,
    submit_task,
)
from relaygraph.runner._task_loop import (
    DEFAULT_SYNC_THREADS,
    EVENT_LOOP_ENV,
    LoopLoad,
    TaskLoop,
    event_loop_kind,
)
from relaygraph.runner._task_run import (
    CONTINUE,
    LEASE_LOST,
    SUSPENDED,
    DrainSignal,
    EventHandler,
)
from relaygraph.runner._task_runner import RunOptions, TaskRunner, policy_digest
from relaygraph.runner._teams import prepare_knowledge_base, team_from_argument, team_of_record

__all__ = [
    "CONTINUE",
    "DEFAULT_LEASE_SECONDS",
    "DEFAULT_SYNC_THREADS",
    "EVENT_LOOP_ENV",
    "LEASE_LOST",
    "POLICY_SOURCE_KEY",
    "RETENTION_SWEEP_SECONDS",
    "SUSPENDED",
    "Answers",
    "CheckpointFence",
    "Decision",
    "DrainSignal",
    "Enqueue",
    "EventHandler",
    "Freed",
    "Intake",
    "LoopLoad",
    "ModelCallRecorder",
    "ModelCallRecording",
    "ModelGate",
    "ModelRules",
    "RefusalKind",
    "ReplayChanges",
    "RequestRefused",
    "Resume",
    "RoleModels",
    "RunOptions",
    "RunResult",
    "RunnerSettings",
    "ServiceTeams",
    "Submission",
    "SubmittedTask",
    "TaskLoop",
    "TaskRequest",
    "TaskRunner",
    "arun_task",
    "check_from_step",
    "check_model_spec",
    "check_request",
    "collect_garbage",
    "decide_task",
    "event_loop_kind",
    "ledger_for",
    "load_runner_settings",
    "policy_digest",
    "prepare_knowledge_base",
    "read_settings",
    "record_submission",
    "replay_task",
    "resolve_model_specs",
    "resume_input",
    "resume_task",
    "run_task",
    "settle_long_lived",
    "sqlite_checkpointer",
    "submit_replay",
    "submit_task",
    "team_from_argument",
    "team_of_record",
    "waiting_approvals",
]
