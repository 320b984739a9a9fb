"""The ``relaygraph`` command line.

Heavy modules (LangGraph, LangChain, the model clients) are imported inside the commands, so
``relaygraph --help`` and argument errors answer at once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from relaygraph import __version__
from relaygraph.cli._argtypes import add_topology_arguments, agent_model, positive, topology_of
from relaygraph.cli._evals import add_eval_parser, run_eval_command
from relaygraph.errors import ConfigError, RelaygraphError
from relaygraph.models import add_doctor_parser, run_doctor

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 3
SERVICE_URL_ENV = "RELAYGRAPH_URL"
SERVICE_KEY_ENV = "RELAYGRAPH_API_KEY"

LOCAL_MODEL_NOTE = (
    "This ran on the embedded model local:smollm2 (SmolLM2-135M, on this machine): it "
    "answers from the documents it finds, by constrained choices, and reasons little. For "
    "open-ended work use --model openai:gpt-4o-mini with OPENAI_API_KEY "
    "set, or OPENAI_BASE_URL pointing at any Chat Completions server (vLLM, Ollama, LiteLLM)."
)


def _port(value: str) -> int:
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise argparse.ArgumentTypeError(f"expected a port between 1 and 65535, got {value!r}")
    return int(value)


def _json_object(value: str) -> dict[str, Any]:
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc.msg}): {value!r}") from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object of arguments, got {value!r}")
    return parsed


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="relaygraph",
        description="A supervised team of agents (researcher, coder, writer) on LangGraph.",
    )
    parser.add_argument("--version", action="version", version=f"relaygraph {__version__}")
    parser.add_argument(
        "--home",
        type=Path,
        help="data directory (default: $RELAYGRAPH_HOME or ~/.relaygraph)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = commands.add_parser(
        "run",
        help="run a task through the team",
        description="Run a task: the supervisor routes it to the agents, who may hand work "
        "to each other; progress goes to stderr, the answer to stdout.",
    )
    run.add_argument("task", help="what the team should do")
    run.add_argument(
        "--model",
        metavar="SPEC",
        help="model for every role: openai:MODEL, scripted:PATH or local:smollm2 "
        "(default: local:smollm2, the embedded model)",
    )
    run.add_argument(
        "--agent-model",
        metavar="AGENT=SPEC",
        type=agent_model,
        action="append",
        default=[],
        help="model for one role (researcher, coder, writer, supervisor, finalize, as the "
        "topology has them); repeatable",
    )
    _add_team_argument(run)
    run.add_argument("--thread", metavar="ID", help="continue the conversation of this thread")
    run.add_argument(
        "--policy",
        metavar="FILE",
        type=Path,
        help="policy TOML: tools, handoffs, budgets, approvals (see docs/policies.md)",
    )
    add_topology_arguments(run)
    run.add_argument(
        "--json", action="store_true", help="print one JSON object on stdout and nothing else"
    )

    resume = commands.add_parser(
        "resume",
        help="continue a task that waits for a person's decision",
        description="Continue an interrupted task from its checkpoint, in this process, with "
        "a decision on what it waits for (a tool needing approval, or a ping-pong).",
    )
    resume.add_argument("task_id", metavar="TASK_ID")
    decision = resume.add_mutually_exclusive_group(required=True)
    decision.add_argument("--approve", action="store_true", help="run the tool as requested")
    decision.add_argument("--reject", action="store_true", help="refuse it; the model is told")
    decision.add_argument(
        "--edit",
        metavar="ARGS_JSON",
        type=_json_object,
        help="run the tool with these arguments instead (a JSON object)",
    )
    resume.add_argument("--reason", metavar="TEXT", help="why; shown to the model on --reject")
    resume.add_argument(
        "--team",
        metavar="FILE",
        type=Path,
        help="the task's team file, when the task does not record where it is",
    )
    resume.add_argument(
        "--json", action="store_true", help="print one JSON object on stdout and nothing else"
    )

    serve = commands.add_parser(
        "serve",
        help="run the task service (HTTP API under /v1)",
        description="Serve the task API. Migrations run at start; tasks that were queued or "
        "running when the server stopped are picked up again.",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=_port, default=8000, help="port (default 8000)")
    serve.add_argument(
        "--model",
        metavar="SPEC",
        help="default model for tasks that name none (default local:smollm2)",
    )
    serve.add_argument(
        "--workers", type=positive, metavar="N", help="tasks that run at once (default 2)"
    )
    serve.add_argument(
        "--policy", metavar="FILE", type=Path, help="the built-in team's base policy"
    )
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
        "PostgreSQL (RELAYGRAPH_DATABASE_URL), one task per process at a time. See "
        "docs/deploy.md.",
    )
    worker.add_argument(
        "--concurrency",
        type=positive,
        metavar="N",
        help="tasks run at once, one process each (default $RELAYGRAPH_CONCURRENCY or 2)",
    )
    worker.add_argument(
        "--queues",
        metavar="Q[,Q]",
        help="queues to consume, comma-separated (default $RELAYGRAPH_QUEUES or relaygraph)",
    )
    worker.add_argument(
        "--hostname",
        metavar="H",
        help="the worker's node name (name@host); two workers on one host need different ones",
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
    create.add_argument("--json", action="store_true", help='print {"project": ..., "key": ...}')

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
    check.add_argument("--json", action="store_true", help="print the team as one JSON object")
    push = team_commands.add_parser(
        "push",
        help="register a team file with a task service, for your project's tasks",
        description="Send a team file to a task service (PUT /v1/teams/NAME) with your "
        "project's API key: the server checks it and keeps it as the next version, unless it "
        'is unchanged. Tasks then name it: {"team": NAME}.',
    )
    push.add_argument("file", type=Path, metavar="FILE")
    push.add_argument(
        "--name", help="the name tasks use (default: the file's name key, else its file name)"
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
    push.add_argument("--json", action="store_true", help="print the version as one JSON object")
    old_create = team_commands.add_parser(
        "create", help="deprecated: use 'relaygraph projects create' (a tenant, not a team)"
    )
    old_create.add_argument("name")
    old_create.add_argument("--json", action="store_true", help='print {"team": ..., "key": ...}')

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
    trace.add_argument("task_id", metavar="TASK_ID")
    trace.add_argument("--json", action="store_true", help="print the timeline as one JSON object")

    graph = commands.add_parser("graph", help="print the team graph's topology")
    graph.add_argument("--ascii", action="store_true", help="ASCII art instead of Mermaid")
    _add_team_argument(graph)
    graph.add_argument(
        "--policy", metavar="FILE", type=Path, help="draw the agents and handoffs of this policy"
    )
    add_topology_arguments(graph)

    add_eval_parser(commands)
    add_doctor_parser(commands)

    kb = commands.add_parser("kb", help="manage the researcher's knowledge base")
    kb_commands = kb.add_subparsers(dest="kb_command", metavar="KB_COMMAND", required=True)
    kb_add = kb_commands.add_parser("add", help="index a folder of Markdown and text files")
    kb_add.add_argument("path", type=Path, help="folder to index")
    kb_search = kb_commands.add_parser("search", help="search the knowledge base")
    kb_search.add_argument("query")
    kb_search.add_argument("-k", type=int, default=5, help="how many results (default 5)")
    kb_commands.add_parser("list", help="list the indexed documents")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``relaygraph`` script; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "resume":
            return _resume(args)
        if args.command == "graph":
            return _graph(args)
        if args.command == "trace":
            return _trace(args)
        if args.command == "eval":
            return run_eval_command(args)
        if args.command == "doctor":
            return run_doctor(args)
        if args.command == "serve":
            return _serve(args)
        if args.command == "worker":
            return _worker(args)
        if args.command == "projects":
            return _create_project(args, key="project")
        if args.command == "teams":
            if args.teams_command == "create":
                print(
                    "relaygraph: 'teams create' is deprecated and goes in the next release: "
                    "tenants are now projects, use 'relaygraph projects create'",
                    file=sys.stderr,
                )
                return _create_project(args, key="team")
            if args.teams_command == "push":
                return _push_team(args)
            return _check_team(args)
        if args.command == "db":
            return _db(args)
        return _kb(args)
    except ConfigError as exc:
        print(f"relaygraph: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RelaygraphError as exc:
        print(f"relaygraph: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("relaygraph: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`relaygraph graph | head`): no traceback, and none again
        # when Python flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _add_team_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--team",
        metavar="FILE",
        type=Path,
        help="a team file (TOML): your own agents, tools and MCP servers (see docs/teams.md); "
        "default: the built-in researcher, coder and writer",
    )


def _team_arg(args: argparse.Namespace) -> Any:
    """The team ``--team`` names, or the built-in team."""
    from relaygraph.team import default_team, load_team

    return load_team(args.team) if args.team is not None else default_team()


def _run(args: argparse.Namespace) -> int:
    from relaygraph.cli._console import ProgressPrinter
    from relaygraph.runner import run_task

    agent_models = dict(args.agent_model)
    printer = ProgressPrinter()
    team = _team_arg(args)
    result = run_task(
        args.task,
        team=team,
        model=args.model,
        agent_models=agent_models,
        thread_id=args.thread,
        policy=args.policy,
        home=args.home,
        on_event=printer,
        topology=topology_of(args, team.arrangement),
    )
    return _report(result, as_json=args.json)


def _resume(args: argparse.Namespace) -> int:
    from relaygraph.cli._console import ProgressPrinter
    from relaygraph.runner import Decision, resume_task

    if args.edit is not None:
        decision = Decision(decision="edit", args=args.edit, reason=args.reason)
    else:
        decision = Decision(decision="approve" if args.approve else "reject", reason=args.reason)
    result = resume_task(
        args.task_id, decision, home=args.home, on_event=ProgressPrinter(), team=args.team
    )
    return _report(result, as_json=args.json)


def _report(result: Any, *, as_json: bool) -> int:
    from relaygraph.cli._console import print_result

    if as_json:
        sys.stdout.write(json.dumps(result.to_json(), ensure_ascii=False) + "\n")
    else:
        print_result(result)
    if any(spec.startswith("local:") for spec in result.models.values()):
        print(LOCAL_MODEL_NOTE, file=sys.stderr)
    if result.status == "interrupted":
        return EXIT_INTERRUPTED
    return EXIT_OK if result.ok else EXIT_FAILED


def _ledger_url(home: Path | None) -> str | None:
    import os

    from relaygraph._home import data_home
    from relaygraph.store import DATABASE_URL_ENV

    if os.environ.get(DATABASE_URL_ENV):
        return None
    return f"sqlite:///{data_home(home) / 'ledger.sqlite'}"


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from relaygraph.api import create_app, load_settings

    overrides: dict[str, Any] = {"home": args.home}
    if args.model:
        overrides["default_model"] = args.model
    if args.workers:
        overrides["workers"] = args.workers
    if args.policy:
        overrides["policy_file"] = args.policy
    if args.scripts:
        overrides["scripts_dir"] = args.scripts
    if args.unsafe_sandbox:
        overrides["unsafe_sandbox"] = True
    if args.team_files:
        overrides["team_files"] = args.team_files
    settings = load_settings(**{k: v for k, v in overrides.items() if v is not None})
    app = create_app(settings)
    print(
        f"relaygraph serving on http://{args.host}:{args.port} (dashboard at /ui, "
        "OpenAPI at /openapi.json)",
        file=sys.stderr,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return EXIT_OK


def _worker(args: argparse.Namespace) -> int:
    from relaygraph.worker import create_celery_app, prepare_worker, worker_argv

    if args.home is not None:
        # The worker's processes read their settings from the environment.
        os.environ["RELAYGRAPH_HOME"] = str(args.home)
    overrides: dict[str, Any] = {}
    if args.concurrency:
        overrides["concurrency"] = args.concurrency
    if args.queues is not None:
        overrides["queues"] = [name.strip() for name in args.queues.split(",") if name.strip()]
    settings = prepare_worker(**overrides)
    app = create_celery_app(settings)
    argv = worker_argv(settings, hostname=args.hostname)
    app.worker_main([*argv, "--task-events"] if args.events else argv)
    return EXIT_OK


def _create_project(args: argparse.Namespace, *, key: str) -> int:
    from relaygraph.store import Ledger

    with Ledger(_ledger_url(args.home)) as ledger:
        ledger.upgrade()
        project, secret = ledger.create_project(args.name)
    if args.json:
        print(json.dumps({key: project.name, "key": secret}))
    else:
        print(f"project {project.name} created. Its API key (shown once, keep it safe):\n{secret}")
    return EXIT_OK


def _push_team(args: argparse.Namespace) -> int:
    import tomllib

    from relaygraph.client import ApiError, Client

    if not args.key:
        raise ConfigError(f"teams push needs your project's API key: --key or ${SERVICE_KEY_ENV}")
    try:
        text = args.file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"team file {str(args.file)!r} cannot be read: {exc}") from None
    try:
        named = tomllib.loads(text).get("name")
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"team file {str(args.file)!r} is not valid TOML: {exc}") from None
    name = args.name or (named if isinstance(named, str) else None) or args.file.stem
    with Client(args.url, args.key) as client:
        try:
            version = client.push_team(name, toml=text)
        except ApiError as exc:
            print(f"relaygraph: error: {args.file}: {exc}", file=sys.stderr)
            return EXIT_USAGE if exc.status == 422 else EXIT_FAILED
    if args.json:
        sys.stdout.write(json.dumps(version, ensure_ascii=False) + "\n")
    else:
        what = "registered" if version.get("created") else "unchanged, still"
        print(
            f"team {version['name']} {what} version {version['version']} ({version['digest']}): "
            f"agents {', '.join(version['agents'])}"
        )
    return EXIT_OK


def _check_team(args: argparse.Namespace) -> int:
    from relaygraph.team import load_team

    team = load_team(args.file)
    described = team.describe()
    if args.json:
        sys.stdout.write(json.dumps(described, ensure_ascii=False) + "\n")
        return EXIT_OK
    print(f"team {described['name']} ({described['digest']})")
    if described["description"]:
        print(f"  {described['description']}")
    print(f"  topology: {described['topology']['kind']}; policy: {described['policy_source']}")
    for agent in described["agents"]:
        print(f"- {agent['name']}: {agent['description']}")
        print(f"    model: {agent['model']}")
        for tool in agent["tools"]:
            print(f"    tool {tool['name']}  ({tool['origin']})")
        print(f"    hands off to: {', '.join(agent['handoffs']) or 'nobody'}")
    return EXIT_OK


def _db(args: argparse.Namespace) -> int:
    from relaygraph.store import upgrade

    print(f"ledger at {upgrade(_ledger_url(args.home))} is up to date")
    return EXIT_OK


def _trace(args: argparse.Namespace) -> int:
    from rich.console import Console

    from relaygraph.store import LOCAL_PROJECT_ID, Ledger
    from relaygraph.tracing import build_timeline, render_timeline

    with Ledger(_ledger_url(args.home)) as ledger:
        if not ledger.is_current():
            ledger.upgrade()
        # The operator reads every project's tasks: the API's as well as the CLI's own.
        project_id = ledger.task_owner(args.task_id) or LOCAL_PROJECT_ID
        timeline = build_timeline(ledger, args.task_id, project_id=project_id)
    if args.json:
        sys.stdout.write(json.dumps(timeline, ensure_ascii=False) + "\n")
    else:
        Console(highlight=False).print(render_timeline(timeline))
        service = os.environ.get(SERVICE_URL_ENV)
        # A link that works in chat and alerts: the dashboard's page of the task. A task of
        # the CLI's own project has none, as no API key signs in to that project.
        if service and project_id != LOCAL_PROJECT_ID:
            print(f"dashboard: {service.rstrip('/')}/ui/tasks/{args.task_id}", file=sys.stderr)
    return EXIT_OK


def _graph(args: argparse.Namespace) -> int:
    from relaygraph.supervisor import draw_team

    team = _team_arg(args)
    policy = team.policy_from(args.policy) if args.policy is not None else team.resolved_policy
    topology = topology_of(args, team.arrangement)
    print(draw_team(team=team, ascii=args.ascii, policy=policy, topology=topology))
    return EXIT_OK


def _kb(args: argparse.Namespace) -> int:
    from relaygraph._home import data_home
    from relaygraph.backends.kb import KnowledgeBase, ensure_sample_corpus

    with KnowledgeBase(data_home(args.home) / "kb.sqlite") as kb:
        ensure_sample_corpus(kb)
        return _kb_command(args, kb)


def _kb_command(args: argparse.Namespace, kb: Any) -> int:
    if args.kb_command == "add":
        if not args.path.is_dir():
            raise ConfigError(f"kb add: {str(args.path)!r} is not a folder")
        report: Any = kb.add_folder(args.path)
        print(f"indexed {args.path}: {report.summary()}")
        for path, reason in report.skipped:
            print(f"  skipped {path}: {reason}", file=sys.stderr)
    elif args.kb_command == "search":
        for hit in kb.search(args.query, k=args.k):
            print(f"[{hit.doc_id}] {hit.title}\n    {hit.snippet}")
    else:
        for doc_id, title in kb.list_documents():
            print(f"{doc_id}\t{title}")
    return EXIT_OK
