"""What each ``relaygraph`` command does, once :mod:`relaygraph.cli._parser` has read it.

Heavy modules (LangGraph, LangChain, the model clients, the API, the store) are imported
inside the commands, so that importing this module costs ``relaygraph --help`` nothing.
Each command takes the parsed arguments and returns the exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from relaygraph.cli._argtypes import topology_of
from relaygraph.cli._parser import SERVICE_KEY_ENV, SERVICE_URL_ENV
from relaygraph.cli._preflight import check_bind, check_ledger, data_directory, ledger_url
from relaygraph.cli._results import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    report_result,
)
from relaygraph.errors import ConfigError


def _team_arg(args: argparse.Namespace) -> Any:
    """The team ``--team`` names, or the built-in team."""
    from relaygraph.team import default_team, load_team

    return load_team(args.team) if args.team is not None else default_team()


def run(args: argparse.Namespace) -> int:
    """``relaygraph run``: run a task through the team, in this process.

    Ctrl-C or SIGTERM stops the task at its next step, ``cancelled``, and prints its result;
    a second one stops it at once, ``cancelled`` on the record all the same.
    """
    from relaygraph.cli._console import ProgressPrinter
    from relaygraph.runner import run_task

    agent_models = dict(args.agent_model)
    printer = ProgressPrinter()
    team = _team_arg(args)
    started: list[str] = []

    def on_event(event: Any) -> None:
        if event.get("type") == "run_started":
            started.append(event["task_id"])
        printer(event)

    cancel = threading.Event()
    try:
        with _stopping_on_signals(cancel):
            result = run_task(
                args.task,
                team=team,
                model=args.model,
                agent_models=agent_models,
                thread_id=args.thread,
                policy=args.policy,
                home=args.home,
                on_event=on_event,
                topology=topology_of(args, team.arrangement),
                cancel=cancel,
            )
    except KeyboardInterrupt:
        if not started:
            raise
        return _report_stopped(started[0], args)
    code = report_result(result, as_json=args.json)
    return EXIT_STOPPED if result.status == "cancelled" else code


EXIT_STOPPED = 130
"""The exit code of a ``relaygraph run`` stopped by Ctrl-C or SIGTERM (128 + SIGINT)."""


@contextlib.contextmanager
def _stopping_on_signals(cancel: threading.Event) -> Iterator[None]:
    """SIGINT and SIGTERM set ``cancel`` (the run stops at its next step); the second one
    raises ``KeyboardInterrupt`` (the run stops now). The handlers before are put back."""
    if threading.current_thread() is not threading.main_thread():
        yield  # Signal handlers belong to the main thread (relaygraph.cli.main in a thread).
        return

    def handle(signum: int, _frame: Any) -> None:
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()
        print(
            f"relaygraph: {signal.Signals(signum).name}: stopping at the next step "
            "(again to stop now)",
            file=sys.stderr,
        )

    before = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _report_stopped(task_id: str, args: argparse.Namespace) -> int:
    """The record of a task whose run was stopped at once: what the ledger says of it."""
    from relaygraph.store import LOCAL_PROJECT_ID, Ledger

    with Ledger(ledger_url(args.home)) as ledger:
        task = ledger.get_task(task_id, project_id=LOCAL_PROJECT_ID)
    if task is None:  # Not recorded yet: nothing ran.
        raise KeyboardInterrupt
    if args.json:
        sys.stdout.write(
            json.dumps(
                {
                    "task_id": task.id,
                    "thread_id": task.thread_id,
                    "status": task.status,
                    "stop_reason": task.stop_reason,
                },
                ensure_ascii=False,
            )
            + "\n"
        )
    else:
        print(f"status {task.status} · {task.stop_reason} · task {task.id}", file=sys.stderr)
    return EXIT_STOPPED


def resume(args: argparse.Namespace) -> int:
    """``relaygraph resume``: continue an interrupted task with a person's decision."""
    from relaygraph.cli._console import ProgressPrinter
    from relaygraph.runner import Decision, resume_task

    _refuse_api_task(args.task_id, ledger_url(args.home))
    if args.edit is not None:
        decision = Decision(decision="edit", args=args.edit, reason=args.reason)
    else:
        decision = Decision(decision="approve" if args.approve else "reject", reason=args.reason)
    result = resume_task(
        args.task_id, decision, home=args.home, on_event=ProgressPrinter(), team=args.team
    )
    return report_result(result, as_json=args.json)


