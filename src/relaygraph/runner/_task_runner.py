"""The long-lived runner of the ledger's tasks: it prepares each run (the team's graph, the
task's context, the graph's config, the lease) and takes it through
:class:`~relaygraph.runner._task_run.TaskRun`'s steps."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relaygraph.backends.workspace import WorkspaceQuota
from relaygraph.errors import ConfigError, NoRoomOnDisk, RelaygraphError
from relaygraph.events import run_finished_event
from relaygraph.policies.budget import DAY_BUDGET_KEY, ProjectDayBudget
from relaygraph.runner._checkpoint import async_checkpointer
from relaygraph.runner._event_writer import EventWriter
from relaygraph.runner._lease import DEFAULT_LEASE_SECONDS
from relaygraph.runner._model_calls import ModelCallRecorder, ModelCallRecording
from relaygraph.runner._no_room import RoomReserve, UnrecordedFailures, no_room_reason
from relaygraph.runner._result import RunResult
from relaygraph.runner._run_mode import InProcessRun, RunMode, WorkerAttempt
from relaygraph.runner._task_run import INTERRUPTED, EventHandler, TaskRun
from relaygraph.runner._team_cache import team_cache
from relaygraph.runner._teams import prepare_knowledge_base, team_of_record
from relaygraph.store import AttemptSuperseded, LedgerToolJournal, Quotas, is_disk_full
from relaygraph.topology import Topology

if TYPE_CHECKING:
    from relaygraph.agents.context import TaskContext
    from relaygraph.policies import TeamPolicy
    from relaygraph.store import Ledger, Task
    from relaygraph.team import Team

__all__ = ["TaskRunner", "policy_digest"]


def policy_digest(policy: Mapping[str, Any] | None) -> str:
    """A short digest of a policy (in the policy file's shape): equal digests, equal rules.

    Traces carry it beside the policy's source, which names a file whose content may change.
    """
    text = json.dumps(policy, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


class TaskRunner:
    """Runs the ledger's tasks through the team: fresh, continued after a restart, or
    resumed after a person's decision. Every event goes to the ledger as it happens."""

    def __init__(
        self,
        *,
        ledger: Ledger,
        home: Path,
        runner_id: str | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        sandbox_isolation_required: bool = False,
        teams: Callable[[Task], Team] | None = None,
        policies: Callable[[Task, TeamPolicy], TeamPolicy] | None = None,
        workspace_quota: WorkspaceQuota | None = None,
        quotas: Quotas | None = None,
        model_calls: ModelCallRecording | None = None,
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
            policies: The policy a task runs under, from the one it recorded (the task
                service's ceiling: ``ServiceTeams.policy_for``); the recorded one when None.
            workspace_quota: What each task's workspace and artifacts may hold (the
                default :class:`WorkspaceQuota` when None).
            quotas: The service's quotas of every project (a project's own over them):
                a run of a project with a daily budget stops when its spend reaches what
                the project had left of it when the run began. None: no quota.
            model_calls: How much of each model call the ledger keeps (the default
                :class:`ModelCallRecording` when None).
        """
        self.ledger = ledger
        self.home = home
        self.runner_id = runner_id or f"runner-{uuid.uuid4().hex[:12]}"
        self.lease_seconds = lease_seconds
        self.sandbox_isolation_required = sandbox_isolation_required
        self.teams = teams or team_of_record
        self.policies = policies
        self.workspace_quota = workspace_quota or WorkspaceQuota()
        self.quotas = quotas
        self.model_calls = model_calls or ModelCallRecording()
        database = ledger.database_file
        self.unrecorded_failures = UnrecordedFailures(
            ledger,
            self.runner_id,
            reserve=RoomReserve(database.with_name(database.name + ".reserve"))
            if database is not None
            else None,
        )
        """The runs that stopped for lack of room on disk whose failure the ledger has
        not taken yet: written by :meth:`UnrecordedFailures.record` once it does; their
        tasks must not be started again meanwhile."""

    def run(
        self,
        task: Task,
        graph_input: Any,
        *,
        on_event: EventHandler | None = None,
        stream_tokens: bool = False,
        cancel: threading.Event | None = None,
        stop: threading.Event | None = None,
        identity: Mapping[str, str] | None = None,
        callbacks: list[Any] | None = None,
        team: Team | None = None,
        models: Mapping[str, Any] | None = None,
        attempt: int | None = None,
        leased: bool = False,
        only_from: tuple[str, ...] | None = None,
        interrupt_cancels: bool = False,
    ) -> RunResult:
        """Run (or continue) ``task`` with ``graph_input``.

        Args:
            task: The ledger's task record.
            graph_input: ``{"request": ...}`` to start, a ``Command(resume=...)`` after a
                decision, or :data:`~relaygraph.runner.CONTINUE` after a restart: on from
                the task's last checkpoint if it made one, else from the start.
            on_event: Also called with each event, after the ledger has it.
            stream_tokens: Emit ``token`` events (not stored in the ledger).
            cancel: When set, the run stops at the next step boundary, status ``cancelled``.
            stop: When set (the server is shutting down), the run stops at the next step
                boundary and stays ``running``, so that a restarted server continues it
                (:data:`~relaygraph.runner.CONTINUE`); the result's status is then
                ``running``.
            identity: Who asked (project, user): goes into ``config["configurable"]``, never
                into graph state.
            callbacks: LangChain callback handlers added to the graph call (tracing).
            team: The task's team (``relaygraph.team.Team``); when None, the team the
                task records (:meth:`team_of`).
            models: Each role's model spec or chat model, when the process has objects the
                task's record only names; else the task's ``models``.
            attempt: A worker's attempt at the task (``Ledger.begin_attempt``), which holds
                it already: no lease is taken; every ledger write of the run (events, usage,
                status, the tool journal) carries the attempt, and the run stops at once
                when the task is on another attempt. The ledger's cancel flag is watched
                (the run stops at the next step boundary, ``cancelled``). None: the run
                takes the task's lease (in process).
            leased: ``task`` was just recorded under this runner's lease
                (``submit_task(runner_id=...)``, ``SubmittedTask.leased``), and nothing ran
                it since: the run does not take the lease again.
            only_from: The statuses the task may have when the run takes its lease (in
                process): ``("queued",)`` for a task that must not have started yet (a
                server's worker starting a queued task: one take, not a check and a take),
                and that is its thread's oldest active task (see ``Ledger.take_lease``).
            interrupt_cancels: A ``KeyboardInterrupt`` or ``SystemExit`` that stops the run
                (the process it runs in is being stopped: ``relaygraph run`` stopped twice)
                ends the task ``cancelled``, saying so, instead of leaving it ``running``
                with no runner to continue it. In process only.

        Raises:
            TaskBusy: Another runner holds the task's lease, or a cancel waits on it (in
                process).
            AttemptSuperseded: The task went on to another attempt than ``attempt``; this
                run wrote nothing since, and nothing of its end.
        """
        mode = self._mode(attempt, only_from)
        run, graph_team = self._prepare(
            task,
            mode,
            on_event=on_event,
            cancel=cancel,
            identity=identity,
            callbacks=callbacks,
            team=team,
            models=models,
            leased=leased,
            stop=stop,
        )
        task, context = run.task, run.context
        try:
            ended = interrupted = no_room = False
            try:
                with mode.checkpointer(self.home, flush=run.writer.flush) as checkpointer:
                    graph = graph_team.copy({"checkpointer": checkpointer})
                    graph_input = run.graph_input(graph, graph_input)
                    if isinstance(graph_input, Mapping) and "request" in graph_input:
                        # The run starts the task from its request: the ledger has no record
                        # of its tool calls (see LedgerToolJournal), so the journal reads none.
                        journal = context.tool_journal
                        if isinstance(journal, LedgerToolJournal):
                            journal.starts_empty(task.id)
                    run.writer.put(run.started_event())
                    mode.before_stream(run.writer.flush)
                    end = run.stream(graph, graph_input, stream_tokens=stream_tokens)
                mode.after_stream(task)
                result = run.result(end)
                run.record_end(end, result)
                ended = True
                return result
            except (KeyboardInterrupt, SystemExit):
                interrupted = mode.cancels_on_interrupt(interrupt_cancels)
                raise
            except Exception as exc:
                no_room = is_disk_full(exc)
                raise
            finally:
                run.lease.close()
                try:
                    run.writer.close()
                except AttemptSuperseded:
                    if ended:
                        raise
                    # The error the run is leaving with (or the superseded attempt) says it.
                finally:
                    if not ended and not no_room:
                        # Failed on the way: let another take it. A run stopped by a full
                        # disk keeps its lease until its failure is written (below).
                        mode.let_go(task)
                    if interrupted:  # After the run's last events, so that its end comes last.
                        self.ledger.request_cancel(task.id, reason=INTERRUPTED)
        except Exception as exc:
            if not is_disk_full(exc):
                raise
            # The disk the ledger writes to is full: the run stopped, its end not written.
            # Continued once room came back, it would run its step again (the program that
            # filled the disk would fill it again): it fails, now or once there is room.
            reason = no_room_reason(exc)
            recorded = self.unrecorded_failures.fail(task.id, attempt=attempt, reason=reason)
            raise NoRoomOnDisk(task.id, recorded=recorded, reason=reason) from exc

    async def arun(
        self,
        task: Task,
        graph_input: Any,
        *,
        on_event: EventHandler | None = None,
        stream_tokens: bool = False,
        cancel: threading.Event | None = None,
        stop: threading.Event | None = None,
        identity: Mapping[str, str] | None = None,
        only_from: tuple[str, ...] | None = None,
    ) -> RunResult:
        """:meth:`run` in process, on the running event loop: the graph runs with
        ``astream``, its models are awaited, and only its sync steps (tools, the ledger's
        reads and writes around the run) take a thread of the loop's default executor, for
        as long as each lasts. A server holds as many tasks in flight as its loop can drive
        this way, not one thread each. The arguments are :meth:`run`'s.

        Raises:
            TaskBusy: Another runner holds the task's lease, or a cancel waits on it.
        """
        mode = self._mode(None, only_from)
        run, graph_team = await asyncio.to_thread(
            self._prepare,
            task,
            mode,
            on_event=on_event,
            cancel=cancel,
            identity=identity,
            callbacks=None,
            team=None,
            models=None,
            leased=False,
            stop=stop,
        )
        task = run.task
        try:
            ended = no_room = False
            try:
                async with async_checkpointer(self.home) as checkpointer:
                    graph = graph_team.copy({"checkpointer": checkpointer})
                    graph_input = await run.agraph_input(graph, graph_input)
                    if isinstance(graph_input, Mapping) and "request" in graph_input:
                        journal = run.context.tool_journal
                        if isinstance(journal, LedgerToolJournal):  # See run().
                            journal.starts_empty(task.id)
                    run.writer.put(run.started_event())
                    end = await run.astream(graph, graph_input, stream_tokens=stream_tokens)
                result = run.result(end)
                # Its reads (a ping-pong's approvals) and its end's write, off the loop.
                await asyncio.to_thread(run.record_end, end, result)
                ended = True
                return result
            except Exception as exc:
                no_room = is_disk_full(exc)
                raise
            finally:
                # Closing waits for a renewal under way: off the loop.
                await asyncio.to_thread(run.lease.close)
                try:
                    await run.writer.aclose()
                finally:
                    if not ended and not no_room:  # Failed on the way: let another take it.
                        await asyncio.to_thread(mode.let_go, task)
        except Exception as exc:
            if not is_disk_full(exc):
                raise
            reason = no_room_reason(exc)  # See run().
            recorded = await asyncio.to_thread(
                self.unrecorded_failures.fail, task.id, attempt=None, reason=reason
            )
            raise NoRoomOnDisk(task.id, recorded=recorded, reason=reason) from exc

    def _mode(self, attempt: int | None, only_from: tuple[str, ...] | None) -> RunMode:
        """The run's mode: in process under this runner's lease, or a worker's attempt."""
        if attempt is None:
            return InProcessRun(
                self.ledger, self.runner_id, lease_seconds=self.lease_seconds, only_from=only_from
            )
        return WorkerAttempt(self.ledger, attempt)

    def _prepare(
        self,
        task: Task,
        mode: RunMode,
        *,
        on_event: EventHandler | None,
        cancel: threading.Event | None,
        identity: Mapping[str, str] | None,
        callbacks: list[Any] | None,
        team: Team | None,
        models: Mapping[str, Any] | None,
        leased: bool,
        stop: threading.Event | None,
    ) -> tuple[TaskRun, Any]:
        """Take the task (in process) and prepare its run: its policy, team graph, context,
        config, hold and event writer. Returns the run and the team's compiled graph.

        Raises:
            TaskBusy: See :meth:`run`.
            RelaygraphError: The run could not be prepared; the task failed (recorded).
        """
        from relaygraph.policies import stored_policy

        reserve = self.unrecorded_failures.reserve
        if reserve is not None:
            # Room for the failure of a run the disk's filling would stop, made before the
            # run (again, if an earlier failure used it and there is room now).
            reserve.ensure()
        # The task is this runner's before anything is written of it (a failure to start
        # included), and its lease is renewed from here on, through the set-up (a team's
        # first compile, its knowledge base made ready) as through the run.
        task = mode.take(task, leased=leased)
        attempt = mode.attempt
        # A cancel asked for on another server reaches this run through the ledger.
        watch_cancel = cancel is not None
        cancel = cancel or threading.Event()
        if task.cancel_requested_at is not None:
            cancel.set()
        hold = mode.keep(task, cancel)
        try:
            # A record the runner cannot read (a policy or topology from another version)
            # fails the task like a team that cannot be built: left queued, it would be
            # taken again at once, and again.
            source = task.metadata.get("policy_source") or "<task>"
            policy = stored_policy(task.policy or {}, source=source)
            if self.policies is not None:
                # Capped at each run, not only at submission: a ceiling tightened since
                # (a server restarted with a tighter --policy) holds for a task queued or
                # paused before it, and for a worker as for the server.
                policy = self.policies(task, policy)
            topology = Topology.from_mapping(task.topology)
            team, graph_team = self._team_graph(task, team, models, policy, topology)
            context = self._context(task, team, mode)
            config = self._config(task, identity, callbacks, recursion_limit=policy.recursion_limit)
            config["callbacks"].append(ModelCallRecorder(policy, self.model_calls))
            day = self._day_budget(task)
            if day is not None:
                config["configurable"][DAY_BUDGET_KEY] = day
        except RelaygraphError as exc:
            # A team or a model that cannot be built, a knowledge base that cannot be made
            # ready: the task fails on the record, not the process; left as it was, it would
            # start again and again.
            hold.close()
            self._failed_to_start(task, attempt, exc)
            raise
        except BaseException:
            hold.close()
            mode.let_go(task)  # Let another take it.
            raise
        run = TaskRun(
            ledger=self.ledger,
            runner_id=self.runner_id,
            task=task,
            policy=policy,
            topology=topology,
            recorded=dict(task.models),
            context=context,
            config=config,
            cancel=cancel,
            watch_cancel=watch_cancel,
            stop=stop,
            lease=hold,
            # The ledger's writes happen behind the graph (see EventWriter), in order; a
            # worker's write refused for a superseded attempt stops the run at once.
            writer=EventWriter(
                self.ledger,
                task.id,
                on_event or (lambda event: None),
                attempt=attempt,
                on_error=mode.on_write_error,
            ),
            attempt=attempt,
        )
        return run, graph_team

    def _day_budget(self, task: Task) -> ProjectDayBudget | None:
        """What the task's project may still spend today, as the run's cost cap; None when
        it has no daily budget. Read once here, so that no model call waits on the ledger."""
        if self.quotas is None:
            return None
        daily = self.quotas.overridden(self.ledger.project_quotas(task.project_id)).daily_cost_usd
        if daily is None:
            return None
        project = self.ledger.project_by_id(task.project_id)
        return ProjectDayBudget(
            project=project.name if project is not None else task.project_id,
            daily_usd=daily,
            spent_elsewhere_usd=self.ledger.spent_today(task.project_id, excluding=task.id),
        )

    def team_of(self, task: Task) -> Team:
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

    def _team_graph(
        self,
        task: Task,
        team: Team | None,
        models: Mapping[str, Any] | None,
        policy: TeamPolicy,
        topology: Topology,
    ) -> tuple[Team, Any]:
        """The task's team and its compiled graph (kept per process).

        Raises:
            RelaygraphError: The team or a model cannot be built (a script file went
                missing or broke, a key was unset).
        """
        specs: dict[str, Any] = dict(models if models is not None else task.models)
        team = team or self.team_of(task)
        return team, team_cache.get(specs, team=team, policy=policy, topology=topology)

    def _failed_to_start(self, task: Task, attempt: int | None, exc: RelaygraphError) -> None:
        """Record that the task failed before its run began, with ``exc`` as the reason."""
        reason = f"error: {exc}"
        event = dict(run_finished_event("failed", reason))
        self.ledger.append_event(task.id, event, attempt=attempt)
        # As any run ends: a lease this runner holds (a task recorded under it, or taken
        # before the run) or a worker's hold ends with it.
        self.ledger.end_run(
            task.id,
            usage=(),
            runner_id=self.runner_id,
            status="failed",
            attempt=attempt,
            stop_reason=reason,
        )

    def _context(self, task: Task, team: Team, mode: RunMode) -> TaskContext:
        """The task's workspace, artifacts folder and knowledge base (made ready), and the
        ledger's tool journal (a worker's fenced by its attempt).

        The workspace and the artifacts folder are made by the tools that use them
        (``Workspace``, ``ArtifactStore``, ``run_python``), not here: a run whose agents
        write no file makes none (two ``mkdir`` of every run, each a wait for the
        interpreter's lock on a busy server)."""
        from relaygraph.agents.context import TaskContext

        context = replace(
            TaskContext.for_task(self.home, task_id=task.id, thread_id=task.thread_id),
            sandbox_isolation_required=self.sandbox_isolation_required,
            workspace_quota=self.workspace_quota,
            tool_journal=mode.tool_journal(),
        )
        own_knowledge_base = _prepared_knowledge_base(team, self.home)
        if own_knowledge_base is not None:
            context = replace(context, knowledge_base=own_knowledge_base)
        return context

    def _config(
        self,
        task: Task,
        identity: Mapping[str, str] | None,
        callbacks: list[Any] | None,
        *,
        recursion_limit: int,
    ) -> dict[str, Any]:
        """The graph call's config: the checkpointer's thread, who asked, the step limit,
        and the tracing handlers (none when tracing is off: no handler, no cost)."""
        from langchain_core.utils.uuid import uuid7

        from relaygraph.tracing import langsmith_config, tracing_callbacks

        config: dict[str, Any] = {
            "configurable": {
                # The checkpointer's thread, unique across projects (a project's thread id
                # is its own: another project may use the same one).
                "thread_id": task.checkpoint_thread,
                "relaygraph_task_id": task.id,
                **{f"relaygraph_{k}": v for k, v in (identity or {}).items()},
            },
            "recursion_limit": recursion_limit,
            "run_name": "relaygraph",
            # The run's root run id, fixed now so that run_started can name its LangSmith
            # run; fresh for every run (a resumed task's run is a trace of its own).
            "run_id": uuid7(),
            "metadata": {"task_id": task.id},
        }
        traced: dict[str, Any] = {
            "task_id": task.id,
            "thread_id": task.thread_id,
            "project": (identity or {}).get("project", task.project_id),
            "team": task.team,
            "policy_source": task.metadata.get("policy_source"),
            "policy_digest": policy_digest(task.policy),
            "models": dict(task.models),
        }
        config["callbacks"] = [*tracing_callbacks(**traced), *(callbacks or [])]
        config.update(langsmith_config(**traced, request=task.input))
        return config


_SHARED_KB_READY: set[Path] = set()
_SHARED_KB_LOCK = threading.Lock()


def _prepared_knowledge_base(team: Team, home: Path) -> Path | None:
    """:func:`prepare_knowledge_base`, done once per process for the shared knowledge base.

    A team with folders of its own has them brought up to date at every run; the shared
    one (``home/kb.sqlite``) is only given the sample corpus when empty, which a process
    needs to see once: opening and checking it again cost every run a few milliseconds.
    """
    if any(agent.kb for agent in team.agents):
        return prepare_knowledge_base(team, home)
    shared = home / "kb.sqlite"
    with _SHARED_KB_LOCK:
        if shared in _SHARED_KB_READY and shared.exists():
            return None
    own = prepare_knowledge_base(team, home)
    with _SHARED_KB_LOCK:
        _SHARED_KB_READY.add(shared)
    return own
