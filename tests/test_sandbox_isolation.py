"""What bubblewrap isolates in the coder's sandbox: one test per row of docs/sandbox.md.

Each attack is really attempted from inside the sandbox, against a data directory laid out
as a server lays it out (``ledger.sqlite``, ``checkpoints.sqlite``, ``tasks/<id>/workspace``),
with the run's workspace two levels below the data directory so that absolute paths and
``../..`` both point at real files. Every attempt must fail, and the files must be unchanged.
The fallback tests show what the same programs do without bubblewrap.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import secrets
import shutil
import socket
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from relaygraph.agents import tools
from relaygraph.agents.context import TaskContext
from relaygraph.backends import _bubblewrap, _cgroup
from relaygraph.backends.sandbox import (
    SandboxLimits,
    SandboxResult,
    SandboxUnavailableError,
    filesystem_isolation,
    run_python_sandboxed,
)
from relaygraph.errors import ToolInputError

requires_bwrap = pytest.mark.skipif(
    filesystem_isolation() is None,
    reason="bubblewrap (bwrap) is not installed or cannot create namespaces on this host "
    "(CI installs it: apt-get install bubblewrap)",
)

POSTGRES_SOCKET = Path("/var/run/postgresql/.s.PGSQL.5432")
SECRET_A = "tenant A's secret input"

_ATTEMPT = '''
import os, sys

def attempt(label, action):
    """Print the label and either the exception that stopped the action or SUCCEEDED."""
    try:
        value = action()
    except BaseException as exc:
        print(label, type(exc).__name__, flush=True)
    else:
        print(label, "SUCCEEDED", repr(value)[:300], flush=True)
'''


@dataclass(frozen=True)
class DataDir:
    """A server's data directory with two tenants' tasks; the run is tenant B's."""

    home: Path
    ledger: Path
    checkpoints: Path
    workspace_a: Path
    workspace_b: Path

    def digest(self) -> dict[str, str]:
        """A hash of every file under the data directory except B's workspace."""
        return {
            str(p.relative_to(self.home)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(self.home.rglob("*"))
            if p.is_file() and not p.is_relative_to(self.workspace_b)
        }


@pytest.fixture
def data_dir(tmp_path: Path) -> DataDir:
    home = tmp_path / "home"
    (home / "tasks").mkdir(parents=True)
    ledger = home / "ledger.sqlite"
    checkpoints = home / "checkpoints.sqlite"
    for path in (ledger, checkpoints):
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE tasks (tenant TEXT, input TEXT)")
            db.execute("INSERT INTO tasks VALUES ('A', ?)", (SECRET_A,))
        db.close()
    workspace_a = home / "tasks" / "A" / "workspace"
    workspace_b = home / "tasks" / "B" / "workspace"
    workspace_a.mkdir(parents=True)
    workspace_b.mkdir(parents=True)
    (workspace_a / "notes.txt").write_text(SECRET_A)
    return DataDir(home, ledger, checkpoints, workspace_a, workspace_b)


def run(code: str, workspace: Path, *, isolated: bool = True, **limits: float) -> SandboxResult:
    # Never run an attack without the isolation under test: as root, the same code would
    # write into /usr or kill the test process for real.
    if isolated:
        assert filesystem_isolation() == "bubblewrap", "refusing to run an attack unisolated"
    program = _ATTEMPT + textwrap.dedent(code)
    return run_python_sandboxed(program, workspace=workspace, limits=SandboxLimits(**limits))


def outcomes(result: SandboxResult) -> dict[str, str]:
    """Each attempt's label and how it ended (an exception name or SUCCEEDED)."""
    assert result.exit_code == 0, result.to_text()
    lines = [line.split(" ", 2) for line in result.stdout.splitlines()]
    return {parts[0]: parts[1] for parts in lines if len(parts) >= 2}


def _pids_with(token: str) -> list[int]:
    """Host pids of live processes whose command line holds ``token``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if token.encode() in cmdline and state not in {"Z", "X"}:
            found.append(int(entry.name))
    return found


def _wait_until(condition: Callable[[], bool], seconds: float = 30.0) -> bool:
    """Poll ``condition()`` until it is true or ``seconds`` pass (generous: CI is busy)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return bool(condition())


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_bubblewrap.BWRAP_ENV, "")


