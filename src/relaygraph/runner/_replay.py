"""Replay a recorded task: a new task of the same project, on a thread of its own, from the
original's request or from its checkpoint after step N, on another model, team (version)
or policy. The original is never changed.

A step is one agent visit (the transfer of work that started it, the agent's tool calls,
its violations and usage), as :mod:`relaygraph.evals._trajectory` reads it from the ledger.
A replay from step N goes on from the original's checkpoint just after its N-th visit: the
checkpoints of the original's thread up to that one, with the writes that made them, are
copied to the replay's thread (LangGraph's fork of a thread: its state is rebuilt from the
copied steps' writes, as the original's was), so the first N steps' tool calls are not run
again and their recorded results stand; the original's workspace is copied to the
replay's (:func:`copy_original_workspace`). The replay is submitted through the one
submission path (:func:`~relaygraph.runner.submit_task`) with ``replay_of`` and
``from_step``, and started like any task: ``TaskRun.graph_input`` goes on from the fork.

The fork reads the saver's checkpoint tuples rather than state through the graph (the rule
elsewhere): what it copies are those tuples, and the step a checkpoint follows is told by
its writes alone, so the original's team graph is never built (a replay on a new version
works when the old one no longer builds).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relaygraph._home import data_home
from relaygraph.backends.workspace import (
    CopiedWorkspace,
    WorkspaceQuota,
    WorkspaceTooLarge,
    copy_workspace,
    delete_folder,
)
from relaygraph.errors import ConfigError
from relaygraph.runner._checkpoint import open_checkpointer
from relaygraph.runner._errors import RequestRefused
from relaygraph.runner._ledger import ledger_for
from relaygraph.runner._submit import Intake, SubmittedTask, TaskRequest, submit_task
from relaygraph.store import new_checkpoint_thread

if TYPE_CHECKING:
    from relaygraph.policies import TeamPolicy
    from relaygraph.runner._result import RunResult
    from relaygraph.runner._task_run import EventHandler
    from relaygraph.store import Ledger, Task
    from relaygraph.team import Team

__all__ = [
    "ReplayChanges",
    "check_from_step",
    "fork_checkpoints",
    "replay_task",
    "submit_replay",
]

logger = logging.getLogger(__name__)

_VISITS_CHANNEL = "visits"
"""The team state's channel each agent visit writes its record to, once per visit."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplayChanges:
    """What a replay changes of the task it replays; everything left None is the
    original's (its team, its models, its policy)."""

    from_step: int = 0
    """Go on after the original's first ``from_step`` steps (agent visits); 0: from its
    request."""
    model: Any = None
    """A spec or chat model for every role that ``agent_models`` leaves open."""
    agent_models: Mapping[str, Any] = field(default_factory=dict)
    team: Team | None = None
    """Another team (another version of it); the original's own when None."""
    team_version: int | None = None
    """The registered version of ``team``."""
    trust_team: bool = True
    """Whether ``team``'s own models skip the caller's model rules (a project's registered
    team names only what a request could)."""
    policy: TeamPolicy | None = None
    """The policy to run under; the original's (or ``team``'s own, with a new team) when
    None."""
    policy_override: Mapping[str, Any] | None = None
    """Policy-file-shaped overrides that may only tighten the policy (the API's body)."""


def check_from_step(value: object) -> int:
    """``value`` as a step number.

    Raises:
        RequestRefused: ``from_step`` is not a whole number of 0 or more.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RequestRefused(
            f"from_step must be a whole number of 0 or more (got {value!r})", field="from_step"
        )
    return value


def replay_request(
    original: Task, changes: ReplayChanges, *, team: Team, policy: TeamPolicy | None
) -> TaskRequest:
    """The submission of a replay of ``original``: its request, in its project, on a new
    thread, with ``changes`` and the original's models where nothing else names one."""
    # The arrangement is the original's unless the team changes (another team may lack the
    # start agent a swarm recorded).
    arrangement = (original.topology or {}) if changes.team is None else {}
    return TaskRequest(
        input=original.input,
        team=team,
        team_version=changes.team_version
        if changes.team is not None
        else (original.team or {}).get("version"),
        trust_team=changes.trust_team,
        policy=policy,
        policy_override=changes.policy_override,
        project_id=original.project_id,
        model=changes.model,
        agent_models=dict(changes.agent_models),
        inherited_models=None if changes.model is not None else dict(original.models),
        topology=arrangement.get("kind"),
        start_agent=arrangement.get("start_agent"),
        output_mode=arrangement.get("output_mode"),
        replay_of=original.id,
        from_step=changes.from_step,
    )


