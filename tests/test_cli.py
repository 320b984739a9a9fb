"""The command line as a user meets it: real subprocesses, stdout kept clean for --json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .conftest import EXAMPLE_RELAY

Script = Callable[[dict[str, Any]], str]


def relaygraph(
    *args: str, home: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``relaygraph ARGS`` in a process of its own on ``home``, in ``env`` (by default this
    process's environment, with wide columns)."""
    if env is None:
        env = {**os.environ, "RELAYGRAPH_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "relaygraph.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_run_json_prints_only_json(home: Path) -> None:
    proc = relaygraph(
        "run",
        "When are checkpoints written?",
        "--model",
        f"scripted:{EXAMPLE_RELAY}",
        "--json",
        home=home,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)  # nothing but the JSON object on stdout
    assert set(result) >= {
        "task_id",
        "thread_id",
        "status",
        "answer",
        "stop_reason",
        "agents_run",
        "handoffs",
        "artifacts",
        "usage",
    }
    assert result["status"] == "succeeded"
    assert result["handoffs"][1] == {
        "kind": "direct",
        "from": "researcher",
        "to": "coder",
        "task": result["handoffs"][1]["task"],
        "reason": "a calculation is best checked by running code",
    }
    researcher = result["usage"]["researcher"]
    assert set(researcher) >= {"model_calls", "tool_calls", "input_tokens", "output_tokens"}
    # The agent's limits stand beside its counts.
    assert researcher["limits"]["max_model_calls"] == 10
    assert result["violations"] == []
    assert result["team_usage"]["agent_runs"] == 3
    # Progress went to stderr.
    assert "hands off to coder" in proc.stderr


def test_run_shows_progress_and_answer(home: Path) -> None:
    proc = relaygraph("run", "When?", "--model", f"scripted:{EXAMPLE_RELAY}", home=home)
    assert proc.returncode == 0, proc.stderr
    assert "41 checkpoints" in proc.stdout
    assert "report.md" in proc.stdout
    assert "supervisor → researcher" in proc.stderr
    assert "researcher calls search_docs" in proc.stderr


def test_thread_continues_in_a_new_process_where_the_script_stopped(
    home: Path, script: Script
) -> None:
    spec = script(
        {
            "supervisor": [
                {"route": {"next": "researcher", "task": "first", "reason": "turn one"}},
                {"route": {"next": "FINISH", "task": "", "reason": "done one"}},
                {"route": {"next": "writer", "task": "second", "reason": "turn two"}},
                {"route": {"next": "FINISH", "task": "", "reason": "done two"}},
            ],
            "researcher": [{"content": "answer one"}],
            "writer": [{"content": "answer two"}],
        }
    )
    first = relaygraph("run", "first question", "--model", spec, "--json", home=home)
    assert first.returncode == 0, first.stderr
    one = json.loads(first.stdout)
    second = relaygraph(
        "run", "follow-up", "--model", spec, "--thread", one["thread_id"], "--json", home=home
    )
    assert second.returncode == 0, second.stderr
    two = json.loads(second.stdout)
    assert one["answer"] == "answer one"
    assert two["thread_id"] == one["thread_id"]
    assert two["task_id"] != one["task_id"]
    # No turn replayed, none skipped: the second run took the supervisor's turns 3-4.
    assert two["agents_run"] == ["writer"]
    assert two["handoffs"][0]["reason"] == "turn two"
    assert two["answer"] == "answer two"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "x", "--agent-model", "coder"], "expected AGENT=SPEC"),
        (["run", "x", "--agent-model", "pilot=openai:gpt-4o"], "unknown agent(s) 'pilot'"),
        (["run", "x", "--model", "gpt-4o"], "invalid model spec 'gpt-4o'"),
        (["run", "x", "--model", "acme:big"], "unknown provider 'acme'"),
        (
            ["run", "x", "--model", "scripted:/nonexistent/s.json"],
            "'/nonexistent/s.json' does not exist",
        ),
        (["run", "x", "--model", "openai:gpt-4o"], "OPENAI_API_KEY is not set"),
        (["run", "   ", "--model", f"scripted:{EXAMPLE_RELAY}"], "the task is empty"),
        (
            ["run", "x", "--model", f"scripted:{EXAMPLE_RELAY}", "--thread", "nope"],
            "thread 'nope' has no earlier run",
        ),
        (["run", "x", "--frobnicate"], "unrecognized arguments: --frobnicate"),
        (["kb", "add", "/nonexistent-folder"], "'/nonexistent-folder' is not a folder"),
    ],
)
def test_bad_input_is_refused_with_a_message_naming_it(
    home: Path, args: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    proc = relaygraph(*args, home=home)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert proc.stdout == ""


def test_broken_script_file_is_refused_naming_the_turn(home: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"supervisor": [{"content": "a", "route": {}}]}))
    proc = relaygraph("run", "x", "--model", f"scripted:{bad}", home=home)
    assert proc.returncode == 2
    assert "'supervisor' turn 1 is invalid" in proc.stderr
    bad.write_text("{not json")
    proc = relaygraph("run", "x", "--model", f"scripted:{bad}", home=home)
    assert proc.returncode == 2
    assert "is not valid JSON" in proc.stderr


