"""Run one task in this process, or resume a paused one: the Python API and the CLI's
``relaygraph run`` and ``relaygraph resume``. Both go through the one submission and
decision paths (:mod:`relaygraph.runner._submit`, :mod:`relaygraph.runner._decide`)."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relaygraph._home import data_home
from relaygraph.errors import ConfigError
from relaygraph.runner._decide import decide_task, resume_input, waiting_approvals
from relaygraph.runner._errors import RequestRefused
from relaygraph.runner._ledger import ledger_for
from relaygraph.runner._result import Decision, RunResult
from relaygraph.runner._submit import TaskRequest, submit_task
from relaygraph.runner._task_run import EventHandler
from relaygraph.runner._task_runner import TaskRunner
from relaygraph.runner._teams import team_from_argument

if TYPE_CHECKING:
    from relaygraph.policies import TeamPolicy
    from relaygraph.team import Team
    from relaygraph.topology import Topology

__all__ = ["arun_task", "resume_task", "run_task"]


def run_task(
    request: str,
    *,
    team: Team | str | Path | None = None,
    model: Any = None,
    agent_models: Mapping[str, Any] | None = None,
    thread_id: str | None = None,
    policy: TeamPolicy | str | Path | None = None,
    home: Path | None = None,
    on_event: EventHandler | None = None,
    stream_tokens: bool = False,
    callbacks: list[Any] | None = None,
    topology: Topology | None = None,
    cancel: threading.Event | None = None,
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
        cancel: When set (from another thread, or a signal handler), the run stops at the
            next step boundary, status ``cancelled``. A ``KeyboardInterrupt`` that stops the
            run itself also ends the task ``cancelled`` on the record.

    Raises:
        ConfigError: Bad input (bad team file, bad policy) before anything runs; a
            :class:`~relaygraph.runner.RequestRefused` names the field at fault (empty
            request, unknown thread, bad model spec, a thread of another topology).
            Failures while running are reported as ``failed``.
    """
    the_team = team_from_argument(team)
    try:
        team_policy = the_team.policy_from(policy) if policy is not None else None
    except RequestRefused:
        raise
    except ConfigError as exc:
        raise RequestRefused(str(exc), field="policy", code="invalid_policy") from None
    home = data_home(home)
    ledger = ledger_for(home)  # kept for the process: not closed here
    runner = TaskRunner(ledger=ledger, home=home)
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
        # Recorded under the runner's lease: it runs the task at once.
        runner.intake(),
    )
    return runner.run_submitted(
        submitted,
        {"request": request},
        on_event=on_event,
        stream_tokens=stream_tokens,
        callbacks=callbacks,
        team=the_team,
        cancel=cancel,
    )


async def arun_task(
    request: str,
    *,
    team: Team | str | Path | None = None,
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
    """:func:`run_task` for an asyncio application: awaits the task without blocking the
    event loop. The arguments are :func:`run_task`'s.

    Cancelling the awaiting coroutine cancels the task: it stops at its next step boundary
    (a coroutine-only tool in progress is cancelled), ends ``cancelled`` on the record, and
    then :class:`asyncio.CancelledError` is raised here.

    ``on_event`` is called on the run's thread, not in the loop: hand its events to the
    loop with ``loop.call_soon_threadsafe`` (or an ``asyncio.Queue`` fed that way).
    """
    # The run on a worker thread, not a native async path: a run holds a lease it renews,
    # writes its events on a writer thread, and waits on synchronous checkpointers and
    # ledgers; one sync runner is what the CLI, the service and the workers all run, so
    # an async caller gets the same guarantees, and its coroutine-only tools run on the
    # process's tool loop all the same (relaygraph.agents._async_tools).
    cancel = threading.Event()
    run = asyncio.ensure_future(
        asyncio.to_thread(
            functools.partial(
                run_task,
                request,
                team=team,
                model=model,
                agent_models=agent_models,
                thread_id=thread_id,
                policy=policy,
                home=home,
                on_event=on_event,
                stream_tokens=stream_tokens,
                callbacks=callbacks,
                topology=topology,
                cancel=cancel,
            )
        )
    )
    try:
        return await asyncio.shield(run)
    except asyncio.CancelledError:
        cancel.set()
        # The task is on the record as cancelled (or however it ended) before this returns.
        await asyncio.wait({run})
        raise


def resume_task(
    task_id: str,
    decision: Decision,
    *,
    home: Path | None = None,
    on_event: EventHandler | None = None,
    stream_tokens: bool = False,
    decided_by: str = "cli",
    team: Team | str | Path | None = None,
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
    the_team = runner.recorded_team(task) if team is None else team_from_argument(team)
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