def fork_checkpoints(saver: Any, original: Task, from_step: int) -> list[Any]:
    """The root checkpoints of ``original``'s thread, oldest first, up to the one just after
    its ``from_step``-th agent visit (the last of the list): what a replay from that step
    copies. The thread's earlier tasks' checkpoints come first (a later request of a
    conversation goes on from them).

    Raises:
        RequestRefused: ``from_step`` is past the original's last step (naming how many
            it has), or the original made no checkpoint to go on from.
    """
    chain: list[Any] = []
    visits = 0
    config = {"configurable": {"thread_id": original.checkpoint_thread, "checkpoint_ns": ""}}
    for saved in reversed(list(saver.list(config))):
        chain.append(saved)
        if (saved.metadata or {}).get("relaygraph_task_id") != original.id:
            continue
        if visits == from_step and from_step > 0:
            return chain
        # A checkpoint's pending writes are those of the step after it: a visit that
        # step finished wrote its record once.
        visits += len(
            {task for task, channel, _ in saved.pending_writes or () if channel == _VISITS_CHANNEL}
        )
    raise RequestRefused(
        f"task {original.id} has {visits} step(s) to replay from: from_step takes 0 to "
        f"{visits} (got {from_step})",
        field="from_step",
    )


def copy_fork(saver: Any, chain: Sequence[Any], *, original: Task, thread: str) -> None:
    """Copy ``chain`` (:func:`fork_checkpoints`) to the checkpointer's ``thread``: each
    checkpoint under its parent, and the writes of each but the last (the last's are the
    step the replay runs anew). Each says what it was forked from
    (``relaygraph_forked_from``); the original's stay its own (``relaygraph_task_id``), so
    a replay's run tells the fork from checkpoints of its own (``TaskRun.graph_input``)."""
    parent: str | None = None
    for index, saved in enumerate(chain):
        metadata = {**(saved.metadata or {}), "relaygraph_forked_from": original.id}
        configurable: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
        if parent is not None:
            configurable["checkpoint_id"] = parent
        checkpoint = saved.checkpoint
        stored = saver.put(
            {"configurable": configurable},
            checkpoint,
            metadata,
            dict(checkpoint["channel_versions"]),
        )
        if index < len(chain) - 1:
            for task_id, writes in _writes_by_task(saved.pending_writes or ()).items():
                saver.put_writes(stored, writes, task_id)
        parent = checkpoint["id"]


def _writes_by_task(pending: Sequence[tuple[str, str, Any]]) -> dict[str, list[tuple[str, Any]]]:
    grouped: dict[str, list[tuple[str, Any]]] = {}
    for task_id, channel, value in pending:
        grouped.setdefault(task_id, []).append((channel, value))
    return grouped