def test_failed_run_exits_non_zero_with_status(home: Path, script: Script) -> None:
    spec = script({"supervisor": [{"route": {"next": "writer", "task": "t", "reason": "r"}}]})
    proc = relaygraph("run", "x", "--model", spec, "--json", home=home)
    assert proc.returncode == 1
    result = json.loads(proc.stdout)
    assert result["status"] == "failed"
    assert "'writer', turn 1" in result["stop_reason"]


def test_kb_add_and_search(home: Path, tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "zebra.md").write_text("# Zebra crossings\n\nStripes help pedestrians cross.\n")
    added = relaygraph("kb", "add", str(docs), home=home)
    assert added.returncode == 0, added.stderr
    assert "1 added" in added.stdout
    found = relaygraph("kb", "search", "pedestrians stripes", home=home)
    assert found.returncode == 0
    assert "Zebra crossings" in found.stdout.splitlines()[0]


def test_help_lists_commands(home: Path) -> None:
    proc = relaygraph("--help", home=home)
    assert proc.returncode == 0
    for command in ("run", "graph", "kb"):
        assert command in proc.stdout


def test_a_reader_that_goes_away_gets_no_traceback(home: Path) -> None:
    env = {**os.environ, "RELAYGRAPH_HOME": str(home)}
    with subprocess.Popen(
        [sys.executable, "-m", "relaygraph.cli", "graph", "--ascii"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # Like `| head -0`: the pipe is gone before the drawing.
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipeError" not in err
    assert code == 141


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (
            ["--workers", "10001"],
            {},
            "RELAYGRAPH_WORKERS / --workers 10001: Input should be less",
        ),
        ([], {"RELAYGRAPH_ALLOWED_MODELS": "openai:*"}, "RELAYGRAPH_ALLOWED_MODELS 'openai:*'"),
        ([], {"RELAYGRAPH_LEASE_SECONDS": "0"}, "RELAYGRAPH_LEASE_SECONDS '0': Input should be"),
    ],
)
def test_serve_refuses_bad_settings_by_name(
    home: Path, args: list[str], env: dict[str, str], message: str
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "relaygraph.cli", "serve", "--port", "9", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "RELAYGRAPH_HOME": str(home), **env},
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("relaygraph: error: bad server setting: "), proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("extra", [(), ("--json",)])
def test_the_removed_teams_create_is_refused_by_name_with_what_to_use(
    home: Path, extra: tuple[str, ...]
) -> None:
    proc = relaygraph("teams", "create", "acme", *extra, home=home)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("relaygraph: error: 'relaygraph teams create' was removed"), (
        proc.stderr
    )
    assert "use 'relaygraph projects create NAME'" in proc.stderr
    assert "Traceback" not in proc.stderr
    # Nothing was created: the name is still free for the command that makes projects.
    made = relaygraph("projects", "create", "acme", "--json", home=home)
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["project"] == "acme"


def test_projects_quota_sets_shows_and_refuses_bad_values_by_name(home: Path) -> None:
    assert relaygraph("projects", "create", "acme", home=home).returncode == 0
    made = relaygraph(
        "projects", "quota", "acme", "--max-running", "4", "--daily-cost-usd", "2.5", home=home
    )
    assert made.returncode == 0, made.stderr
    shown = relaygraph("projects", "quota", "acme", "--json", home=home)
    assert json.loads(shown.stdout) == {
        "project": "acme",
        "quotas": {"max_running": 4, "max_queued": None, "daily_cost_usd": 2.5},
    }
    for flag, bad, named in (
        ("--max-running", "0", "'0'"),
        ("--max-queued", "many", "'many'"),
        ("--daily-cost-usd", "-1", "'-1'"),
        ("--daily-cost-usd", "nan", "'nan'"),
    ):
        refused = relaygraph("projects", "quota", "acme", flag, bad, home=home)
        assert refused.returncode == 2, refused
        assert flag in refused.stderr and named in refused.stderr, refused.stderr
    unknown = relaygraph("projects", "quota", "nobody", "--max-running", "2", home=home)
    assert unknown.returncode == 2 and "no project named 'nobody'" in unknown.stderr
    # Nothing of the refused values was kept; --reset gives the server's settings back.
    again = relaygraph("projects", "quota", "acme", "--json", home=home)
    assert json.loads(again.stdout)["quotas"]["max_running"] == 4
    reset = relaygraph("projects", "quota", "acme", "--reset", "--json", home=home)
    assert json.loads(reset.stdout)["quotas"] == {
        "max_running": None,
        "max_queued": None,
        "daily_cost_usd": None,
    }
