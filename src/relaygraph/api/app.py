"""The task service: FastAPI routes under ``/v1`` over the ledger and the task workers."""

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Annotated, Any

from anyio import to_thread
from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.responses import JSONResponse
from sse_starlette.sse import EventSourceResponse

from relaygraph._home import data_home
from relaygraph.api._errors import ApiError, BodyLimit, error_body, install_error_handlers
from relaygraph.api._schemas import (
    POLICY_SOURCE_KEY,
    ApprovalOut,
    DecisionIn,
    TaskCreate,
    TaskOut,
    TaskPage,
)
from relaygraph.api._settings import ServiceSettings
from relaygraph.api._workers import TaskWorkers
from relaygraph.errors import ConfigError
from relaygraph.models import load_model, parse_model_spec
from relaygraph.policies import TeamPolicy, default_policy, load_policy, policy_to_mapping, tighten
from relaygraph.store import FINISHED_STATUSES, TASK_STATUSES, Ledger, RecordConflict, Team
from relaygraph.topology import Topology

__all__ = ["create_app"]

SSE_POLL_SECONDS = 0.2


def create_app(settings: ServiceSettings | None = None, *, start_workers: bool = True) -> FastAPI:
    """Build the API app. Migrations run and unfinished tasks restart when it starts.

    Args:
        settings: Service settings; read from the environment when None.
        start_workers: Pick up unfinished tasks at start-up (tests of a stopped server
            turn it off).
    """
    settings = settings or ServiceSettings()
    home = data_home(settings.home)
    base_policy = load_policy(settings.policy_file) if settings.policy_file else default_policy()
    parse_model_spec(settings.default_model)
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        import os

        from relaygraph.store import DATABASE_URL_ENV

        url = settings.database_url
        if url is None and not os.environ.get(DATABASE_URL_ENV):
            url = f"sqlite:///{home / 'ledger.sqlite'}"
        ledger = Ledger(url)
        await to_thread.run_sync(ledger.upgrade)
        workers = TaskWorkers(
            ledger, home=home, workers=settings.workers, lease_seconds=settings.lease_seconds
        )
        state.update(ledger=ledger, workers=workers)
        if start_workers:
            await to_thread.run_sync(workers.recover)
            workers.sweep()
        try:
            yield
        finally:
            # Running tasks stop at their next step boundary and stay `running`, for the
            # next start to continue; the ledger closes after their last writes.
            await to_thread.run_sync(lambda: workers.shutdown(wait=True))
            ledger.close()

    app = FastAPI(
        title="relaygraph",
        version="0.1.0",
        description="Submit tasks to a supervised team of agents and follow them as they run.",
        lifespan=lifespan,
        openapi_url="/openapi.json",
    )
    install_error_handlers(app)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)

    def ledger() -> Ledger:
        return state["ledger"]

    def team_of(authorization: Annotated[str | None, Header()] = None) -> Team:
        scheme, _, key = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise ApiError(401, "unauthorized", "send 'Authorization: Bearer <key>'")
        team = ledger().authenticate(key.strip())
        if team is None:
            raise ApiError(401, "unauthorized", "the API key is not valid (or was revoked)")
        return team

    TeamDep = Annotated[Team, Depends(team_of)]

    def own_task(task_id: str, team: Team) -> Any:
        task = ledger().get_task(task_id, team_id=team.id)
        if task is None:  # Another team's task is as absent as a missing one: 404, not 403.
            raise ApiError(404, "task_not_found", f"no task {task_id!r}", "task_id")
        return task

    def task_topology(body: TaskCreate) -> Topology:
        try:
            topology = Topology.parse(
                body.topology, start_agent=body.start_agent, output_mode=body.output_mode
            )
            topology.check_agents(tuple(base_policy.agents))
        except ConfigError as exc:
            field = "start_agent" if "start_agent" in str(exc) else "output_mode"
            raise ApiError(422, "invalid_topology", str(exc), field) from None
        return topology

    def check_models(body: TaskCreate, topology: Topology) -> dict[str, str]:
        from relaygraph.run import resolve_model_specs

        roles = topology.roles(tuple(base_policy.agents))
        agent_models = body.agent_models or {}
        for role in agent_models:
            if role not in roles:
                raise ApiError(
                    422,
                    "invalid_model",
                    f"agent_models names unknown role {role!r}; known: {', '.join(roles)}",
                    f"agent_models.{role}",
                )
        named = [("model", body.model)] + [
            (f"agent_models.{r}", s) for r, s in agent_models.items()
        ]
        for field, spec in named:
            if spec is None:
                continue
            try:
                parse_model_spec(spec)
            except ConfigError as exc:
                raise ApiError(422, "invalid_model", str(exc), field) from None
            if not settings.model_allowed(spec):
                raise ApiError(
                    422,
                    "model_not_allowed",
                    f"model {spec!r} is not allowed on this server "
                    f"(allowed: {', '.join(settings.allowed_models)})",
                    field,
                )
            if parse_model_spec(spec).provider != "local":
                # A script file that is missing or broken, or an OpenAI model with no key,
                # is refused now rather than failing the task later. (The embedded model
                # is not loaded here: loading it takes seconds, and its spec is checked.)
                try:
                    load_model(spec, agent=field.removeprefix("agent_models."))
                except ConfigError as exc:
                    raise ApiError(422, "invalid_model", str(exc), field) from None
        specs = resolve_model_specs(body.model or settings.default_model, agent_models, roles)
        return specs

    def task_metadata(body: TaskCreate) -> dict[str, Any]:
        """The caller's metadata, plus where the task's policy came from, which the server
        says (traces and the audit timeline show it)."""
        metadata = dict(body.metadata or {})
        if POLICY_SOURCE_KEY in metadata:
            raise ApiError(
                422,
                "invalid_request",
                f"metadata.{POLICY_SOURCE_KEY} is set by the server (where the task's policy "
                f"came from); use another key (got {metadata[POLICY_SOURCE_KEY]!r})",
                f"metadata.{POLICY_SOURCE_KEY}",
            )
        source = base_policy.source or "default"
        metadata[POLICY_SOURCE_KEY] = f"{source} + request" if body.policy else source
        return metadata

    def task_policy(body: TaskCreate) -> TeamPolicy:
        if body.policy is None:
            return base_policy
        try:
            return tighten(base_policy, body.policy, source="policy")
        except ConfigError as exc:
            code = "policy_loosens" if "loosens" in str(exc) else "invalid_policy"
            raise ApiError(422, code, str(exc), "policy") from None

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    def readyz() -> JSONResponse:
        try:
            current = ledger().is_current()
        except Exception as exc:  # Any database failure means not ready.
            return JSONResponse(error_body("not_ready", f"database: {exc}"), status_code=503)
        if not current:
            return JSONResponse(error_body("not_ready", "migrations pending"), status_code=503)
        return JSONResponse({"status": "ready"})

    @app.post("/v1/tasks", status_code=202, response_model=TaskOut)
    def create_task(
        body: TaskCreate,
        team: TeamDep,
        idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    ) -> TaskOut:
        topology = task_topology(body)
        specs = check_models(body, topology)
        policy = task_policy(body)
        # A retry of a task already created is answered with that task, even while the
        # task keeps its thread busy.
        retry = idempotency_key is not None and (
            ledger().task_by_idempotency_key(team.id, idempotency_key) is not None
        )
        if body.thread_id is not None:
            owner = ledger().thread_owner(body.thread_id)
            if owner is not None and owner != team.id:
                raise ApiError(
                    404, "thread_not_found", f"no thread {body.thread_id!r}", "thread_id"
                )
            if owner is not None:
                earlier = Topology.from_mapping(ledger().thread_topology(body.thread_id))
                try:
                    topology = topology.continuing(body.thread_id, earlier)
                except ConfigError as exc:
                    field = "output_mode" if "output_mode" in str(exc) else "topology"
                    raise ApiError(422, "invalid_topology", str(exc), field) from None
            busy = ledger().active_task_on_thread(body.thread_id)
            if busy is not None and body.multitask == "reject" and not retry:
                raise ApiError(
                    409,
                    "thread_busy",
                    f"thread {body.thread_id!r} is busy with task {busy.id} ({busy.status}); "
                    'retry later or send "multitask": "enqueue"',
                    "thread_id",
                )
        else:
            busy = None
        try:
            task, created = ledger().create_task(
                team_id=team.id,
                input=body.input,
                thread_id=body.thread_id,
                policy=policy_to_mapping(policy),
                models=specs,
                topology=topology.to_mapping(),
                metadata=task_metadata(body),
                idempotency_key=idempotency_key,
            )
        except RecordConflict as exc:
            raise ApiError(409, "idempotency_conflict", str(exc), "Idempotency-Key") from None
        if created and busy is None:
            state["workers"].start(task, team=team.id)
        return TaskOut.of(task)

    @app.get("/v1/tasks", response_model=TaskPage)
    def list_tasks(
        team: TeamDep,
        status: str | None = None,
        limit: Annotated[int, Query(ge=1, le=200)] = 50,
        cursor: str | None = None,
    ) -> TaskPage:
        if status is not None and status not in TASK_STATUSES:
            raise ApiError(
                422,
                "invalid_request",
                f"status {status!r} is not one of {', '.join(TASK_STATUSES)}",
                "status",
            )
        try:
            tasks, next_cursor = ledger().list_tasks(
                team_id=team.id, status=status, limit=limit, cursor=cursor
            )
        except ConfigError as exc:  # The status is known good: the cursor is at fault.
            raise ApiError(422, "invalid_request", str(exc), "cursor") from None
        return TaskPage(tasks=[TaskOut.of(t) for t in tasks], next_cursor=next_cursor)

    @app.get("/v1/tasks/{task_id}", response_model=TaskOut)
    def get_task(task_id: str, team: TeamDep) -> TaskOut:
        return TaskOut.of(own_task(task_id, team))

    @app.get("/v1/tasks/{task_id}/handoffs")
    def handoffs(task_id: str, team: TeamDep) -> dict[str, Any]:
        own_task(task_id, team)
        return {
            "handoffs": [
                {
                    "kind": h.kind,
                    "from": h.source,
                    "to": h.target,
                    "task": h.task,
                    "reason": h.reason,
                    "step": h.step,
                    "checkpoint_ns": h.checkpoint_ns,
                    "tokens_so_far": h.tokens_so_far,
                    "at": h.created_at.isoformat(),
                }
                for h in ledger().handoffs(task_id)
            ]
        }

    @app.get("/v1/tasks/{task_id}/approvals")
    def approvals(task_id: str, team: TeamDep) -> dict[str, Any]:
        own_task(task_id, team)
        return {"approvals": [ApprovalOut.of(a).model_dump() for a in ledger().approvals(task_id)]}

    @app.post("/v1/tasks/{task_id}/cancel", status_code=202, response_model=TaskOut)
    def cancel(task_id: str, team: TeamDep) -> TaskOut:
        task = own_task(task_id, team)
        if task.finished:
            raise ApiError(409, "task_finished", f"task {task_id} already {task.status}")
        stopped = ledger().claim(task_id, "cancelled", only_from=("queued", "interrupted"))
        if stopped is None:
            state["workers"].cancel(task_id)  # Running: stops at the next step boundary.
        else:
            state["workers"].start_next(task.thread_id)  # A task enqueued behind it.
        return TaskOut.of(own_task(task_id, team))

    @app.post(
        "/v1/tasks/{task_id}/approvals/{approval_id}", status_code=202, response_model=TaskOut
    )
    def decide(task_id: str, approval_id: str, body: DecisionIn, team: TeamDep) -> TaskOut:
        from langgraph.types import Command

        task = own_task(task_id, team)
        approval = ledger().get_approval(task_id, approval_id)
        if approval is None:
            raise ApiError(404, "approval_not_found", f"no approval {approval_id!r}", "approval_id")
        if not approval.pending or task.status != "interrupted":
            raise ApiError(
                409,
                "not_waiting",
                f"approval {approval_id} is already decided or the task is {task.status}",
            )
        if body.decision == "edit" and body.args is None:
            raise ApiError(422, "invalid_request", "an edit needs 'args'", "args")
        if body.decision == "edit" and body.args is not None and approval.tool:
            from relaygraph.agents.tools import check_tool_args

            try:
                check_tool_args(approval.tool, body.args)
            except ConfigError as exc:
                raise ApiError(422, "invalid_request", str(exc), "args") from None
        ledger().record_decision(
            task_id,
            approval_id,
            decision=body.decision,
            decided_by=team.name,
            reason=body.reason,
            args=body.args,
        )
        answer = body.model_dump(exclude_none=True)
        # Taken with this server's lease at once: no other server may start it meanwhile.
        if state["workers"].take(task_id, only_from=("interrupted",)) is None:
            raise ApiError(409, "not_waiting", f"task {task_id} is no longer waiting")
        state["workers"].start(task, Command(resume={approval_id: answer}), team=team.id)
        return TaskOut.of(own_task(task_id, team))

    @app.get("/v1/tasks/{task_id}/trace")
    def trace(task_id: str, team: TeamDep) -> dict[str, Any]:
        """The task's timeline (the span-tree shape): visits, routes, handoffs, violations."""
        from relaygraph.tracing import build_timeline

        own_task(task_id, team)
        return build_timeline(ledger(), task_id, team_id=team.id)

    @app.get("/v1/usage")
    def usage(
        team: TeamDep, since: datetime | None = None, until: datetime | None = None
    ) -> dict[str, Any]:
        for field, value in (("since", since), ("until", until)):
            if value is not None and value.tzinfo is None:
                raise ApiError(
                    422,
                    "invalid_request",
                    f"{field} {value.isoformat()!r} has no time zone; add one, e.g. "
                    f"{value.isoformat()}Z",
                    field,
                )
        if since is not None and until is not None and since > until:
            raise ApiError(
                422,
                "invalid_request",
                f"since {since.isoformat()!r} is after until {until.isoformat()!r}",
                "since",
            )
        return ledger().usage_for_team(team.id, since, until)

    @app.get("/v1/tasks/{task_id}/events")
    async def events(
        task_id: str,
        request: Request,
        team: TeamDep,
        last_event_id: Annotated[str | None, Header()] = None,
        after: Annotated[int | None, Query(ge=0)] = None,
    ) -> EventSourceResponse:
        await to_thread.run_sync(own_task, task_id, team)
        start = after if after is not None else _event_id(last_event_id)

        async def stream() -> AsyncIterator[dict[str, Any]]:
            seq = start
            finished = False
            while True:
                batch = await to_thread.run_sync(ledger().events_after, task_id, seq)
                for event in batch:
                    seq = event.seq
                    yield {
                        "id": str(event.seq),
                        "event": event.type,
                        "data": json.dumps(event.data, ensure_ascii=False),
                    }
                if batch:
                    continue
                if finished:
                    return
                task = await to_thread.run_sync(lambda: ledger().get_task(task_id, team_id=team.id))
                if task is None or task.status in FINISHED_STATUSES:
                    # Events written between the read above and the status read are read
                    # once more before the stream closes: a finished task's last events
                    # are never lost.
                    finished = True
                    continue
                if await request.is_disconnected():
                    return
                await asyncio.sleep(SSE_POLL_SECONDS)

        return EventSourceResponse(stream())

    return app


def _event_id(value: str | None) -> int:
    if value is None or not value.strip():
        return 0
    if not value.strip().isdigit():
        raise ApiError(
            422,
            "invalid_request",
            f"Last-Event-ID {value!r} is not a sequence number",
            "Last-Event-ID",
        )
    return int(value)