def _refuse_api_task(task_id: str, url: str | None) -> None:
    """Refuse to resume a task of an API project: its project decides it, with its key.

    ``resume`` decides the tasks of ``relaygraph run`` only (the CLI's own project); the
    runner would answer that there is no such task, which ``trace`` contradicts.
    """
    from relaygraph.store import LOCAL_PROJECT_ID, Ledger

    with Ledger(url) as ledger:
        if not ledger.is_current():
            return  # The runner brings the schema up to date, and finds no task.
        owner = ledger.task_owner(task_id)
        if owner is None or owner == LOCAL_PROJECT_ID:
            return
        pending = [a.interrupt_id for a in ledger.approvals(task_id) if a.decision is None]
        project = ledger.project_by_id(owner)
    name = project.name if project is not None else None
    where = f"/v1/tasks/{task_id}/approvals/{pending[0] if len(pending) == 1 else 'APPROVAL_ID'}"
    raise ConfigError(
        f"task {task_id!r} belongs to project {name or owner!r} and is decided over the API "
        f"with that project's key: POST {where} (relaygraph resume decides the tasks of "
        "relaygraph run)"
    )


def serve(args: argparse.Namespace) -> int:
    """``relaygraph serve``: run the task service."""
    import uvicorn

    from relaygraph.api import create_app, load_settings, raise_open_file_limit
    from relaygraph.runner import event_loop_kind, settle_long_lived
    from relaygraph.store import database_pool_size

    loop = event_loop_kind()  # Checked before anything starts.
    database_pool_size()
    overrides: dict[str, Any] = {"home": args.home}
    if args.model:
        overrides["default_model"] = args.model
    if args.workers:
        overrides["workers"] = args.workers
    if args.processes:
        overrides["processes"] = args.processes
    if args.policy:
        overrides["policy_file"] = args.policy
    if args.scripts:
        overrides["scripts_dir"] = args.scripts
    if args.unsafe_sandbox:
        overrides["unsafe_sandbox"] = True
    if args.team_files:
        overrides["team_files"] = args.team_files
    if args.mcp_file:
        overrides["mcp_file"] = args.mcp_file
    settings = load_settings(**{k: v for k, v in overrides.items() if v is not None})
    # The server's own ledger and address are checked before it starts: uvicorn would
    # report either failure as a traceback and "Application startup failed", after the
    # line below had said it serves.
    check_ledger(settings.database_url or ledger_url(settings.home))
    check_bind(args.host, args.port)
    app = create_app(settings)
    _warn_without_isolation(unsafe=settings.unsafe_sandbox)
    # A process that lives to serve: what it holds now (the modules its runs use) is kept
    # out of the cyclic GC's full collections, which would otherwise stall every running
    # task for a fifth of a second every few seconds (see relaygraph.runner._long_lived).
    settle_long_lived()
    # Every event stream holds a connection: the soft limit of a shell (often 1,024 open
    # files) would let a few hundred streams starve the tasks of descriptors.
    raise_open_file_limit()
    print(
        f"relaygraph serving on http://{args.host}:{args.port} (dashboard at /ui, "
        "OpenAPI at /openapi.json)",
        file=sys.stderr,
    )
    # The HTTP server's loop is of the task loop's kind (uvloop where installed).
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", loop=loop)
    return EXIT_OK


def worker(args: argparse.Namespace) -> int:
    """``relaygraph worker``: run a Celery worker of the worker mode."""
    from celery.utils.nodenames import default_nodename, host_format

    from relaygraph.runner import event_loop_kind, load_runner_settings
    from relaygraph.store import DATABASE_URL_ENV, database_pool_size
    from relaygraph.worker import (
        check_broker,
        create_celery_app,
        default_node_name,
        prepare_worker,
        start_worker,
        worker_argv,
    )

    # Read where its tasks are begun, not on the command line: checked before anything starts.
    event_loop_kind()
    database_pool_size()

    if args.home is not None:
        # The worker's processes read their settings from the environment.
        os.environ["RELAYGRAPH_HOME"] = str(args.home)
    overrides: dict[str, Any] = {}
    if args.concurrency:
        overrides["concurrency"] = args.concurrency
    if args.tasks_in_flight:
        overrides["tasks_in_flight"] = args.tasks_in_flight
    if args.queues is not None:
        overrides["queues"] = [name.strip() for name in args.queues.split(",") if name.strip()]
    if os.environ.get(DATABASE_URL_ENV):  # Unset: prepare_worker says the worker needs it.
        check_ledger(None)
    settings = prepare_worker(**overrides)
    _warn_without_isolation(unsafe=load_runner_settings().unsafe_sandbox)
    app = create_celery_app(settings)
    # Celery's own spelling of a node name: `name` alone is `name@<host>`, `%h` the host.
    node_name = host_format(default_nodename(args.hostname or default_node_name()))
    check_broker(app, node_name)
    argv = worker_argv(settings, hostname=node_name)
    start_worker(app, [*argv, "--task-events"] if args.events else argv)
    return EXIT_OK


