"""``POST /v1/tasks/{id}/replay`` and ``GET /v1/tasks/{a}/diff/{b}``: rerun a project's
recorded task from any step with something changed, and compare two of its tasks step by
step. A replay is submitted like any task (the same model rules, quotas and policy
ceiling: its policy may only tighten); another project's task is absent (404)."""

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import Field

from relaygraph.api._auth import own_task
from relaygraph.api._errors import ErrorAnswer, error_responses
from relaygraph.api._schemas import TaskOut, _RequestBody
from relaygraph.api._state import ServiceState
from relaygraph.api.routes.tasks import (
    SUBMISSION_ERRORS,
    idempotency_key_header,
    submitted_task_out,
)
from relaygraph.errors import ConfigError
from relaygraph.runner import ReplayChanges, SubmittedTask, submit_replay
from relaygraph.store import Project, Task

__all__ = ["ReplayCreate", "replay_in_project", "replays_router"]


class ReplayCreate(_RequestBody):
    """What a replay changes of the task it replays; what it leaves out stays the task's."""

    from_step: int = Field(
        default=0,
        ge=0,
        description="Go on after the task's first N steps (agent visits), whose tool calls "
        "are not run again; 0: from its request.",
    )
    team: str | None = Field(
        default=None, description="Another team of the project (or the server's)."
    )
    version: int | None = Field(
        default=None,
        ge=1,
        description="A registered version of `team` (of the task's own team without `team`).",
    )
    model: str | None = Field(default=None, description="Model spec for every role.")
    agent_models: dict[str, str] | None = Field(default=None, description="Spec per role.")
    policy: dict[str, Any] | None = Field(
        default=None,
        description="Policy-file-shaped overrides; may only tighten the replay's policy.",
    )


def replays_router(state: ServiceState) -> APIRouter:
    """``POST /v1/tasks/{id}/replay`` and ``GET /v1/tasks/{a}/diff/{b}``."""
    router = APIRouter(prefix="/v1/tasks")
    ProjectDep = Annotated[Project, Depends(state.project_of)]

    @router.post(
        "/{task_id}/replay",
        status_code=202,
        response_model=TaskOut,
        responses=SUBMISSION_ERRORS,
    )
    def replay(
        task_id: str,
        body: ReplayCreate,
        project: ProjectDep,
        idempotency_key: Annotated[str | None, idempotency_key_header("replay")],
    ) -> TaskOut:
        """Replay the task as a new task of the project, on a thread of its own (202); the
        task is not changed. The new task records `replay_of` and `from_step`. From a step,
        it starts with a copy of the task's workspace (held to the workspace quota)."""
        original = own_task(state.ledger(), task_id, project)
        submitted = replay_in_project(
            state, project.id, original, body, idempotency_key=idempotency_key
        )
        return submitted_task_out(state, submitted, project)

    @router.get("/{task_a}/diff/{task_b}", responses=error_responses(401, 404))
    def diff(task_a: str, task_b: str, project: ProjectDep) -> dict[str, Any]:
        """Two of the project's tasks aligned by step: routes and handoffs, tool calls
        (arguments and a result digest), violations, answers and usage per role, the first
        step where they part, and the differences summed."""
        from relaygraph.evals import diff_trajectories, read_trajectory

        ledger = state.ledger()
        a = read_trajectory(ledger, own_task(ledger, task_a, project))
        b = read_trajectory(ledger, own_task(ledger, task_b, project))
        return diff_trajectories(a, b).to_json()

    return router


def replay_in_project(
    state: ServiceState,
    project_id: str,
    original: Task,
    body: ReplayCreate,
    *,
    idempotency_key: str | None = None,
) -> SubmittedTask:
    """Submit a replay of the project's task ``original`` (the API's and the dashboard's
    one way): the team and version it recorded unless ``body`` names others, its policy
    under the operator's ceiling, tightened by ``body.policy``.

    Raises:
        ErrorAnswer: 404 for a team the project cannot use; 422 naming the bad field.
        RequestRefused: What the submission refuses (the API answers it by its field).
    """
    recorded = original.team or {}
    name = body.team if body.team is not None else recorded.get("name")
    version = body.version
    if body.team is None and version is None:
        version = recorded.get("version")
    chosen = state.teams.choose(project_id, name, version)
    unchanged = body.team is None and body.version is None
    policy = chosen.policy
    if unchanged and original.policy:
        policy = _recorded_policy(original, state)
    return submit_replay(
        original,
        ReplayChanges(
            from_step=body.from_step,
            model=body.model,
            agent_models=body.agent_models or {},
            team=None if unchanged else chosen.team,
            team_version=chosen.version,
            trust_team=chosen.origin != "project",
            policy_override=body.policy,
        ),
        team=chosen.team,
        policy=policy,
        intake=state.intake(),
        home=state.home,
        workspace_quota=state.settings.workspace_quota(),
        idempotency_key=idempotency_key,
    )


def _recorded_policy(task: Task, state: ServiceState) -> Any:
    """The policy ``task`` ran under, under the operator's ceiling as it is now."""
    from relaygraph.policies import stored_policy

    try:
        policy = stored_policy(task.policy or {}, source=f"task {task.id}")
    except ConfigError as exc:
        raise ErrorAnswer(422, "invalid_policy", str(exc), "policy") from None
    return state.teams.capped(policy)
