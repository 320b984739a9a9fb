"""One way in for a task: a request is checked into a :class:`Submission`, recorded in the
ledger, then started: in this process (``run_task``, ``relaygraph run``) or handed to an
``enqueue`` callable (the server's workers; a task queue).

The CLI, the Python API and the HTTP API all submit here, so a request is held to the same
rules whichever way it comes: the thread is the project's own and keeps its topology, the
topology's options fit the team, each role's model is one the caller may name, a request's
policy only tightens the team's, and a refusal names the field at fault
(:class:`~relaygraph.runner.RequestRefused`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from relaygraph.errors import ConfigError
from relaygraph.policies import TeamPolicy, policy_to_mapping, tighten
from relaygraph.runner._errors import RequestRefused
from relaygraph.runner._models import ModelRules, RoleModels, choose_models
from relaygraph.store import LOCAL_PROJECT_ID, Quotas, RecordConflict, Task
from relaygraph.topology import Topology

if TYPE_CHECKING:
    from relaygraph.store import Ledger
    from relaygraph.team import Team

__all__ = [
    "POLICY_SOURCE_KEY",
    "Enqueue",
    "Intake",
    "Submission",
    "SubmittedTask",
    "TaskRequest",
    "check_request",
    "record_submission",
    "submit_task",
]

POLICY_SOURCE_KEY = "policy_source"
"""The task metadata key that says where the task's policy came from (traces and the audit
timeline show it); the submission sets it, never the caller."""

Enqueue = Callable[[Task], None]
"""Starts a recorded ``queued`` task when a worker is free (the server's worker pool
in-process; a task queue's producer). It is handed the task as the submission recorded it,
so a worker pool need not read it again (two reads of every submission)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Intake:
    """Where a service records and starts the tasks submitted to it: its ledger, the rules
    its callers' models are held to, and how a recorded task starts (handed to ``enqueue``,
    or recorded under the lease of the runner that runs it in this process at once).

    Raises:
        ValueError: Both ``runner_id`` and ``enqueue``: a task runs in this process or is
            enqueued.
    """

    ledger: Ledger
    """Where the tasks are recorded."""
    model_rules: ModelRules | None = None
    """Which models the callers' requests may name; a user's own rules (any valid spec)
    when None."""
    enqueue: Enqueue | None = None
    """Starts a recorded task; None when the caller runs it itself (``run_task`` runs it
    in this process)."""
    runner_id: str | None = None
    """The runner that runs the tasks in this process at once (not with ``enqueue``): a
    task that may start now is recorded ``running`` under its lease, in the transaction
    that records it (``SubmittedTask.leased``), instead of ``queued`` for a ``take_lease``
    after, which would be a transaction of its own."""
    lease_seconds: float | None = None
    """With ``runner_id``, how long its lease lasts unrenewed."""
    quotas: Quotas | None = None
    """The server's quotas of every project (``RunnerSettings.quotas``): a new task past
    its project's quotas is refused. None: none (``run_task`` in a user's own process)."""

    def __post_init__(self) -> None:
        if self.runner_id is not None and self.enqueue is not None:
            raise ValueError("Intake: a task runs in this process (runner_id) or is enqueued")


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskRequest:
    """A task as a caller asks for it, before any check: ``run_task``'s arguments, the CLI's
    flags or the body of ``POST /v1/tasks``. A refusal names these fields."""

    input: str
    """What the team should do."""
    team: Team
    team_version: int | None = None
    """The registered version of ``team``, recorded with it; None for a team that has none."""
    trust_team: bool = True
    """Whether the team's own models skip the caller's model rules (a user's own team, a
    server's); a project's registered team may name only what a request could."""
    policy: TeamPolicy | None = None
    """The policy to run under; the team's own when None."""
    policy_override: Mapping[str, Any] | None = None
    """Policy-file-shaped overrides of ``policy`` that may only tighten it (the API body's
    ``policy``; a refusal names the field ``policy``)."""
    project_id: str = LOCAL_PROJECT_ID
    thread_id: str | None = None
    """Continue this conversation of the project; a new thread when None."""
    thread_must_exist: bool = True
    """Refuse a ``thread_id`` the project has not used (the CLI and ``run_task``); when
    False, an unknown id starts a thread of that id (the API's clients choose ids)."""
    model: Any = None
    """A spec or chat model for every role the team and ``agent_models`` leave open."""
    agent_models: Mapping[str, Any] = field(default_factory=dict)
    topology: str | None = None
    """The topology's kind; with ``start_agent`` and ``output_mode`` all None, the team's
    own arrangement."""
    start_agent: str | None = None
    output_mode: str | None = None
    metadata: Mapping[str, Any] | None = None
    """The caller's own JSON object, kept with the task."""
    multitask: Literal["reject", "enqueue"] | None = None
    """When the thread is busy with another task: refuse (``reject``), or queue behind it
    (``enqueue``). None: not asked (a user's own runs start at once)."""
    idempotency_key: str | None = None
    """A retry with the same key returns the task the first try created."""
    replay_of: str | None = None
    """The task this one replays (``runner.submit_replay``), of the same project."""
    from_step: int | None = None
    """The step of ``replay_of``'s trajectory the replay goes on from (0: its request)."""
    inherited_models: Mapping[str, str] | None = None
    """A replay's models: each role's spec as the replayed task recorded it, taken where
    the request and the team's agents name none (:func:`choose_models`)."""
    task_id: str | None = None
    """The new task's id, chosen before it is recorded (a replay copies the original's
    workspace into the new task's folder first); a new one when None."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Submission:
    """A checked request: everything the ledger records of it, and the objects a run in
    this process uses (the team, chat model objects)."""

    request: TaskRequest
    policy: TeamPolicy
    topology: Topology
    models: RoleModels
    metadata: dict[str, Any]
    waits_for_thread: bool
    """The thread is busy and the task queues behind its current one (``enqueue``)."""

    @property
    def team_record(self) -> dict[str, Any]:
        """What the task records of its team (``Team.record``)."""
        return self.request.team.record(version=self.request.team_version)


@dataclass(frozen=True, kw_only=True, slots=True)
class SubmittedTask:
    """A recorded submission."""

    task: Task
    submission: Submission
    created: bool
    """False: an earlier try with the same idempotency key created ``task``."""
    starts: bool
    """Whether it may start now: created, and its thread free (handed to ``enqueue``)."""
    leased: bool = False
    """Recorded ``running`` under the lease of the runner the submission named
    (``Intake.runner_id``), which starts it without taking the lease again."""


def check_request(
    request: TaskRequest, *, ledger: Ledger, model_rules: ModelRules | None = None
) -> Submission:
    """Check ``request`` against the team, the thread and the caller's model rules.

    Raises:
        RequestRefused: Naming the field at fault: ``input`` (empty); ``topology``,
            ``start_agent`` or ``output_mode`` (``invalid_topology``: an option of another
            topology, an agent the team lacks, a thread of another topology);
            ``agent_models.ROLE``, ``model`` or ``team`` (``invalid_model``,
            ``model_not_allowed``); ``policy`` (``invalid_policy``, ``policy_loosens``);
            ``metadata.policy_source``; ``thread_id`` (an unknown thread where it must
            exist; ``thread_busy``, a conflict).
    """
    if not request.input.strip():
        raise RequestRefused("the task is empty: say what the team should do", field="input")
    team = request.team
    topology = _requested_topology(request)
    models = choose_models(
        team,
        topology.roles(team.agent_names),
        model=request.model,
        agent_models=request.agent_models,
        rules=model_rules,
        trust_team=request.trust_team,
        inherited=request.inherited_models,
    )
    base = request.policy or team.resolved_policy
    policy = _tightened(base, request.policy_override)
    metadata = _metadata(request, base)
    topology, waits = _thread(request, topology, ledger)
    return Submission(
        request=request,
        policy=policy,
        topology=topology,
        models=models,
        metadata=metadata,
        waits_for_thread=waits,
    )


def record_submission(submission: Submission, intake: Intake) -> tuple[Task, bool]:
    """Record ``submission`` in ``intake``'s ledger as a ``queued`` task, or find the one an
    earlier try with its idempotency key created. With the intake's ``runner_id`` and
    ``lease_seconds``, a new task is recorded ``running`` under that runner's lease
    (``Ledger.create_task``). With its ``quotas`` (the server's), a new task past its
    project's quotas is refused.

    Returns:
        The task, and True when this call created it.

    Raises:
        RequestRefused: ``idempotency_key_reused`` (a conflict): the key was used for
            another request.
    """
    request = submission.request
    try:
        return intake.ledger.create_task(
            project_id=request.project_id,
            input=request.input,
            thread_id=request.thread_id,
            policy=policy_to_mapping(submission.policy),
            models=submission.models.recorded,
            topology=submission.topology.to_mapping(),
            metadata=submission.metadata,
            idempotency_key=request.idempotency_key,
            team=submission.team_record,
            runner_id=intake.runner_id,
            lease_seconds=intake.lease_seconds,
            quotas=intake.quotas,
            replay_of=request.replay_of,
            from_step=request.from_step,
            task_id=request.task_id,
        )
    except RecordConflict as exc:
        raise RequestRefused(
            str(exc), field="idempotency_key", code="idempotency_key_reused", kind="conflict"
        ) from None


def submit_task(request: TaskRequest, intake: Intake) -> SubmittedTask:
    """Check ``request``, record it, and hand it to ``intake.enqueue`` when it may start now.

    Args:
        request: The task asked for.
        intake: Where the task is recorded and how it starts.

    Raises:
        RequestRefused: See :func:`check_request` and :func:`record_submission`.
        QuotaExceeded: The project is at its queued quota or spent its day's budget.
    """
    submission = check_request(request, ledger=intake.ledger, model_rules=intake.model_rules)
    lease = intake.runner_id is not None and not submission.waits_for_thread
    # A task that waits for its thread is recorded queued: the runner's lease is for
    # tasks that start now.
    recorded_in = intake if lease else replace(intake, runner_id=None, lease_seconds=None)
    task, created = record_submission(submission, recorded_in)
    starts = created and not submission.waits_for_thread
    if starts and intake.enqueue is not None:
        intake.enqueue(task)
    return SubmittedTask(
        task=task,
        submission=submission,
        created=created,
        starts=starts,
        leased=lease and created,
    )


def _requested_topology(request: TaskRequest) -> Topology:
    """The request's topology; the team's own when it names none."""
    team = request.team
    if request.topology is None and request.start_agent is None and request.output_mode is None:
        topology = team.arrangement
    else:
        kind = request.topology or team.arrangement.kind
        # Each option is added on its own, so that a refusal names the one that does not
        # fit: the kind, then the start agent, then the output mode.
        steps: tuple[tuple[str, dict[str, Any]], ...] = (
            ("topology", {}),
            ("start_agent", {"start_agent": request.start_agent}),
            (
                "output_mode",
                {"start_agent": request.start_agent, "output_mode": request.output_mode},
            ),
        )
        for name, options in steps:
            try:
                topology = Topology.parse(kind, **options)
            except ConfigError as exc:
                raise RequestRefused(str(exc), field=name, code="invalid_topology") from None
    try:
        topology.check_agents(team.agent_names)
    except ConfigError as exc:
        raise RequestRefused(str(exc), field="start_agent", code="invalid_topology") from None
    return topology


def _tightened(base: TeamPolicy, override: Mapping[str, Any] | None) -> TeamPolicy:
    """``base``, tightened by the request's ``override``."""
    if override is None:
        return base
    try:
        return tighten(base, override, source="in the request")
    except ConfigError as exc:
        # tighten() raises one error type both for an override it cannot read and for
        # one that loosens the team's policy; its message is the only difference.
        code = "policy_loosens" if "loosens" in str(exc) else "invalid_policy"
        raise RequestRefused(str(exc), field="policy", code=code) from None


def _metadata(request: TaskRequest, base: TeamPolicy) -> dict[str, Any]:
    """The caller's metadata, plus where the task's policy came from, which the runner says."""
    metadata = dict(request.metadata or {})
    if POLICY_SOURCE_KEY in metadata:
        raise RequestRefused(
            f"metadata.{POLICY_SOURCE_KEY} is set by the server (where the task's policy "
            f"came from); use another key (got {metadata[POLICY_SOURCE_KEY]!r})",
            field=f"metadata.{POLICY_SOURCE_KEY}",
        )
    source = base.source or "default"
    metadata[POLICY_SOURCE_KEY] = f"{source} + request" if request.policy_override else source
    return metadata


def _thread(request: TaskRequest, topology: Topology, ledger: Ledger) -> tuple[Topology, bool]:
    """The topology continued from the request's thread, and whether the task waits for the
    thread's current one.

    Thread ids are each project's own: one that another project uses is, for this project,
    a new thread (and nothing says that the other project uses it).
    """
    thread_id, project_id = request.thread_id, request.project_id
    if thread_id is None:
        return topology, False
    if ledger.thread_exists(thread_id, project_id=project_id):
        earlier = Topology.from_mapping(ledger.thread_topology(thread_id, project_id=project_id))
        try:
            topology = topology.continuing(thread_id, earlier)
        except ConfigError as exc:
            name = "topology" if earlier.kind != topology.kind else "output_mode"
            raise RequestRefused(str(exc), field=name, code="invalid_topology") from None
    elif request.thread_must_exist:
        raise RequestRefused(
            f"thread {thread_id!r} has no earlier run in {ledger.url}; "
            "leave out --thread to start a new conversation",
            field="thread_id",
            code="thread_not_found",
            kind="not_found",
        )
    if request.multitask is None:
        return topology, False
    busy = ledger.active_task_on_thread(thread_id, project_id=project_id)
    if busy is None:
        return topology, False
    # A retry of a task already created is answered with that task, even while the task
    # keeps its thread busy.
    retry = request.idempotency_key is not None and (
        ledger.task_by_idempotency_key(project_id, request.idempotency_key) is not None
    )
    if request.multitask == "reject" and not retry:
        raise RequestRefused(
            f"thread {thread_id!r} is busy with task {busy.id} ({busy.status}); "
            'retry later or send "multitask": "enqueue"',
            field="thread_id",
            code="thread_busy",
            kind="conflict",
        )
    return topology, True
