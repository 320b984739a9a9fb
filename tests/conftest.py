"""Shared fixtures: an isolated data directory and no way to reach a real model by accident;
the services a test needs (PostgreSQL, RabbitMQ, bubblewrap or its fallback); the task
service in process (``api``, the dashboard's ``dash`` and ``priced``) and as a process
(``start_server``)."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from sqlalchemy import create_engine

from ._service import ServiceClient, free_port, in_process_service

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_RELAY = REPO / "examples" / "scripts" / "relay.json"
POSTGRES_URLS = (
    "postgresql+psycopg://root@127.0.0.1:5432/test",
    "postgresql+psycopg://postgres@127.0.0.1:5432/test",
)
POSTGRES_URL_ENV = "RELAYGRAPH_TEST_POSTGRES_URL"
REQUIRE_POSTGRES_ENV = "RELAYGRAPH_REQUIRE_POSTGRES"
REQUIRE_RABBITMQ_ENV = "RELAYGRAPH_REQUIRE_RABBITMQ"


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Every test gets its own data directory, no API key, and a dead OpenAI endpoint.

    A test that reaches for a real model by mistake fails with a connection error instead
    of spending money or waiting on the network.
    """
    home = tmp_path / "home"
    monkeypatch.setenv("RELAYGRAPH_HOME", str(home))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("LANGSMITH_TRACING", "false")
    monkeypatch.delenv("LANGCHAIN_TRACING_V2", raising=False)
    return home


@pytest.fixture
def home(_offline: Path) -> Path:
    return _offline


# Tenant code on a host without bubblewrap (a fresh machine).

UNSAFE_SANDBOX_ENV = "RELAYGRAPH_UNSAFE_SANDBOX"


def isolation_missing() -> bool:
    """Whether this host offers sandboxed code no filesystem isolation (no usable
    bubblewrap, or ``RELAYGRAPH_BWRAP=""``): ``serve`` and ``worker`` then refuse
    ``run_python`` unless told ``--unsafe-sandbox``."""
    from relaygraph.backends.sandbox import filesystem_isolation

    return filesystem_isolation() is None


def unsafe_sandbox_env() -> dict[str, str]:
    """The environment of a ``serve`` or ``worker`` process that a test starts to run
    ``run_python`` for what the service does around it (approvals, cancel, restarts,
    queueing), not for its isolation.

    Where bubblewrap works it is empty: the program runs isolated, as in production. Where it
    does not (a fresh machine, ``./scripts/test`` word for word), the documented
    ``--unsafe-sandbox`` lets the program run. The isolation itself is attacked by
    tests/test_sandbox_isolation.py, which needs bubblewrap and skips without it, and CI
    (``.ci/run``) installs bubblewrap and runs the affected tests once more without it
    (tests/test_fresh_machine.py).
    """
    return {UNSAFE_SANDBOX_ENV: "true"} if isolation_missing() else {}


@pytest.fixture(params=["bubblewrap", "none"])
def isolation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test inside bubblewrap, then again in the fallback without it."""
    if request.param == "none":
        monkeypatch.setenv("RELAYGRAPH_BWRAP", "")
    elif isolation_missing():
        pytest.skip("bubblewrap (bwrap) is missing or cannot create namespaces here")
    return str(request.param)


@pytest.fixture
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Model retries back off briefly and reach the local fake server with no proxy between
    (``openai_server.quick_retries``)."""
    from .openai_server import quick_retries

    quick_retries(monkeypatch)


@pytest.fixture
def scripts(tmp_path: Path) -> Path:
    """The server's scripts folder (``serve --scripts``), holding the example relay script as
    ``relay.json``."""
    folder = tmp_path / "scripts"
    folder.mkdir()
    shutil.copy(EXAMPLE_RELAY, folder / "relay.json")
    return folder