def _warn_without_isolation(*, unsafe: bool) -> None:
    """Say at start, not at a tenant's first refused call, that this host cannot isolate
    tenants' code: ``run_python`` will be refused (or, with ``--unsafe-sandbox``, run
    unisolated)."""
    from relaygraph.backends.sandbox import filesystem_isolation

    if filesystem_isolation() is not None:
        return
    if unsafe:
        print(
            "relaygraph: warning: no filesystem isolation (bubblewrap) on this host, and "
            "--unsafe-sandbox: tenants' run_python code runs with this server's files in reach",
            file=sys.stderr,
        )
    else:
        print(
            "relaygraph: warning: no filesystem isolation (bubblewrap) on this host: tasks' "
            "run_python calls will be refused (install the 'bubblewrap' package; see "
            "docs/sandbox.md)",
            file=sys.stderr,
        )


def create_project(args: argparse.Namespace) -> int:
    """``relaygraph projects create NAME [--json]``."""
    from relaygraph.store import Ledger

    with Ledger(ledger_url(args.home)) as ledger:
        ledger.upgrade()
        project, secret = ledger.create_project(args.name)
    if args.json:
        print(json.dumps({"project": project.name, "key": secret}))
    else:
        print(f"project {project.name} created. Its API key (shown once, keep it safe):\n{secret}")
    return EXIT_OK


def project_quota(args: argparse.Namespace) -> int:
    """``relaygraph projects quota NAME [--max-running N] [--max-queued N]
    [--daily-cost-usd X] [--reset]``: set a project's own quotas in the ledger; print them."""
    from dataclasses import asdict, replace

    from relaygraph.store import Ledger, QuotaOverrides

    given = {
        name: value
        for name in ("max_running", "max_queued", "daily_cost_usd")
        if (value := getattr(args, name)) is not None
    }
    with Ledger(ledger_url(args.home)) as ledger:
        ledger.upgrade()
        project = ledger.get_project(args.name)
        if project is None:
            raise ConfigError(f"no project named {args.name!r} (relaygraph projects create)")
        quotas = QuotaOverrides() if args.reset else ledger.project_quotas(project.id)
        if given or args.reset:
            quotas = ledger.set_project_quotas(project.name, replace(quotas, **given))
    shown = asdict(quotas)
    if args.json:
        print(json.dumps({"project": project.name, "quotas": shown}))
    else:
        told = ", ".join(
            f"{name} {'(the server setting)' if value is None else value}"
            for name, value in shown.items()
        )
        print(f"project {project.name}: {told}")
    return EXIT_OK


def push_team(args: argparse.Namespace) -> int:
    """``relaygraph teams push``: register a team file with a task service."""
    import tomllib

    import httpx

    from relaygraph.cli._argtypes import team_name
    from relaygraph.client import ApiError, Client

    if not args.key:
        raise ConfigError(f"teams push needs your project's API key: --key or ${SERVICE_KEY_ENV}")
    if not args.key.isascii() or not args.key.isprintable():
        raise ConfigError(f"--key / ${SERVICE_KEY_ENV}: an API key is printable ASCII")
    service = _service_url(args.url)
    try:
        text = args.file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"team file {str(args.file)!r} cannot be read: {exc}") from None
    try:
        named = tomllib.loads(text).get("name")
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"team file {str(args.file)!r} is not valid TOML: {exc}") from None
    name = args.name or (named if isinstance(named, str) else None) or args.file.stem
    if not args.name:  # --name was checked as it was read.
        try:
            team_name(name)
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(
                f"{exc} (from {str(args.file)!r}; give another with --name)"
            ) from None
    with Client(service, args.key) as client:
        try:
            version = client.push_team(name, toml=text)
        except ApiError as exc:
            print(f"relaygraph: error: {args.file}: {exc}", file=sys.stderr)
            return EXIT_USAGE if exc.status == 422 else EXIT_FAILED
        except httpx.TransportError as exc:
            raise ConfigError(f"cannot reach the task service at {service}: {exc}") from None
        except ValueError:  # A body that is not JSON: whatever answered is no task service.
            raise ConfigError(
                f"the answer from {service} is not the task service's (not JSON): is "
                f"--url / ${SERVICE_URL_ENV} its address?"
            ) from None
    if args.json:
        sys.stdout.write(json.dumps(version, ensure_ascii=False) + "\n")
    else:
        what = "registered" if version.get("created") else "unchanged, still"
        print(
            f"team {version['name']} {what} version {version['version']} ({version['digest']}): "
            f"agents {', '.join(version['agents'])}"
        )
    return EXIT_OK


