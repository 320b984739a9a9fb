"""``relaygraph replay`` and ``relaygraph diff``: rerun a recorded task from any step with
something changed, and read two tasks' trajectories side by side."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from relaygraph.cli._argtypes import agent_model, utf8_text
from relaygraph.cli._preflight import ledger_url
from relaygraph.errors import ConfigError

__all__ = ["add_replay_parsers", "diff", "replay"]


def _step(value: str) -> int:
    """A step number: a whole number of 0 or more."""
    if not value.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number of 0 or more, got {value!r}")
    return int(value)


def add_replay_parsers(commands: Any) -> None:
    """Add ``replay`` and ``diff`` to the command parsers."""
    replay_parser = commands.add_parser(
        "replay",
        help="rerun a recorded task, from its request or a step, with a change",
        description="Replay a recorded task as a new task on a thread of its own (the original "
        "is never changed): from its request, or with --from-step N after its first N steps "
        "(agent visits), whose tool calls are not run again. Compare with 'relaygraph diff'.",
    )
    replay_parser.add_argument("task_id", metavar="TASK", type=utf8_text)
    replay_parser.add_argument(
        "--from-step",
        metavar="N",
        type=_step,
        default=0,
        help="go on after the original's first N steps (default 0: from its request)",
    )
    replay_parser.add_argument("--model", metavar="SPEC", help="model for every role")
    replay_parser.add_argument(
        "--agent-model",
        metavar="ROLE=SPEC",
        type=agent_model,
        action="append",
        default=[],
        help="model for one role; repeatable",
    )
    replay_parser.add_argument(
        "--team",
        metavar="FILE",
        type=Path,
        help="another team file (another version of the team); the original's by default",
    )
    replay_parser.add_argument(
        "--policy", metavar="FILE", type=Path, help="another policy file for the team"
    )
    replay_parser.add_argument(
        "--json", action="store_true", help="print one JSON object on stdout and nothing else"
    )

    diff_parser = commands.add_parser(
        "diff",
        help="two tasks' trajectories side by side, aligned by step",
        description="Show two tasks' routes and handoffs, tool calls, violations, answers and "
        "usage step by step, the first step where they part, and the differences summed.",
    )
    diff_parser.add_argument("task_a", metavar="A", type=utf8_text)
    diff_parser.add_argument("task_b", metavar="B", type=utf8_text)
    diff_parser.add_argument(
        "--json", action="store_true", help="print one JSON object on stdout and nothing else"
    )


def replay(args: argparse.Namespace) -> int:
    """``relaygraph replay``: replay a task of ``relaygraph run`` in this process."""
    from relaygraph.cli._commands import _report
    from relaygraph.cli._console import ProgressPrinter
    from relaygraph.runner import ReplayChanges, RequestRefused, replay_task
    from relaygraph.team import load_team

    team = None
    if args.team is not None:
        if not args.team.is_file():
            raise ConfigError(
                f"--team {str(args.team)!r} is no team file; a project's registered team "
                "versions are replayed over the API: POST /v1/tasks/TASK/replay "
                '{"team": NAME, "version": N}'
            )
        team = load_team(args.team)
    policy = None
    if args.policy is not None:
        from relaygraph.runner import ledger_for, team_of_record
        from relaygraph.store import LOCAL_PROJECT_ID

        base = team
        if base is None:
            original = ledger_for(args.home).get_task(args.task_id, project_id=LOCAL_PROJECT_ID)
            if original is None:
                raise RequestRefused(f"no task {args.task_id!r}", field="task_id")
            base = team_of_record(original)
        try:
            policy = base.policy_from(args.policy)
        except ConfigError as exc:
            raise RequestRefused(str(exc), field="policy", code="invalid_policy") from None
    changes = ReplayChanges(
        from_step=args.from_step,
        model=args.model,
        agent_models=dict(args.agent_model),
        team=team,
        policy=policy,
    )
    result = replay_task(
        args.task_id,
        changes,
        home=args.home,
        on_event=None if args.json else ProgressPrinter(),
    )
    return _report(result, as_json=args.json)


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
