"""The ``relaygraph`` command line's arguments: :func:`build_parser` and nothing it runs.

Only light modules are imported here, so ``relaygraph --help`` and argument errors answer
at once; :mod:`relaygraph.cli._commands` carries the commands out.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from relaygraph import __version__
from relaygraph.cli._argtypes import (
    add_json_argument,
    add_model_arguments,
    add_policy_argument,
    add_topology_arguments,
    data_folder,
    days,
    json_object,
    port,
    positive,
    team_name,
    usd,
    utf8_text,
)
from relaygraph.cli._doctor import add_doctor_parser
from relaygraph.cli._evals import add_eval_parser
from relaygraph.cli._replay import add_evals_parser, add_replay_parsers

__all__ = ["SERVICE_KEY_ENV", "SERVICE_URL_ENV", "build_parser"]

SERVICE_URL_ENV = "RELAYGRAPH_URL"
SERVICE_KEY_ENV = "RELAYGRAPH_API_KEY"


class CommandParser(argparse.ArgumentParser):
    """A command's parser that refuses an argument it does not know itself.

    argparse hands a subcommand's unknown arguments back to the top-level parser, which
    then prints its own usage (``relaygraph [-h] ... COMMAND ...``) instead of the
    command's. Refused here, the error shows the usage of the command that was mistyped
    (``relaygraph run [-h] ...``) and names the argument.
    """

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``relaygraph`` and all its commands."""
    parser = argparse.ArgumentParser(
        prog="relaygraph",
        description="A supervised team of agents (researcher, coder, writer) on LangGraph.",
    )
    parser.add_argument("--version", action="version", version=f"relaygraph {__version__}")
    parser.add_argument(
        "--home",
        type=data_folder,
        help="data directory (default: $RELAYGRAPH_HOME or ~/.relaygraph)",
    )
    commands = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=CommandParser
    )

    run = commands.add_parser(
        "run",
        help="run a task through the team",
        description="Run a task: the supervisor routes it to the agents, who may hand work "
        "to each other; progress goes to stderr, the answer to stdout.",
    )
    run.add_argument("task", type=utf8_text, help="what the team should do")
    add_model_arguments(
        run,
        model_help="model for every role: openai:MODEL, scripted:PATH or local:smollm2 "
        "(default: local:smollm2, the embedded model)",
        agent_model_help="model for one role (researcher, coder, writer, supervisor, "
        "finalize, as the topology has them); repeatable",
    )
    _add_team_argument(run)
    run.add_argument(
        "--thread", metavar="ID", type=utf8_text, help="continue the conversation of this thread"
    )
    add_policy_argument(
        run, "policy TOML: tools, handoffs, budgets, approvals (see docs/policies.md)"
    )
    add_topology_arguments(run)
    add_json_argument(run)

    resume = commands.add_parser(
        "resume",
        help="continue a task that waits for a person's decision",
        description="Continue an interrupted task from its checkpoint, in this process, with "
        "a decision on what it waits for (a tool needing approval, or a ping-pong).",
    )
    resume.add_argument("task_id", metavar="TASK_ID", type=utf8_text)
    decision = resume.add_mutually_exclusive_group(required=True)
    decision.add_argument("--approve", action="store_true", help="run the tool as requested")
    decision.add_argument("--reject", action="store_true", help="refuse it; the model is told")
    decision.add_argument(
        "--edit",
        metavar="ARGS_JSON",
        type=json_object,
        help="run the tool with these arguments instead (a JSON object)",
    )
    resume.add_argument(
        "--reason", metavar="TEXT", type=utf8_text, help="why; shown to the model on --reject"
    )
    resume.add_argument(
        "--team",
        metavar="FILE",
        type=Path,
        help="the task's team file, when the task does not record where it is",
    )
    add_json_argument(resume)
    add_replay_parsers(commands)
    add_evals_parser(commands)

    serve = commands.add_parser(
        "serve",
        help="run the task service (HTTP API under /v1)",
        description="Serve the task API. Migrations run at start; tasks that were queued or "
        "running when the server stopped are picked up again.",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=port, default=8000, help="port (default 8000)")
    serve.add_argument(
        "--model",
        metavar="SPEC",
        help="default model for tasks that name none (default local:smollm2)",
    )
    serve.add_argument(
        "--workers",
        type=positive,
        metavar="N",
        help="tasks in flight at once, on the server's event loop (default 100; see "
        "docs/deploy.md for sizing)",
    )
    serve.add_argument(
        "--processes",
        type=positive,
        metavar="N",
        help="spread the tasks in flight over N processes sharing the ledger, one core "
        "each (default: one per 1000 tasks in flight, so 1 for the default 100)",
    )
    add_policy_argument(serve, "the built-in team's base policy")
    serve.add_argument(
        "--scripts",
        metavar="DIR",
        type=Path,
        help="a folder of scripted models that requests may name by file name "
        "(scripted:NAME.json); off by default",
    )
    serve.add_argument(
        "--team",
        metavar="FILE",
        type=Path,
        action="append",
        default=[],
        dest="team_files",
        help="a team file every project may run by its name (repeatable); only these may use "
        "stdio MCP servers, ./file.py tools and kb folders (see docs/api.md)",
    )
    serve.add_argument(
        "--mcp",
        metavar="FILE",
        type=Path,
        dest="mcp_file",
        help="a file of [mcp.NAME] tables (as in a team file): MCP servers projects' "
        "registered teams may use as mcp:NAME/..., each project with its own session",
    )
    serve.add_argument(
        "--unsafe-sandbox",
        action="store_true",
        help="run tenants' run_python code even where this host has no filesystem "
        "isolation (bubblewrap): the code can then read and write the server's files",
    )

    worker = commands.add_parser(
        "worker",
        help="run tasks for API servers in the worker mode (Celery on RabbitMQ)",
        description="A Celery worker of the worker mode: it takes the task ids API servers "
        "publish to RabbitMQ (RELAYGRAPH_BROKER_URL) and runs each task from the ledger on "
        "PostgreSQL (RELAYGRAPH_DATABASE_URL): one task per process at a time, or with "
        "--tasks-in-flight many at once in one process. See docs/deploy.md.",
    )
    # One pool or the other: given both, the worker would silently ignore --concurrency.
    pool = worker.add_mutually_exclusive_group()
    pool.add_argument(
        "--concurrency",
        type=positive,
        metavar="N",
        help="tasks run at once, one process each (default $RELAYGRAPH_CONCURRENCY or 2)",
    )
    pool.add_argument(
        "--tasks-in-flight",
        type=positive,
        metavar="N",
        help="hold N tasks in flight in this one process instead, each a coroutine on its "
        "event loop (default $RELAYGRAPH_TASKS_IN_FLIGHT; unset: --concurrency processes)",
    )
    worker.add_argument(
        "--queues",
        metavar="Q[,Q]",
        help="queues to consume, comma-separated (default $RELAYGRAPH_QUEUES or relaygraph)",
    )
    worker.add_argument(
        "--hostname",
        metavar="H",
        help="the worker's node name (name@host, %%h for this host; default "
        "relaygraph-<pid>@<host>, unique per process)",
    )
    worker.add_argument(
        "--events",
        action="store_true",
        help="send Celery's task events (for Flower or celery-exporter)",
    )

    projects = commands.add_parser(
        "projects", help="manage projects (the task service's tenants) and their API keys"
    )
    project_commands = projects.add_subparsers(
        dest="projects_command", metavar="PROJECTS_COMMAND", required=True
    )
    create = project_commands.add_parser(
        "create", help="create a project and print its API key (once)"
    )
    create.add_argument("name")
    add_json_argument(create, 'print {"project": ..., "key": ...}')
    quota = project_commands.add_parser(
        "quota",
        help="set a project's quotas over the server's (RELAYGRAPH_PROJECT_*), or show them",
        description="Set the quotas of one project, kept in the ledger: every API server and "
        "worker applies them at once. A quota not named keeps its value; --reset first "
        "clears them all (the server's settings apply again). With no quota named, print them.",
    )
    quota.add_argument("name", type=utf8_text)
    quota.add_argument(
        "--max-running", type=positive, help="its tasks running at once (a whole number, 1 or more)"
    )
    quota.add_argument(
        "--max-queued", type=positive, help="its tasks queued; one more submission gets 429"
    )
    quota.add_argument(
        "--daily-cost-usd", type=usd, help="its spend per UTC day in USD (0 or more)"
    )
    quota.add_argument(
        "--reset", action="store_true", help="clear the project's quotas before setting any"
    )
    add_json_argument(quota, "print the quotas as one JSON object")

    teams = commands.add_parser(
        "teams", help="check team files (your own agents and tools) and register them"
    )
    team_commands = teams.add_subparsers(
        dest="teams_command", metavar="TEAMS_COMMAND", required=True
    )
    check = team_commands.add_parser(
        "check",
        help="validate a team file and print its agents, tools, handoffs and models",
        description="Build the team a file describes (tools imported, MCP servers started "
        "and listed) without calling any model, and print it.",
    )
    check.add_argument("file", type=Path, metavar="FILE")
    add_json_argument(check, "print the team as one JSON object")
    push = team_commands.add_parser(
        "push",
        help="register a team file with a task service, for your project's tasks",
        description="Send a team file to a task service (PUT /v1/teams/NAME) with your "
        "project's API key: the server checks it and keeps it as the next version, unless it "
        'is unchanged. Tasks then name it: {"team": NAME}.',
    )
    push.add_argument("file", type=Path, metavar="FILE")
    push.add_argument(
        "--name",
        type=team_name,
        help="the name tasks use (default: the file's name key, else its file name)",
    )
    push.add_argument(
        "--url",
        default=os.environ.get(SERVICE_URL_ENV, "http://127.0.0.1:8000"),
        help=f"the task service (default: ${SERVICE_URL_ENV} or http://127.0.0.1:8000)",
    )
    push.add_argument(
        "--key",
        default=os.environ.get(SERVICE_KEY_ENV),
        help=f"your project's API key (default: ${SERVICE_KEY_ENV})",
    )
    add_json_argument(push, "print the version as one JSON object")
    # Removed: a tenant is a project. Still parsed, whatever its arguments, so that the old
    # spelling is refused by name with what to use instead (_main.py), not as an unknown word.
    removed = team_commands.add_parser(
        "create", help="removed: use 'relaygraph projects create' (a tenant, not a team)"
    )
    removed.add_argument("old_arguments", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    gc = commands.add_parser(
        "gc",
        help="delete the workspaces (and artifacts) of tasks that ended long ago",
        description="Delete the workspaces of the tasks that ended more than --older-than "
        "days ago (default: RELAYGRAPH_RETENTION_DAYS), and with --artifacts their artifacts "
        "too; the ledger's records stay. Prints what it freed.",
    )
    gc.add_argument(
        "--older-than",
        type=days,
        metavar="DAYS",
        help="days since a task ended (default: RELAYGRAPH_RETENTION_DAYS)",
    )
    gc.add_argument("--artifacts", action="store_true", help="delete their artifacts too")
    add_json_argument(gc, "print what was freed as JSON")

    db = commands.add_parser("db", help="manage the ledger database")
    db_commands = db.add_subparsers(dest="db_command", metavar="DB_COMMAND", required=True)
    db_commands.add_parser("upgrade", help="apply the ledger's migrations")

    trace = commands.add_parser(
        "trace",
        help="print a task's timeline from the ledger",
        description="Each route and handoff with its reason, each agent visit with its start, "
        "duration, tokens and tools, each violation and budget hit.",
        epilog=f"With {SERVICE_URL_ENV} set to the task service's address (e.g. "
        "http://127.0.0.1:8000), the task's dashboard page is printed too (on stderr), "
        "for a task of a project of that service; the tasks of 'relaygraph run' belong to "
        "no project a key opens, and get no link.",
    )
    trace.add_argument("task_id", metavar="TASK_ID", type=utf8_text)
    add_json_argument(trace, "print the timeline as one JSON object")

    graph = commands.add_parser("graph", help="print the team graph's topology")
    graph.add_argument("--ascii", action="store_true", help="ASCII art instead of Mermaid")
    _add_team_argument(graph)
    add_policy_argument(graph, "draw the agents and handoffs of this policy")
    add_topology_arguments(graph)

    add_eval_parser(commands)
    add_doctor_parser(commands)

    kb = commands.add_parser("kb", help="manage the researcher's knowledge base")
    kb_commands = kb.add_subparsers(dest="kb_command", metavar="KB_COMMAND", required=True)
    kb_add = kb_commands.add_parser("add", help="index a folder of Markdown and text files")
    kb_add.add_argument("path", type=Path, help="folder to index")
    kb_search = kb_commands.add_parser("search", help="search the knowledge base")
    kb_search.add_argument("query", type=utf8_text)
    kb_search.add_argument("-k", type=int, default=5, help="how many results (default 5)")
    kb_commands.add_parser("list", help="list the indexed documents")
    return parser


def _add_team_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--team",
        metavar="FILE",
        type=Path,
        help="a team file (TOML): your own agents, tools and MCP servers (see docs/teams.md); "
        "default: the built-in researcher, coder and writer",
    )
