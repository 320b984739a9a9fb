"""Run one task through the team, or resume a paused one: stream events, return a result."""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from relaygraph._home import data_home
from relaygraph.errors import ConfigError, RelaygraphError, TaskBusy
from relaygraph.policies import TeamPolicy
from relaygraph.runner._checkpoint import open_checkpointer, sqlite_checkpointer
from relaygraph.runner._decide import decide_task, resume_input, waiting_approvals
from relaygraph.runner._errors import RequestRefused
from relaygraph.runner._event_writer import EventWriter
from relaygraph.runner._lease import DEFAULT_LEASE_SECONDS, LeaseKeeper
from relaygraph.runner._models import resolve_model_specs
from relaygraph.runner._result import Decision, RunResult
from relaygraph.runner._submit import TaskRequest, submit_task
from relaygraph.runner._summary import (
    USAGE_FIELDS,
    honest_status,
    in_flight_records,
    summarize,
    waiting_violations,
)
from relaygraph.runner._team_cache import team_cache
from relaygraph.topology import Topology

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
    "team_of",
    "team_of_record",
]

EventHandler = Callable[[dict[str, Any]], None]
CONTINUE: Any = object()
"""Graph input for :meth:`TaskRunner.run`: continue an interrupted process's task."""
SUSPENDED = "suspended: the server stopped; the task continues when it starts again"
LEASE_LOST = "suspended: another runner took the task over (this one could not renew its lease)"


def _token_text(chunk: Any) -> str:
    from langchain_core.messages import AIMessageChunk

    return chunk.text if isinstance(chunk, AIMessageChunk) else ""


def _pending_reason(pending: list[dict[str, Any]]) -> str:
    first = pending[0]
    if first.get("type") == "approval":
        return f"awaiting approval: {first['agent']} wants to run {first['tool']}"
    return f"awaiting a decision: {first.get('detail', first.get('type'))}"


