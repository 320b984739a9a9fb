"""The command line given bad input or a bad environment, as a stranger meets it: one line
``relaygraph: error: ...`` naming the bad value, exit code 2, never a traceback, and no
work done that the failure would lose.

Most cases call ``main(argv)`` in this process (an uncaught exception fails the test, as a
traceback would show); one runs the real command to hand it bytes that are not UTF-8.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from relaygraph.cli import main
from relaygraph.cli._argtypes import TEAM_NAME
from relaygraph.cli._preflight import check_folder

from ._service import free_port
from .conftest import EXAMPLE_RELAY, REPO

Cli = Callable[..., tuple[int, str, str]]

# Port 1 on loopback: nothing listens there, so the connection is refused at once.
UNREACHABLE_LEDGER = "postgresql+psycopg://nobody:secret@127.0.0.1:1/x"
GOLDEN = REPO / "examples" / "golden" / "golden.jsonl"
TEAM_FILE = REPO / "examples" / "teams" / "docs-review.toml"


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    """Run ``relaygraph ARGV`` in this process; returns (exit code, stdout, stderr)."""

    def run(*argv: str) -> tuple[int, str, str]:
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse refuses a flag by exiting 2.
            code = exc.code if isinstance(exc.code, int) else 1
        out, err = capsys.readouterr()
        return code, out, err

    return run


def error_line(err: str) -> str:
    """The one ``relaygraph...: error:`` line of ``err``, after argparse's usage lines."""
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1, err
    return errors[0]


# 1. The ledger cannot be reached.

LEDGER_COMMANDS = [
    ("run", "x", "--model", f"scripted:{EXAMPLE_RELAY}"),
    ("trace", "abc"),
    ("resume", "abc", "--approve"),
    ("projects", "create", "pgx"),
    ("db", "upgrade"),
    ("eval", str(GOLDEN)),
    ("replay", "abc"),
    ("diff", "abc", "def"),
    ("eval", "--replay"),
    ("evals", "export", "--out", "cases.jsonl"),
]


@pytest.mark.parametrize("argv", LEDGER_COMMANDS, ids=lambda argv: argv[0])
def test_an_unreachable_ledger_is_one_line_naming_it_without_its_password(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, argv: tuple[str, ...]
) -> None:
    monkeypatch.setenv("RELAYGRAPH_DATABASE_URL", UNREACHABLE_LEDGER)
    code, _, err = cli(*argv)
    assert code == 2
    line = error_line(err)
    shown = "postgresql+psycopg://nobody:***@127.0.0.1:1/x"
    assert line.startswith(f"relaygraph: error: cannot reach the ledger at {shown}: ")
    assert "Connection refused" in line
    assert "secret" not in err
    assert "eval 1/" not in err  # No case ran.


