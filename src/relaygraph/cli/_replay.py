"""``relaygraph replay`` and ``relaygraph diff``: rerun a recorded task from any step with
something changed, and read two tasks' trajectories side by side."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from relaygraph.cli._argtypes import (
    add_json_argument,
    add_model_arguments,
    add_policy_argument,
    step_number,
    utf8_text,
)
from relaygraph.cli._preflight import ledger_url
from relaygraph.errors import ConfigError

__all__ = ["add_replay_parsers", "diff", "replay"]


def add_replay_parsers(commands: Any) -> None:
    """Add ``replay`` and ``diff`` to the command parsers."""
    replay_parser = commands.add_parser(
        "replay",
        help="rerun a recorded task, from its request or a step, with a change",
        description="Replay a recorded task as a new task on a thread of its own (the original "
        "is never changed): from its request, or with --from-step N after its first N steps "
        "(agent visits), whose tool calls are not run again, in a copy of its workspace. "
        "Compare with 'relaygraph diff'.",
    )
    replay_parser.add_argument("task_id", metavar="TASK", type=utf8_text)
    replay_parser.add_argument(
        "--from-step",
        metavar="N",
        type=step_number,
        default=0,
        help="go on after the original's first N steps (default 0: from its request)",
    )
    add_model_arguments(
        replay_parser,
        model_help="model for every role",
        agent_model_help="model for one role; repeatable",
        agent_metavar="ROLE=SPEC",
    )
    replay_parser.add_argument(
        "--team",
        metavar="FILE|NAME[@VERSION]",
        type=utf8_text,
        help="another team file, or a team the task's project registered (its latest "
        "version, or VERSION); the original's by default",
    )
    add_policy_argument(replay_parser, "another policy file for the team")
    add_json_argument(replay_parser)

    diff_parser = commands.add_parser(
        "diff",
        help="two tasks' trajectories side by side, aligned by step",
        description="Show two tasks' routes and handoffs, tool calls, violations, answers and "
        "usage step by step, the first step where they part, and the differences summed.",
    )
    diff_parser.add_argument("task_a", metavar="A", type=utf8_text)
    diff_parser.add_argument("task_b", metavar="B", type=utf8_text)
    add_json_argument(diff_parser)


def replay(args: argparse.Namespace) -> int:
    """``relaygraph replay``: replay a recorded task in this process. The operator replays
    any project's task (as ``trace`` reads any), in that project, on its registered teams
    and under the operator's policy ceiling (``RELAYGRAPH_*`` settings, as a worker's)."""
    from relaygraph.cli._console import ProgressPrinter
    from relaygraph.cli._results import report_result
    from relaygraph.runner import RequestRefused, ledger_for, replay_task
    from relaygraph.store import LOCAL_PROJECT_ID

    ledger = ledger_for(args.home)
    project_id = ledger.task_owner(args.task_id) or LOCAL_PROJECT_ID
    original = ledger.get_task(args.task_id, project_id=project_id)
    if original is None:
        raise RequestRefused(f"no task {args.task_id!r} in {ledger.url}", field="task_id")
    service = _service_teams(args, ledger, project_id)
    team, version = _team(args.team, ledger, project_id, service)
    policy = None
    if args.policy is not None:
        base = team if team is not None else _recorded_team(original, service)
        try:
            policy = base.policy_from(args.policy)
        except ConfigError as exc:
            raise RequestRefused(str(exc), field="policy", code="invalid_policy") from None
    changes = _changes(args, team, version, policy)
    result = replay_task(
        args.task_id,
        changes,
        home=args.home,
        on_event=None if args.json else ProgressPrinter(),
        project_id=project_id,
        teams=None if service is None else service.resolve,
        policies=None if service is None else service.policy_for,
    )
    return report_result(result, as_json=args.json)


def _changes(args: argparse.Namespace, team: Any, version: Any, policy: Any) -> Any:
    """The :class:`~relaygraph.runner.ReplayChanges` of ``replay`` and ``eval --replay``:
    their step and models from the arguments, the team and policy already resolved."""
    from relaygraph.runner import ReplayChanges

    return ReplayChanges(
        from_step=args.from_step,
        model=args.model,
        agent_models=dict(args.agent_model),
        team=team,
        team_version=version,
        policy=policy,
    )


def _service_teams(args: argparse.Namespace, ledger: Any, project_id: str) -> Any:
    """A project's registered teams and the operator's ceiling, as the server's runner has
    them; None for ``relaygraph run``'s own tasks (a user's own teams, no ceiling)."""
    from relaygraph.runner import ServiceTeams, load_runner_settings
    from relaygraph.store import LOCAL_PROJECT_ID

    if project_id == LOCAL_PROJECT_ID:
        return None
    return ServiceTeams(ledger=ledger, settings=load_runner_settings(), home=args.home)


def _recorded_team(task: Any, service: Any) -> Any:
    from relaygraph.runner import team_of_record

    return service.resolve(task) if service is not None else team_of_record(task)


def _team(value: str | None, ledger: Any, project_id: str, service: Any) -> tuple[Any, Any]:
    """The team ``--team`` names, with its registered version: a team file, else a team
    the project registered (``NAME`` or ``NAME@VERSION``); (None, None) without it."""
    from relaygraph.team import load_team

    if value is None:
        return None, None
    if Path(value).is_file():
        return load_team(Path(value)), None
    name, sep, number = value.partition("@")
    found = None
    if service is not None and (not sep or number.isdigit()):
        found = ledger.team_version(project_id, name, int(number) if sep else None)
    if found is None:
        raise ConfigError(
            f"--team {value!r} is no team file, nor a team the tasks' project registered"
            + (" (relaygraph run's tasks take team files)" if service is None else "")
        )
    return service.registered(found), found.version


def diff(args: argparse.Namespace) -> int:
    """``relaygraph diff``: two tasks of the ledger side by side."""
    from relaygraph.evals import diff_trajectories, read_trajectory
    from relaygraph.store import LOCAL_PROJECT_ID, Ledger

    with Ledger(ledger_url(args.home)) as ledger:
        if not ledger.is_current():
            ledger.upgrade()
        trajectories = []
        for task_id in (args.task_a, args.task_b):
            # The operator reads every project's tasks, as ``trace`` does.
            owner = ledger.task_owner(task_id) or LOCAL_PROJECT_ID
            task = ledger.get_task(task_id, project_id=owner)
            if task is None:
                raise ConfigError(f"no task {task_id!r} in {ledger.url}")
            trajectories.append(read_trajectory(ledger, task))
    result = diff_trajectories(trajectories[0], trajectories[1])
    if args.json:
        sys.stdout.write(json.dumps(result.to_json(), ensure_ascii=False) + "\n")
    else:
        print(render_diff(result))
    return 0


def render_diff(result: Any) -> str:
    """The diff as text: one block per step, ``=`` where both agree, ``≠`` where they part."""
    lines = [
        f"A {result.a.task_id} ({result.a.status})",
        f"B {result.b.task_id} ({result.b.status})",
    ]
    for step in result.steps:
        mark = "=" if not step.differences else "≠"
        first = "  <- first divergence" if step.number == result.first_divergence else ""
        lines.append(f"{mark} step {step.number}{first}")
        for side, item in (("A", step.a), ("B", step.b)):
            if item is None:
                lines.append(f"    {side}: (no such step)")
                continue
            calls = ", ".join(
                f"{c.name}#{c.args_digest}→{c.result_digest}" for c in item.tool_calls
            )
            lines.append(
                f"    {side}: {item.source} → {item.agent}: {item.task!r}"
                + (f" ({item.reason})" if item.reason else "")
                + (f" | tools: {calls}" if calls else "")
                + (f" | violations: {'; '.join(item.violations)}" if item.violations else "")
                + (" | inherited" if item.inherited else "")
            )
        if step.differences:
            lines.append(f"    differs in: {', '.join(step.differences)}")
    summary = result.summary()
    lines.append(f"answer: {'same' if result.answer_same else 'differs'}")
    for role, usage in result.per_agent.items():
        a, b = usage["a"], usage["b"]
        lines.append(
            f"  {role}: tokens {a['input_tokens'] + a['output_tokens']:.0f} → "
            f"{b['input_tokens'] + b['output_tokens']:.0f}, cost ${a['cost_usd']:.4f} → "
            f"${b['cost_usd']:.4f}, time {a['seconds']:.2f}s → {b['seconds']:.2f}s"
        )
    lines.append(
        "same trajectory"
        if summary["same"]
        else f"{summary['steps_differing']} step(s) differ; first at step "
        f"{summary['first_divergence']}"
    )
    return "\n".join(lines)


# -- replay as an eval, and golden cases from the ledger ---------------------------------


def _when(value: str) -> Any:
    """An ISO date or time (UTC unless it says otherwise)."""
    from datetime import UTC, datetime

    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO date or time such as 2026-11-30 or 2026-11-30T08:00, got {value!r}"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _team_version(value: str) -> tuple[str, int | None]:
    """``NAME`` or ``NAME@VERSION``."""
    name, sep, version = value.partition("@")
    if not name.strip() or (sep and not version.strip().isdigit()):
        raise argparse.ArgumentTypeError(f"expected NAME or NAME@VERSION, got {value!r}")
    return name.strip(), int(version) if sep else None


def add_selection_arguments(parser: argparse.ArgumentParser) -> None:
    """The ledger query of ``eval --replay`` and ``evals export``."""
    group = parser.add_argument_group("which recorded tasks (the ledger query)")
    group.add_argument(
        "--project",
        metavar="NAME",
        help="the project whose tasks to take (default: relaygraph run's own)",
    )
    group.add_argument(
        "--of-team",
        metavar="NAME[@VERSION]",
        type=_team_version,
        help="only tasks that ran on this team (and version); 'default' is the built-in team",
    )
    group.add_argument("--since", metavar="WHEN", type=_when, help="created at or after")
    group.add_argument("--until", metavar="WHEN", type=_when, help="created before")
    group.add_argument("--status", metavar="STATUS", help="only tasks that ended so")
    group.add_argument(
        "--limit", metavar="N", type=int, default=50, help="the newest N that match (default 50)"
    )


def add_replay_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """``relaygraph eval --replay`` and its options."""
    parser.add_argument(
        "--replay",
        action="store_true",
        help="replay recorded tasks (the ledger query below) instead of a golden set, with "
        "--team/--model/--agent-model/--policy changed, and compare each with its original",
    )
    parser.add_argument(
        "--from-step", metavar="N", type=step_number, default=0, help="with --replay: from step N"
    )
    add_policy_argument(parser, "with --replay: another policy file")
    parser.add_argument(
        "--min-same-rate",
        metavar="X",
        type=float,
        help="with --replay: fail when under this share of tasks routes the same way",
    )
    add_selection_arguments(parser)


def add_evals_parser(commands: Any) -> None:
    """``relaygraph evals export``."""
    evals = commands.add_parser("evals", help="golden sets from the ledger")
    sub = evals.add_subparsers(dest="evals_command", metavar="EVALS_COMMAND", required=True)
    export = sub.add_parser(
        "export",
        help="write recorded tasks as golden cases, their recorded trajectory expected",
        description="Write the tasks a ledger query selects as a golden file (JSON Lines, "
        "docs/evals.md): each task's request, and its recorded trajectory (agents in order, "
        "handoffs, tools, status, violations) as what is expected.",
    )
    export.add_argument("--out", metavar="FILE", type=Path, required=True, help="the .jsonl file")
    add_selection_arguments(export)


def _selection(args: argparse.Namespace, ledger: Any) -> Any:
    """The :class:`~relaygraph.store.TaskSelection` of :func:`add_selection_arguments`."""
    from relaygraph.store import TaskSelection

    team, version = args.of_team or (None, None)
    selection = TaskSelection(
        project_id=_project_id(args.project, ledger),
        team=team,
        version=version,
        since=args.since,
        until=args.until,
        status=args.status,
        limit=args.limit,
    )
    selection.check()
    return selection


def _project_id(name: str | None, ledger: Any) -> str:
    """The id of the project ``--project`` names; ``relaygraph run``'s own without it."""
    from relaygraph.store import LOCAL_PROJECT_ID

    if name is None:
        return LOCAL_PROJECT_ID
    project = ledger.get_project(name)
    if project is None:
        raise ConfigError(f"--project {name!r}: no such project in {ledger.url}")
    return project.id