@pytest.fixture
def served_script(scripts: Path) -> Callable[[dict[str, Any]], str]:
    """Write a script into the server's scripts folder; returns the spec a request names
    (``scripted:`` and the file's name: a server opens only files of its folder)."""
    counter = iter(range(1000))

    def write(turns: dict[str, Any]) -> str:
        name = f"script-{next(counter)}.json"
        (scripts / name).write_text(json.dumps(turns), encoding="utf-8")
        return f"scripted:{name}"

    return write


@pytest.fixture
def script(tmp_path: Path) -> Callable[[dict[str, Any]], str]:
    """Write a scripted-model file and return its model spec."""
    counter = iter(range(1000))

    def write(turns: dict[str, Any]) -> str:
        path = tmp_path / f"script-{next(counter)}.json"
        path.write_text(json.dumps(turns), encoding="utf-8")
        return f"scripted:{path}"

    return write


# PostgreSQL and RabbitMQ: CI requires them (RELAYGRAPH_REQUIRE_POSTGRES=1,
# RELAYGRAPH_REQUIRE_RABBITMQ=1); elsewhere a test that needs one is skipped without it.


def require(problem: str, env: str) -> NoReturn:
    """Skip the test for ``problem`` (a service it needs is missing), or fail it where the
    environment variable ``env`` is ``1`` (CI, where the service must be there)."""
    if os.environ.get(env) == "1":
        pytest.fail(f"{problem} (and {env}=1 requires it)", pytrace=False)
    pytest.skip(f"{problem}; set {env}=1 to make this a failure")


@pytest.fixture(scope="session")
def postgres_server() -> str:
    """A URL of the PostgreSQL server that answers (``$RELAYGRAPH_TEST_POSTGRES_URL`` first)."""
    from .worker_cluster import postgres_server as reachable_postgres

    url, problem = reachable_postgres()
    if url is None:
        require(problem, REQUIRE_POSTGRES_ENV)
    return url


@pytest.fixture(scope="session")
def rabbitmq() -> str:
    """The URL of the RabbitMQ that answers (``$RELAYGRAPH_TEST_BROKER_URL`` first)."""
    from .worker_cluster import broker_problem, broker_url

    url = broker_url()
    problem = broker_problem(url)
    if problem is not None:
        require(problem, REQUIRE_RABBITMQ_ENV)
    return url


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """A URL whose connections work in a new, empty schema of their own."""
    schema = f"rg_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(postgres_server, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    try:
        # psycopg passes ``options`` to the server: every session starts in the schema.
        yield f"{postgres_server}?options=-csearch_path%3D{schema}"
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A ledger URL: once a fresh SQLite file, once a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def ledger(url: str) -> Iterator[Any]:
    """An upgraded ledger at ``url``, on each backend."""
    from relaygraph.store import Ledger

    with Ledger(url) as ledger:
        ledger.upgrade()
        yield ledger


@pytest.fixture
def sqlite_ledger(tmp_path: Path) -> Iterator[Any]:
    """An upgraded ledger in a fresh SQLite file."""
    from relaygraph.store import Ledger

    with Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}") as ledger:
        ledger.upgrade()
        yield ledger