def submit_replay(
    original: Task,
    changes: ReplayChanges,
    *,
    team: Team,
    policy: TeamPolicy | None,
    intake: Intake,
    home: Path,
    workspace_quota: WorkspaceQuota | None = None,
    idempotency_key: str | None = None,
) -> SubmittedTask:
    """Submit a replay of ``original`` (which the caller found in its own project): copy the
    original's checkpoints up to the step to a new thread and its workspace to the new
    task's, then check and record the replay on it as a new task with ``replay_of`` and
    ``from_step``, and start it (``intake.enqueue``) or leave it to the caller's runner
    (``intake.runner_id``), as :func:`~relaygraph.runner.submit_task` does.

    Args:
        intake: Where the replay is recorded and how it starts.
        workspace_quota: What the replay's files may hold (the runner's); the workspace
            copied from the original is held to it.
        idempotency_key: A retry with the same key returns the replay the first try
            created (and copies nothing again).

    Raises:
        RequestRefused: See :func:`~relaygraph.runner.check_request`; ``from_step`` past
            the original's steps, or a workspace to copy past ``workspace_quota``
            (``workspace_quota_exceeded``); ``idempotency_key_reused``.
    """
    from_step = check_from_step(changes.from_step)
    request = replace(
        replay_request(original, changes, team=team, policy=policy),
        idempotency_key=idempotency_key,
    )
    submit = functools.partial(submit_task, intake=intake)
    ledger = intake.ledger
    if from_step == 0:
        return submit(request)
    retry = _retry_of_replay(request, ledger)
    if retry is not None:
        return submit(retry)
    try:
        return _submit_fork(
            original,
            request,
            submit,
            ledger=ledger,
            home=home,
            quota=workspace_quota or WorkspaceQuota(),
        )
    except RequestRefused as refused:
        # Two first tries with one key raced (PostgreSQL): the other recorded its replay,
        # on a thread of its own, and this one's fork is gone. Answer as to a retry.
        retry = _retry_of_replay(request, ledger)
        if refused.code != "idempotency_key_reused" or retry is None:
            raise
        return submit(retry)


def _retry_of_replay(request: TaskRequest, ledger: Ledger) -> TaskRequest | None:
    """``request`` as a retry of the replay its idempotency key created, or None when the
    key created nothing yet. A retry copies nothing: it names the first try's thread, so the
    ledger answers with the first try's task when everything else is the same, and refuses
    the key (naming what differs) when not."""
    key = request.idempotency_key
    first_try = None if key is None else ledger.task_by_idempotency_key(request.project_id, key)
    if first_try is None:
        return None
    same_fork = (first_try.replay_of, first_try.from_step) == (request.replay_of, request.from_step)
    # Not the same replay: a thread of no fork, which the ledger's refusal never reaches.
    thread_id = first_try.thread_id if same_fork else str(uuid.uuid4())
    return replace(request, thread_id=thread_id, thread_must_exist=False)


def _submit_fork(
    original: Task,
    request: TaskRequest,
    submit: Callable[[TaskRequest], SubmittedTask],
    *,
    ledger: Ledger,
    home: Path,
    quota: WorkspaceQuota,
) -> SubmittedTask:
    """Copy the fork and the workspace, then submit ``request`` on them.

    Both are copied before the replay is recorded: a runner that takes queued tasks from
    the ledger (``serve --processes``) may start it the moment it is, and must find them.
    Its id is therefore chosen here, for the workspace's folder (``tasks/<id>``)."""
    from relaygraph.agents.context import TaskContext

    thread_id, task_id = str(uuid.uuid4()), str(uuid.uuid4())
    thread = new_checkpoint_thread(original.project_id, thread_id)
    workspace = TaskContext.for_task(home, task_id=task_id, thread_id=thread_id).workspace
    with open_checkpointer(home) as saver:
        copy_fork(
            saver,
            fork_checkpoints(saver, original, request.from_step or 0),
            original=original,
            thread=thread,
        )
        try:
            copy_original_workspace(original, workspace, home=home, quota=quota, request=request)
            return submit(
                replace(request, thread_id=thread_id, thread_must_exist=False, task_id=task_id)
            )
        except BaseException:
            # The fork and the files of a replay that was not recorded are removed. One that
            # was (its start failed after: a broker down) keeps them, for a retry with its
            # Idempotency-Key to start it; so does one the ledger cannot tell of now.
            recorded = True
            with contextlib.suppress(Exception):
                recorded = ledger.get_task(task_id, project_id=original.project_id) is not None
            if not recorded:
                saver.delete_thread(thread)
                delete_folder(workspace.parent)
            raise