def policy_digest(policy: Mapping[str, Any]) -> str:
    """A short digest of a policy (in the policy file's shape): equal digests, equal rules.

    Traces carry it beside the policy's source, which names a file whose content may change.
    """
    import hashlib
    import json

    text = json.dumps(policy, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


_LEDGERS: OrderedDict[str, Any] = OrderedDict()
_LEDGERS_LOCK = threading.Lock()
_LEDGERS_KEPT = 4


def ledger_for(home: Path) -> Any:
    """The ledger: ``$RELAYGRAPH_DATABASE_URL`` if set, else SQLite in the data directory.

    Opened with its schema brought up to date, so a first run needs no set-up step, and
    kept for the process (the last few databases used): opening one (an engine, a schema
    check, a cold statement cache) cost each ``run_task`` about 8 ms. A caller may still
    ``close()`` it: that only empties its connection pool, which refills on the next use.
    """
    import os

    from relaygraph.store import DATABASE_URL_ENV, Ledger

    env_url = os.environ.get(DATABASE_URL_ENV)
    url = None if env_url else f"sqlite:///{home / 'ledger.sqlite'}"
    key = url or f"env:{env_url}"
    with _LEDGERS_LOCK:
        ledger = _LEDGERS.get(key)
        if ledger is not None:
            _LEDGERS.move_to_end(key)
            return ledger
    ledger = Ledger(url)
    if not ledger.is_current():
        ledger.upgrade()
    with _LEDGERS_LOCK:
        kept = _LEDGERS.setdefault(key, ledger)
        _LEDGERS.move_to_end(key)
        while len(_LEDGERS) > _LEDGERS_KEPT:
            _LEDGERS.popitem(last=False)[1].close()
    if kept is not ledger:  # Another thread opened it meanwhile.
        ledger.close()
    return kept


class TaskRunner:
    """Runs the ledger's tasks through the team: fresh, continued after a restart, or
    resumed after a person's decision. Every event goes to the ledger as it happens."""

    def __init__(
        self,
        *,
        ledger: Any,
        home: Path,
        runner_id: str | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        sandbox_isolation_required: bool = False,
        teams: Callable[[Any], Any] | None = None,
    ) -> None:
        """
        Args:
            ledger: Where tasks and their events are recorded.
            home: The data directory (checkpoints, workspaces, knowledge base).
            runner_id: Who this runner is in the tasks' leases; a new id when None.
            lease_seconds: How long its lease on a running task lasts unrenewed (it renews
                every third of that): how long a task of a runner that died waits before
                another may take it over.
            sandbox_isolation_required: Refuse ``run_python`` where the host offers no
                filesystem isolation for it (a server running tenants' tasks); when False
                (a user's own runs), such code runs with a warning.
            teams: Finds the team a task records when the caller passes none (the task
                service's registered teams); :func:`team_of_record` when None.
        """
        self.ledger = ledger
        self.home = home
        self.runner_id = runner_id or f"runner-{uuid.uuid4().hex[:12]}"
        self.lease_seconds = lease_seconds
        self.sandbox_isolation_required = sandbox_isolation_required
        self.teams = teams or team_of_record

    def run(
        self,
        task: Any,
        graph_input: Any,
        *,
        on_event: EventHandler | None = None,
        stream_tokens: bool = False,
        cancel: threading.Event | None = None,
        stop: threading.Event | None = None,
        identity: Mapping[str, str] | None = None,
        callbacks: list[Any] | None = None,
        team: Any = None,
        models: Mapping[str, Any] | None = None,
    ) -> RunResult:
        """Run (or continue) ``task`` with ``graph_input``.

        Args:
            task: The ledger's task record.
            graph_input: ``{"request": ...}`` to start, a ``Command(resume=...)`` after a
                decision, or :data:`CONTINUE` after a restart: on from the task's last
                checkpoint if it made one, else from the start.
            on_event: Also called with each event, after the ledger has it.
            stream_tokens: Emit ``token`` events (not stored in the ledger).
            cancel: When set, the run stops at the next step boundary, status ``cancelled``.
            stop: When set (the server is shutting down), the run stops at the next step
                boundary and stays ``running``, so that a restarted server continues it
                (:data:`CONTINUE`); the result's status is then ``running``.
            identity: Who asked (project, user): goes into ``config["configurable"]``, never
                into graph state.
            callbacks: LangChain callback handlers added to the graph call (tracing).
            team: The task's team (``relaygraph.team.Team``); when None, the team the
                task records (:meth:`team_of`).
            models: Each role's model spec or chat model, when the process has objects the
                task's record only names; else the task's ``models``.
        """
        from langgraph.errors import GraphDrained, GraphRecursionError
        from langgraph.runtime import RunControl

        from relaygraph.agents.context import TaskContext
        from relaygraph.backends.kb import KnowledgeBase, ensure_sample_corpus
        from relaygraph.policies import stored_policy
        from relaygraph.tracing import langsmith_config, tracing_callbacks

        policy = stored_policy(task.policy, source=task.metadata.get("policy_source") or "<task>")
        topology = Topology.from_mapping(task.topology)
        specs: dict[str, Any] = dict(models if models is not None else task.models)
        recorded: dict[str, str] = dict(task.models)
        roles = topology.roles(tuple(policy.agents))
        try:
            team = team or self.team_of(task)
            graph_team = team_cache.get(specs, team=team, policy=policy, topology=topology)
        except RelaygraphError as exc:
            # A model that cannot be built (its script file went missing or broke, a key
            # was unset): the task fails on the record, with the reason, before it starts.
            reason = f"error: {exc}"
            self.ledger.append_event(
                task.id, {"type": "run_finished", "status": "failed", "stop_reason": reason}
            )
            self.ledger.set_status(task.id, "failed", stop_reason=reason)
            raise
        context = replace(
            TaskContext.for_task(self.home, task_id=task.id, thread_id=task.thread_id),
            sandbox_isolation_required=self.sandbox_isolation_required,
        )
        folders = sorted({str(folder) for agent in team.agents for folder in agent.kb})
        if folders:
            # A team with folders of its own reads a knowledge base of exactly those (one
            # per set of folders), brought up to date at each run.
            key = hashlib.sha256("\n".join(folders).encode()).hexdigest()[:16]
            context = replace(context, knowledge_base=self.home / "kb" / f"{key}.sqlite")
        context.workspace.mkdir(parents=True, exist_ok=True)
        context.artifacts.mkdir(parents=True, exist_ok=True)
        context.knowledge_base.parent.mkdir(parents=True, exist_ok=True)
        with KnowledgeBase(context.knowledge_base) as kb:
            for folder in folders:
                kb.add_folder(Path(folder))
            if not folders:
                ensure_sample_corpus(kb)
        config: Any = {
            "configurable": {
                # The checkpointer's thread, unique across projects (a project's thread id
                # is its own: another project may use the same one).
                "thread_id": task.checkpoint_thread,
                "relaygraph_task_id": task.id,
                **{f"relaygraph_{k}": v for k, v in (identity or {}).items()},
            },
            "recursion_limit": policy.recursion_limit,
            "run_name": "relaygraph",
            "metadata": {"task_id": task.id},
        }
        traced = {
            "task_id": task.id,
            "thread_id": task.thread_id,
            "project": (identity or {}).get("project", task.project_id),
            "team": task.team,
            "policy_source": task.metadata.get("policy_source"),
            "policy_digest": policy_digest(task.policy),
            "models": recorded,
        }
        # Both are empty when tracing is off: no handler, no cost.
        config["callbacks"] = [*tracing_callbacks(**traced), *(callbacks or [])]
        config.update(langsmith_config(**traced, request=task.input))
        # The lease makes this runner the only one that runs the task until it ends.
        taken = self.ledger.take_lease(task.id, self.runner_id, seconds=self.lease_seconds)
        if taken is None:
            if self.ledger.cancel_requested(task.id):
                raise TaskBusy(task.id, "a cancel waits on it")
            holder, until = self.ledger.lease_of(task.id)
            raise TaskBusy(task.id, f"runner {holder} holds it until {until}")
        task = taken
        # A cancel asked for on another server reaches this run through the ledger.
        cancel = cancel or threading.Event()
        if task.cancel_requested_at is not None:
            cancel.set()
        lease = LeaseKeeper(
            self.ledger, task.id, self.runner_id, seconds=self.lease_seconds, cancel=cancel
        )
        # The ledger's writes happen behind the graph (see EventWriter), in order.
        writer = EventWriter(self.ledger, task.id, on_event or (lambda event: None))
        emit = writer.put
        released = False
        try:
            with open_checkpointer(self.home) as checkpointer:
                graph = graph_team.copy({"checkpointer": checkpointer})
                if graph_input is CONTINUE:
                    graph_input = self._continue_input(graph, config, task)
                if not (isinstance(graph_input, dict) and "request" in graph_input):
                    self._settle_usage(graph, config, task, policy, roles)
                emit(
                    {
                        "type": "run_started",
                        "task_id": task.id,
                        "thread_id": task.thread_id,
                        "models": recorded,
                        "topology": topology.to_mapping(),
                    }
                )
                error: str | None = None
                drained = False
                # Cancel and stop ask LangGraph to drain: the run ends at the next super-step
                # boundary (in whichever graph or agent subgraph is running) after that step's
                # writes are checkpointed, so a continued run neither loses nor repeats work.
                control = RunControl()
                try:
                    modes: Any = ["custom", "messages"] if stream_tokens else ["custom"]
                    stream: Any = graph.stream(
                        graph_input,
                        config,
                        context=context,
                        stream_mode=modes,
                        subgraphs=True,
                        control=control,
                    )
                    # A lost lease drains the run too; it stays the new holder's.
                    lease.when_lost(lambda: control.request_drain("shutdown"))
                    with _drain_when(control, cancel=cancel, stop=stop):
                        for _ns, mode, data in stream:
                            if mode == "custom":
                                emit(data)
                            elif text := _token_text(data[0]):
                                role = data[1].get("lc_agent_name") or data[1].get("langgraph_node")
                                emit({"type": "token", "role": role, "text": text})
                except GraphDrained:
                    drained = True
                except GraphRecursionError:
                    # The team's own step guard finalizes before this; it stays a last resort
                    # that ends the task cleanly instead of surfacing LangGraph's error.
                    error = "budget:team:recursion_limit"
                except RelaygraphError as exc:
                    error = f"error: {exc}"
                except Exception as exc:
                    # A provider or tool failure ends this task, not the process.
                    error = f"error: {type(exc).__name__}: {exc}"
                snapshot = graph.get_state(config, subgraphs=True)
                in_flight = in_flight_records(snapshot, policy)
            state = snapshot.values
            waiting = waiting_violations(snapshot)
            in_flight = (in_flight[0], [*in_flight[1], *waiting])
            pending = [
                {"id": i.id, **(i.value if isinstance(i.value, dict) else {"value": i.value})}
                for i in snapshot.interrupts
            ]
            status: str
            stop_reason: str | None
            answer: str | None
            cancelled = drained and cancel is not None and cancel.is_set()
            suspended = drained and not cancelled
            if cancelled:
                status, stop_reason, answer = "cancelled", "cancelled by request", None
            elif suspended:
                reason = LEASE_LOST if lease.lost.is_set() else SUSPENDED
                status, stop_reason, answer = "running", reason, None
            elif error is not None:
                status, stop_reason, answer = "failed", error, None
            elif pending:
                status, stop_reason, answer = "interrupted", _pending_reason(pending), None
            else:
                status = state.get("status") or "failed"
                stop_reason, answer = state.get("stop_reason"), state.get("answer")
            summary = summarize(state, policy, roles, in_flight)
            turn = state.get("turn", 0)
            status, stop_reason = honest_status(
                status,
                stop_reason,
                summary,
                answer,
                request=task.input,
                transcripts=[
                    m for v in state.get("visits", []) if v["turn"] == turn for m in v["messages"]
                ],
                # Checked on the embedded model, whose answers the grounding mechanism
                # builds: a docs question answered there without a citation of a document
                # the run read is not a success. (Other models: see the closing note.)
                grounding=any(spec.startswith("local:") for spec in recorded.values()),
            )
            artifacts = sorted(p.name for p in context.artifacts.iterdir() if p.is_file())
            result = RunResult(
                task_id=task.id,
                thread_id=task.thread_id,
                status=status,
                answer=answer,
                stop_reason=stop_reason,
                artifacts=artifacts,
                models=recorded,
                topology=topology.to_mapping(),
                pending=pending,
                **summary,
            )
            if suspended:
                # Not finished: the task stays ``running`` for the next server to continue.
                emit({"type": "run_suspended", "reason": stop_reason})
                writer.flush()
                self.ledger.end_run(task.id, usage=result.usage, runner_id=self.runner_id)
                released = True
                return result
            waits_on_ping_pong = any(item.get("type") == "ping_pong" for item in pending)
            if waits_on_ping_pong:
                writer.flush()  # The approvals read next come from `interrupted` events.
            reported = (
                {a.interrupt_id for a in self.ledger.approvals(task.id)}
                if waits_on_ping_pong
                else set()
            )
            for item in pending:
                if item.get("type") == "ping_pong" and item["id"] not in reported:
                    # The detection step re-runs when the decision comes, so the violation is
                    # reported here, at the pause: once, even if no decision ever comes.
                    emit(
                        {
                            "type": "violation",
                            "agent": item.get("next"),
                            "kind": "ping_pong",
                            "detail": item.get("detail"),
                        }
                    )
                emit({**item, "type": "interrupted", "waits_for": item.get("type")})
            emit(
                {"type": "run_finished", "status": result.status, "stop_reason": result.stop_reason}
            )
            writer.flush()
            self.ledger.end_run(
                task.id,
                usage=result.usage,
                runner_id=self.runner_id,
                status=status,
                answer=answer,
                stop_reason=stop_reason,
            )
            released = True
            return result
        finally:
            lease.close()
            try:
                writer.close()
            finally:
                if not released:  # A run that failed on the way: let another take it.
                    self.ledger.release_lease(task.id, self.runner_id)

    def team_of(self, task: Any) -> Any:
        """The team ``task`` records (see ``teams`` in the constructor).

        Raises:
            ConfigError: The team cannot be found, or is no longer the one that started the
                task (its digest changed).
        """
        team = self.teams(task)
        recorded = (task.team or {}).get("digest")
        if recorded is not None and team.digest != recorded:
            raise ConfigError(
                f"team {team.name!r} changed since task {task.id} started (digest "
                f"{recorded}, now {team.digest}); continue it with the definition it started with"
            )
        return team

    def _settle_usage(
        self, graph: Any, config: Any, task: Any, policy: TeamPolicy, roles: tuple[str, ...]
    ) -> None:
        """Before a paused or stopped task goes on: its usage rows back to what finished
        nodes spent. The calls of a visit in progress, counted when it stopped, arrive
        again with the visit's ``agent_finished`` (which adds it whole)."""
        done = summarize(graph.get_state(config).values, policy, roles)["usage"]
        zero = {**dict.fromkeys((*USAGE_FIELDS, "cost_usd", "seconds"), 0), "estimated": False}
        stale = {row.agent: zero for row in self.ledger.usage(task.id) if row.agent not in done}
        self.ledger.record_usage(task.id, {**stale, **done})

    def _continue_input(self, graph: Any, config: Any, task: Any) -> Any:
        """The graph input that continues ``task`` after a restart (:data:`CONTINUE`).

        On from the task's last checkpoint if it made one (the thread's latest checkpoint
        is this task's); else from the start, as if it had just been claimed. A task that
        was resuming after a decision when the server stopped, and still waits at that
        interrupt, is resumed with the decisions the ledger recorded.
        """
        latest = graph.get_state(config)
        if (latest.metadata or {}).get("relaygraph_task_id") != task.id:
            return {"request": task.input}
        decided = {a.interrupt_id: a for a in self.ledger.approvals(task.id) if not a.pending}
        waiting = [i.id for i in latest.interrupts]
        if waiting and all(i in decided for i in waiting):
            from langgraph.types import Command

            answers = {
                i: {
                    k: v
                    for k, v in (
                        ("decision", decided[i].decision),
                        ("args", decided[i].edited_args),
                        ("reason", decided[i].reason),
                    )
                    if v is not None
                }
                for i in waiting
            }
            return Command(resume=answers)
        return None


@contextmanager
def _drain_when(
    control: Any, *, cancel: threading.Event | None, stop: threading.Event | None
) -> Iterator[None]:
    """While in the block, ask ``control`` to drain as soon as ``cancel`` or ``stop`` is set.

    A watcher thread, so that the request reaches LangGraph before its next step boundary
    even when the step in progress emits no event (a long model or tool call).
    """
    events = [event for event in (cancel, stop) if event is not None]
    if not events:
        yield
        return
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.05):
            if any(event.is_set() for event in events):
                control.request_drain("cancel" if cancel and cancel.is_set() else "shutdown")
                return

    watcher = threading.Thread(target=watch, name="relaygraph-drain", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


def team_of_record(task: Any) -> Any:
    """The team a task records, from the process's own knowledge: the built-in team, or
    the team file it was read from (read again; :meth:`TaskRunner.team_of` checks that it
    is unchanged).

    Raises:
        ConfigError: The task's team is neither.
    """
    from relaygraph.team import DEFAULT_TEAM_NAME, default_team, load_team

    record = task.team or {}
    if record.get("source"):
        return load_team(record["source"])
    if record.get("name", DEFAULT_TEAM_NAME) == DEFAULT_TEAM_NAME:
        return default_team()
    raise ConfigError(
        f"task {task.id} ran team {record.get('name')!r}, which this process does not know; "
        "pass the team (relaygraph resume --team FILE)"
    )


def team_of(team: Any) -> Any:
    """The team a caller names: a :class:`~relaygraph.team.Team`, the path of a team file,
    or None for the built-in team."""
    from relaygraph.team import Team, default_team, load_team

    if team is None:
        return default_team()
    if isinstance(team, Team):
        return team
    return load_team(team)


def run_task(
    request: str,
    *,
    team: Any = None,
    model: Any = None,
    agent_models: Mapping[str, Any] | None = None,
    thread_id: str | None = None,
    policy: TeamPolicy | str | Path | None = None,
    home: Path | None = None,
    on_event: EventHandler | None = None,
    stream_tokens: bool = False,
    callbacks: list[Any] | None = None,
    topology: Topology | None = None,
) -> RunResult:
    """Run ``request`` through the team and return the result.

    Args:
        request: What the user asks for.
        team: A :class:`~relaygraph.team.Team` or the path of a team file; the built-in
            team (researcher, coder, writer) when None.
        model: Spec (or chat model) every role uses unless ``agent_models`` or the team
            says otherwise; defaults to the team's model, else the embedded model.
        agent_models: Per-role specs or chat models: agent names, ``supervisor``,
            ``finalize``.
        thread_id: Continue this earlier conversation; a new thread when None.
        policy: A policy over the team's agents, or the path of a policy file; the team's
            own when None.
        home: The data directory; ``$RELAYGRAPH_HOME`` or ``~/.relaygraph`` when None.
        on_event: Called with each event (route, handoff, tool call, violation, ...).
        stream_tokens: Also emit ``token`` events as models stream their text (models are
            then called in streaming mode).
        callbacks: LangChain callback handlers added to the graph call (tracing).
        topology: How the agents are arranged; the team's own when None. A thread keeps
            the topology it started with.

    Raises:
        ConfigError: Bad input (bad team file, bad policy) before anything runs; a
            :class:`~relaygraph.runner.RequestRefused` names the field at fault (empty
            request, unknown thread, bad model spec, a thread of another topology).
            Failures while running are reported as ``failed``.
    """
    the_team = team_of(team)
    try:
        team_policy = the_team.policy_from(policy) if policy is not None else None
    except RequestRefused:
        raise
    except ConfigError as exc:
        raise RequestRefused(str(exc), field="policy", code="invalid_policy") from None
    home = data_home(home)
    ledger = ledger_for(home)  # kept for the process: not closed here
    submitted = submit_task(
        TaskRequest(
            input=request,
            team=the_team,
            policy=team_policy,
            thread_id=thread_id,
            model=model,
            agent_models=dict(agent_models or {}),
            topology=None if topology is None else topology.kind,
            start_agent=None if topology is None else topology.start_agent,
            output_mode=None if topology is None else topology.output_mode,
        ),
        ledger=ledger,
    )
    runner = TaskRunner(ledger=ledger, home=home)
    return runner.run(
        submitted.task,
        {"request": request},
        on_event=on_event,
        stream_tokens=stream_tokens,
        callbacks=callbacks,
        team=the_team,
        models=submitted.submission.models.chosen,
    )


def resume_task(
    task_id: str,
    decision: Decision,
    *,
    home: Path | None = None,
    on_event: EventHandler | None = None,
    stream_tokens: bool = False,
    decided_by: str = "cli",
    team: Any = None,
) -> RunResult:
    """Continue a task that is waiting for a person's decision, from its checkpoint.

    The decision answers every request the task waits for (usually one approval).

    Args:
        team: The task's team (a :class:`~relaygraph.team.Team` or its file) when it is
            neither the built-in team nor a team file the task records.

    Raises:
        ConfigError: No such task, it is not waiting for a decision, its team cannot be
            found or changed since it started, or the edited arguments do not fit the tool
            (a :class:`~relaygraph.runner.RequestRefused` for each but the team).
    """
    from relaygraph.store import LOCAL_PROJECT_ID

    home = data_home(home)
    ledger = ledger_for(home)  # kept for the process: not closed here
    task = ledger.get_task(task_id, project_id=LOCAL_PROJECT_ID)
    if task is None:
        raise RequestRefused(
            f"no task {task_id!r} in {ledger.url}",
            field="task_id",
            code="task_not_found",
            kind="not_found",
        )
    # A task that waits for nothing is refused before its team is looked for.
    waiting_approvals(task, ledger=ledger)
    runner = TaskRunner(ledger=ledger, home=home)
    the_team = runner.team_of(task) if team is None else team_of(team)
    answers = decide_task(
        task, decision, ledger=ledger, tools=lambda: the_team.tools, decided_by=decided_by
    )
    return runner.run(
        task,
        resume_input(answers),
        on_event=on_event,
        stream_tokens=stream_tokens,
        team=the_team,
    )
