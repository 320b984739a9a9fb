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
from typing import TYPE_CHECKING, Any, Unpack

from relaygraph.backends.workspace import WorkspaceQuota
from relaygraph.errors import ConfigError, RelaygraphError
from relaygraph.events import run_finished_event
from relaygraph.policies.budget import DAY_BUDGET_KEY, ProjectDayBudget
from relaygraph.runner._event_writer import EventWriter
from relaygraph.runner._lease import DEFAULT_LEASE_SECONDS
from relaygraph.runner._model_calls import ModelCallRecorder, ModelCallRecording
from relaygraph.runner._no_room import RoomReserve, UnrecordedFailures
from relaygraph.runner._result import RunResult
from relaygraph.runner._run_mode import InProcessRun, RunMode, WorkerAttempt
from relaygraph.runner._run_steps import RunOptions, RunSteps
from relaygraph.runner._submit import Intake
from relaygraph.runner._task_run import TaskRun
from relaygraph.runner._team_cache import team_cache
from relaygraph.runner._teams import prepare_knowledge_base, team_of_record
from relaygraph.store import AttemptSuperseded, Quotas, is_disk_full
from relaygraph.topology import Topology

if TYPE_CHECKING:
    from relaygraph.agents.context import TaskContext
    from relaygraph.policies import TeamPolicy
    from relaygraph.runner._submit import SubmittedTask
    from relaygraph.store import Ledger, Task
    from relaygraph.team import Team