# --- the data directory ------------------------------------------------------------------


@requires_bwrap
@pytest.mark.parametrize("name", ["ledger.sqlite", "checkpoints.sqlite"])
def test_cannot_read_the_ledger_or_the_checkpoints(data_dir: DataDir, name: str) -> None:
    target = data_dir.home / name
    result = run(
        f"""
        import sqlite3
        attempt('absolute', lambda: open({str(target)!r}, 'rb').read())
        attempt('dotdot', lambda: open('../../../{name}', 'rb').read())
        attempt('home', lambda: open(os.path.expanduser('~/../../../{name}'), 'rb').read())
        attempt('sqlite', lambda: sqlite3.connect('file:{target}?mode=ro', uri=True)
                .execute('SELECT input FROM tasks').fetchall())
        attempt('listdir', lambda: os.listdir({str(data_dir.home)!r}))
        """,
        data_dir.workspace_b,
    )

    assert outcomes(result) == {
        "absolute": "FileNotFoundError",
        "dotdot": "FileNotFoundError",
        "home": "FileNotFoundError",
        "sqlite": "OperationalError",
        "listdir": "FileNotFoundError",
    }
    assert SECRET_A not in result.to_text()
    assert result.isolation == "bubblewrap"


@requires_bwrap
def test_cannot_write_the_ledger(data_dir: DataDir) -> None:
    before = data_dir.digest()
    ledger = str(data_dir.ledger)
    result = run(
        f"""
        import sqlite3
        def insert_key():
            db = sqlite3.connect({ledger!r})
            db.execute("CREATE TABLE api_keys (tenant TEXT, key TEXT)")
            db.execute("INSERT INTO api_keys VALUES ('A', 'rg-stolen')")
            db.commit()
        attempt('sqlite', insert_key)
        attempt('append', lambda: open({ledger!r}, 'ab').write(b'x'))
        attempt('dotdot', lambda: open('../../../ledger.sqlite', 'wb').write(b'x'))
        def recreate():
            os.makedirs({str(data_dir.home)!r}, exist_ok=True)
            return open({ledger!r}, 'wb').write(b'x')
        attempt('recreate', recreate)
        """,
        data_dir.workspace_b,
    )

    found = outcomes(result)
    # The test's data directory lies under /tmp, and the sandbox's /tmp is a tmpfs of its
    # own: a file made at the same path there is not the ledger. (Under a home folder the
    # sandbox's root is read-only and this fails with EROFS.)
    assert found.pop("recreate") in {"SUCCEEDED", "OSError"}
    assert found == {
        "sqlite": "OperationalError",
        "append": "FileNotFoundError",
        "dotdot": "OSError",  # the sandbox's root is read-only: EROFS
    }
    assert data_dir.digest() == before
    with sqlite3.connect(data_dir.ledger) as db:
        tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master")]
    db.close()
    assert tables == ["tasks"]


@requires_bwrap
def test_cannot_list_read_or_write_another_tasks_workspace(data_dir: DataDir) -> None:
    before = data_dir.digest()
    other = str(data_dir.workspace_a)
    result = run(
        f"""
        attempt('listdir', lambda: os.listdir({other!r}))
        attempt('listdir_dotdot', lambda: os.listdir('../../A/workspace'))
        attempt('tasks', lambda: os.listdir('../..'))
        attempt('read', lambda: open({other!r} + '/notes.txt').read())
        attempt('write', lambda: open('../../A/workspace/planted.py', 'w').write('x'))
        """,
        data_dir.workspace_b,
    )

    found = outcomes(result)
    # '../..' from /workspace is the sandbox's root: it lists the mounted system, no tasks.
    assert found.pop("tasks") == "SUCCEEDED"
    assert "'A'" not in result.stdout and "'B'" not in result.stdout
    assert found == {
        "listdir": "FileNotFoundError",
        "listdir_dotdot": "FileNotFoundError",
        "read": "FileNotFoundError",
        "write": "FileNotFoundError",
    }
    assert data_dir.digest() == before
    assert SECRET_A not in result.to_text()


