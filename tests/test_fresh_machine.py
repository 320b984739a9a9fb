"""``./scripts/test`` passes on a fresh machine: one without bubblewrap and without chromium.

CI (``.ci/run``) installs both, so the rest of its run cannot see a test that passes only where
they are. This test runs, once more, every test file that starts the service around tenant
code (``serve``, its in-process app, the worker cluster) and has it run ``run_python``, the
way ``./scripts/test`` runs them on a fresh machine: bubblewrap off (``RELAYGRAPH_BWRAP=""``).
Such a test must either run the program with the documented ``--unsafe-sandbox``
(tests/conftest.py's ``unsafe_sandbox_env``) or skip with its reason; a test that assumes the
isolation is there fails here. (The browser tests look for /usr/bin/chromium and skip with
their reason; they are slow, outside the default run.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

TESTS = REPO / "tests"
RUNS_TENANT_CODE = re.compile(r"run_python")
STARTS_THE_SERVICE = re.compile(r'create_app\(|"serve"|Cluster\(')


def service_tests_with_code() -> list[Path]:
    """The test files that start the service and have it run a program: found by what they
    say, so that a file added later is covered too."""
    found = []
    for path in sorted(TESTS.glob("test_*.py")):
        if path.name == Path(__file__).name:
            continue
        text = path.read_text(encoding="utf-8")
        if RUNS_TENANT_CODE.search(text) and STARTS_THE_SERVICE.search(text):
            found.append(path)
    return found


def test_the_selection_holds_the_files_that_broke_on_a_fresh_machine() -> None:
    names = {path.name for path in service_tests_with_code()}
    assert {"test_server.py", "test_dashboard.py"} <= names, names


@pytest.mark.slow
def test_the_service_tests_pass_without_bubblewrap() -> None:
    env = {**os.environ, "RELAYGRAPH_BWRAP": ""}
    for name in ("RELAYGRAPH_TEST_SLOW", "PYTEST_ADDOPTS"):
        env.pop(name, None)
    files = [str(path.relative_to(REPO)) for path in service_tests_with_code()]
    # `-m "not slow"`: the selection ./scripts/test makes by default.
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider", *files],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-2000:]