def export_command(args: argparse.Namespace) -> int:
    """``relaygraph evals export``."""
    from relaygraph.evals import export_golden
    from relaygraph.runner import ledger_for

    ledger = ledger_for(args.home)
    tasks = ledger.select_tasks(_selection(args, ledger))
    count = export_golden(ledger, tasks, args.out)
    print(f"wrote {count} case(s) to {args.out}", file=sys.stderr)
    return 0


def replay_eval_command(args: argparse.Namespace) -> int:
    """``relaygraph eval --replay``: replay the selected tasks and gate on the report."""
    from relaygraph.evals import run_replay_eval
    from relaygraph.runner import ledger_for

    if args.golden is not None:
        raise ConfigError(
            f"eval --replay takes its tasks from the ledger, not a golden file "
            f"(got {str(args.golden)!r})"
        )
    ledger = ledger_for(args.home)
    selection = _selection(args, ledger)
    tasks = ledger.select_tasks(selection)
    if not tasks:
        raise ConfigError("the ledger query selected no task to replay")
    service = _service_teams(args, ledger, selection.project_id)
    # A team file, or a team the selected project registered, as ``relaygraph replay``
    # takes it (``eval``'s --team is a path for golden sets: its text is the name).
    team, version = _team(
        None if args.team is None else str(args.team), ledger, selection.project_id, service
    )
    policy = None
    if args.policy is not None:
        if team is None:
            raise ConfigError("--policy with --replay needs --team: the policy of which team")
        policy = team.policy_from(args.policy)
    changes = _changes(args, team, version, policy)
    described = {
        "team": None if args.team is None else str(args.team),
        "model": args.model,
        "agent_models": dict(args.agent_model),
        "policy": None if args.policy is None else str(args.policy),
        "from_step": args.from_step,
    }

    def progress(done: int, total: int, case: Any) -> None:
        what = case.error or (
            "same routes" if case.same_routes else f"parts at step {case.first_divergence}"
        )
        print(f"replay {done}/{total}: {case.task_id} {what}", file=sys.stderr)

    report = run_replay_eval(
        tasks,
        changes,
        ledger=ledger,
        home=args.home,
        baseline=args.baseline,
        described=described,
        on_progress=progress,
        teams=None if service is None else service.resolve,
        policies=None if service is None else service.policy_for,
    )
    print(render_replay_report(report))
    if args.out is not None:
        print(f"report: {report.write(args.out)}", file=sys.stderr)
    reasons = report.gate(min_same_rate=args.min_same_rate)
    for reason in reasons:
        print(f"relaygraph eval: failed: {reason}", file=sys.stderr)
    return 1 if reasons else 0