@pytest.fixture
def postgres_ledger(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """An upgraded ledger on PostgreSQL, whose database the runs' checkpointers use too
    (``RELAYGRAPH_DATABASE_URL``); their code runs unisolated where bubblewrap is missing."""
    from relaygraph.store import DATABASE_URL_ENV, Ledger

    monkeypatch.setenv(DATABASE_URL_ENV, postgres_url)
    monkeypatch.setenv(UNSAFE_SANDBOX_ENV, "true")
    with Ledger(postgres_url) as made:
        made.upgrade()
        yield made


SCRIPT_ROLES = ("supervisor", "researcher", "coder", "writer", "finalize")
"""The roles of a script that :func:`over_http` plays, each on a model of its own."""


@pytest.fixture
def over_http(monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[Any, list[dict[str, Any]]]]:
    """Run a script through ``ChatOpenAI`` against the local server; the result and every
    request body the team sent."""
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")

    def run(script: dict[str, Any], **kwargs: Any) -> tuple[Any, list[dict[str, Any]]]:
        from .openai_server import serve_script

        with serve_script(script) as server:
            monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
            from relaygraph.runner import run_task

            result = run_task(
                "When are checkpoints written? Write a short report.",
                agent_models={role: f"openai:script-{role}" for role in SCRIPT_ROLES},
                **kwargs,
            )
            return result, list(server.requests)

    return run


@pytest.fixture
def kb(tmp_path: Path) -> Iterator[Any]:
    """An empty knowledge base of its own (``tests/test_kb*.py``)."""
    from relaygraph.backends.kb import KnowledgeBase

    with KnowledgeBase(tmp_path / "db" / "kb.sqlite") as knowledge_base:
        yield knowledge_base


@pytest.fixture
async def api(home: Path, scripts: Path) -> AsyncIterator[ServiceClient]:
    """The task service in process (``httpx.ASGITransport``) as a :class:`ServiceClient`,
    on this test's home and scripts folder, waiting for a task until it ends or pauses."""
    # The operator's own default (the example relay) may be a script anywhere; requests
    # name only scripts of the scripts folder, by file name. These tests follow approvals
    # and cancels of the coder's program, not its isolation: where bubblewrap is missing it
    # runs unisolated (a fresh machine).
    async with in_process_service(
        home,
        scripts_dir=scripts,
        workers=2,
        max_body_bytes=4096,
        unsafe_sandbox=isolation_missing(),
    ) as service:
        yield service


# The audit dashboard in process (tests/test_dashboard.py's ``Dash``).


@pytest.fixture
async def dash(home: Path, scripts: Path) -> AsyncIterator[Any]:
    """The task service with its dashboard, started on this test's home and scripts."""
    from .test_dashboard import running

    async with running(home, scripts) as started:
        yield started


@pytest.fixture
def priced_policy(tmp_path: Path) -> Path:
    """A policy file that prices the scripted models, in a folder of the server's own."""
    from .test_dashboard_audit import PRICE

    folder = tmp_path / "server-only" / "policies"
    folder.mkdir(parents=True)
    path = folder / "priced.toml"
    path.write_text(
        f'[prices."relay.json"]\ninput = {PRICE["input"]}\noutput = {PRICE["output"]}\n'
        f'[prices."refusing.json"]\ninput = {PRICE["input"]}\noutput = {PRICE["output"]}\n',
        encoding="utf-8",
    )
    return path


@pytest.fixture
async def priced(home: Path, scripts: Path, priced_policy: Path) -> AsyncIterator[Any]:
    """The service with its dashboard, the scripted models priced."""
    from .test_dashboard import running

    async with running(home, scripts, policy_file=priced_policy) as started:
        yield started


@pytest.fixture
def start_server(home: Path, tmp_path: Path, scripts: Path) -> Iterator[Callable[..., Any]]:
    """Start ``relaygraph serve`` on this test's home: ``start(scripts, model=, port=,
    **env)`` writes the scripts (file name to turns) into its scripts folder, serves
    ``model`` by default (the example relay) on ``port`` (by default a free one) and adds
    ``env`` to its environment. Every server still running is killed at the end of the
    test."""
    from .test_server import Server, _env

    started: list[Server] = []
    folder = scripts

    def start(
        scripts: dict[str, Any] | None = None,
        *,
        model: str = f"scripted:{EXAMPLE_RELAY}",
        port: int | None = None,
        **env: str,
    ) -> Server:
        for name, turns in (scripts or {}).items():
            (folder / name).write_text(json.dumps(turns), encoding="utf-8")
        server = Server(
            home,
            model,
            port or free_port(),
            tmp_path / "serve.log",
            folder,
            env={**_env(home), **env},
        )
        started.append(server)
        server.wait_ready()
        return server

    yield start
    for server in started:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()