@requires_bwrap
def test_data_dir_under_a_mounted_folder_is_masked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A data directory inside a folder the sandbox must mount (here a fake part of the
    # Python installation) is hidden by a tmpfs; the run_python tool passes it along.
    opt = tmp_path / "opt"
    (opt / "lib").mkdir(parents=True)
    (opt / "lib" / "tool.txt").write_text("visible")
    home = opt / "relaygraph-data"
    (home / "tasks").mkdir(parents=True)
    (home / "ledger.sqlite").write_text(SECRET_A)
    real_roots = _bubblewrap.python_roots
    monkeypatch.setattr(_bubblewrap, "python_roots", lambda: [*real_roots(), opt])
    context = TaskContext.for_task(home, task_id="B", thread_id="t-1")
    code = _ATTEMPT + textwrap.dedent(
        f"""
        attempt('mounted', lambda: open({str(opt / "lib" / "tool.txt")!r}).read())
        attempt('listdir', lambda: os.listdir({str(home)!r}))
        attempt('ledger', lambda: open({str(home / "ledger.sqlite")!r}).read())
        """
    )

    text = tools.run_python.func(code=code, runtime=SimpleNamespace(context=context))  # type: ignore[misc]

    assert "mounted SUCCEEDED 'visible'" in text
    assert "listdir SUCCEEDED []" in text
    assert "ledger FileNotFoundError" in text
    assert SECRET_A not in text


# --- sockets, processes, the server's files -----------------------------------------------


@requires_bwrap
@pytest.mark.skipif(not POSTGRES_SOCKET.exists(), reason="no PostgreSQL socket on this host")
def test_cannot_connect_to_the_postgres_socket(data_dir: DataDir) -> None:
    # The socket is live: the test process itself can connect to it.
    with socket.socket(socket.AF_UNIX) as probe:
        probe.connect(str(POSTGRES_SOCKET))
    result = run(
        f"""
        import socket
        def connect(path):
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(path)
        attempt('socket', lambda: connect({str(POSTGRES_SOCKET)!r}))
        attempt('run', lambda: connect('/run/postgresql/.s.PGSQL.5432'))
        attempt('listdir', lambda: os.listdir('/var/run/postgresql'))
        """,
        data_dir.workspace_b,
    )

    assert outcomes(result) == {
        "socket": "FileNotFoundError",
        "run": "FileNotFoundError",
        "listdir": "FileNotFoundError",
    }


@pytest.fixture
def server_sockets(tmp_path: Path) -> Iterator[tuple[socket.socket, socket.socket]]:
    """A Unix socket on a path in the data directory and one in the abstract namespace."""
    path = tmp_path / "home" / "server.sock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with socket.socket(socket.AF_UNIX) as on_path, socket.socket(socket.AF_UNIX) as abstract:
        on_path.bind(str(path))
        abstract.bind(f"\0relaygraph-test-{secrets.token_hex(8)}")
        for server in (on_path, abstract):
            server.listen()
            server.setblocking(False)
        yield on_path, abstract


@requires_bwrap
def test_cannot_reach_the_servers_unix_sockets(
    data_dir: DataDir, server_sockets: tuple[socket.socket, socket.socket]
) -> None:
    on_path, abstract = server_sockets
    result = run(
        f"""
        import socket
        def connect(address):
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(address)
        attempt('path', lambda: connect({on_path.getsockname()!r}))
        attempt('abstract', lambda: connect({abstract.getsockname()!r}))
        """,
        data_dir.workspace_b,
    )

    # Abstract sockets belong to the network namespace, which is the sandbox's own.
    assert outcomes(result) == {"path": "FileNotFoundError", "abstract": "ConnectionRefusedError"}
    for server in server_sockets:
        with pytest.raises(BlockingIOError):
            server.accept()


@requires_bwrap
def test_cannot_signal_or_see_the_server(data_dir: DataDir) -> None:
    me = os.getpid()
    if me < 100:
        pytest.skip("the test process's pid could also exist in the sandbox's namespace")
    result = run(
        f"""
        import signal
        attempt('kill_parent', lambda: os.kill(os.getppid(), signal.SIGKILL))
        attempt('kill_server', lambda: os.kill({me}, signal.SIGKILL))
        attempt('still_running', lambda: os.getppid())
        attempt('processes', lambda: sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))
        attempt('server_cmdline', lambda: open('/proc/{me}/cmdline').read())
        """,
        data_dir.workspace_b,
    )

    found = outcomes(result)
    # The parent in the sandbox is its namespace's init, which ignores signals sent from
    # inside; the server's pid does not exist there.
    assert found["kill_parent"] == "SUCCEEDED"
    assert "still_running SUCCEEDED 1" in result.stdout
    assert found["kill_server"] == "ProcessLookupError"
    assert found["server_cmdline"] == "FileNotFoundError"
    visible = result.stdout.split("processes SUCCEEDED ", 1)[1].splitlines()[0]
    assert len(eval(visible)) <= 3  # init, the program, and at most a transient pid
    # This process, the "server", survived.
    assert Path(f"/proc/{me}").exists()


_SURVIVOR = """
import os, subprocess, sys, time
GRANDCHILD = '''
import os, time
open("started", "w").close()
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    if os.path.exists("go"):
        open("survived", "w").close()
        break
    time.sleep(0.05)
'''
subprocess.Popen(
    [sys.executable, "-c", GRANDCHILD, TOKEN],
    start_new_session=True,  # setsid(): the child leaves the program's process group
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
)
deadline = time.monotonic() + 60
while not os.path.exists("started") and time.monotonic() < deadline:
    time.sleep(0.02)
print("started" if os.path.exists("started") else "never started", flush=True)
"""


def _survivor(token: str, *, then_sleep: bool = False) -> str:
    code = _SURVIVOR.replace("TOKEN", repr(token))
    return code + ("time.sleep(120)\n" if then_sleep else "")


@requires_bwrap
def test_a_setsid_child_does_not_survive_the_run(data_dir: DataDir) -> None:
    token = f"relaygraph-survivor-{secrets.token_hex(8)}"
    workspace = data_dir.workspace_b
    result = run(_survivor(token), workspace, wall_seconds=90)
    assert result.stdout == "started\n", result.to_text()

    # The run is over: tell a survivor to write its file, then wait until no process with
    # the token is left, so none can write it later.
    (workspace / "go").touch()
    assert _wait_until(lambda: not _pids_with(token))
    assert not (workspace / "survived").exists()


@requires_bwrap
def test_a_wall_timeout_ends_a_setsid_child_too(data_dir: DataDir) -> None:
    token = f"relaygraph-survivor-{secrets.token_hex(8)}"
    workspace = data_dir.workspace_b
    result = run(_survivor(token, then_sleep=True), workspace, wall_seconds=10)
    assert result.timed_out and result.stdout == "started\n", result.to_text()

    (workspace / "go").touch()
    assert _wait_until(lambda: not _pids_with(token))
    assert not (workspace / "survived").exists()


_SERVER = """
import sys
from pathlib import Path
from relaygraph.backends.sandbox import SandboxLimits, run_python_sandboxed
limits = SandboxLimits(wall_seconds=120)
run_python_sandboxed(sys.argv[1], workspace=Path(sys.argv[2]), limits=limits)
"""


@requires_bwrap
def test_a_setsid_child_dies_with_the_server(data_dir: DataDir) -> None:
    # A server killed mid-run (SIGKILL: no cleanup code of its own runs) takes the whole
    # PID namespace with it, a child that left the process group included.
    token = f"relaygraph-survivor-{secrets.token_hex(8)}"
    workspace = data_dir.workspace_b
    code = _survivor(token, then_sleep=True)
    server = subprocess.Popen([sys.executable, "-c", _SERVER, code, str(workspace)])
    try:
        assert _wait_until(lambda: (workspace / "started").exists(), 60)
    finally:
        server.kill()
        server.wait()

    # The server's death takes the namespace down without anyone's help (bwrap dies with
    # its parent, and the namespace with its init), but not in the same instant: wait for
    # that first. Told to go before it, the child could still write its file in the few
    # milliseconds the kernel takes (this test failed so, now and then, on a busy machine).
    # A child that outlived the server would still be there after the 30 s.
    assert _wait_until(lambda: not _pids_with(token))
    (workspace / "go").touch()
    assert not (workspace / "survived").exists()


@pytest.mark.usefixtures("no_bwrap")
def test_fallback_lets_a_setsid_child_survive_without_a_cgroup(
    data_dir: DataDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The documented weakness of the fallback on a host without cgroups, and proof that
    # the tests above and below can fail.
    monkeypatch.setenv(_cgroup.CGROUP_ENV, "")
    token = f"relaygraph-survivor-{secrets.token_hex(8)}"
    workspace = data_dir.workspace_b
    try:
        result = run(_survivor(token), workspace, isolated=False, wall_seconds=90)
        assert result.stdout == "started\n", result.to_text()
        assert result.isolation == "none"
        (workspace / "go").touch()
        assert _wait_until(lambda: (workspace / "survived").exists())
    finally:
        for pid in _pids_with(token):
            os.kill(pid, 9)


@pytest.mark.skipif(_cgroup.available() is None, reason="no cgroup for runs on this host")
@pytest.mark.usefixtures("no_bwrap")
def test_fallback_ends_a_setsid_child_through_the_runs_cgroup(data_dir: DataDir) -> None:
    # Without bubblewrap there is no PID namespace, but a child that left the process group
    # is still in the run's cgroup, and everything in it is killed when the run ends.
    token = f"relaygraph-survivor-{secrets.token_hex(8)}"
    workspace = data_dir.workspace_b
    try:
        result = run(_survivor(token), workspace, isolated=False, wall_seconds=90)
        assert result.stdout == "started\n", result.to_text()
        assert result.isolation == "none" and result.cgroup is not None
        (workspace / "go").touch()
        assert _wait_until(lambda: not _pids_with(token))
        assert not (workspace / "survived").exists()
    finally:
        for pid in _pids_with(token):
            os.kill(pid, 9)


@requires_bwrap
def test_cannot_read_the_servers_home(data_dir: DataDir) -> None:
    home = Path.home()
    if home == Path("/"):
        pytest.skip("the server user's home is the root folder")
    secret = home / f".relaygraph-sandbox-test-{secrets.token_hex(6)}"
    secret.write_text(SECRET_A)
    try:
        result = run(
            f"""
            attempt('read', lambda: open({str(secret)!r}).read())
            attempt('listdir', lambda: os.listdir({str(home)!r}))
            attempt('expanduser', lambda: os.path.expanduser('~'))
            attempt('cmdline', lambda: open('/proc/1/cmdline').read())
            attempt('environ', lambda: dict(os.environ))
            """,
            data_dir.workspace_b,
        )
    finally:
        secret.unlink()

    found = outcomes(result)
    assert found["read"] == "FileNotFoundError"
    # The home folder exists in the sandbox only if the Python installation lies in it;
    # then it holds just the folders leading there.
    assert secret.name not in result.stdout
    assert "expanduser SUCCEEDED '/workspace'" in result.stdout
    # No server path in what the program can read about itself and its init process.
    assert str(data_dir.home) not in result.stdout
    assert SECRET_A not in result.to_text()


@requires_bwrap
def test_etc_holds_only_what_the_interpreter_needs(data_dir: DataDir) -> None:
    result = run(
        """
        attempt('etc', lambda: sorted(os.listdir('/etc')))
        attempt('passwd', lambda: open('/etc/passwd').read())
        attempt('shadow', lambda: open('/etc/shadow').read())
        attempt('hosts', lambda: open('/etc/hosts').read())
        """,
        data_dir.workspace_b,
    )

    listing = result.stdout.split("etc SUCCEEDED ", 1)[1].splitlines()[0]
    assert set(eval(listing)) <= {"alternatives", "group", "ld.so.cache", "localtime", "passwd"}
    assert "passwd SUCCEEDED 'nobody:x:65534:65534:nobody:/workspace:" in result.stdout
    assert "root:" not in result.stdout
    found = outcomes(result)
    assert found["shadow"] == "FileNotFoundError"
    assert found["hosts"] == "FileNotFoundError"


@requires_bwrap
def test_system_and_python_installation_are_read_only(data_dir: DataDir) -> None:
    # Writing into site-packages would plant code that the server itself imports.
    site_packages = _bubblewrap.python_roots()[-1]
    result = run(
        f"""
        import site, sys
        attempt('site_packages', lambda: open({str(site_packages)!r} + '/planted.pth', 'w'))
        attempt('venv', lambda: open(sys.prefix + '/planted.txt', 'w'))
        attempt('usr', lambda: open('/usr/bin/planted', 'w'))
        attempt('root', lambda: open('/planted', 'w'))
        attempt('etc', lambda: open('/etc/passwd', 'a'))
        """,
        data_dir.workspace_b,
    )

    assert set(outcomes(result).values()) == {"OSError"}  # EROFS, a read-only file system
    assert not (site_packages / "planted.pth").exists()


# --- what still works inside --------------------------------------------------------------


@requires_bwrap
def test_stdlib_and_installed_packages_import(data_dir: DataDir) -> None:
    packages = ["pydantic", "pydantic_core", "sqlalchemy"]
    if importlib.util.find_spec("numpy") is not None:
        packages.append("numpy")
    result = run(
        f"""
        import json, sqlite3, decimal, ctypes, zoneinfo, tempfile, multiprocessing
        import importlib
        for name in {packages!r}:
            module = importlib.import_module(name)
            print(name, getattr(module, '__version__', '?'))
        """,
        data_dir.workspace_b,
    )

    assert result.exit_code == 0, result.to_text()
    assert result.isolation == "bubblewrap"
    assert [line.split()[0] for line in result.stdout.splitlines()] == packages


@requires_bwrap
def test_files_written_in_the_workspace_stay(data_dir: DataDir) -> None:
    workspace = data_dir.workspace_b
    result = run(
        """
        import os, tempfile
        os.makedirs('out', exist_ok=True)
        with open('out/result.txt', 'w') as f:
            f.write('42')
        with open(os.path.expanduser('~/at-home.txt'), 'w') as f:
            f.write('home is the workspace')
        with open('/tmp/scratch.txt', 'w') as f:  # a tmpfs of the run, gone afterwards
            f.write('scratch')
        print(os.getcwd(), os.getuid())
        """,
        workspace,
    )

    assert result.stdout == "/workspace 65534\n", result.to_text()
    assert (workspace / "out" / "result.txt").read_text() == "42"
    assert (workspace / "at-home.txt").read_text() == "home is the workspace"
    # The files belong to the user relaygraph runs as.
    assert (workspace / "out" / "result.txt").stat().st_uid == os.geteuid()
    assert sorted(p.name for p in workspace.iterdir()) == ["at-home.txt", "out"]


@pytest.mark.parametrize("isolated", [True, False], ids=["bubblewrap", "fallback"])
def test_a_setuid_program_left_in_the_workspace_is_disarmed(
    data_dir: DataDir, isolated: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The program runs as the server's user as far as the host sees: a copy of a program
    it marks setuid (or setgid), and a workspace it opens to every user, would let any
    user of the host run as the server's. After the run, no set-id bit is left in the
    workspace (in folders below it too; no symlink followed), and the workspace is 0700."""
    if isolated and filesystem_isolation() is None:
        pytest.skip("bubblewrap (bwrap) cannot create namespaces here")
    if not isolated:
        monkeypatch.setenv(_bubblewrap.BWRAP_ENV, "")
    workspace = data_dir.workspace_b
    result = run(
        """
        import os, shutil, stat
        shutil.copy('/usr/bin/id', 'rootid')
        os.makedirs('a/b/c', exist_ok=True)
        shutil.copy('/usr/bin/id', 'a/b/c/deep')
        os.symlink('a/b/c/deep', 'link')
        os.mkdir('shared')
        for name, mode in (('rootid', 0o6755), ('a/b/c/deep', 0o4711), ('shared', 0o2777)):
            attempt('chmod-' + name.replace('/', '-'), lambda: os.chmod(name, mode))
        attempt('open-workspace', lambda: os.chmod('.', 0o777))
        print('modes', oct(os.stat('rootid').st_mode), oct(os.stat('.').st_mode), flush=True)
        """,
        workspace,
        isolated=isolated,
    )
    assert result.exit_code == 0, result.to_text()
    assert "modes 0o106755 0o40777" in result.stdout, result.to_text()  # it did set them
    set_id = stat.S_ISUID | stat.S_ISGID
    left = [
        str(path.relative_to(workspace))
        for path in [workspace, *workspace.rglob("*")]
        if path.lstat().st_mode & set_id
    ]
    assert left == []
    assert stat.S_IMODE((workspace / "rootid").stat().st_mode) == 0o755
    assert stat.S_IMODE((workspace / "a/b/c/deep").stat().st_mode) == 0o711
    assert stat.S_IMODE(workspace.stat().st_mode) == 0o700


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv, to drop the capabilities that let root read any folder",
)
def test_a_folder_closed_to_its_owner_does_not_hide_a_setuid_file(tmp_path: Path) -> None:
    """A server that is not root obeys its folders' permissions: a program that made its
    workspace and a folder in it execute-only (0311, 0111) would keep the walk out of
    them. The disarm gives its user's folders their permissions back first, so nothing is
    skipped and no error ends the run's result. Run with root's DAC override dropped."""
    workspace = tmp_path / "workspace"
    hidden = workspace / "hide"
    hidden.mkdir(parents=True)
    shutil.copy("/usr/bin/id", hidden / "suid")
    (hidden / "suid").chmod(0o4755)
    hidden.chmod(0o111)
    workspace.chmod(0o311)
    disarm = (
        "import sys; from pathlib import Path; "
        "from relaygraph.backends.sandbox import _disarm; _disarm(Path(sys.argv[1]))"
    )
    capabilities = "-dac_override,-dac_read_search"
    done = subprocess.run(
        [
            "setpriv",
            f"--inh-caps={capabilities}",
            f"--bounding-set={capabilities}",
            sys.executable,
            "-c",
            disarm,
            str(workspace),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "could not disarm" not in done.stderr, done.stderr
    assert stat.S_IMODE(workspace.stat().st_mode) == 0o700
    assert stat.S_IMODE((hidden / "suid").stat().st_mode) == 0o755


def test_a_data_directory_and_its_tasks_folder_are_the_owners_alone(tmp_path: Path) -> None:
    """A data directory relaygraph makes is 0700, and its tasks folder (every tenant's
    workspaces) is 0700 even in a data directory the operator made open to all."""
    from relaygraph._home import data_home

    made = data_home(tmp_path / "new" / "home")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    assert stat.S_IMODE((made / "tasks").stat().st_mode) == 0o700

    opened = tmp_path / "opened"
    (opened / "tasks").mkdir(parents=True)
    opened.chmod(0o755)
    (opened / "tasks").chmod(0o777)
    assert data_home(opened) == opened.resolve()
    assert stat.S_IMODE(opened.stat().st_mode) == 0o755  # the operator's own choice
    assert stat.S_IMODE((opened / "tasks").stat().st_mode) == 0o700


@requires_bwrap
def test_a_signal_death_is_reported_as_a_signal(data_dir: DataDir) -> None:
    # bwrap turns death by signal N into exit status 128 + N; the result undoes that.
    result = run("import signal; os.kill(os.getpid(), signal.SIGSEGV)", data_dir.workspace_b)
    assert result.exit_code == -11
    assert "killed by signal SIGSEGV" in result.to_text()


@requires_bwrap
def test_an_installation_reached_through_a_symlink_is_found(
    tmp_path: Path, data_dir: DataDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only resolved folders are mounted; a link on the way (a home folder that is a link,
    # as /home -> var/home) is recreated so that the interpreter's own paths still work.
    (tmp_path / "var" / "home" / "lib").mkdir(parents=True)
    (tmp_path / "var" / "home" / "lib" / "module.py").write_text("VALUE = 42\n")
    (tmp_path / "home-link").symlink_to("var/home")
    real_roots, real_paths = _bubblewrap.python_roots, _bubblewrap._interpreter_paths
    monkeypatch.setattr(
        _bubblewrap, "python_roots", lambda: [*real_roots(), tmp_path / "var" / "home"]
    )
    monkeypatch.setattr(
        _bubblewrap,
        "_interpreter_paths",
        lambda: {*real_paths(), str(tmp_path / "home-link" / "lib")},
    )
    result = run(
        f"""
        sys.path.insert(0, {str(tmp_path / "home-link" / "lib")!r})
        attempt('import', lambda: __import__('module').VALUE)
        """,
        data_dir.workspace_b,
    )

    assert outcomes(result) == {"import": "SUCCEEDED"}
    assert "SUCCEEDED 42" in result.stdout


# --- the fallback and the run_python gate --------------------------------------------------


@pytest.mark.usefixtures("no_bwrap")
def test_fallback_without_bubblewrap_reports_no_isolation(data_dir: DataDir) -> None:
    assert filesystem_isolation() is None
    result = run(
        f"print(open({str(data_dir.ledger)!r}, 'rb').read(6))", data_dir.workspace_b, isolated=False
    )

    # Without bubblewrap the ledger is readable; the result says that files were exposed.
    assert result.stdout == "b'SQLite'\n"
    assert result.isolation == "none"
    assert result.network_isolated
    assert "files and processes were not isolated" in result.to_text()


def test_a_bwrap_that_cannot_create_namespaces_means_no_isolation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text(
        "#!/bin/sh\necho 'bwrap: Creating new namespace failed: Operation not permitted' >&2\n"
        "exit 1\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv(_bubblewrap.BWRAP_ENV, str(fake))
    with caplog.at_level(logging.WARNING):
        assert filesystem_isolation() is None
        assert filesystem_isolation() is None  # probed once, then cached
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "Creating new namespace failed" in warnings[0]

    monkeypatch.setenv(_bubblewrap.BWRAP_ENV, str(tmp_path / "missing"))
    assert filesystem_isolation() is None


def _context(data_dir: DataDir, *, required: bool) -> SimpleNamespace:
    """What the run_python tool reads from its ToolRuntime: the task's context."""
    context = TaskContext(
        task_id="B",
        thread_id="t-1",
        workspace=data_dir.workspace_b,
        artifacts=data_dir.home / "tasks" / "B" / "artifacts",
        knowledge_base=data_dir.home / "kb.sqlite",
        data_dir=data_dir.home,
        sandbox_isolation_required=required,
    )
    return SimpleNamespace(context=context)


@pytest.mark.usefixtures("no_bwrap")
def test_run_python_is_refused_when_isolation_is_required_and_missing(
    data_dir: DataDir,
) -> None:
    runtime = _context(data_dir, required=True)
    with pytest.raises(SandboxUnavailableError) as refused:
        tools.run_python.func(code="open('ran', 'w')", runtime=runtime)  # type: ignore[misc]

    # A ToolInputError: the model reads the message as the tool's result.
    assert isinstance(refused.value, ToolInputError)
    message = str(refused.value)
    assert "run_python is refused on this server" in message
    assert "bubblewrap" in message and "--unsafe-sandbox" in message
    assert not (data_dir.workspace_b / "ran").exists()


@pytest.mark.usefixtures("no_bwrap")
def test_run_python_warns_once_and_runs_when_isolation_is_not_required(
    data_dir: DataDir, caplog: pytest.LogCaptureFixture
) -> None:
    tools._warn_unisolated.cache_clear()
    runtime = _context(data_dir, required=False)
    with caplog.at_level(logging.WARNING, logger="relaygraph.agents.tools"):
        for _ in range(2):
            text = tools.run_python.func(code="open('ran', 'a').write('x')", runtime=runtime)  # type: ignore[misc]
            assert "files and processes were not isolated" in text

    assert (data_dir.workspace_b / "ran").read_text() == "xx"
    warnings = [r for r in caplog.records if r.name == "relaygraph.agents.tools"]
    assert len(warnings) == 1
    assert "without filesystem isolation" in warnings[0].getMessage()


@requires_bwrap
def test_run_python_runs_isolated_when_isolation_is_required(data_dir: DataDir) -> None:
    runtime = _context(data_dir, required=True)
    text = tools.run_python.func(code="print(open('/etc/passwd').read()[:6])", runtime=runtime)  # type: ignore[misc]

    assert text.startswith("exit code 0")
    assert "nobody" in text
    assert "not isolated" not in text