def _service_url(url: str) -> str:
    """``--url`` (or ``$RELAYGRAPH_URL``) when it is an http(s) address with a host.

    Raises:
        ConfigError: Anything else, naming it.
    """
    import httpx

    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigError(
            f"--url / ${SERVICE_URL_ENV} {url!r} is not the task service's address: expected "
            "http://HOST:PORT or https://HOST"
        )
    return url


def check_team(args: argparse.Namespace) -> int:
    """``relaygraph teams check``: build a team file's team and print it."""
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
            removed = "  [removed by the policy]" if tool["removed_by_policy"] else ""
            print(
                f"    tool {tool['name']}({_arguments(tool['args'])})  ({tool['origin']}){removed}"
            )
        print(f"    hands off to: {', '.join(agent['handoffs']) or 'nobody'}")
    return EXIT_OK


def _arguments(schema: dict[str, Any]) -> str:
    """``text: string, k?: integer``: a tool's arguments from their JSON schema, the
    optional ones marked ``?``."""
    required = set(schema.get("required", ()))
    return ", ".join(
        f"{name}{'' if name in required else '?'}: {_json_type(prop)}"
        for name, prop in schema.get("properties", {}).items()
    )


def _json_type(prop: dict[str, Any]) -> str:
    if "type" in prop:
        kind = prop["type"]
        if kind == "array" and isinstance(prop.get("items"), dict) and prop["items"]:
            return f"array of {_json_type(prop['items'])}"
        return kind if isinstance(kind, str) else " | ".join(kind)
    if "anyOf" in prop:
        return " | ".join(_json_type(p) for p in prop["anyOf"])
    if "$ref" in prop:
        return str(prop["$ref"]).rsplit("/", 1)[-1]
    if "enum" in prop:
        return " | ".join(map(repr, prop["enum"]))
    return "any"


def upgrade_db(args: argparse.Namespace) -> int:
    """``relaygraph db upgrade``: apply the ledger's migrations."""
    from relaygraph.store import upgrade

    print(f"ledger at {upgrade(ledger_url(args.home))} is up to date")
    return EXIT_OK


def collect_garbage(args: argparse.Namespace) -> int:
    """``relaygraph gc``: delete the files of tasks that ended long ago; print what was freed."""
    from relaygraph.runner import collect_garbage, load_runner_settings
    from relaygraph.store import Ledger

    settings = load_runner_settings()
    older_than = args.older_than or settings.retention_days
    if older_than is None:
        raise ConfigError(
            "relaygraph gc needs --older-than DAYS (or RELAYGRAPH_RETENTION_DAYS): how long "
            "after its end a task's files are kept"
        )
    artifacts = args.artifacts or settings.retention_artifacts
    with Ledger(ledger_url(args.home)) as ledger:
        if not ledger.is_current():
            ledger.upgrade()
        freed = collect_garbage(
            ledger, data_directory(args.home), older_than_days=older_than, artifacts=artifacts
        )
    if args.json:
        sys.stdout.write(json.dumps(freed.to_json()) + "\n")
    else:
        what = "workspaces and artifacts" if artifacts else "workspaces"
        print(
            f"freed {freed.bytes:,} bytes in {freed.files:,} files: the {what} of "
            f"{freed.tasks} task(s) that ended over {older_than:g} days ago"
        )
    return EXIT_OK


def trace(args: argparse.Namespace) -> int:
    """``relaygraph trace``: print a task's timeline from the ledger."""
    from rich.console import Console

    from relaygraph.store import LOCAL_PROJECT_ID, Ledger
    from relaygraph.tracing import build_timeline, render_timeline

    with Ledger(ledger_url(args.home)) as ledger:
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


def graph(args: argparse.Namespace) -> int:
    """``relaygraph graph``: print the team graph's topology."""
    from relaygraph.supervisor import draw_team

    team = _team_arg(args)
    policy = team.policy_from(args.policy) if args.policy is not None else team.resolved_policy
    topology = topology_of(args, team.arrangement)
    print(draw_team(team=team, ascii=args.ascii, policy=policy, topology=topology))
    return EXIT_OK


def manage_kb(args: argparse.Namespace) -> int:
    """``relaygraph kb``: add to, search or list the knowledge base."""
    from relaygraph.backends.kb import KnowledgeBase, ensure_sample_corpus

    with KnowledgeBase(data_directory(args.home) / "kb.sqlite") as kb:
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
