"""The OpenAPI document is the truth: schemathesis drives a live ``relaygraph serve`` on
loopback, on SQLite and on PostgreSQL, and every answer must be one the document lists (its
status, its media type, its headers, its body's schema), never a 5xx.

Bounded: a fixed number of examples per operation and a deadline for the whole run. Set
``RELAYGRAPH_SCHEMATHESIS_EXAMPLES`` and ``RELAYGRAPH_SCHEMATHESIS_SEED`` for a deeper or
another run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from relaygraph.store import DATABASE_URL_ENV

from ._service import free_port, stop_process, wait_answering

pytestmark = pytest.mark.slow

CHECKS = (
    # What the document promises of every answer.
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    # What it promises of requests: one outside the schema is refused, a missing key is
    # 401, a method a path does not take is 405 with `Allow`, a created task can be read.
    "negative_data_rejection",
    "missing_required_header",
    "ignored_auth",
    "unsupported_method",
    "allow_header_conformance",
    "ensure_resource_availability",
)
"""Every check but ``positive_data_acceptance``: a request the schema admits may still be
refused for what a schema cannot say (a model the server does not allow, a policy that
loosens the team's, an option of another topology), with a documented 4xx."""

EXAMPLES = int(os.environ.get("RELAYGRAPH_SCHEMATHESIS_EXAMPLES", "25"))
SEED = os.environ.get("RELAYGRAPH_SCHEMATHESIS_SEED", "4711")
DEADLINE_SECONDS = 300
"""The whole run, all phases; a hung request fails it sooner (``--request-timeout``)."""

ANSWER_AT_ONCE = {
    "supervisor": [{"route": {"next": "FINISH", "task": "", "reason": "done"}}] * 200,
    "finalize": [{"content": "Done."}] * 200,
}
"""The server's default model: tasks the run creates end at once, without tools."""


@pytest.fixture
def server_env(home: Path, url: str) -> dict[str, str]:
    """The server's environment: its ledger at ``url`` (conftest: once SQLite, once
    PostgreSQL), no API key and a dead OpenAI endpoint (conftest)."""
    env = dict(os.environ)
    env.update({"RELAYGRAPH_HOME": str(home), DATABASE_URL_ENV: url})
    return env


@pytest.fixture
def live_server(tmp_path: Path, server_env: dict[str, str]) -> Iterator[str]:
    """``relaygraph serve`` on a free loopback port; yields its URL."""
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    default = scripts / "answer.json"
    default.write_text(json.dumps(ANSWER_AT_ONCE), encoding="utf-8")
    port = free_port()
    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "relaygraph.cli", "serve", "--port", str(port)]
    command += ["--model", f"scripted:{default}", "--scripts", str(scripts)]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, env=server_env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_answering(process, f"{url}/readyz", log, seconds=60)
        yield url
    finally:
        stop_process(process)
    # A stream that broke after its 200, or any error the answers hid, is in the log.
    assert "Traceback" not in log.read_text(), log.read_text()


def team_key(server_env: dict[str, str]) -> str:
    """``relaygraph projects create`` in its own process, as an operator would."""
    done = subprocess.run(
        [sys.executable, "-m", "relaygraph.cli", "projects", "create", "fuzzers", "--json"],
        env=server_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    key: str = json.loads(done.stdout)["key"]
    return key


def test_the_live_server_answers_as_its_openapi_document_says(
    live_server: str, server_env: dict[str, str], tmp_path: Path
) -> None:
    key = team_key(server_env)
    st = shutil.which("st", path=str(Path(sys.executable).parent)) or "st"
    command = [
        st,
        "run",
        f"{live_server}/openapi.json",
        "--header",
        f"Authorization: Bearer {key}",
        "--checks",
        ",".join(CHECKS),
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--max-examples",
        str(EXAMPLES),
        "--seed",
        SEED,
        # One worker: the machine is small, and the run stays reproducible by its seed.
        "--workers",
        "1",
        "--request-timeout",
        "30",
        "--generation-database",
        "none",
        "--no-color",
    ]
    started = time.monotonic()
    try:
        done = subprocess.run(
            command,
            cwd=tmp_path,
            env={**os.environ, "SCHEMATHESIS_TELEMETRY": "false"},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=DEADLINE_SECONDS,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"schemathesis ran over {DEADLINE_SECONDS} s:\n{exc.stdout!s}")
    report = done.stdout + done.stderr
    print(f"schemathesis ran {time.monotonic() - started:.0f} s:\n{report}")
    assert done.returncode == 0, report
    assert "Test cases:" in report and " passed" in report, report
