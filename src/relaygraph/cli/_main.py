"""The ``relaygraph`` command line's entry point: parse, run the command, turn errors into
exit codes.

The arguments are read by :mod:`relaygraph.cli._parser` and carried out by
:mod:`relaygraph.cli._commands`. Heavy modules (LangGraph, LangChain, the model clients) are
imported inside the commands, so ``relaygraph --help`` and argument errors answer at once.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from relaygraph.cli import _commands
from relaygraph.cli._evals import run_eval_command
from relaygraph.cli._parser import build_parser
from relaygraph.cli._preflight import check_ledger, data_directory, ledger_url
from relaygraph.cli._replay import diff, export_command, replay
from relaygraph.cli._results import report_error
from relaygraph.errors import ConfigError, RelaygraphError
from relaygraph.models import run_doctor

# The commands that write in the data directory, and those of them that use the ledger.
# ``serve`` checks its own (its settings may name another), after reading them.
_HOME_COMMANDS = frozenset(
    {"run", "resume", "replay", "diff", "trace", "eval", "evals", "projects", "db", "kb"}
    | {"worker", "gc"}
)
_LEDGER_COMMANDS = frozenset(
    {"run", "resume", "replay", "diff", "trace", "eval", "evals", "projects", "db", "gc"}
)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``relaygraph`` script; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        _check_surroundings(args)
        return _run_command(args)
    except RelaygraphError as exc:
        return report_error(exc)
    except KeyboardInterrupt:
        print("relaygraph: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`relaygraph graph | head`): no traceback, and none again
        # when Python flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _check_surroundings(args: argparse.Namespace) -> None:
    """Refuse a data directory or a ledger the command cannot use, in one line, before it
    starts (the command would otherwise fail deep inside, with a traceback).

    Raises:
        ConfigError: Naming the directory or the ledger's URL, and why.
    """
    if args.command in _HOME_COMMANDS:
        data_directory(args.home)
    if args.command in _LEDGER_COMMANDS:
        check_ledger(ledger_url(args.home))


def _run_command(args: argparse.Namespace) -> int:
    """Carry out the command ``args`` name; returns the exit code."""
    if args.command == "projects":
        if args.projects_command == "quota":
            return _commands.project_quota(args)
        return _commands.create_project(args)
    if args.command == "teams":
        if args.teams_command == "create":
            raise ConfigError(
                "'relaygraph teams create' was removed: the tenant an API key speaks for is a "
                "project, and a team is the agents a task runs; use 'relaygraph projects "
                'create NAME\' (with --json it prints {"project": ..., "key": ...})'
            )
        if args.teams_command == "push":
            return _commands.push_team(args)
        return _commands.check_team(args)
    return _COMMANDS[args.command](args)


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": _commands.run,
    "resume": _commands.resume,
    "replay": replay,
    "diff": diff,
    "evals": export_command,
    "graph": _commands.graph,
    "trace": _commands.trace,
    "eval": run_eval_command,
    "doctor": run_doctor,
    "serve": _commands.serve,
    "worker": _commands.worker,
    "db": _commands.upgrade_db,
    "gc": _commands.collect_garbage,
    "kb": _commands.manage_kb,
}
"""The command each name carries out, for the commands that have no subcommand of their own
to choose by."""