def test_a_sqlite_ledger_whose_folder_cannot_be_made_is_named(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("RELAYGRAPH_DATABASE_URL", f"sqlite:///{blocker}/ledger.sqlite")
    code, _, err = cli("db", "upgrade")
    assert code == 2
    assert error_line(err).startswith(
        f"relaygraph: error: cannot reach the ledger at sqlite:///{blocker}/ledger.sqlite: "
    )


def test_serve_checks_its_ledger_before_it_says_it_serves(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAYGRAPH_DATABASE_URL", UNREACHABLE_LEDGER)
    code, _, err = cli("serve", "--port", str(free_port()))
    assert code == 2
    assert "cannot reach the ledger at postgresql+psycopg://nobody:***@" in error_line(err)
    assert "serving on" not in err


# 2. The data directory cannot be used.


def test_a_file_as_the_data_directory_is_refused_naming_it(cli: Cli, tmp_path: Path) -> None:
    afile = tmp_path / "relay.json"
    afile.write_text("{}")
    code, _, err = cli("--home", str(afile), "kb", "list")
    assert code == 2
    assert error_line(err) == (
        f"relaygraph: error: cannot use the data directory --home {str(afile)!r}: "
        "it is not a folder"
    )


def test_a_data_directory_that_cannot_be_made_is_refused_naming_it(
    cli: Cli, tmp_path: Path
) -> None:
    afile = tmp_path / "a-file"
    afile.write_text("")
    home = afile / "home"
    code, _, err = cli("--home", str(home), "run", "x", "--model", f"scripted:{EXAMPLE_RELAY}")
    assert code == 2
    assert error_line(err).startswith(
        f"relaygraph: error: cannot use the data directory --home {str(home)!r}: "
    )


def test_relaygraph_home_that_is_a_file_is_named_as_the_variable(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    afile = tmp_path / "a-file"
    afile.write_text("")
    monkeypatch.setenv("RELAYGRAPH_HOME", str(afile))
    code, _, err = cli("trace", "abc")
    assert code == 2
    assert f"$RELAYGRAPH_HOME {str(afile)!r}: it is not a folder" in error_line(err)


def test_an_empty_home_is_refused_not_taken_as_the_working_directory(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("--home", "", "kb", "list")
    assert code == 2
    assert "argument --home: expected the data directory's path, got ''" in error_line(err)
    assert list(tmp_path.iterdir()) == []  # Nothing was written in the working directory.


# 3. teams push.


def test_teams_push_to_an_unreachable_service_is_one_line(cli: Cli) -> None:
    code, _, err = cli("teams", "push", str(TEAM_FILE), "--url", "http://127.0.0.1:1", "--key", "x")
    assert code == 2
    assert error_line(err).startswith(
        "relaygraph: error: cannot reach the task service at http://127.0.0.1:1: "
    )


@pytest.mark.parametrize("url", ["notaurl", "ftp://127.0.0.1/", "http://[::1"])
def test_teams_push_refuses_a_url_that_is_no_service_address(cli: Cli, url: str) -> None:
    code, _, err = cli("teams", "push", str(TEAM_FILE), "--url", url, "--key", "x")
    assert code == 2
    assert f"--url / $RELAYGRAPH_URL {url!r} is not the task service's address" in error_line(err)


def test_teams_push_checks_the_name_with_the_servers_rule_before_sending(cli: Cli) -> None:
    # Nothing listens on port 1: a request sent would be a "cannot reach" error instead.
    code, _, err = cli(
        "teams", "push", str(TEAM_FILE), "--name", "../x", "--url", "http://127.0.0.1:1",
        "--key", "x",
    )  # fmt: skip
    assert code == 2
    assert "argument --name: team name '../x' is invalid: " in error_line(err)


def test_the_clis_team_name_rule_is_the_servers() -> None:
    from relaygraph.api._teams import NAME as SERVER_RULE
    from relaygraph.store._validate import NAME as LEDGER_RULE

    assert TEAM_NAME.pattern == SERVER_RULE.pattern == LEDGER_RULE.pattern


def test_teams_push_checks_a_name_from_the_file_too(cli: Cli, tmp_path: Path) -> None:
    unnamed = tmp_path / "my team.toml"
    unnamed.write_text(
        "\n".join(
            line
            for line in TEAM_FILE.read_text(encoding="utf-8").splitlines()
            if not line.startswith("name")
        ),
        encoding="utf-8",
    )
    code, _, err = cli("teams", "push", str(unnamed), "--url", "http://127.0.0.1:1", "--key", "x")
    assert code == 2
    assert error_line(err).startswith("relaygraph: error: team name 'my team' is invalid: ")
    assert "give another with --name" in err


# 4. Bytes that are not UTF-8 in an id.


@pytest.mark.parametrize(
    ("argv", "argument"),
    [
        (("run", "x", "--model", f"scripted:{EXAMPLE_RELAY}", "--thread", "\udcff"), "--thread"),
        (("trace", "\udcff"), "TASK_ID"),
        (("resume", "\udcff", "--approve"), "TASK_ID"),
        (("resume", "abc", "--reject", "--reason", "\udcff"), "--reason"),
    ],
    ids=["run --thread", "trace", "resume", "resume --reason"],
)
def test_an_id_that_is_not_utf8_is_refused_naming_it(
    cli: Cli, argv: tuple[str, ...], argument: str
) -> None:
    code, _, err = cli(*argv)
    assert code == 2
    assert f"argument {argument}: expected UTF-8 text, got b'\\xff'" in error_line(err)


def test_the_real_command_refuses_a_byte_that_is_not_utf8(home: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "relaygraph.cli", "trace", b"\xff"],
        capture_output=True,
        env={**os.environ, "RELAYGRAPH_HOME": str(home)},
        timeout=60,
    )
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2, err
    assert "argument TASK_ID: expected UTF-8 text, got b'\\xff'" in error_line(err)


# 5. resume of a task that belongs to an API project.


def test_resume_of_an_api_projects_task_says_whose_it_is_and_how_to_decide_it(
    cli: Cli, home: Path
) -> None:
    from relaygraph.store import Ledger

    with Ledger(f"sqlite:///{home / 'ledger.sqlite'}") as ledger:
        ledger.upgrade()
        project, _ = ledger.create_project("acme")
        task, _ = ledger.create_task(project_id=project.id, input="write the report")
        ledger.append_event(
            task.id,
            {
                "type": "interrupted",
                "id": "wait-1",
                "waits_for": "approval",
                "agent": "coder",
                "tool": "run_python",
                "args": {"code": "print(1)"},
            },
        )
    code, _, err = cli("resume", task.id, "--approve")
    assert code == 2
    line = error_line(err)
    assert f"task {task.id!r} belongs to project 'acme'" in line
    assert f"POST /v1/tasks/{task.id}/approvals/wait-1" in line
    # The approval still waits: nothing was decided.
    with Ledger(f"sqlite:///{home / 'ledger.sqlite'}") as ledger:
        assert [a.decision for a in ledger.approvals(task.id)] == [None]


# 6. eval --out that cannot be written.


def test_eval_checks_its_out_folder_before_the_first_case(cli: Cli, tmp_path: Path) -> None:
    afile = tmp_path / "a-file"
    afile.write_text("")
    out = afile / "report"
    code, stdout, err = cli("eval", str(GOLDEN), "--out", str(out))
    assert code == 2
    assert error_line(err).startswith(
        f"relaygraph: error: --out {str(out)!r} cannot be written, so the report could not be: "
    )
    assert "eval 1/" not in err
    assert stdout == ""


def test_the_out_folder_check_leaves_nothing_behind(tmp_path: Path) -> None:
    check_folder(tmp_path / "new" / "deeper", "--out", holds="the report")
    assert list(tmp_path.iterdir()) == []


# 7. serve on an address it cannot bind.


def test_serve_on_an_address_not_of_this_host_is_refused_before_it_says_it_serves(
    cli: Cli,
) -> None:
    # 192.0.2.1 is TEST-NET-1 (RFC 5737): no host has it, and no name lookup is needed.
    code, _, err = cli("serve", "--host", "192.0.2.1", "--port", str(free_port()))
    assert code == 2
    assert "cannot serve on --host '192.0.2.1': " in error_line(err)
    assert "serving on" not in err


def test_serve_on_a_port_in_use_is_refused_naming_the_port(cli: Cli) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = cli("serve", "--port", str(port))
    assert code == 2
    assert f"cannot serve on --port {port} of '127.0.0.1': " in error_line(err)
    assert "serving on" not in err


# 8. doctor --timeout.


@pytest.mark.parametrize("timeout", ["-1", "0", "nan"])
def test_doctor_refuses_a_timeout_that_is_not_above_zero(cli: Cli, timeout: str) -> None:
    code, _, err = cli("doctor", "--model", "openai:x", "--timeout", timeout)
    assert code == 2
    assert (
        f"argument --timeout: expected a number of seconds above 0, got {timeout!r}"
        in error_line(err)
    )


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (("run", "x", "--bogus"), "usage: relaygraph run "),
        (("projects", "create", "x", "--bogus"), "usage: relaygraph projects create "),
        (("eval", str(GOLDEN), "--bogus"), "usage: relaygraph eval "),
    ],
)
def test_an_unknown_flag_shows_its_commands_usage_and_names_the_flag(
    cli: Cli, argv: tuple[str, ...], usage: str
) -> None:
    code, out, err = cli(*argv)
    assert code == 2 and out == ""
    assert err.startswith(usage), err
    command = usage.removeprefix("usage: ").strip()
    assert error_line(err) == f"{command}: error: unrecognized arguments: --bogus"


@pytest.mark.parametrize(
    ("command", "variable", "value"),
    [
        ("serve", "RELAYGRAPH_EVENT_LOOP", "trio"),
        ("serve", "RELAYGRAPH_DATABASE_POOL_SIZE", "0"),
        ("worker", "RELAYGRAPH_EVENT_LOOP", "gevent"),
        ("worker", "RELAYGRAPH_DATABASE_POOL_SIZE", "lots"),
    ],
)
def test_a_bad_loop_or_pool_setting_stops_serve_and_worker_before_they_start(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, command: str, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    code, _, err = cli(command)
    assert code == 2
    assert error_line(err).startswith(f"relaygraph: error: {variable}={value!r}: ")
