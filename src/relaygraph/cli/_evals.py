"""``relaygraph eval``: run a golden set, show each case and the metrics, gate on the result.

Only argparse is imported here; the runner, rich and the team load when the command runs,
so ``relaygraph --help`` stays quick.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from relaygraph.cli._argtypes import (
    add_model_arguments,
    add_topology_arguments,
    positive,
    share,
    topology_of,
)
from relaygraph.cli._replay import add_replay_eval_arguments, replay_eval_command
from relaygraph.cli._results import EXIT_FAILED, EXIT_OK, EXIT_USAGE, report_error

__all__ = ["add_eval_parser", "run_eval_command"]


def add_eval_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``eval`` command to ``relaygraph``'s sub-commands; returns its parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "eval",
        help="score a team against a golden set",
        description="Run every case of a golden set (JSON Lines, see docs/evals.md) through "
        "the team and score what it did: routes, agents, handoffs, tools, answer, status, "
        "budget. Progress goes to stderr; the cases and metrics to stdout.",
    )
    parser.add_argument(
        "golden",
        metavar="GOLDEN",
        type=Path,
        nargs="?",
        help="the golden file (.jsonl); none with --replay",
    )
    parser.add_argument(
        "--team",
        metavar="FILE",
        type=Path,
        help="a team file (TOML, see docs/teams.md) to evaluate, for the cases that name no "
        "team of their own; default: the built-in researcher, coder and writer. With "
        "--replay: a team file, or NAME[@VERSION] of a team the project registered",
    )
    add_model_arguments(
        parser,
        model_help="model for every role of every case (default: each case's script, offline)",
        agent_model_help="model for one role (an agent of the team, supervisor, finalize); "
        "repeatable",
    )
    parser.add_argument(
        "--concurrency", metavar="N", type=positive, default=1, help="runs at once (default 1)"
    )
    parser.add_argument(
        "--repeat",
        metavar="K",
        type=positive,
        default=1,
        help="runs per case; adds pass@k and pass^k (default 1)",
    )
    parser.add_argument(
        "--out", metavar="DIR", type=Path, help="write DIR/report.json and DIR/report.md"
    )
    parser.add_argument(
        "--baseline",
        metavar="REPORT",
        type=Path,
        help="an earlier report.json (or its folder): cases that passed there and fail now "
        "are regressions, and fail the command",
    )
    parser.add_argument(
        "--min-pass-rate",
        metavar="X",
        type=share,
        help="fail the command when the pass rate is under X (0 to 1)",
    )
    parser.add_argument(
        "--tag",
        metavar="T",
        action="append",
        default=[],
        help="run only cases with this tag; repeatable (any of them)",
    )
    add_topology_arguments(parser)
    parser.add_argument(
        "--langsmith-dataset",
        metavar="NAME",
        help="create or update this LangSmith dataset and record the run as an experiment "
        "(without it nothing is sent to LangSmith)",
    )
    add_replay_eval_arguments(parser)
    return parser


def run_eval_command(args: argparse.Namespace) -> int:
    """Run ``relaygraph eval`` with parsed ``args``; returns the exit code.

    0 when the gate passes; 1 when the pass rate is under ``--min-pass-rate``, a case
    regressed against ``--baseline`` or LangSmith failed; 2 for bad input (flags, paths,
    golden lines that could not be read — the other cases still run and are reported).

    """
    from relaygraph.errors import ConfigError, RelaygraphError

    try:
        if args.replay:
            return replay_eval_command(args)
        if args.golden is None:
            raise ConfigError("eval takes a golden file, or --replay (recorded tasks)")
        return _run(args)
    except RelaygraphError as exc:
        return report_error(exc)


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from relaygraph.cli._preflight import check_folder
    from relaygraph.evals import TrialResult, run_eval
    from relaygraph.team import load_team

    if args.out is not None:
        # The report is written after the last case: a folder it cannot go to would lose
        # every run's result.
        check_folder(args.out, "--out", holds="the report")
    team = load_team(args.team) if args.team is not None else None
    # No topology flag: each case's team runs in its own topology.
    named = args.topology or args.start_agent or args.output_mode
    topology = topology_of(args, team.arrangement if team else None) if named else None
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    out = Console(highlight=False)
    # A bar on a terminal; in a pipeline's log, one line per finished run instead.
    progress = Progress(
        TextColumn("[bold]eval[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    )
    bar = progress.add_task("", total=None)

    def advance(done: int, total: int, trial: TrialResult) -> None:
        mark = "[green]passed[/]" if trial.passed else "[red]failed[/]"
        if err.is_terminal:
            progress.update(
                bar, completed=done, total=total, description=f"{escape(trial.case_id)} {mark}"
            )
        else:
            run = f" (run {trial.trial})" if args.repeat > 1 else ""
            err.print(f"eval {done}/{total}: {escape(trial.case_id)}{run} {mark}")

    with progress:
        report = run_eval(
            args.golden,
            model=args.model,
            agent_models=dict(args.agent_model),
            topology=topology,
            team=team,
            concurrency=args.concurrency,
            repeat=args.repeat,
            tags=tuple(args.tag),
            out=args.out,
            baseline=args.baseline,
            on_progress=advance,
            langsmith_dataset=args.langsmith_dataset,
            home=getattr(args, "home", None),
        )
    _print_report(report, out)
    for error in report.invalid_lines:
        err.print(f"[red]relaygraph: {escape(str(args.golden))}, {escape(str(error))}[/]")
    if args.out is not None:
        err.print(f"report: {args.out / 'report.json'} and {args.out / 'report.md'}")
    code = EXIT_OK
    if report.langsmith is not None:
        if "error" in report.langsmith:
            err.print(f"[red]LangSmith: {escape(report.langsmith['error'])}[/]")
            code = EXIT_FAILED
        else:
            err.print(
                f"LangSmith: dataset {report.langsmith['dataset']}, "
                f"experiment {report.langsmith['experiment']}"
            )
    reasons = report.gate(min_pass_rate=args.min_pass_rate)
    for reason in reasons:
        err.print(f"[bold red]relaygraph eval: failed:[/] {escape(reason)}")
    if reasons:
        code = EXIT_FAILED
    if report.invalid_lines:
        err.print(
            f"[red]relaygraph: error: {len(report.invalid_lines)} line(s) of "
            f"{escape(str(args.golden))} could not be read (above); the other cases ran[/]"
        )
        code = EXIT_USAGE
    return code


def _print_report(report: Any, console: Any) -> None:
    from rich.markup import escape
    from rich.table import Table

    from relaygraph.evals import case_outcome, metric_rows

    cases = Table(title=f"{len(report.cases)} cases", title_justify="left")
    cases.add_column("case", overflow="fold")
    cases.add_column("result", overflow="fold")
    if report.repeat > 1:
        cases.add_column("runs passed", justify="right")
    cases.add_column("tokens", justify="right")
    cases.add_column("task", overflow="fold")
    regressed = set(report.regressions)
    for case in report.cases:
        outcome = escape(case_outcome(case))
        style = "green" if case.passed else "red"
        if case.id in regressed:
            outcome += " [bold](regression)[/]"
        row = [escape(case.id), f"[{style}]{outcome}[/]"]
        if report.repeat > 1:
            row.append(f"{case.passes}/{len(case.trials)}")
        row.append(
            str(
                sum(
                    int(t.usage.get("input_tokens", 0)) + int(t.usage.get("output_tokens", 0))
                    for t in case.trials
                )
            )
        )
        row.append(case.trials[-1].task_id or "–")
        cases.add_row(*row)
    console.print(cases)
    metrics = Table(title="metrics", title_justify="left")
    metrics.add_column("metric")
    metrics.add_column("value", justify="right")
    for name, value in metric_rows(report):
        metrics.add_row(name, escape(value))
    console.print(metrics)
    if report.baseline is not None:
        console.print(
            f"against {escape(report.baseline)}: "
            f"{len(report.regressions)} regression(s)"
            + (f" ({escape(', '.join(report.regressions))})" if report.regressions else "")
            + f", {len(report.fixed)} fixed"
            + (f" ({escape(', '.join(report.fixed))})" if report.fixed else "")
        )