__all__ = ["RunOptions", "TaskRunner", "policy_digest"]


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

    def run(self, task: Task, graph_input: Any, **options: Unpack[RunOptions]) -> RunResult:
        """Run (or continue) ``task`` with ``graph_input`` on this thread.

        Args:
            task: The ledger's task record.
            graph_input: ``{"request": ...}`` to start, a ``Command(resume=...)`` after a
                decision, or :data:`~relaygraph.runner.CONTINUE` after a restart: on from
                the task's last checkpoint if it made one, else from the start.
            options: How to run it (:class:`RunOptions`).

        Raises:
            TaskBusy: Another runner holds the task's lease, or a cancel waits on it (in
                process).
            AttemptSuperseded: The task went on to another attempt than ``attempt``; this
                run wrote nothing since, and nothing of its end.
        """
        steps = self._steps(task, options)
        steps.prepare()
        run, mode = steps.run, steps.mode
        try:
            try:
                with mode.checkpointer(self.home, flush=run.writer.flush) as checkpointer:
                    graph = steps.graph(checkpointer)
                    steps.begin(run.graph_input(graph, graph_input))
                    if mode.flushes_before_stream:
                        run.writer.flush()
                    end = run.stream(graph, steps.graph_input, stream_tokens=steps.tokens)
                result = steps.result(end)
                steps.record_end(end, result)
                return result
            except BaseException as exc:
                steps.failed(exc)
                raise
            finally:
                run.lease.close()
                try:
                    run.writer.close()
                except AttemptSuperseded:
                    if steps.ended:
                        raise
                    # The error the run is leaving with (or the superseded attempt) says it.
                finally:
                    steps.let_go()
        except Exception as exc:
            if not is_disk_full(exc):
                raise
            raise steps.no_room(exc) from exc

    def intake(self) -> Intake:
        """Where a task this runner runs at once is submitted: its ledger, with the task
        recorded under this runner's lease (for :meth:`run_submitted`)."""
        return Intake(
            ledger=self.ledger, runner_id=self.runner_id, lease_seconds=self.lease_seconds
        )

    def run_submitted(
        self, submitted: SubmittedTask, graph_input: Any, **options: Unpack[RunOptions]
    ) -> RunResult:
        """Run, at once and on this thread, a task this process just submitted under this
        runner's lease (``submit_task(request, self.intake())``, as ``run_task`` and
        ``replay_task`` do): on the chat models its submission chose, without taking the
        lease again, and ended ``cancelled`` by a ``KeyboardInterrupt`` that stops it
        (``interrupt_cancels``: the process is the task's only runner).

        Args:
            submitted: What the submission recorded.
            graph_input: See :meth:`run`.
            options: How to run it (:class:`RunOptions`), but for what the submission says.
        """
        submitted_options: RunOptions = {
            **options,
            "models": submitted.submission.models.chosen,
            "leased": submitted.leased,
            "interrupt_cancels": True,
        }
        return self.run(submitted.task, graph_input, **submitted_options)

    async def arun(self, task: Task, graph_input: Any, **options: Unpack[RunOptions]) -> RunResult:
        """:meth:`run` on the running event loop: the graph runs with ``astream``, its models
        are awaited, and only its sync steps (tools, the ledger's reads and writes around the
        run) take a thread of the loop's default executor, for as long as each lasts. A
        process holds as many tasks in flight as its loop can drive this way, not one thread
        each: a server in process, a worker with tasks in flight (its attempts, fenced as
        on a thread). The arguments are :meth:`run`'s.

        Raises:
            TaskBusy: See :meth:`run`.
            AttemptSuperseded: See :meth:`run`.
        """
        steps = self._steps(task, options)
        await asyncio.to_thread(steps.prepare)
        run, mode = steps.run, steps.mode
        try:
            try:
                async with mode.acheckpointer(
                    self.home, flush=run.writer.aflush, save_with=run.writer.asave_with
                ) as checkpointer:
                    graph = steps.graph(checkpointer)
                    steps.begin(await run.agraph_input(graph, graph_input))
                    if mode.flushes_before_stream:
                        await run.writer.aflush()
                    end = await run.astream(graph, steps.graph_input, stream_tokens=steps.tokens)
                result = steps.result(end)
                # Its reads (a ping-pong's approvals) and its end's write, off the loop.
                await asyncio.to_thread(steps.record_end, end, result)
                return result
            except BaseException as exc:
                steps.failed(exc)
                raise
            finally:
                # Closing waits for a renewal under way: off the loop.
                await asyncio.to_thread(run.lease.close)
                try:
                    await run.writer.aclose()
                except AttemptSuperseded:
                    if steps.ended:
                        raise
                    # The error the run is leaving with (or the superseded attempt) says it.
                finally:
                    await asyncio.to_thread(steps.let_go)
        except Exception as exc:
            if not is_disk_full(exc):
                raise
            raise await asyncio.to_thread(steps.no_room, exc) from exc

    def _steps(self, task: Task, options: RunOptions) -> RunSteps:
        """The steps of a run of ``task``, in its mode: in process under this runner's lease,
        or a worker's attempt (the ``attempt`` option)."""
        attempt = options.get("attempt")
        mode: RunMode = (
            InProcessRun(
                self.ledger,
                self.runner_id,
                lease_seconds=self.lease_seconds,
                only_from=options.get("only_from"),
            )
            if attempt is None
            else WorkerAttempt(self.ledger, attempt)
        )
        return RunSteps(
            task,
            options,
            mode=mode,
            prepare=self._prepare,
            ledger=self.ledger,
            unrecorded_failures=self.unrecorded_failures,
        )

    def _prepare(self, task: Task, mode: RunMode, options: RunOptions) -> tuple[TaskRun, Any]:
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
        task = mode.take(task, leased=options.get("leased", False))
        attempt = mode.attempt
        # A cancel asked for on another server reaches this run through the ledger.
        cancel = options.get("cancel")
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
            team, graph_team = self._team_graph(
                task, options.get("team"), options.get("models"), policy, topology
            )
            context = self._context(task, team, mode)
            config = self._config(
                task,
                options.get("identity"),
                options.get("callbacks"),
                recursion_limit=policy.recursion_limit,
            )
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
        on_event = options.get("on_event")
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
            stop=options.get("stop"),
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

    def recorded_team(self, task: Task) -> Team:
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
        team = team or self.recorded_team(task)
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