def copy_original_workspace(
    original: Task, workspace: Path, *, home: Path, quota: WorkspaceQuota, request: TaskRequest
) -> CopiedWorkspace:
    """Copy ``original``'s workspace, as it is now, to the replay's ``workspace``.

    Which files existed just after step N is not recorded (a program may write any file,
    and nothing journals the workspace), so the files as the original left them are the
    honest approximation: a later step finds what earlier steps wrote, and also what the
    original's steps after N wrote.

    Raises:
        RequestRefused: ``workspace_quota_exceeded``: the workspace holds more than
            ``quota`` lets the replay's files hold.
    """
    from relaygraph.agents.context import TaskContext

    source = TaskContext.for_task(home, task_id=original.id, thread_id=original.thread_id)
    try:
        copied = copy_workspace(source.workspace, workspace, quota=quota)
    except WorkspaceTooLarge as exc:
        raise RequestRefused(
            f"task {original.id}'s workspace cannot be copied to its replay from step "
            f"{request.from_step}: {exc.quota}; replay from step 0, or raise the quota",
            field="from_step",
            code="workspace_quota_exceeded",
        ) from None
    if copied.left_out:
        logger.warning(
            "replay of task %s: %d workspace entries not copied (symlinks, special files, "
            "files with several links): %s",
            original.id,
            len(copied.left_out),
            ", ".join(copied.left_out[:10]),
        )
    return copied


def replay_task(
    task_id: str,
    changes: ReplayChanges | None = None,
    *,
    home: Path | None = None,
    on_event: EventHandler | None = None,
    cancel: threading.Event | None = None,
    project_id: str | None = None,
    teams: Callable[[Task], Team] | None = None,
    policies: Callable[[Task, TeamPolicy], TeamPolicy] | None = None,
) -> RunResult:
    """Replay the recorded task ``task_id`` of this data directory in this process, with
    ``changes``, and return the replay's result (its ``task_id`` is the new task's).

    ``project_id`` is the task's project: the CLI's own (``relaygraph run``'s) when None;
    an operator's eval may replay an API project's tasks, in that project, with ``teams``
    (the project's registered teams, ``ServiceTeams.resolve``) and ``policies`` (the
    operator's ceiling, ``ServiceTeams.policy_for``), as the server's runner has them.

    Raises:
        RequestRefused: No such task (``task_id``), a bad ``from_step``, or a change the
            submission refuses (a model, a policy that loosens).
        ConfigError: The original's team cannot be rebuilt (its file changed) and no
            other team was given.
    """
    from relaygraph.policies import stored_policy
    from relaygraph.runner._task_runner import TaskRunner
    from relaygraph.store import LOCAL_PROJECT_ID

    changes = changes or ReplayChanges()
    home = data_home(home)
    ledger = ledger_for(home)  # kept for the process: not closed here
    original = ledger.get_task(task_id, project_id=project_id or LOCAL_PROJECT_ID)
    if original is None:
        raise RequestRefused(
            f"no task {task_id!r} in {ledger.url}",
            field="task_id",
            code="task_not_found",
            kind="not_found",
        )
    runner = TaskRunner(ledger=ledger, home=home, teams=teams, policies=policies)
    team = changes.team if changes.team is not None else runner.recorded_team(original)
    policy = changes.policy
    if policy is None and changes.team is None and original.policy:
        try:
            policy = stored_policy(original.policy, source=f"task {original.id}")
        except ConfigError as exc:
            raise RequestRefused(str(exc), field="policy", code="invalid_policy") from None
    submitted = submit_replay(
        original,
        changes,
        team=team,
        policy=policy,
        intake=runner.intake(),
        home=home,
        workspace_quota=runner.workspace_quota,
    )
    return runner.run_submitted(
        submitted, {"request": original.input}, on_event=on_event, team=team, cancel=cancel
    )