def render_replay_report(report: Any) -> str:
    """One line per task, then the summary."""

    def ratio(value: float | None) -> str:
        return "–" if value is None else f"{value:.2f}x"

    lines = ["task  replay  routes  first divergence  answer similarity  cost  tokens  time"]
    for case in report.cases:
        if case.error is not None:
            lines.append(f"{case.task_id}  error: {case.error}")
            continue
        lines.append(
            f"{case.task_id}  {case.replay_id}  {'same' if case.same_routes else 'differ'}  "
            f"{case.first_divergence if case.first_divergence is not None else '–'}  "
            f"{case.answer_similarity:.2f}  {ratio(case.cost_ratio)}  "
            f"{ratio(case.tokens_ratio)}  {ratio(case.time_ratio)}"
        )
    summary = report.summary()
    lines.append(
        f"{summary['same_routes']}/{summary['replayed']} route the same way; "
        f"{len(summary['diverged'])} part somewhere; mean answer similarity "
        f"{summary['mean_answer_similarity']}; mean tokens ratio {summary['mean_tokens_ratio']}"
        f"; mean time ratio {summary['mean_time_ratio']}"
    )
    if report.baseline is not None:
        lines.append(
            f"against {report.baseline}: {len(report.regressions)} regression(s), "
            f"{len(report.fixed)} fixed"
        )
    return "\n".join(lines)
